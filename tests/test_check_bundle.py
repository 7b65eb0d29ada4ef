"""`doit check_bundle --path DIR` (checks/genie_bundle.py): every bundle `doit bundle` makes is
accepted, so is one laid out by hand as ai-hub-apps' manual_bundle.md describes, and each of the
broken bundles below is refused naming its problem."""
import json
import os
import shutil

import pytest

from conftest import CONFIGS
from hexbundle.checks.genie_bundle import check_bundle
from hexbundle.config.devices import read_table
from hexbundle.config.layout import ProjectLayout

TABLE = read_table(ProjectLayout(CONFIGS))
CHIPSETS = {soc: row["dsp_arch"] for soc, row in TABLE["qualcomm_soc_models"].items()}
BINS = [f"qwen2_tiny_part_{i}_of_4.bin" for i in range(1, 5)]


@pytest.fixture
def bundle(built, tmp_path):
    """A private copy of the built bundle (real files)."""
    return shutil.copytree(built.bundle(), tmp_path / "bundle")


def problems(path, model_config=None) -> list:
    return check_bundle(path, CHIPSETS, model_config).problems


def edit_json(path, edit):
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, indent=2))


def genie(bundle, edit):
    edit_json(bundle / "genie_config.json", lambda doc: edit(doc["dialog"]))


def ctx_bins(dialog) -> list:
    return dialog["engine"]["model"]["binary"]["ctx-bins"]


def test_the_built_bundle_is_accepted_in_process_and_by_doit(built, bundle):
    assert problems(bundle) == []
    run = built.doit("check_bundle", "--path", str(built.bundle()))
    assert "check_bundle" in run.executed and "no problem" in run.out, run.out
    log = (built.build_dir() / "logs" / "bundle.log").read_text()
    assert "check_bundle: no problem" in log   # the bundle step's own lint of what it made


def manual_bundle(bundle, dest):
    """The layout manual_bundle.md describes, written by hand: Qualcomm's genie_config.json
    keys and values (n-threads 3, cpu-mask 0xe0, ...), our bins renamed <model>_part_i_of_N."""
    dest.mkdir()
    names = [f"tiny_part_{i}_of_4.bin" for i in range(1, 5)]
    for old, new in zip(BINS, names):
        shutil.copyfile(bundle / old, dest / new)
    shutil.copyfile(bundle / "tokenizer.json", dest / "tokenizer.json")
    ours = json.loads((bundle / "genie_config.json").read_text())["dialog"]
    config = {"dialog": {
        "version": 1, "type": "basic", "max-num-tokens": 200,
        "context": {"version": 1, "size": 256, "n-vocab": ours["context"]["n-vocab"],
                    "bos-token": ours["context"]["bos-token"],
                    "eos-token": ours["context"]["eos-token"],
                    "eot-token": ours["context"]["eot-token"]},
        "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, "top-p": 0.95},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {"version": 1, "n-threads": 3,
                   "backend": {"version": 1, "type": "QnnHtp",
                               "QnnHtp": {"version": 1, "use-mmap": True,
                                          "spill-fill-bufsize": 0, "mmap-budget": 0,
                                          "poll": True, "cpu-mask": "0xe0", "kv-dim": 32,
                                          "pos-id-dim": 16, "rope-theta": 1000000,
                                          "allow-async-init": False},
                               "extensions": "htp_backend_ext_config.json"},
                   "model": {"version": 1, "type": "binary",
                             "binary": {"version": 1, "ctx-bins": names}}}}}
    (dest / "genie_config.json").write_text(json.dumps(config, indent=4))
    (dest / "htp_backend_ext_config.json").write_text(json.dumps(
        {"devices": [{"soc_model": 77, "dsp_arch": "v73",
                      "cores": [{"core_id": 0, "perf_profile": "burst",
                                 "rpc_control_latency": 100}]}],
         "memory": {"mem_type": "shared_buffer"}, "context": {"weight_sharing_enabled": True}}))
    return dest


