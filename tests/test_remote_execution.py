"""REAPI remote execution (hexbundle.remote.execute) against a real BuildGrid 0.4.4 with its
Execution, Bots, CAS and ActionCache services on its SQL scheduler (PostgreSQL, a private cluster
in a temp directory), and real worker processes (tests/reapi_worker.py) that take leases over
the Remote Workers API and run each Action as a subprocess in a fresh directory.

One grid for the module (two workers); the test that stops the server has a server of its own.
Under CI these must run: no skip for a missing server, PostgreSQL or worker.
"""
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from reapi_grid import ExecGrid

from hexbundle.config.build import remote_settings
from hexbundle.remote import reapi
from hexbundle.remote.action import input_root
from hexbundle.remote.buildgrid import find_bgd
from hexbundle.remote.execute import (ActionFailed, ExecutionTimeout, ExecutionUnavailable,
                                      RemoteExecutor)
from hexbundle.remote.postgres import find_pg_bin

pytestmark = pytest.mark.heavy   # BuildGrid, PostgreSQL and workers: the full suite

PLATFORM = [("ISA", "x86-64"), ("OSFamily", "linux")]


def unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so the remote execution tests must run, but: {reason}")
    pytest.skip(f"{reason} (these tests run under CI=true, where .ci/run provides it)")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    if not find_bgd():
        unavailable("no BuildGrid `bgd`: set HEXBUNDLE_BGD (.ci/run installs it)")
    if not find_pg_bin():
        unavailable("no PostgreSQL (initdb): apt-get install postgresql")
    with ExecGrid.start(tmp_path_factory.mktemp("grid")) as grid:
        grid.add_worker("w1")
        grid.add_worker("w2")
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
    assert ex.logs(result) == (b"to-stdout\n", b"to-stderr\n")
    assert result.execution_metadata.worker in ("w1", "w2")
    assert stages[-1] == "completed" and "queued" in stages, stages
    # uploaded first: nothing the action needs is missing on the server now
    assert not ex.cas.find_missing(reapi.Digest(hash=h, size_bytes=s) for h, s in blobs)


def test_a_failed_command_is_an_action_failed_error_with_its_stderr(grid, tmp_path):
    digest, blobs = action(tmp_path, "echo 'no such weight: w.3' >&2; exit 3")
    with pytest.raises(ActionFailed) as err:
        executor(grid.url, tmp_path).execute(digest, blobs, timeout=60)
    assert "exited 3" in str(err.value) and "no such weight: w.3" in str(err.value)
    assert err.value.result.exit_code == 3


def test_two_workers_run_two_actions_side_by_side(grid, tmp_path):
    """Each action waits until the other has started (a rendezvous through a directory both
    workers see): they can only both finish if two workers ran them at the same time."""
    meet = tmp_path / "meet"
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


def test_a_worker_killed_mid_action_has_its_action_requeued_to_another(grid, tmp_path):
    """w3 takes the action (it alone offers the property) and is killed with SIGKILL while the
    action runs; w4 (offering it too) comes up afterwards and gets the requeued lease."""
    prop = "executor=kill-test"
    w3 = grid.add_worker("w3", "--property", prop)
    digest, blobs = action(tmp_path, "sleep 2; mkdir -p o; echo built > o/f", ["o/f"],
                           platform=PLATFORM + [("executor", "kill-test")])
    ex = executor(grid.url, tmp_path, timeout=60)
    out = {}
    t = threading.Thread(target=lambda: out.update(r=ex.execute(digest, blobs, timeout=120)))
    t.start()
    grid.wait_for(lambda: any(e["event"] == "start" for e in grid.events("w3")),
                  "w3 to start the action", w3)
    os.kill(w3.pid, signal.SIGKILL)
    w3.wait()
    grid.workers.pop("w3")
    grid.add_worker("w4", "--property", prop)
    t.join(timeout=150)
    assert not t.is_alive()
    result = out["r"]
    assert result.execution_metadata.worker == "w4"
    assert fetched(ex, result.output_files[0].digest) == b"built\n"
    assert not any(e["event"] == "done" for e in grid.events("w3"))
    grid.stop_worker("w4")


def test_the_server_going_away_mid_execution_is_an_unavailable_error(tmp_path):
    if not find_bgd() or not find_pg_bin():
        unavailable("no BuildGrid or no PostgreSQL")
    with ExecGrid.start(tmp_path / "grid") as grid:
        w = grid.add_worker("w1")
        digest, blobs = action(tmp_path, "sleep 30")
        ex = executor(grid.url, tmp_path, timeout=10)
        errors = []

        def run():
            try:
                ex.execute(digest, blobs, timeout=120)
            except Exception as exc:   # noqa: BLE001 -- the test inspects it
                errors.append(exc)
        t = threading.Thread(target=run)
        t.start()
        grid.wait_for(lambda: any(e["event"] == "start" for e in grid.events("w1")),
                      "the worker to start the action", w)
        grid.server.stop()
        t.join(timeout=60)
        assert not t.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], ExecutionUnavailable), errors
        assert grid.url in str(errors[0])
