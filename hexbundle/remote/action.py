"""A build step as a REAPI Action: its Command, its input root, its platform; the Action's digest
is the step's key in a remote cache.

Nothing in an Action may depend on where the project or the build root is, or two machines would
never share a result: every path in it is a *remote path*, relative to an imaginary input root
that holds the project (`configs/...`, `hexbundle/...`), the build root as `build/`, and an export
used in place outside the project as `export/`.

  Command    arguments: the step, its own arguments (part, graph) and its step key's document
             (graph.stepdesc: typed options, code, pins, toolchain) as the step key's canonical
             typed JSON (formats.stepkey, docs/step-key.md); the environment variables that change what a step
             writes, sorted; output_paths: the task's targets, sorted.
  input root the Merkle tree of the task's file_dep and of the code that runs the step (the
             hexbundle package but the layers above steps/, and scripts/step.py): a changed
             input file or a changed line of that code is another input root, another Action.
  platform   OSFamily and ISA as the REAPI platform lexicon spells them (linux, x86-64 /
             arm-a64), the executor; with executor=docker the toolchain image as
             container-image (docker://sha256:...), as remote-execution workers expect it; with
             the local executor the Python, numpy and onnx the step computes with.

Remote execution's Action (exec_action) is another: its Command runs scripts/step.py with the
interpreter named by its absolute path (remote_python, else this process's: exec_python) and a
PATH of its own (exec_environment), because a worker that follows the contract gives a Command
exactly its environment variables and nothing of its own.

File digests come from the digest cache (hexbundle.support.hashing: SHA-256 beside the XXH3, one
read of the bytes gives both). The Command, the Action and the Directory messages are blobs of
their own, held in memory (a few KB).
"""
from __future__ import annotations

import functools
import os
import platform as host_platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import hexbundle
from hexbundle.config.layout import Layout
from hexbundle.formats import stepkey
from hexbundle.remote import reapi
from hexbundle.support import hashing
from hexbundle.support.errors import HexbundleError

# Set on the host, these change what a step writes (the docker executor passes them into the
# container for that reason): they are part of the Command.
STEP_ENVIRONMENT = ("SOURCE_DATE_EPOCH",)
PROGRAM = "hexbundle-step"   # Command.arguments[0]: scripts/step.py, as remote execution runs it
STEP_SCRIPT = "scripts/step.py"


class ActionError(HexbundleError):
    """A step cannot be described as an Action (an input outside every known root)."""


@dataclass
class StepAction:
    """One step's Action and what goes with it."""

    digest: object                       # the Action's Digest: the cache key
    command: object                      # reapi.Command
    action: object                       # reapi.Action
    blobs: dict                          # (hash, size) -> bytes: Command, Action, Directories
    outputs: dict                        # remote path -> local Path, the step's targets
    inputs: dict = field(default_factory=dict)   # remote path -> local Path
    files: dict = field(default_factory=dict)    # (hash, size) -> local Path: every file of
                                                 # the input root (remote execution uploads them)

    @property
    def key(self) -> str:
        return reapi.digest_text(self.digest)


def remote_path(layout: Layout, path) -> str:
    """A file's path in the input root: the same on every machine for the same file."""
    path = Path(layout.root, path).resolve()
    for base, prefix in ((layout.build_root, "build"), (layout.root, ""),
                         (layout.cfg.export_dir, "export")):
        if base is None:
            continue
        try:
            rel = path.relative_to(Path(base).resolve()).as_posix()
        except ValueError:
            continue
        return f"{prefix}/{rel}" if prefix else rel
    # Elsewhere on this machine: its absolute path names it (machines share it only if they
    # keep the file at the same place).
    return "external" + path.as_posix()


def canonical_json(value) -> str:
    """The step key's canonical typed JSON (formats.stepkey, docs/step-key.md); a path in it
    is refused: machines with the file elsewhere would never share the Action."""
    try:
        return stepkey.canonical(value)
    except stepkey.StepKeyError as exc:
        raise ActionError(f"an option of the step cannot enter the Action: {exc}") from None


def command(step: str, arguments: dict, options: dict, output_paths: list):
    env = sorted((k, os.environ[k]) for k in STEP_ENVIRONMENT if k in os.environ)
    args = [PROGRAM, step] + [f"--{k}={v}" for k, v in sorted(arguments.items())]
    args.append(f"--options={canonical_json(options)}")
    return reapi.Command(
        arguments=args,
        environment_variables=[reapi.message(f"{reapi.REAPI}.Command.EnvironmentVariable")(
            name=k, value=v) for k, v in env],
        output_paths=sorted(output_paths))