def test_a_bundle_laid_out_by_hand_as_manual_bundle_md_describes_is_accepted(bundle, tmp_path):
    manual = manual_bundle(bundle, tmp_path / "manual")
    config = tmp_path / "config.json"
    dialog = json.loads((manual / "genie_config.json").read_text())["dialog"]
    config.write_text(json.dumps({"vocab_size": dialog["context"]["n-vocab"],
                                  "rope_theta": 1000000.0, "hidden_size": 128,
                                  "num_attention_heads": 4, "head_dim": 32,
                                  "bos_token_id": dialog["context"]["bos-token"],
                                  "eos_token_id": dialog["context"]["eos-token"]}))
    assert problems(manual, config) == []


def sparse_over_4gib(bundle):
    path = bundle / BINS[3]
    with open(path, "r+b") as fh:
        fh.truncate((4 << 30) + 1)   # sparse: no disk used


BROKEN = {
    "genie_config.json missing": (lambda b: os.remove(b / "genie_config.json"),
                                  "genie_config.json: missing from the bundle"),
    "genie_config.json not JSON": (lambda b: (b / "genie_config.json").write_text("{dialog"),
                                   "genie_config.json: not valid JSON"),
    "a listed bin missing": (lambda b: os.remove(b / BINS[2]),
                             f"ctx-bins'[2] is {BINS[2]}, which is not in the bundle"),
    "a bin listed twice": (lambda b: genie(b, lambda d: ctx_bins(d).append(BINS[0])),
                           f"ctx-bins'[4] lists {BINS[0]} again"),
    "a stray bin": (lambda b: shutil.copyfile(b / BINS[0], b / "old_part_1_of_4.bin"),
                    "old_part_1_of_4.bin: in the bundle but not in"),
    "parts out of order": (lambda b: genie(b, lambda d: ctx_bins(d).reverse()),
                           "is not parts 1..4 of 4 in order"),
    "names that sort wrongly": (
        lambda b: [os.rename(b / old, b / new) for old, new in zip(
            BINS, ["m_part_1_of_4.bin", "n_part_2_of_4.bin", "l_part_3_of_4.bin",
                   "o_part_4_of_4.bin"])]
        and genie(b, lambda d: d["engine"]["model"]["binary"].update(
            {"ctx-bins": ["m_part_1_of_4.bin", "n_part_2_of_4.bin", "l_part_3_of_4.bin",
                          "o_part_4_of_4.bin"]})),
        "a loader that sorts by name would feed the parts out of order"),
    "context size not the graphs'": (lambda b: genie(b, lambda d: d["context"].update(size=512)),
                                     "'dialog.context.size' is 512 but the bins' largest context "
                                     "length is 256"),
    "max-num-tokens over the context": (lambda b: genie(b, lambda d: d.update(
        {"max-num-tokens": 4096})), "'dialog.max-num-tokens' 4096 exceeds the context size"),
    "eos id outside n-vocab": (lambda b: genie(b, lambda d: d["context"].update(
        {"eos-token": 999999})), "'dialog.context.eos-token' 999999 is outside"),
    "n-vocab below the tokenizer's ids": (lambda b: genie(b, lambda d: d["context"].update(
        {"n-vocab": 100})), "but 'dialog.context.n-vocab' is 100"),
    "a required key missing": (lambda b: genie(b, lambda d: d["engine"]["backend"]["QnnHtp"].pop(
        "poll")), "'dialog.engine.backend.QnnHtp.poll' is missing (required by Qualcomm's"),
    "kv-dim missing": (lambda b: genie(b, lambda d: d["engine"]["backend"]["QnnHtp"].pop(
        "kv-dim")), "QnnHtp.kv-dim' is missing: the KV cache's head dimension"),
    "RoPE settings missing": (lambda b: genie(b, lambda d: d["engine"]["backend"]["QnnHtp"].pop(
        "pos-id-dim")), "QnnHtp.pos-id-dim' is missing, and the runtime builds the RoPE tables"),
    "a positional-encoding block without rope-dim": (lambda b: genie(
        b, lambda d: d["engine"]["model"].update({"positional-encoding": {
            "type": "rope", "rope-theta": 1000000}})),
        "positional-encoding.rope-dim' is missing: the block gives RoPE's settings"),
    "rope-theta of the wrong type": (lambda b: genie(b, lambda d: d["engine"]["backend"][
        "QnnHtp"].update({"rope-theta": "1e6"})), "rope-theta' is '1e6', expected an integer"),
    "a misspelt key": (lambda b: genie(b, lambda d: d.update({"max-num-token": 5})),
                       "'dialog.max-num-token' is not a key of Qualcomm's schema"),
    "the CPU backend": (lambda b: genie(b, lambda d: d["engine"]["backend"].update(
        type="QnnGenAiTransformer")), "context binaries need 'QnnHtp'"),
    "soc_model of another arch": (lambda b: edit_json(b / "htp_backend_ext_config.json",
                                                      lambda d: d["devices"][0].update(
                                                          dsp_arch="v75")),
                                  "soc_model 77 is a v73 chipset, not v75"),
    "an unknown arch": (lambda b: edit_json(b / "htp_backend_ext_config.json",
                                            lambda d: d["devices"][0].update(dsp_arch="v99")),
                        "dsp_arch 'v99' is no Hexagon version of Qualcomm's chipset table"),
    "an unloadable tokenizer": (lambda b: (b / "tokenizer.json").write_text('{"model": 1}'),
                                "tokenizer.json: the tokenizers library cannot load it"),
    "a bin over 4 GiB": (sparse_over_4gib, f"{BINS[3]}: 4.00 GiB, over the 4 GiB"),
}


