"""`doit bundle --explain` names why each step runs: the setting (old -> new), the input (its
recorded and current digest), the code file, the edited output; "up to date" otherwise
(graph/explain.py). Real doit runs on copies of one finished build; the reasons are checked
against what the test changed, the digests against the bytes."""
from __future__ import annotations

import re
import subprocess

import pytest

from conftest import Project, copy_project
from hexbundle.formats import stepkey
from hexbundle.graph.explain import key_changes
from hexbundle.support.hashing import bytes_digest

BUILD = "build/qwen2-tiny/iq9075/four/reference"
DATA = "build/qwen2-tiny/inputs/part_2_of_4.data"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Project:
    project = copy_project(tmp_path_factory.mktemp("explain") / "base")
    project.doit("bundle")
    return project


@pytest.fixture
def built(base, tmp_path) -> Project:
    """A copy of the finished build (cp -a: the bundle's bins stay hard links to bin/)."""
    subprocess.run(["cp", "-a", str(base.root), str(tmp_path / "p")], check=True)
    return Project(tmp_path / "p")


def explained(run) -> dict:
    """task -> its explain line's reason."""
    found = dict(re.findall(r"^explain: (\S+)  (.*)$", run.out, re.M))
    assert found, run.out
    return found


def running(lines: dict) -> dict:
    return {t: why for t, why in lines.items() if why != "up to date"}


def test_a_built_tree_explains_every_step_as_up_to_date(built):
    lines = explained(built.doit("bundle", "--explain"))
    assert len(lines) == 18 and running(lines) == {}, lines


def test_a_setting_is_named_with_its_old_and_new_value(built):
    lines = running(explained(built.doit("bundle", "--explain", "float_bitwidth=32")))
    converts = {t: w for t, w in lines.items() if t.startswith("convert:")}
    assert len(converts) == 8, lines
    # named by its path in the step's options (ConvertStepOptions holds the backend's own)
    assert set(converts.values()) == {"runs because convert.float_bitwidth changed: 16 -> 32"}, \
        lines
    # the bundle's own options hold the convert options (its size model): named by path
    assert "convert.float_bitwidth changed: 16 -> 32" in lines["bundle"], lines
    # back again: the old and new values swap
    lines = running(explained(built.doit("bundle", "--explain")))
    assert lines["convert:part_1_of_4_prompt"] == \
        "runs because convert.float_bitwidth changed: 32 -> 16", lines


def test_an_input_is_named_with_its_recorded_and_current_digest(built):
    path = built.root / DATA
    data = bytearray(path.read_bytes())
    old = bytes_digest(bytes(data))
    data[-1] ^= 0xFF
    path.write_bytes(data)
    new = bytes_digest(bytes(data))
    lines = running(explained(built.doit("bundle", "--explain", check=False)))
    want = f"runs because {DATA} changed (digest {old[:12]} -> {new[:12]})"
    for graph in ("prompt", "token"):
        assert lines[f"convert:part_2_of_4_{graph}"].startswith(want), lines
    assert not any(t.startswith(("convert:part_1", "inputs:")) for t in lines), lines


def test_a_code_file_is_named(built):
    source = built.root / "hexbundle" / "formats" / "ctxbin.py"
    source.write_text(source.read_text() + "\n# an edit\n")
    lines = running(explained(built.doit("bundle", "--explain")))
    compiles = {t: w for t, w in lines.items() if t.startswith("compile:")}
    assert len(compiles) == 4, lines
    assert set(compiles.values()) == {"runs because code file hexbundle/formats/ctxbin.py "
                                      "changed"}, lines
    assert not any(t.startswith("inputs:") for t in lines), lines


def test_an_edited_output_and_a_missing_one_are_named(built):
    dlc = f"{BUILD}/dlc/prompt_ar128_cl256_3_of_4.dlc"
    (built.root / dlc).write_bytes((built.root / dlc).read_bytes() + b"x")
    (built.root / BUILD / "bin" / "qwen2_tiny_part_4_of_4.bin").unlink()
    lines = running(explained(built.doit("bundle", "--explain")))
    assert lines["convert:part_3_of_4_prompt"] == \
        f"runs because output {dlc} changed since it was built", lines
    assert lines["compile:part_4_of_4"].startswith(
        f"runs because target missing: {BUILD}/bin/qwen2_tiny_part_4_of_4.bin"), lines


