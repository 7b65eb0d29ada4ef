"""Variants side by side (issue 15): each (model, device, plan, backend) keeps its own build
state and directory, so switching back and forth reruns nothing already built for a variant;
a model's inputs are the model's, generated (or split) once for all its variants.

Real `doit` runs in a copy of the project (hexbundle/graph/variants.py says how it works)."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, DoitRun

TINY_PARTS = ["part_1_of_4", "part_2_of_4", "part_3_of_4", "part_4_of_4"]
EVERY_STEP = ({f"inputs:{p}" for p in TINY_PARTS} | {"inputs:tokenizer"}
              | {f"convert:{p}_{k}" for p in TINY_PARTS for k in ("prompt", "token")}
              | {f"compile:{p}" for p in TINY_PARTS} | {"bundle"})
STANDIN_SDK = ROOT / "tests" / "standin_qairt"


# ---------------------------------------------------------------------------------------------
# helpers: a second model, device, plan in the project copy

def add_model(project, name: str, seed: int) -> None:
    """A second generated model: qwen2-tiny under another name, with other random weights."""
    tiny = (project.root / "configs" / "models" / "qwen2-tiny.toml").read_text()
    text = (tiny.replace('name = "qwen2-tiny"', f'name = "{name}"')
            .replace('slug = "qwen2_tiny"', f'slug = "{name.replace("-", "_")}"')
            .replace("[inputs]\nsource = \"generated\"\nseed = 0",
                     f"[inputs]\nsource = \"generated\"\nseed = {seed}"))
    assert f"seed = {seed}" in text
    (project.root / "configs" / "models" / f"{name}.toml").write_text(text)


def add_device(project) -> str:
    """A second device: a chipset of Qualcomm's table (configs/devices.toml) other than the
    default board (iq9075, soc_model 77). (The one place that knows how a second device is had:
    adapt it if devices are configured otherwise.)"""
    assert "[chipset.sa8775p]" in (project.root / "configs" / "devices.toml").read_text()
    return "sa8775p"


OTHER_SOC_MODEL = 52   # add_device's chipset


def add_plan(project, name: str, layers: list) -> None:
    """Another plan of qwen2-tiny (its 4 layers split otherwise)."""
    path = project.root / "configs" / "models" / "qwen2-tiny.toml"
    path.write_text(path.read_text() + f"\n[plans.{name}]\nlayers_per_part = {layers}\n"
                    "tolerance_pct = 5.0\n")


def files_of(directory) -> dict:
    """name -> (bytes, inode, mtime_ns) of every file under `directory`: 'untouched' means all
    three stay."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            st = path.stat()
            out[str(path.relative_to(directory))] = (path.read_bytes(), st.st_ino, st.st_mtime_ns)
    return out


def bundle_bytes(bundle) -> dict:
    return {p.name: p.read_bytes() for p in sorted(bundle.iterdir())}


def edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


# ---------------------------------------------------------------------------------------------
# switching models, devices, plans, backends