def relink(bundle, name, target=None):
    """Replace bundle/name by a symbolic link: to `target`, or to the file moved out of the
    bundle (beside it)."""
    if target is None:
        target = bundle.parent / f"moved-{name}"
        os.replace(bundle / name, target)
    else:
        os.remove(bundle / name)
    os.symlink(target, bundle / name)


def set_number(*keys, value):
    def edit(dialog):
        node = dialog
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return lambda b: genie(b, edit)


# Issue 36, item 1: what check_bundle passed. The seam test (test_check_bundle_and_the_host_
# runtime_agree) has the host runtime refuse each too.
ITEM1 = {
    "genie_config.json a link out of the bundle": (
        lambda b: relink(b, "genie_config.json"),
        "genie_config.json: a symbolic link (to "),
    "tokenizer.json a link to /etc/shadow": (
        lambda b: relink(b, "tokenizer.json", "/etc/shadow"),
        "tokenizer.json: a symbolic link (to /etc/shadow)"),
    "a context binary a link out of the bundle": (
        lambda b: relink(b, BINS[1]), f"{BINS[1]}: a symbolic link (to "),
    "a context binary a link inside the bundle": (
        lambda b: os.replace(b / BINS[1], b / "hidden.data") or os.symlink(
            "hidden.data", b / BINS[1]), f"{BINS[1]}: a symbolic link (to hidden.data)"),
    "a stray extra -> /etc": (lambda b: os.symlink("/etc", b / "extra"),
                              "extra: a symbolic link (to /etc)"),
    "a stray file": (lambda b: (b / "notes.txt").write_text("x"),
                     "notes.txt: in the bundle but named by nothing"),
    "a directory in the bundle": (lambda b: (b / "sub").mkdir(), "sub: a directory, not a file"),
    "a FIFO in the bundle": (lambda b: os.mkfifo(b / "pipe"), "pipe: a named pipe (FIFO)"),
    "genie_config.json null": (lambda b: (b / "genie_config.json").write_text("null"),
                               "no top-level object 'dialog' (the file is a JSON null)"),
    "max-num-tokens -1": (set_number("max-num-tokens", value=-1),
                          "'dialog.max-num-tokens' is -1, outside its range"),
    "n-vocab 10**30": (set_number("context", "n-vocab", value=10 ** 30),
                       "genie_config.json: key 'dialog.context.n-vocab' is an integer of 31 "
                       "digits, outside +-2**64"),
    "dialog.version -1": (set_number("version", value=-1),
                          "'dialog.version' is -1, outside its range"),
    "context.version 10**30": (set_number("context", "version", value=10 ** 30),
                               "genie_config.json: key 'dialog.context.version' is an integer "
                               "of 31 digits"),
    "top-p 1.5": (set_number("sampler", "top-p", value=1.5),
                  "'dialog.sampler.top-p' is 1.5, outside its range"),
}
BROKEN.update(ITEM1)
# the numbers against the graphs (hexbundle-format bins): check_bundle's; the host runtime
# takes the dimensions from the graphs themselves, so it runs these (the device would not)
BROKEN.update({
    "n-vocab not the logits' width": (set_number("context", "n-vocab", value=2048),
                                      "'dialog.context.n-vocab' is 2048 but the bins' graphs say "
                                      "1024 (the logits' width)"),
    "kv-dim not the graphs'": (set_number("engine", "backend", "QnnHtp", "kv-dim", value=64),
                               "'dialog.engine.backend.QnnHtp.kv-dim' is 64 but the bins' graphs "
                               "say 32"),
})


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_bundle_is_refused_naming_the_problem(bundle, case):
    breaking, says = BROKEN[case]
    breaking(bundle)
    found = problems(bundle)
    assert any(says in p for p in found), (case, found)


