"""Read-only commands answer while a build runs: no lock, nothing written (graph.commands.ReadOnly,
graph.loader, graph.runguard).

A real `doit bundle` is held at its compile step's pause point (support.testhooks): it holds the
build lock and is mid-step. Each read-only command then runs with HEXBUNDLE_LOCK_TIMEOUT=0 (a
command that asked for the lock would be refused at once), exits 0, and leaves every file of the
project (the build root and hexbundle's state in it: DBs, caches, lock) as it was, byte for byte.
"""
import json
import os
from pathlib import Path

import pytest

from conftest import Held

REPORT = "build/qwen2-tiny/iq9075/four/reference/verify/report.json"


def tree(root: Path) -> dict:
    """Every file and directory under root: its kind, bytes and modification time."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = os.lstat(path)
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            found[str(path.relative_to(root))] = (st.st_mode, st.st_mtime_ns, data)
    return found


@pytest.fixture(scope="module")
def held_build(built, tmp_path_factory):
    """The built project (verified: it has a report), rebuilding one bin, held mid-compile."""
    built.doit("verify")
    next((built.build_dir() / "bin").glob("*_2_of_4.bin")).unlink()
    held = Held(built, ["bundle"], pause_at="compile", tmp=tmp_path_factory.mktemp("held"))
    held.wait_paused()
    yield built, held
    held.release()
    run = held.finish()
    assert run.code == 0 and "compile:part_2_of_4" in run.executed, run.out + run.err


@pytest.mark.parametrize("args", [
    # (`doit info` exits 1 for a task that is not up to date: one that is, here)
    ["list"], ["list", "--all"], ["help"], ["help", "bundle"], ["info", "convert:part_1_of_4_token"],
    ["bundle", "--help"], ["bundle", "--dry-run"],
    ["check_bundle", "--path", "build/qwen2-tiny/iq9075/four/reference/bundle"],
    ["verify", "--json"],
], ids=" ".join)
def test_a_read_only_command_answers_during_a_build_and_writes_nothing(held_build, args):
    project, held = held_build
    assert (project.root / "build" / ".hexbundle" / "lock").read_text().split()[0] == \
        str(held.proc.pid)   # the held build has the lock
    before = tree(project.root)
    run = project.doit(*args, env={"HEXBUNDLE_LOCK_TIMEOUT": "0"})
    assert run.code == 0 and "waiting for another hexbundle run" not in run.err, run.err
    assert tree(project.root) == before, f"doit {' '.join(args)} wrote into the project"
    assert held.proc.poll() is None   # the build is still there, paused


def test_verify_json_prints_the_last_report(held_build):
    project, _ = held_build
    run = project.doit("verify", "--json")
    assert json.loads(run.out) == json.loads((project.root / REPORT).read_text())


def test_verify_json_without_a_report_says_to_run_verify(project):
    run = project.doit("verify", "--json", check=False)
    assert run.code == 3 and "Traceback" not in run.err
    assert f"{REPORT}: no verify report for this variant yet: run `python3 -m doit verify` " \
           "first" in run.err, run.err
    assert not (project.root / "build").exists()   # nothing written, not even the build root


def test_a_build_beside_the_held_one_still_waits_for_the_lock(held_build):
    """The lock is taken by every command that writes: a second build is refused."""
    project, _ = held_build
    run = project.doit("bundle", env={"HEXBUNDLE_LOCK_TIMEOUT": "0"}, check=False)
    assert run.code == 3 and "another hexbundle run" in run.err, run.err
