"""The process's own stdio (issue 40, kind 8) and Ctrl-C at start-up (kind 9): a reader that
goes away (`doit bundle | head`) is what git and ninja make of it, a full or closed stdout is a
message on stderr, and the build goes on in each case: real `doit` runs."""
import os
import signal
import subprocess
import sys

import pytest

from conftest import Held, copy_project

# (id, the shell's redirection of doit's stdout, what stderr must say ("" for nothing))
OUTPUTS = [
    ("broken-pipe", "| head -1", ""),
    ("dev-full", "> /dev/full", "cannot write to standard output (No space left on device)"),
    ("closed", ">&-", "cannot write to standard output (it is closed)"),
]


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("stdio") / "proj")


def run_shell(proj, command: str):
    err = proj.root / "err.txt"
    proc = subprocess.run(["sh", "-c", f"{command} 2> {err}; echo $? > {proj.root / 'rc'}"],
                          cwd=proj.root, capture_output=True, text=True, timeout=600)
    return proc.stdout, err.read_text(), int((proj.root / "rc").read_text())


@pytest.mark.parametrize("command", [
    "list", pytest.param("bundle", marks=pytest.mark.heavy)])   # bundle: measured ~15 s each
@pytest.mark.parametrize("redirect, said", [o[1:] for o in OUTPUTS], ids=[o[0] for o in OUTPUTS])
def test_a_lost_stdout_is_no_traceback_and_the_build_goes_on(proj, command, redirect, said):
    doit = f"{sys.executable} -m doit"
    if command == "bundle":
        subprocess.run(["rm", "-rf", str(proj.root / "build")], check=True)
    # the build's exit code through the pipe: sh has no pipefail, so the status goes to a file
    status = proj.root / "doit-status"
    out, err, _ = run_shell(proj, f"({doit} {command}; echo $? > {status}) {redirect}")
    assert "Traceback" not in err and "Error" not in err, err
    assert said in err
    if not said:
        assert err == ""
    assert int(status.read_text()) == 0
    if command == "bundle":
        again = proj.doit("bundle")
        assert again.executed == set(), "the build did not finish when its output was lost"


def test_ctrl_c_during_start_up_is_a_line_not_a_traceback(tmp_path):
    project = copy_project(tmp_path / "p")
    held = Held(project, ["bundle"], pause_at="start-up", tmp=tmp_path / "held")
    held.wait_paused()
    held.proc.send_signal(signal.SIGINT)
    stopped = held.finish()
    assert stopped.code == 130
    assert "Traceback" not in stopped.out + stopped.err
    assert "interrupted while starting up" in stopped.err
    assert not (project.root / "build" / "qwen2-tiny").exists()


@pytest.mark.parametrize("pause_at", ["plugins", "start-up"])
def test_ctrl_c_twice_during_start_up_is_one_line_not_a_traceback(tmp_path, pause_at):
    """Issue 47, kind 5: a second Ctrl-C while the first one's interrupt unwinds (or while the
    run exits) printed a KeyboardInterrupt traceback. Held at hexbundle's first code (doit
    importing its plugins) and at the loader, SIGINT is sent twice, then a third time: the run
    ends non-zero with the one start-up line, no traceback, nothing built."""
    project = copy_project(tmp_path / "p")
    held = Held(project, ["bundle"], pause_at=pause_at, tmp=tmp_path / "held")
    held.wait_paused()
    held.proc.send_signal(signal.SIGINT)
    held.proc.send_signal(signal.SIGINT)
    try:
        held.proc.wait(timeout=0.3)
    except subprocess.TimeoutExpired:
        held.proc.send_signal(signal.SIGINT)
    stopped = held.finish()
    assert stopped.code != 0, stopped.err
    text = stopped.out + stopped.err
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert stopped.err.strip() == "hexbundle: interrupted while starting up; nothing was run", \
        stopped.err
    assert not (project.root / "build" / "qwen2-tiny").exists()