# The REAPI platform lexicon's spellings (remote-apis, build/bazel/remote/execution/v2/
# platform.md): schedulers (BuildGrid, Buildbarn, BuildBuddy) match OSFamily and ISA by exact
# value against their workers', so Python's `Linux` / `x86_64` would be queued for ever.
OS_FAMILY = {"Linux": "linux", "Darwin": "macos", "Windows": "windows", "FreeBSD": "freebsd"}
ISA = {"x86_64": "x86-64", "AMD64": "x86-64", "amd64": "x86-64", "aarch64": "arm-a64",
       "arm64": "arm-a64", "i386": "x86-32", "i686": "x86-32", "ppc64le": "ppc64le",
       "riscv64": "riscv64"}


def lexicon_platform(system: str, machine: str) -> dict:
    """OSFamily and ISA as the lexicon spells them, from platform.system() and .machine();
    a value the lexicon does not name is passed on lower-cased."""
    return {"OSFamily": OS_FAMILY.get(system, system.lower()),
            "ISA": ISA.get(machine, machine.lower())}


def platform_properties(layout: Layout, image_id: str = "") -> list:
    """(name, value) pairs, sorted: what a result computed on this platform depends on."""
    cfg = layout.cfg
    props = {**lexicon_platform(host_platform.system(), host_platform.machine()),
             "executor": cfg.executor}
    if cfg.executor == "docker":
        props["container-image"] = f"docker://{image_id}" if image_id else "docker://(unknown)"
    else:
        props.update(_local_runtime())
    return sorted(props.items())


@functools.lru_cache(maxsize=1)
def _local_runtime() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": ".".join(host_platform.python_version_tuple()[:2])}
    for package in ("numpy", "onnx"):   # the reference backend computes with these
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "none"
    return out


# Packages a step never runs: the layers above steps/ (tests/test_architecture.py keeps steps/
# from importing them) and this client, which changes no step's output. Editing the benchmark
# or the doit glue does not invalidate every cached step.
NOT_STEP_CODE = ("release", "graph", "bench", "remote")


def code_files(layout: Layout) -> dict:
    """remote path -> local Path of the code a step runs: the modules of the hexbundle package
    this process runs (all but NOT_STEP_CODE), and the step script."""
    package = Path(hexbundle.__file__).resolve().parent
    files = {f"hexbundle/{p.relative_to(package).as_posix()}": p
             for p in sorted(package.rglob("*.py"))
             if "__pycache__" not in p.parts and p.relative_to(package).parts[0] not in NOT_STEP_CODE}
    script = layout.script("step.py")
    if script.is_file():
        files[STEP_SCRIPT] = script
    return files


def file_digest(path: Path):
    return reapi.Digest(hash=hashing.cached_sha256(path), size_bytes=path.stat().st_size)


def input_root(files: dict) -> tuple:
    """(root Digest, {(hash, size): Directory bytes}) of the Merkle tree of `files` (remote path
    -> local Path): one Directory per directory, entries sorted by name, as REAPI requires."""
    tree: dict = {}
    for rpath, local in files.items():
        *dirs, name = rpath.split("/")
        node = tree
        for d in dirs:
            node = node.setdefault(d, {})
            if not isinstance(node, dict):
                raise ActionError(f"{rpath}: a file and a directory of the same name in the "
                                  "input root")
        node[name] = file_digest(Path(local))
    blobs: dict = {}
    return _directory(tree, blobs), blobs


def _directory(node: dict, blobs: dict):
    msg = reapi.Directory()
    for name in sorted(node):
        entry = node[name]
        if isinstance(entry, dict):
            msg.directories.add(name=name, digest=_directory(entry, blobs))
        else:
            msg.files.add(name=name, digest=entry)
    data = reapi.encode(msg)
    digest = reapi.digest_of(data)
    blobs[reapi.digest_key(digest)] = data
    return digest


def step_action(layout: Layout, step: str, arguments: dict, options: dict, inputs: list,
                outputs: list, image_id: str = "") -> StepAction:
    """The Action of `step` (arguments: its own, e.g. part and graph; options: the exact option
    values its up-to-date check covers; inputs / outputs: local paths of its file_dep and
    targets)."""
    outs = {remote_path(layout, p): Path(layout.root, p) for p in outputs}
    ins = {remote_path(layout, p): Path(layout.root, p) for p in inputs}
    cmd = command(step, arguments, options, list(outs))
    act_digest, act, blobs = action_of(layout, cmd, {**code_files(layout), **ins}, image_id)
    return StepAction(act_digest, cmd, act, blobs, outs, ins)


def action_of(layout: Layout, cmd, tree: dict, image_id: str) -> tuple:
    """(digest, Action, blobs) of `cmd` run in the input root of `tree` (remote path -> local
    file) on this build's platform: the blobs hold the tree's, the Command's and the Action's."""
    root_digest, blobs = input_root(tree)
    cmd_bytes = reapi.encode(cmd)
    cmd_digest = reapi.digest_of(cmd_bytes)
    act = reapi.Action(command_digest=cmd_digest, input_root_digest=root_digest,
                       platform=reapi.Platform(properties=[
                           reapi.message(f"{reapi.REAPI}.Platform.Property")(name=k, value=v)
                           for k, v in platform_properties(layout, image_id)]))
    act_bytes = reapi.encode(act)
    act_digest = reapi.digest_of(act_bytes)
    blobs[reapi.digest_key(cmd_digest)] = cmd_bytes
    blobs[reapi.digest_key(act_digest)] = act_bytes
    return act_digest, act, blobs


