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
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROJECT_FILES, copy_project, step_descriptions, unsplit_only_tree
from hexbundle.config import resolved
from hexbundle.steps import runner
from hexbundle.steps.description import from_json

# One task of each build step (qwen2-tiny, plan four): a part's and the tokenizer's inputs, a
# convert and the compile it feeds, the bundle.
TASKS = {"inputs": "inputs:part_2_of_4", "tokenizer": "inputs:tokenizer",
         "convert": "convert:part_2_of_4_prompt", "compile": "compile:part_2_of_4",
         "bundle": "bundle"}
CODE = ("hexbundle", "scripts")
# A worker's toolchain, as the toolchain image holds it, beside the code: qairt's SDK and the
# pin it is checked against (backends/qairt.py refuses any other SDK before using it); the
# ortqnn compiler kit's pins (requirements/ortqnn.txt: the backend's version, which the
# toolchain key and the manifest name). Not the runtime's files: those are declared inputs.
QAIRT_PIN = ("configs/toolchain.toml",)
ORTQNN_PIN = ("requirements/ortqnn.txt",)


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


def run_as_worker(project, description: dict, root: Path, toolchain=None,
                  toolchain_files=()) -> dict:
    """Run the step in a fresh input root `root` holding the code and its declared inputs
    alone, with the project's build moved away; its outputs' bytes by project path. Fails
    (AssertionError, with the step's log) when the step fails. The worker's toolchain, if the
    step runs through one: `toolchain` the environment naming it (a qairt step's SDK),
    `toolchain_files` the project files that pin it (QAIRT_PIN, ORTQNN_PIN)."""
    for name in CODE + tuple(toolchain_files):
        source = project.root / name
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, root / name)
    moved = relocated(description, project.root, root)
    for source, dest in zip(paths_of(description, "inputs"), paths_of(moved, "inputs")):
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
    spec = {"step": description["step"], "description": moved}
    away = project.root / "build.away"
    (project.root / "build").rename(away)   # nothing of the build is there to read
    try:
        proc = subprocess.run([sys.executable, "scripts/step.py", json.dumps(spec)], cwd=root,
                              capture_output=True, text=True, timeout=300,
                              env={**worker_env(), **(toolchain or {})})
    finally:
        away.rename(project.root / "build")
    assert proc.returncode == 0, f"the step failed as a worker runs it:\n{proc.stdout}{proc.stderr}"
    return {original: dest.read_bytes() for original, dest
            in zip(paths_of(description, "outputs"), paths_of(moved, "outputs"))}


def worker_env() -> dict:
    """The environment a worker runs a step in: no variable that points a step at files of this
    machine (the ortqnn wheelhouse, an SDK root): what it reads must come from its inputs."""
    return {k: v for k, v in os.environ.items() if k not in MACHINE_PATHS}


MACHINE_PATHS = ("HEXBUNDLE_ORTQNN_WHEELHOUSE", "QAIRT_SDK_ROOT", "QNN_SDK_ROOT")


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


# ---------------------------------------------------- the bundle step's runtime files (ortqnn)

@pytest.fixture(scope="module")
def ortqnn_built(tmp_path_factory):
    """`doit bundle backend=ortqnn` (the real compiler, under Wine), and the bundle step's
    description as that build ran it."""
    from test_ortqnn import require_kit
    env = require_kit()
    project = copy_project(tmp_path_factory.mktemp("ortqnn") / "proj",
                           (*PROJECT_FILES, "requirements"))
    project.doit("bundle", "backend=ortqnn", env=env, timeout=1800)   # Wine compiles: slow
    return project, env, step_descriptions(project.root, ("bundle",), ("backend=ortqnn",),
                                           env=env)["bundle"]


def runtime_inputs(description: dict) -> list:
    return [Path(p[resolved.PATH]) for role, p in description["inputs"]
            if role.startswith("runtime")]


def assert_same_bundle_with_runtime(outputs: dict) -> None:
    """A worker's bundle (output path -> the bytes the worker wrote) carries the runtime and
    equals the normal build's, file by file."""
    assert any(p.name == "libGenie.so" for p in outputs), sorted(p.name for p in outputs)
    for path, data in outputs.items():
        assert data == path.read_bytes(), f"{path.name} differs from the normal build's"