@pytest.mark.parametrize("field, value, says", [
    ("rope_theta", 500000.0, "rope-theta' is 1000000, config.json rope_theta is 500000.0"),
    ("vocab_size", 2048, "n-vocab' is"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 32.0}, "rope_scaling of type 'llama3'"),
])
def test_the_models_config_json_is_checked_when_given(bundle, tmp_path, field, value, says):
    dialog = json.loads((bundle / "genie_config.json").read_text())["dialog"]
    model = {"vocab_size": dialog["context"]["n-vocab"], "rope_theta": 1000000.0,
             "head_dim": dialog["engine"]["backend"]["QnnHtp"]["kv-dim"],
             "num_attention_heads": 4, field: value}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(model))
    assert any(says in p for p in problems(bundle, config)), problems(bundle, config)
    model.pop(field) if field == "rope_scaling" else model.update(
        {field: {"rope_theta": 1000000.0, "vocab_size": dialog["context"]["n-vocab"]}[field]})
    config.write_text(json.dumps(model))
    assert problems(bundle, config) == []


def test_every_number_of_the_schema_has_its_range():
    """formats/genie_ranges.py gives each int, float and id of Qualcomm's schema a range, and
    names no key the schema lacks: a schema regenerated with a new number fails here."""
    from hexbundle.formats.genie_ranges import RANGES, range_of
    from hexbundle.formats.genie_schema import DIALOG

    def numbers(node, where):
        if node["type"] == "object":
            return [n for key, child in node["keys"].items() for n in numbers(child, f"{where}.{key}")]
        if node["type"] == "list":
            return numbers(node["item"], f"{where}[]")
        return [where] if node["type"] in ("int", "float", "ids") else []
    found = numbers(DIALOG, "dialog")
    for where in found:
        range_of(where)   # KeyError: a number without its range
    assert set(RANGES) <= set(found)


@pytest.mark.parametrize("case", sorted(ITEM1))
def test_doit_check_bundle_refuses_each_bundle_it_passed(built, bundle, case):
    """Issue 36, item 1, through `doit check_bundle`: each exited 0 ("no problem")."""
    ITEM1[case][0](bundle)
    run = built.doit("check_bundle", "--path", str(bundle), check=False)
    assert run.code != 0 and ITEM1[case][1] in run.out, run.out + run.err
    assert "Traceback" not in run.out + run.err


