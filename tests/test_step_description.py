"""A step sees only what its key covers (issue 51): it receives its description
(steps/description.py: its input and output paths, arguments and typed options) and nothing
else, so a remote worker that holds only the declared inputs and the code writes the same bytes.

Every build step (inputs: a generated part and the tokenizer; convert; compile; bundle) is run as
a worker runs it: its declared inputs copied into a fresh input root laid out as its description
says, the code beside them, the build moved away, `python scripts/step.py <spec>` run there; its
outputs must be byte-identical to the normal build's (test_split_step_description: the local
split's inputs step). A step that reads a file its description does not declare fails here (shown
with a description that leaves one out). The fields a step reads are those of its options type:
read through a recorder, and a description without one of them is refused in one line. The
`check` step a cache hit's downloads get (graph.remote_steps.check_description) runs as a worker
runs it with only its declared inputs, under both remote_cache_trust settings."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import copy_project, step_descriptions, unsplit_only_tree
from hexbundle.config import resolved
from hexbundle.steps import runner
from hexbundle.steps.description import from_json

# One task of each build step (qwen2-tiny, plan four): a part's and the tokenizer's inputs, a
# convert and the compile it feeds, the bundle.
TASKS = {"inputs": "inputs:part_2_of_4", "tokenizer": "inputs:tokenizer",
         "convert": "convert:part_2_of_4_prompt", "compile": "compile:part_2_of_4",
         "bundle": "bundle"}
CODE = ("hexbundle", "scripts")


@pytest.fixture(scope="module")
def described(built) -> dict:
    """Task name -> the description dodo.py gives the step, as the build ran it."""
    return step_descriptions(built.root)


def test_every_build_step_is_described(described):
    """Every task that runs the step runner gets a description (no config, no Layout): the
    steps here are all of them."""
    steps = {d["step"] for d in described.values()}
    assert steps == {"inputs", "convert", "compile", "bundle"}, steps
    assert set(TASKS.values()) <= set(described)


def paths_of(description: dict, side: str) -> list:
    return [Path(path[resolved.PATH]) for _, path in description[side]]


def relocated(description: dict, project: Path, root: Path) -> dict:
    """The description with each path moved from the project into `root` (as the remote
    Action relocates it into its input root); a path outside the project (an export used in
    place) under root/outside."""
    def inside(path: Path) -> Path:
        if path.is_relative_to(project):
            return root / path.relative_to(project)
        return root / "outside" / path.relative_to(path.anchor)

    def move(pairs):
        return [[role, {resolved.PATH: str(inside(Path(p[resolved.PATH])))}]
                for role, p in pairs]
    return {**description, "inputs": move(description["inputs"]),
            "outputs": move(description["outputs"])}


def run_as_worker(project, description: dict, root: Path) -> dict:
    """Run the step in a fresh input root `root` holding the code and its declared inputs
    alone, with the project's build moved away; its outputs' bytes by project path. Fails
    (AssertionError, with the step's log) when the step fails."""
    for name in CODE:
        shutil.copytree(project.root / name, root / name)
    moved = relocated(description, project.root, root)
    for source, dest in zip(paths_of(description, "inputs"), paths_of(moved, "inputs")):
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
    spec = {"step": description["step"], "description": moved}
    away = project.root / "build.away"
    (project.root / "build").rename(away)   # nothing of the build is there to read
    try:
        proc = subprocess.run([sys.executable, "scripts/step.py", json.dumps(spec)], cwd=root,
                              capture_output=True, text=True, timeout=300)
    finally:
        away.rename(project.root / "build")
    assert proc.returncode == 0, f"the step failed as a worker runs it:\n{proc.stdout}{proc.stderr}"
    return {original: dest.read_bytes() for original, dest
            in zip(paths_of(description, "outputs"), paths_of(moved, "outputs"))}


@pytest.mark.parametrize("step", sorted(TASKS))
def test_a_step_with_only_its_declared_inputs_writes_the_same_bytes(built, described, step,
                                                                    tmp_path):
    description = described[TASKS[step]]
    assert description["step"] == TASKS[step].split(":")[0]
    outputs = run_as_worker(built, description, tmp_path / "worker")
    assert outputs, "the step declares no output"
    for path, data in outputs.items():
        assert data == path.read_bytes(), f"{path.name} differs from the normal build's"


def test_a_step_that_reads_an_undeclared_file_fails_here(built, described, tmp_path):
    """The check can fail: the convert's description without its data file (which its ONNX
    records, so the step reads it all the same) is a step reading an undeclared file."""
    description = described[TASKS["convert"]]
    hidden = {**description, "inputs": [pair for pair in description["inputs"]
                                        if pair[0] != "data"]}
    with pytest.raises(AssertionError, match="the step failed as a worker runs it") as failed:
        run_as_worker(built, hidden, tmp_path / "worker")
    assert "part_2_of_4.data" in str(failed.value)   # the file it read without declaring it


class Recorder:
    """An options value whose fields' reads are recorded; reading anything else fails."""

    def __init__(self, value, read: set):
        self._value, self._read = value, read

    def __getattr__(self, name):
        fields = {f.name for f in dataclasses.fields(self._value)}
        assert name in fields, f"the step reads {name!r}, not a field of " \
                               f"{type(self._value).__name__}"
        self._read.add(name)
        return getattr(self._value, name)


# Fields a step reads only when it refuses its inputs (compile names the graphs' source files)
# or for another backend (the bundle: the qairt runtime's mode and board OS).
READ_ON_REFUSAL = {"compile": {"graph_sources"}, "bundle": {"runtime", "target"}}


@pytest.mark.parametrize("step", sorted(TASKS))
def test_every_field_the_step_reads_is_in_its_options_type(built, described, step, tmp_path):
    description = described[TASKS[step]]
    root = tmp_path / "worker"
    moved = from_json(relocated(description, built.root, root))
    for source, (_, dest) in zip(paths_of(description, "inputs"), moved.inputs):
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
    read = set()
    recorded = dataclasses.replace(moved, options=Recorder(moved.options, read))
    lines = []
    runner.DESCRIBED[moved.step](recorded, lines.append)
    declared = {f.name for f in dataclasses.fields(moved.options)}
    assert read == declared - READ_ON_REFUSAL.get(step, set()), \
        f"fields declared but never read (a key wider than the step): {declared - read}"


@pytest.mark.parametrize("step", sorted(TASKS))
def test_a_description_whose_options_lack_a_field_is_refused_in_one_line(described, step):
    description = described[TASKS[step]]
    for name in [k for k in description["options"] if k != resolved.TYPE]:
        options = {k: v for k, v in description["options"].items() if k != name}
        lines = []
        code = runner.run({"step": description["step"],
                           "description": {**description, "options": options}}, lines.append)
        assert code == 1, lines
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
        assert "Traceback" not in lines[0] and name in lines[0], lines


@pytest.mark.parametrize("trust", ["trusted", "verify"])
@pytest.mark.parametrize("step", ["compile", "convert"])
def test_the_check_of_a_fetched_output_needs_only_its_declared_inputs(built, described, step,
                                                                      trust, tmp_path):
    """The `check` step (steps/check.py), described by graph.remote_steps.check_description:
    a cache hit's download (here the normal build's own output) passes its checks as a worker
    runs them, with only the download and the inputs its description declares (under verify,
    a compile's graphs' ONNX and encodings too)."""
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.graph.remote_steps import check_description
    cfg = load_build(built.root)
    layout = Layout(dataclasses.replace(cfg, remote=dataclasses.replace(cfg.remote,
                                                                        cache_trust=trust)))
    checked = described[TASKS[step]]
    target = paths_of(checked, "outputs")[0]
    fetched = target.with_name(".fetched.tmp")
    shutil.copyfile(target, fetched)
    try:
        check = check_description(layout, checked, {target: fetched})
        assert run_as_worker(built, check, tmp_path / "worker") == {}   # it writes nothing
    finally:
        fetched.unlink()


@pytest.mark.heavy
def test_the_local_split_with_only_its_declared_inputs_writes_the_same_bytes(tmp_path):
    """The inputs step of an export split locally (inputs/split.py): its description declares
    the unsplit graphs' files; run as a worker runs it, with them alone (the export moved
    away too), it writes the same part files; every field it reads is in SplitOptions."""
    project = copy_project(tmp_path / "proj")
    export = unsplit_only_tree(tmp_path / "export")
    project.doit("import_export", "--dir", str(export), "--name", "mine", "--plan", "0,3,3,3")
    project.doit("inputs", "model=mine")
    description = step_descriptions(project.root, ("inputs",), ("model=mine",))[
        "inputs:part_2_of_4"]
    assert {role for role, _ in description["inputs"]} >= {"onnx:prompt", "onnx:token", "data"}
    away = tmp_path / "export.away"
    export.rename(away)
    try:
        for source in paths_of(description, "inputs"):   # the worker's copies come from here
            assert not source.exists()
        moved = {**description, "inputs": [[r, {resolved.PATH: str(away / Path(
            p[resolved.PATH]).relative_to(export))}] for r, p in description["inputs"]]}
        outputs = run_as_worker(project, moved, tmp_path / "worker")
    finally:
        away.rename(export)
    assert len(outputs) == len(description["outputs"])
    for path, data in outputs.items():
        assert data == path.read_bytes(), f"{path.name} differs from the normal build's"
    read, root = set(), tmp_path / "recorded"
    moved = from_json(relocated(description, project.root, root))
    for source, (_, dest) in zip(paths_of(description, "inputs"), moved.inputs):
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
    runner.DESCRIBED["inputs"](dataclasses.replace(moved, options=Recorder(moved.options, read)),
                               lambda line: None)
    declared = {f.name for f in dataclasses.fields(moved.options)}
    assert read == declared, f"fields declared but never read: {declared - read}"