@pytest.mark.heavy
def test_the_ortqnn_bundle_with_only_its_declared_inputs_writes_the_same_bytes(ortqnn_built,
                                                                               tmp_path):
    """The ortqnn bundle step reads the pinned runtime wheel of the board's OS: a declared input
    (role "runtime"), so a worker holding its inputs alone (no wheelhouse, no
    HEXBUNDLE_ORTQNN_WHEELHOUSE, no requirements/ in its root) writes the same bundle."""
    project, _, description = ortqnn_built
    wheels = [p for p in runtime_inputs(description) if p.suffix == ".whl"]
    assert [w.name for w in wheels] == \
        ["onnxruntime_qnn-2.7.0-cp312-cp312-manylinux_2_34_aarch64.whl"], description["inputs"]
    outputs = run_as_worker(project, description, tmp_path / "worker",
                            toolchain_files=ORTQNN_PIN)
    assert_same_bundle_with_runtime(outputs)


@pytest.mark.heavy
def test_the_ortqnn_bundle_reads_every_field_of_its_options(ortqnn_built, tmp_path):
    """With backend=ortqnn the bundle step reads all of BundleOptions (the runtime's mode and
    board OS too), and the wheel it reads is the declared one."""
    project, _, description = ortqnn_built
    root = tmp_path / "worker"
    moved = from_json(relocated(description, project.root, root))
    for source, (_, dest) in zip(paths_of(description, "inputs"), moved.inputs):
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
    read, lines = set(), []
    recorded = dataclasses.replace(moved, options=Recorder(moved.options, read))
    runner.DESCRIBED["bundle"](recorded, lines.append)
    assert read == {f.name for f in dataclasses.fields(moved.options)}
    assert any("file(s) from onnxruntime_qnn-2.7.0" in line for line in lines), lines


@pytest.mark.heavy
def test_the_ortqnn_bundle_without_its_wheel_names_it_and_the_command(ortqnn_built, tmp_path):
    """A description whose runtime wheel is not there: one line naming the wheel and
    `doit ortqnn_kit`, no traceback."""
    _, _, description = ortqnn_built
    wheel = [p for p in runtime_inputs(description) if p.suffix == ".whl"][0]
    gone = {**description, "inputs": [
        [r, {resolved.PATH: str(tmp_path / wheel.name)} if Path(p[resolved.PATH]) == wheel
         else p] for r, p in description["inputs"]]}
    lines = []
    assert runner.run({"step": "bundle", "description": gone}, lines.append) == 1
    text = "\n".join(lines)
    assert wheel.name in text and "doit ortqnn_kit" in text and "Traceback" not in text, text


@pytest.mark.heavy
def test_a_changed_runtime_wheel_reruns_the_bundle_step_alone(ortqnn_built, tmp_path):
    """Both directions: an unchanged run is up to date; the runtime wheel's bytes changed (a
    copy in another wheelhouse, one byte of its zip comment added) rerun the bundle step and
    nothing else -- which then refuses the wheel, whose sha256 the pins do not list."""
    project, env, _ = ortqnn_built
    again = project.doit("bundle", "backend=ortqnn", env=env)
    assert again.executed == set(), again.out
    house = tmp_path / "wheelhouse"
    house.mkdir()
    source = Path(env["HEXBUNDLE_ORTQNN_WHEELHOUSE"])
    for wheel in source.glob("*.whl"):
        os.symlink(wheel.resolve(), house / wheel.name)
    name = "onnxruntime_qnn-2.7.0-cp312-cp312-manylinux_2_34_aarch64.whl"
    (house / name).unlink()
    shutil.copyfile(source / name, house / name)
    same = project.doit("bundle", "backend=ortqnn",
                        env={**env, "HEXBUNDLE_ORTQNN_WHEELHOUSE": str(house)})
    assert same.executed == {"bundle"}, same.out   # another path: another input
    with open(house / name, "ab") as fh:
        fh.write(b"\0")
    changed = project.doit("bundle", "backend=ortqnn",
                           env={**env, "HEXBUNDLE_ORTQNN_WHEELHOUSE": str(house)}, check=False)
    assert changed.executed == {"bundle"}, changed.out
    assert changed.code != 0 and name in changed.out + changed.err, changed.out
    assert "Traceback" not in changed.out + changed.err
    back = project.doit("bundle", "backend=ortqnn", env=env)
    assert back.executed == {"bundle"}, back.out


# ------------------------------------------- the bundle step's runtime files (qairt, local SDK)