# ------------------------------------------------------------------------ remote execution

# What a step sees of an environment on a worker, as in the toolchain container
# (steps/docker_executor.environment) less the host's paths. A worker that follows the REAPI
# contract (buildbox-run, bb-runner, BuildBuddy's executors) gives the Command exactly its
# environment_variables and nothing of its own: no PATH, no PYTHONPATH.
EXEC_ENVIRONMENT = {"HOME": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
                    "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
                    "PYTHONHASHSEED": "0", "HEXBUNDLE_BUILD_ROOT": "build"}
# The Command's PATH after the interpreter's own directory (executor = local): what a step that
# runs a tool by name finds (a venv's bin/ first, as an activated venv has it).
EXEC_SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
PATH_TAG = "@path"        # config.resolved's tag of a Path


def exec_python(layout: Layout) -> str:
    """The interpreter a worker runs scripts/step.py with, as the Command names it: remote_python
    (an absolute path on the workers); else with executor = docker the toolchain image's
    (found on the image's PATH: the image, pinned by digest in container-image, says which);
    else this process's own, by its absolute path (sys.executable, not resolved: a venv's
    python finds the venv's packages only by its own path). Never a bare `python3`: a worker
    that follows the contract has no PATH, and its system Python lacks numpy and onnx."""
    if layout.cfg.remote.python:
        return layout.cfg.remote.python
    if layout.cfg.executor == "docker":
        from hexbundle.toolchain.docker import IMAGE_PYTHON
        return IMAGE_PYTHON
    return os.path.abspath(sys.executable)


def exec_environment(layout: Layout, python: str) -> dict:
    """The Command's environment: EXEC_ENVIRONMENT, the host's STEP_ENVIRONMENT that is set,
    and with an interpreter named by its path a PATH of its directory and EXEC_SYSTEM_PATH (in
    the toolchain image the image's PATH stays: a docker worker keeps the image's environment
    under the Command's, and the image's PATH holds the SDK's tools)."""
    env = {**EXEC_ENVIRONMENT, **{k: os.environ[k] for k in STEP_ENVIRONMENT if k in os.environ}}
    if os.path.isabs(python):
        env["PATH"] = os.pathsep.join(dict.fromkeys((os.path.dirname(python),
                                                     *EXEC_SYSTEM_PATH)))
    return env


def relocate(data, layout: Layout):
    """A step spec (config.resolved's JSON) with every absolute path made a remote path: the
    spec runs in the worker's input root, which holds the project at `.` and the build root
    at `build/` (remote_path)."""
    if isinstance(data, dict):
        if set(data) == {PATH_TAG} and isinstance(data[PATH_TAG], str):
            path = data[PATH_TAG]
            return {PATH_TAG: remote_path(layout, path) or "."} if os.path.isabs(path) else data
        return {k: relocate(v, layout) for k, v in data.items()}
    if isinstance(data, list):
        return [relocate(v, layout) for v in data]
    return data


def exec_action(layout: Layout, spec: dict, inputs: list, outputs: list,
                image_id: str = "") -> StepAction:
    """The Action a worker runs: `<exec_python> scripts/step.py <spec>` in an input root that
    holds everything the step reads (its file_dep and the code), the spec relocated into it,
    with exec_environment; its output paths and platform as step_action's. (Not the cache's
    Action, whose Command names the step and its key without a path: a worker could not run
    that.)"""
    outs = {remote_path(layout, p): Path(layout.root, p) for p in outputs}
    ins = {remote_path(layout, p): Path(layout.root, p) for p in inputs}
    tree = {**code_files(layout), **ins}
    python = exec_python(layout)
    env = exec_environment(layout, python)
    spec_text = spec_json(relocate(spec, layout))
    cmd = reapi.Command(
        arguments=[python, STEP_SCRIPT, spec_text],
        environment_variables=[reapi.message(f"{reapi.REAPI}.Command.EnvironmentVariable")(
            name=k, value=v) for k, v in sorted(env.items())],
        output_paths=sorted(outs))
    act_digest, act, blobs = action_of(layout, cmd, tree, image_id)
    files = {reapi.digest_key(file_digest(local)): local for local in tree.values()}
    return StepAction(act_digest, cmd, act, blobs, outs, ins, files)


def spec_json(value) -> str:
    """Sorted, compact JSON: the same spec is the same Command bytes on every machine."""
    import json
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