def test_dry_run_gives_the_same_reasons_and_runs_nothing(built):
    run = built.doit("bundle", "--dry-run", "weights_packing=false")
    assert re.search(r"^\.   compile:part_1_of_4  \(compile\.weights_packing changed: true -> "
                     r"false\)$",
                     run.out, re.M), run.out
    assert running(explained(built.doit("bundle", "--explain"))) == {}   # nothing had run


# ---------------------------------------------------------------------------- in-process

def test_key_changes_name_nested_options_pins_toolchain_and_code_files():
    old = {"options": {"a": 0.5, "device": {"soc": 60}, "parts": [{"p": True}, {"p": True}]},
           "pins": {"x.data": "aa"}, "toolchain": {"version": "1"}, "code": "c1"}
    new = {"options": {"a": 0.25, "device": {"soc": 77}, "parts": [{"p": False}, {"p": False}]},
           "pins": {"x.data": "bb"}, "toolchain": {"version": "2"}, "code": "c2"}
    found = key_changes(stepkey.canonical(old), stepkey.canonical(new),
                        {"hexbundle/a.py": "1", "hexbundle/b.py": "2"},
                        {"hexbundle/a.py": "1", "hexbundle/b.py": "3", "hexbundle/c.py": "4"})
    assert found == ["code file hexbundle/b.py changed", "code file hexbundle/c.py is new to it",
                     "a changed: 0.5 -> 0.25", "device.soc changed: 60 -> 77",
                     "parts[*].p changed: true -> false",
                     "the pin of x.data changed: aa -> bb",
                     "the toolchain's version changed: 1 -> 2"]
    assert key_changes("Options(repr)", stepkey.canonical(new), {}, {}) == \
        ["its key was recorded by an older hexbundle"]


# ------------------------------------------------- what each step's key holds (derived, not listed)

def test_a_pin_reruns_the_convert_of_its_file_only(built):
    """Pins key the steps whose inputs they name: a new pin (the right digest) reruns that
    graph's convert; the DLC comes out the same, so compile (whose inputs no pin names) is
    up to date."""
    name = "prompt_ar128_cl256_2_of_4.onnx"
    digest = bytes_digest((built.root / "build/qwen2-tiny/inputs" / name).read_bytes())
    model = built.root / "configs" / "models" / "qwen2-tiny.toml"
    model.write_text(model.read_text().replace(
        "seed = 0\n", f'seed = 0\n\n[inputs.pins]\n"{name}" = "xxh3_128:{digest}"\n'))
    lines = running(explained(built.doit("bundle", "--explain")))
    # bundle reads the config files themselves (the manifest records them)
    assert lines.pop("bundle").startswith(
        "runs because configs/models/qwen2-tiny.toml changed (digest "), lines
    assert lines == {"convert:part_2_of_4_prompt":
                     f"runs because the pin of {name} is new: xxh3_128:{digest}"}, lines


def test_the_backend_and_its_version_are_in_every_backend_steps_key(base):
    """convert, compile and bundle run through the backend: their keys hold its name and
    version (bundle's used to leave the name out); the others' do not."""
    import json
    db = json.loads((base.doit_db()).read_text())
    keys = {t: stepkey.plain(stepkey.loads(v["_values_:"]["_step_key"]))
            for t, v in db.items() if "_step_key" in v.get("_values_:", {})}
    assert {t.split(":")[0] for t in keys} >= {"convert", "compile", "bundle"}, sorted(keys)
    for task, doc in keys.items():
        if task.startswith("inputs:"):
            assert "toolchain" not in doc, task   # numpy and onnx: not a backend
            continue
        assert doc["toolchain"]["backend"] == "reference", task
        assert doc["toolchain"]["version"].startswith("hexbundle-reference"), task
        assert doc["step"] == task.split(":")[0]


def test_a_change_at_one_index_keeps_its_index():
    old = {"options": {"parts": [{"p": True}, {"p": True}]}}
    new = {"options": {"parts": [{"p": False}, {"p": True}]}}
    assert key_changes(stepkey.canonical(old), stepkey.canonical(new), {}, {}) == \
        ["parts[0].p changed: true -> false"]
