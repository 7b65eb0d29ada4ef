"""Shared fixtures: a throwaway copy of the project in which real `doit` runs in subprocesses."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT_FILES = ("dodo.py", "pyproject.toml", "configs", "scripts", "hexbundle", ".gitignore")


@dataclass
class DoitRun:
    code: int
    out: str
    err: str

    @property
    def executed(self) -> set:
        """Tasks doit ran: one line each when done, off a terminal ("[5/18] name ...", or
        "[5/18] FAILED name ..."; graph.reporter); an up-to-date one prints nothing."""
        return set(re.findall(r"^\[\d+/\d+\] (?:FAILED )?(\S+)", self.out, re.M))

    @property
    def up_to_date(self) -> int:
        """The summary line's count of steps up to date ("..., 18 up to date, 0.0 s")."""
        counts = re.findall(r"^hexbundle: .*[:;] .*?(\d+) up to date, ", self.out, re.M)
        assert len(counts) == 1, self.out
        return int(counts[0])


class Project:
    def __init__(self, root: Path):
        self.root = root

    def doit(self, *args, env=None, check=True, timeout=600) -> DoitRun:
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=self.root,
                              capture_output=True, text=True, env=full_env, timeout=timeout)
        run = DoitRun(proc.returncode, proc.stdout, proc.stderr)
        if check and run.code != 0:
            raise AssertionError(f"doit {' '.join(args)} exited {run.code}\n--- stdout\n"
                                 f"{run.out}\n--- stderr\n{run.err}")
        return run

    def build_dir(self, model="qwen2-tiny", device="iq9075", plan=None,
                  backend="reference") -> Path:
        """A variant's directory: build/<model>/<device>/<plan>/<backend> (plan: the model's
        default_plan unless given)."""
        return variant_dir(self.root / "build", self.root, model, device, plan, backend)

    def bundle(self, model="qwen2-tiny", device="iq9075", plan=None, backend="reference") -> Path:
        return self.build_dir(model, device, plan, backend) / "bundle"

    def manifest(self, model="qwen2-tiny", device="iq9075", plan=None,
                 backend="reference") -> dict:
        return json.loads((self.bundle(model, device, plan, backend) / "manifest.json")
                          .read_text())

    def doit_db(self, model="qwen2-tiny", device="iq9075", plan=None,
                backend="reference") -> Path:
        """A variant's dependency DB (build/.hexbundle/db/<model>/<device>/<plan>/<backend>)."""
        return variant_dir(self.root / "build" / ".hexbundle" / "db", self.root, model, device,
                           plan, backend) / "doit-db.json"

    def model_db(self, model="qwen2-tiny") -> Path:
        """The DB of a model's own steps (inputs:*), shared by its variants."""
        return self.root / "build" / ".hexbundle" / "db" / model / "doit-db.json"


def steps_run(text: str) -> set:
    """Tasks whose step was built in this doit run ("[5/18] <task> [backend/executor] 0.4s"
    lines; a fetched one says "fetched" instead), not the checks of a remote cache hit's
    downloads ("  ok <task>:cache-check [...]": a sub-step says its own line)."""
    return set(re.findall(r"^\[\d+/\d+\] (\S+) \[", text, re.M))


def default_plan(root: Path, model: str) -> str:
    with open(root / "configs" / "models" / f"{model}.toml", "rb") as fh:
        return tomllib.load(fh)["model"]["default_plan"]


def variant_dir(base: Path, root: Path, model="qwen2-tiny", device="iq9075", plan=None,
                backend="reference") -> Path:
    """<base>/<model>/<device>/<plan>/<backend>: where a variant's outputs (base: the build root)
    or its DB (base: build/.hexbundle/db) are."""
    return base / model / device / (plan or default_plan(root, model)) / backend


# Ctrl-C as a terminal delivers it, to every run a test starts: a shell running the suite as a
# background job (`pytest &`) starts it with SIGINT ignored, children would inherit that, and an
# interrupted run would never see the signal. Set here, in the test process, rather than in each
# child through Popen's preexec_fn: that forces fork() instead of vfork(), and a worker where gRPC
# is loaded (the remote-cache tests' servers and proxies) then loses about 3% of its children
# between fork and exec (SIGSEGV/SIGABRT in gRPC's fork handlers: 2 of 60 children of a process
# serving gRPC crashed with a preexec_fn, 0 of 60 without).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Where a user's own files live in a checkout: `doit import_export` writes configs/models/NAME.toml
# (exports/ and build/ are git-ignored). Only what git tracks is taken from there.
USER_STATE = ("configs",)