@pytest.fixture(scope="module")
def qairt_built(tmp_path_factory):
    """`doit bundle backend=qairt` with the stand-in SDK (tests/standin_runtime.py: its runtime
    files real binaries built here), executor=local; the bundle step's description."""
    from standin_runtime import bin_sizes, build_runtime
    tmp = tmp_path_factory.mktemp("qairt")
    sdk = build_runtime(tmp / "sdk", tmp / "work")
    project = copy_project(tmp / "proj")
    project.doit("inputs")
    env = {"QAIRT_SDK_ROOT": str(sdk), "STANDIN_QAIRT_MODE": "ok",
           "STANDIN_QAIRT_BIN_BYTES": json.dumps(bin_sizes(project, "iq9075"))}
    project.doit("bundle", "backend=qairt", env=env)
    return project, env, step_descriptions(project.root, ("bundle",), ("backend=qairt",),
                                           env=env)["bundle"]


def toolchain_only(sdk: Path, dest: Path) -> Path:
    """The SDK without any file the bundle step may declare (every board's runtime files, the
    Genie header): what a worker's toolchain holds (its Python API, sdk.yaml,
    qnn-context-binary-utility)."""
    from hexbundle.backends.qairt_runtime import GENIE_HEADER
    from hexbundle.config.runtime_files import ANDROID, LINUX, WINDOWS, runtime_files
    shutil.copytree(sdk, dest, symlinks=True)
    for rel in {f.sdk_path for t in (ANDROID, LINUX, WINDOWS) for f in runtime_files(t, "v73")}:
        (dest / rel).unlink(missing_ok=True)
    (dest / GENIE_HEADER).unlink()
    return dest


@pytest.mark.heavy
def test_the_local_qairt_bundle_takes_its_runtime_from_its_declared_inputs(qairt_built,
                                                                          tmp_path):
    """The SDK's runtime files, sdk.yaml and Genie header are declared inputs: a worker whose
    SDK has none of them (its toolchain alone) writes the same bundle from its input root."""
    project, env, description = qairt_built
    declared = {role for role, _ in description["inputs"]}
    assert {"runtime", "runtime-release", "runtime-genie"} <= declared, declared
    sdk = toolchain_only(Path(env["QAIRT_SDK_ROOT"]), tmp_path / "toolchain")
    outputs = run_as_worker(project, description, tmp_path / "worker",
                            toolchain={**env, "QAIRT_SDK_ROOT": str(sdk)},
                            toolchain_files=QAIRT_PIN)
    assert_same_bundle_with_runtime(outputs)


@pytest.mark.heavy
def test_the_local_qairt_bundle_without_a_declared_runtime_file_fails(qairt_built, tmp_path):
    """The check can fail: the description without its libGenie.so is refused by the step,
    naming the file, though the worker's toolchain SDK still has every file."""
    project, env, description = qairt_built
    hidden = {**description, "inputs": [pair for pair in description["inputs"]
                                        if not pair[1][resolved.PATH].endswith("/libGenie.so")]}
    assert len(hidden["inputs"]) == len(description["inputs"]) - 1
    with pytest.raises(AssertionError, match="the step failed as a worker runs it") as failed:
        run_as_worker(project, hidden, tmp_path / "worker", toolchain=env,
                      toolchain_files=QAIRT_PIN)
    assert "libGenie.so: missing from the SDK root" in str(failed.value)
    assert "Traceback" not in str(failed.value)


@pytest.mark.heavy
def test_doit_bundle_without_the_runtime_wheel_names_it_and_the_command(ortqnn_built, tmp_path):
    """A wheelhouse without the board's runtime wheel (the compiler's kit there): no wheel is
    declared, and the bundle step alone runs and stops in one error naming the wheel and
    `doit ortqnn_kit`; the previous bundle stays."""
    project, env, _ = ortqnn_built
    house = tmp_path / "wheelhouse"
    house.mkdir()
    for wheel in Path(env["HEXBUNDLE_ORTQNN_WHEELHOUSE"]).glob("*.whl"):
        if "aarch64" not in wheel.name:
            os.symlink(wheel.resolve(), house / wheel.name)
    manifest = project.bundle(backend="ortqnn") / "manifest.json"
    kept = manifest.read_bytes()
    run = project.doit("bundle", "backend=ortqnn",
                       env={**env, "HEXBUNDLE_ORTQNN_WHEELHOUSE": str(house)}, check=False)
    text = run.out + run.err
    assert run.code != 0 and run.executed == {"bundle"}, text
    assert "no onnxruntime_qnn-2.7.0 manylinux_2_34_aarch64 wheel" in text, text
    assert "doit ortqnn_kit" in text and "Traceback" not in text, text
    assert manifest.read_bytes() == kept
    project.doit("bundle", "backend=ortqnn", env=env)   # as it was, for the module's others
