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
                                   "genie_config.json: not readable JSON"),
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