def project_files(names=PROJECT_FILES) -> list:
    """The checkout's own files under `names`, relative to ROOT: under configs/ those git tracks
    (staged ones included), so a user's imported models never reach a test; elsewhere also the
    new files git does not ignore (a module being written). Outside a git checkout: every file
    but bytecode."""
    def listed(paths, *extra):
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", *extra, "--", *paths],
                             capture_output=True, check=True).stdout
        return [rel for rel in out.decode().split("\0") if rel]
    try:
        state = [n for n in names if n in USER_STATE]
        code = [n for n in names if n not in USER_STATE]
        rels = (listed(state) if state else []) + \
            (listed(code, "--cached", "--others", "--exclude-standard") if code else [])
    except (OSError, subprocess.CalledProcessError):
        return sorted(p.relative_to(ROOT) for name in names for p in
                      ([ROOT / name] if (ROOT / name).is_file() else (ROOT / name).rglob("*"))
                      if p.is_file() and "__pycache__" not in p.parts)
    return sorted({Path(rel) for rel in rels if (ROOT / rel).is_file()})


def copy_project(dest: Path, names=PROJECT_FILES) -> Project:
    """The project's own files (project_files) copied to `dest`: a checkout with no user state."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in project_files(names):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return Project(dest)


def _pristine_configs() -> Path:
    """A private copy of the project's own configs/ for in-process config loading (load_build,
    load_model): what the tests judge is the shipped configuration, not a user's build.toml or
    imported models. Made once per test process, removed at its exit."""
    import atexit
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="hexbundle-configs-"))
    atexit.register(shutil.rmtree, base, True)
    copy_project(base, ("configs",))
    return base


# Pass CONFIGS where a test loads the shipped configuration: load_build(CONFIGS, ...).
CONFIGS = _pristine_configs()


def embedded_models() -> list:
    """The model configs the project ships (configs/models/*.toml in CONFIGS), by name."""
    return sorted(p.stem for p in (CONFIGS / "configs" / "models").glob("*.toml"))


def tree_digests(root: Path) -> dict:
    """Every file under `root` (recursive) by relative path, with its digest."""
    from hexbundle.support.hashing import file_digest
    return {str(p.relative_to(root)): file_digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


def snapshot(directory: Path) -> dict:
    """Every file of a directory (not recursive) by name, with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def unsplit_only_tree(dest: Path) -> Path:
    """A qai-hub-models 0.53-0.55 tree whose export stopped before splitting: the unsplit graphs
    of tests/data/qaihm/export (Qualcomm-made) alone, and its tokenizer.json."""
    export, slug = ROOT / "tests" / "data" / "qaihm" / "export", "qwen2_5_7b_instruct"
    for ar in (128, 1):
        d = dest / f"ar{ar}_cl256"
        d.mkdir(parents=True)
        for suffix in (".onnx", ".data", ".encodings"):
            shutil.copy(export / f"ar{ar}_cl256" / f"{slug}{suffix}", d)
    shutil.copy(export / "tokenizer.json", dest)
    return dest


def drop_encoding(path: Path, name: str) -> None:
    """Remove weight `name`'s entry from an AIMET encodings file (a weight left unencoded)."""
    data = json.loads(path.read_text())
    data["param_encodings"] = [e for e in data["param_encodings"] if e["name"] != name]
    path.write_text(json.dumps(data))


def tiny_as_export(dest: Path, name: str) -> Project:
    """A project with qwen2-tiny's inputs as a user export (exports/qwen2-tiny/) under model
    `name`, built once; `good` is its bundle's snapshot."""
    proj = copy_project(dest)
    proj.doit("inputs")
    models = proj.root / "configs" / "models"
    text = (models / "qwen2-tiny.toml").read_text()
    text = text.replace('name = "qwen2-tiny"', f'name = "{name}"')
    text = re.sub(r'source = "generated"\n(seed = \d+\n)?',
                  'source = "export"\ndir = "exports/qwen2-tiny"\n', text)
    (models / f"{name}.toml").write_text(text)
    shutil.copytree(proj.root / "build" / "qwen2-tiny" / "inputs", proj.root / "exports" / "qwen2-tiny")
    proj.doit("bundle", f"model={name}")
    proj.good = snapshot(proj.bundle(name))
    return proj


WAIT_S = 120   # upper bound for a held run to reach its pause point (a safety net, not a timing)


class Held:
    """A `doit` run in the background, output to files (no pipe can fill up and block it)."""

    def __init__(self, project, args, env=None, pause_at=None, tmp=None):
        self.dir = Path(tmp)
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(env or {})}
        if pause_at:
            env.update(HEXBUNDLE_TEST_PAUSE_AT=pause_at, HEXBUNDLE_TEST_PAUSE_DIR=str(self.dir))
        self.out_path, self.err_path = self.dir / "out.txt", self.dir / "err.txt"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "doit", *args], cwd=project.root,
                                         stdout=out, stderr=err, env=env)

    def text(self) -> str:
        return self.out_path.read_text() + self.err_path.read_text()

    def wait_for(self, predicate, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not predicate():
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended (exit {self.proc.returncode}) before {what}:"
                                     f"\n{self.text()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"no {what} after {WAIT_S}s:\n{self.text()}")
            time.sleep(0.05)

    def wait_paused(self) -> None:
        self.wait_for(lambda: (self.dir / "paused").exists(), "pause point")

    def release(self) -> None:
        (self.dir / "release").touch()

    def finish(self) -> DoitRun:
        self.proc.wait(timeout=WAIT_S)
        return DoitRun(self.proc.returncode, self.out_path.read_text(), self.err_path.read_text())


@pytest.fixture
def project(tmp_path) -> Project:
    return copy_project(tmp_path / "proj")


LIST_DESCRIPTIONS = """
import json, sys
import dodo   # the key=value arguments are its settings (graph.session reads sys.argv)
found = {}
for creator in [a for a in sys.argv[1:] if "=" not in a]:
    made = getattr(dodo, "task_" + creator)()
    for task in [made] if isinstance(made, dict) else made:
        for fn, args, _ in [a for a in task["actions"] if isinstance(a, tuple)]:
            if fn.__name__ == "_run_step":   # graph.actions.step_action's
                made = args[5]() if callable(args[5]) else args[5]
                found[args[2]] = made        # task name -> its description
print(json.dumps(found))
"""


def step_descriptions(root: Path, creators=("inputs", "convert", "compile", "bundle"),
                      settings=(), env=None) -> dict:
    """Task name -> the description (steps.description's JSON) dodo.py gives each build step
    of the project at `root` (graph.stepdesc.description), as a build there with `settings`
    (key=value) runs it."""
    proc = subprocess.run([sys.executable, "-c", LIST_DESCRIPTIONS, *settings, *creators],
                          cwd=root, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, check=True, timeout=300)
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Project:
    """One fresh `doit bundle` of the default model, shared by read-only tests of a module."""
    proj = copy_project(tmp_path_factory.mktemp("built") / "proj")
    proj.first_run = proj.doit("bundle")
    return proj


# ---------------------------------------------------------------------------------------------
# test tiers: `pytest` runs the fast tier; `pytest --full` (what .ci/run runs) runs everything

HEAVY_MARKERS = ("heavy", "real_qairt")


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="the full suite: also the tests marked heavy (the Docker engine, "
                          "BuildGrid, fuzzing, the long end-to-end builds) and real_qairt")


def names_no_file(config) -> bool:
    """True when the command line names directories only (or nothing: testpaths): a file or
    node id named on it selects its heavy tests too."""
    return all(Path(arg.split("::")[0]).is_dir() for arg in config.args)


def pytest_report_header(config):
    if config.getoption("--full"):
        return "tier: full (every test)"
    if names_no_file(config) and not config.getoption("markexpr"):
        return (f"tier: fast (tests marked {' or '.join(HEAVY_MARKERS)} are deselected; "
                "`pytest --full` runs every test)")
    return "tier: as selected on the command line"


# Above this many characters an operand of a failed `==`/`in` is not diffed: pytest's own
# explanation runs difflib over it (quadratic in a line's length), and a step log of a MiB shown
# in a doit run's output took an xdist worker down while it formatted the failure.
HUGE_OPERAND = 1 << 16


def pytest_assertrepr_compare(config, op, left, right):
    sizes = [len(v) for v in (left, right) if isinstance(v, (str, bytes))]
    if sizes and max(sizes) > HUGE_OPERAND:
        return [f"{type(left).__name__} {op} {type(right).__name__} failed "
                f"(operand sizes {sizes}: too long to diff; the message shows the part that matters)"]
    return None


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full") or config.getoption("markexpr") or not names_no_file(config):
        return
    heavy = [i for i in items if any(i.get_closest_marker(m) for m in HEAVY_MARKERS)]
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        items[:] = [i for i in items if not any(i.get_closest_marker(m) for m in HEAVY_MARKERS)]