def test_a_model_config_of_the_wrong_shape_is_named_not_a_traceback(built, bundle, tmp_path):
    """`bos_token_id: [1, {"x": 2}]` ended in a TypeError traceback."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"vocab_size": 1024, "bos_token_id": [1, {"x": 2}]}))
    run = built.doit("check_bundle", "--path", str(bundle), "--model-config", str(config),
                     check=False)
    assert run.code != 0 and "Traceback" not in run.out + run.err
    assert f"--model-config {config}: bos_token_id is [1, {{\"x\": 2}}], expected a token id" \
        in run.out, run.out


def generate(project, bundle):
    """scripts/generate.py: one prompt through the bundle on the host, as genie-t2t-run would."""
    import subprocess
    import sys
    return subprocess.run([sys.executable, "scripts/generate.py", "-p", "Hello there", "-n", "2",
                           "--greedy", "--bundle", str(bundle)], cwd=project.root,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.heavy   # one host generation per mutation (~5 s each): the full suite
def test_check_bundle_and_the_host_runtime_agree(built, bundle, tmp_path):
    """The seam: a bundle check_bundle passes loads in the host runtime and runs a prompt; each
    bundle of item 1 is refused by both, the runtime without a traceback."""
    assert problems(bundle) == []
    ok = generate(built, bundle)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for case, (breaking, _) in sorted(ITEM1.items()):
        mutated = shutil.copytree(built.bundle(), tmp_path / case.replace(" ", "-") / "bundle")
        breaking(mutated)
        assert problems(mutated), case
        run = generate(built, mutated)
        assert run.returncode != 0, (case, run.stdout)
        assert "Traceback" not in run.stdout + run.stderr, (case, run.stderr)


def test_doit_check_bundle_lists_every_problem_and_exits_non_zero(built, bundle):
    genie(bundle, lambda d: d["context"].update(size=512))
    os.remove(bundle / BINS[1])
    run = built.doit("check_bundle", "--path", str(bundle), check=False)
    assert run.code != 0
    listed = [line for line in run.out.splitlines() if "PROBLEM" in line]
    assert len(listed) >= 2, run.out
    assert "Traceback" not in run.out + run.err


# ------------------------------------------------------------------------------ Qualcomm's schema

@pytest.fixture(scope="module")
def real(tmp_path_factory):
    import real_qairt
    api = real_qairt.load_locked(tmp_path_factory.mktemp("qairt-dev"))
    yield api
    real_qairt.unload(api)


@pytest.mark.real_qairt
def test_the_committed_schema_is_qualcomms(real):
    """formats/genie_schema.py is what scripts/make_genie_schema.py makes of the pinned wheel."""
    import importlib.util
    from conftest import ROOT
    from hexbundle.formats import genie_schema
    spec = importlib.util.spec_from_file_location("make_genie_schema",
                                                  ROOT / "scripts" / "make_genie_schema.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    assert make.basic_dialog_schema(real.GenieConfig) == genie_schema.DIALOG


SCHEMA_CASES = ["a required key missing", "rope-theta of the wrong type", "a misspelt key"]


@pytest.mark.real_qairt
@pytest.mark.parametrize("case", SCHEMA_CASES)
def test_check_bundle_and_qualcomms_genieconfig_agree(real, bundle, case):
    """What the lint refuses by the schema, Qualcomm's class refuses; what it accepts (the
    built bundle, the hand-laid-out one), the class accepts."""
    from pydantic import ValidationError
    real.GenieConfig.model_validate(json.loads((bundle / "genie_config.json").read_text()))
    breaking, _ = BROKEN[case]
    breaking(bundle)
    assert problems(bundle)
    with pytest.raises(ValidationError):
        real.GenieConfig.model_validate(json.loads((bundle / "genie_config.json").read_text()))