@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_switching_models_back_and_forth_reruns_nothing_already_built(project):
    add_model(project, "qwen2-tiny-b", seed=1)
    assert project.doit("bundle").executed == EVERY_STEP                       # A
    a_bundle = bundle_bytes(project.bundle())
    assert project.doit("bundle", "model=qwen2-tiny-b").executed == EVERY_STEP  # B
    back = project.doit("bundle")                                              # A again
    assert back.executed == set(), back.out
    assert project.doit("bundle", "model=qwen2-tiny-b").executed == set()      # B again
    # side by side: each model's bundle in its own directory, A's as it was built
    assert bundle_bytes(project.bundle()) == a_bundle
    assert sorted(p.name for p in project.bundle("qwen2-tiny-b").glob("*.bin")) == \
        [f"qwen2_tiny_b_{t}.bin" for t in TINY_PARTS]


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_switching_devices_back_and_forth_reruns_nothing_already_built(project):
    other = add_device(project)
    project.doit("bundle")                                                     # X
    on_other = project.doit("bundle", f"device={other}")                       # Y
    assert on_other.executed == EVERY_STEP - {t for t in EVERY_STEP if t.startswith("inputs:")}
    back = project.doit("bundle")                                              # X again
    assert back.executed == set(), back.out
    assert project.doit("bundle", f"device={other}").executed == set()         # Y again
    htp = json.loads((project.bundle(device=other) / "htp_backend_ext_config.json").read_text())
    assert htp["devices"][0]["soc_model"] == OTHER_SOC_MODEL   # its own bundle, built for it
    htp = json.loads((project.bundle() / "htp_backend_ext_config.json").read_text())
    assert htp["devices"][0]["soc_model"] == 77


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_second_device_of_a_generated_model_leaves_its_inputs_alone(project):
    other = add_device(project)
    project.doit("bundle")
    inputs = project.root / "build" / "qwen2-tiny" / "inputs"
    before = files_of(inputs)
    run = project.doit("bundle", f"device={other}")
    assert not [t for t in run.executed if t.startswith("inputs")], run.out
    assert {f"compile:{t}" for t in TINY_PARTS} | {"bundle"} <= run.executed
    assert files_of(inputs) == before   # same bytes, same inodes, same mtimes


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_config_change_after_switching_rebuilds_exactly_what_it_should(project):
    add_model(project, "qwen2-tiny-b", seed=1)
    project.doit("bundle")
    project.doit("bundle", "model=qwen2-tiny-b")
    model_a = project.root / "configs" / "models" / "qwen2-tiny.toml"
    # a Genie setting of A: A's bundle, nothing else
    edit(model_a, "top_k = 40", "top_k = 20")
    run = project.doit("bundle")
    assert run.executed == {"bundle"}, run.out
    genie = json.loads((project.bundle() / "genie_config.json").read_text())
    assert genie["dialog"]["sampler"]["top-k"] == 20
    # A's random weights: every step of A but its tokenizer (no weights in it); B untouched
    edit(model_a, "[inputs]\nsource = \"generated\"\nseed = 0",
         "[inputs]\nsource = \"generated\"\nseed = 7")
    assert project.doit("bundle").executed == EVERY_STEP - {"inputs:tokenizer"}
    assert project.doit("bundle", "model=qwen2-tiny-b").executed == set()
    assert project.doit("bundle").executed == set()


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_switching_plans_keeps_both_side_by_side(project):
    add_plan(project, "five", [0, 1, 1, 1, 1])
    project.doit("bundle")
    four = bundle_bytes(project.bundle())
    five = project.doit("bundle", "plan=five")
    assert "inputs:part_1_of_5" in five.executed and "bundle" in five.executed
    assert project.doit("bundle").executed == set()
    assert project.doit("bundle", "plan=five").executed == set()
    assert bundle_bytes(project.bundle()) == four
    assert len(list(project.bundle(plan="five").glob("*.bin"))) == 5


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_plans_that_write_the_same_input_files_regenerate_them_and_stay_correct(project):
    """Two plans with the same number of parts name their generated inputs alike (the model's
    inputs/ is shared): switching regenerates them, never builds on the other plan's."""
    add_plan(project, "four-b", [0, 1, 2, 1])
    project.doit("bundle")
    good = bundle_bytes(project.bundle())
    other = project.doit("bundle", "plan=four-b")
    assert {f"inputs:{t}" for t in TINY_PARTS} <= other.executed
    assert bundle_bytes(project.bundle(plan="four-b")) != good
    back = project.doit("bundle")
    # the inputs come back with plan four's bytes, so its DLCs, bins and bundle stand
    assert back.executed == {f"inputs:{t}" for t in TINY_PARTS}, back.out
    assert bundle_bytes(project.bundle()) == good
    assert project.doit("check_sizes").code == 0


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_switching_backends_keeps_both_side_by_side(project, tmp_path):
    qairt = ["backend=qairt"]
    env = {"QAIRT_SDK_ROOT": str(STANDIN_SDK), "STANDIN_QAIRT_RECORD": str(tmp_path / "c.jsonl"),
           "STANDIN_QAIRT_MODE": "ok"}
    project.doit("compile")
    reference = files_of(project.build_dir() / "bin")
    run = project.doit("compile", *qairt, env=env)
    assert not [t for t in run.executed if t.startswith("inputs")], run.out
    assert {f"compile:{t}" for t in TINY_PARTS} <= run.executed
    assert project.doit("compile").executed == set()
    assert project.doit("compile", *qairt, env=env).executed == set()
    assert files_of(project.build_dir() / "bin") == reference
    assert len(list(project.build_dir(backend="qairt").glob("bin/*.bin"))) == 4


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_locally_split_export_is_split_once_for_all_devices(project):
    data = ROOT / "tests" / "data" / "qaihm" / "export"
    project.doit("import_export", "--dir", str(data), "--name", "mine", "--plan", "0,3,3,3")
    other = add_device(project)
    project.doit("bundle", "model=mine")
    split = project.root / "build" / "mine" / "inputs"
    before = files_of(split)
    run = project.doit("bundle", "model=mine", f"device={other}")
    assert not [t for t in run.executed if t.startswith("inputs")], run.out
    assert "bundle" in run.executed
    assert files_of(split) == before
    assert project.doit("bundle", "model=mine").executed == set()


# ---------------------------------------------------------------------------------------------
# the state: where it is, what is left of an older hexbundle's

def test_each_variant_has_its_own_db_and_the_model_one_for_its_inputs(project):
    other = add_device(project)
    project.doit("bundle")
    project.doit("bundle", f"device={other}")
    model = json.loads(project.model_db().read_text())
    assert sorted(model) == sorted(t for t in EVERY_STEP if t.startswith("inputs:"))
    for device in ("iq9075", other):
        records = json.loads(project.doit_db(device=device).read_text())
        assert "compile:part_1_of_4" in records and "bundle" in records
        targets = records["bundle"]["_values_:"]["_targets_xxh3"]
        assert all(f"/{device}/four/reference/bundle/" in t for t in targets), targets


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_model_db_set_aside_regenerates_the_inputs_for_every_variant(project):
    """The model's DB has the last word on its inputs: without it no variant trusts its own copy
    of the inputs' records."""
    other = add_device(project)
    project.doit("bundle")
    project.doit("bundle", f"device={other}")
    project.model_db().write_text("not json")
    run = project.doit("bundle")
    assert "qwen2-tiny/doit-db.json was unreadable" in run.err, run.err
    # regenerated to the same bytes: the DLCs, bins and bundle built from them stand
    assert run.executed == {t for t in EVERY_STEP if t.startswith("inputs:")}, run.out
    assert project.doit("bundle", f"device={other}").executed == set()


def test_the_db_of_an_older_hexbundle_is_set_aside_with_one_line(project):
    state = project.root / "build" / ".hexbundle"
    state.mkdir(parents=True)
    (state / "doit-db.json").write_text('{"bundle": {"deps:": []}}')
    run = project.doit("bundle")
    lines = [ln for ln in run.err.splitlines() if "of an older hexbundle" in ln]
    assert len(lines) == 1 and "doit-db.json.former" in lines[0], run.err
    assert (state / "doit-db.json.former").is_file() and not (state / "doit-db.json").exists()
    assert run.executed == EVERY_STEP
    assert "of an older hexbundle" not in project.doit("bundle").err


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_two_variants_of_one_model_built_at_once_take_turns(project, tmp_path):
    """The lock serialises runs in a build root: a second variant of the same model waits, and
    then finds the model's inputs the first run generated."""
    other = add_device(project)
    procs = []
    for i, args in enumerate(([], [f"device={other}"])):
        out, err = (open(tmp_path / f"{i}.{n}", "w") for n in ("out", "err"))   # no pipe fills up
        with out, err:
            procs.append(subprocess.Popen([sys.executable, "-m", "doit", "bundle", *args],
                                          cwd=project.root, stdout=out, stderr=err))
    runs = [DoitRun(p.wait(timeout=600), (tmp_path / f"{i}.out").read_text(),
                    (tmp_path / f"{i}.err").read_text()) for i, p in enumerate(procs)]
    assert [r.code for r in runs] == [0, 0], [r.out + r.err for r in runs]
    generated = [t for r in runs for t in r.executed if t.startswith("inputs:")]
    # generated once, by whichever run went first
    assert sorted(generated) == sorted(t for t in EVERY_STEP if t.startswith("inputs:"))
    assert project.doit("bundle").executed == set()
    assert project.doit("bundle", f"device={other}").executed == set()


@pytest.mark.parametrize("records, model, expected", [
    ({"convert:x": 1, "inputs:p": "stale"}, {"inputs:p": "fresh"},
     {"convert:x": 1, "inputs:p": "fresh"}),
    ({"convert:x": 1, "inputs:p": "stale"}, {}, {"convert:x": 1}),   # model's DB gone: dropped
    ({}, {"inputs:p": 2, "inputs:q": 3}, {"inputs:p": 2, "inputs:q": 3}),
])
def test_seeding_gives_the_model_s_records_the_last_word(records, model, expected):
    from hexbundle.graph.variants import seeded, split_records
    assert seeded(records, model) == expected
    assert split_records(expected)[0] == {k: v for k, v in expected.items()
                                          if k.startswith("inputs:")}
