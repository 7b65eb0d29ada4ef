"""What a run says: the banner only for tasks that build or check a variant; as ninja, one status
line rewriting itself on a terminal, one line a step off it; one summary line at the end (what,
where, steps built / fetched / up to date, time; the failed task and its log), verify's
verdict even when it is up to date, progress of long steps in bytes (rate, ETA), and SIGTERM
handled as Ctrl-C is.

Real `python -m doit` runs on a copied project; one build of qwen2-tiny is shared by the module.
"""
import io
import os
import re
import signal
from pathlib import Path

import pytest

from conftest import ROOT, Held, copy_project
from hexbundle.support.atomic import is_temp_name

BUNDLE = "build/qwen2-tiny/iq9075/four/reference/bundle"
REPORT = "build/qwen2-tiny/iq9075/four/reference/verify/report.json"
BANNER = "hexbundle 0"   # the banner's first words: `hexbundle <version>: <model>, plan ...`
SUMMARY = re.compile(r"^hexbundle: bundle (\S+) \(reference backend, NOT deployable\): "
                     r"(\d+) built, (\d+) up to date, [\d.]+ s$", re.M)
STEP_LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S+)(?: \[reference/local\])? [\d.]+s$")
PROGRESS = re.compile(r"^  \.\. compile:(\S+) \[reference/local\]: \S+ DLC weights "
                      r"[\d.]+ (?:B|KiB|MiB|GiB) / [\d.]+ (?:B|KiB|MiB|GiB) \(\d+%\), "
                      r"[\d.]+ (?:B|KiB|MiB|GiB)/s, ETA (?:\d+s|\d+m\d\ds|\d+h\d\dm|\?)", re.M)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    proj = copy_project(tmp_path_factory.mktemp("runout") / "proj")
    proj.first_run = proj.doit("bundle")
    return proj


def leftovers(build: Path) -> list:
    return [Path(d, n) for d, dirs, files in os.walk(build) for n in dirs + files
            if is_temp_name(n)]


# ---------------------------------------------------------------------------------------------
# the summary line

def test_a_build_ends_with_one_summary_line_naming_the_bundle(built):
    last = built.first_run.out.rstrip("\n").splitlines()[-1]
    m = SUMMARY.match(last)
    assert m, f"last line: {last!r}\n{built.first_run.out}"
    assert m.group(1) == BUNDLE and (built.root / BUNDLE / "manifest.json").is_file()
    assert int(m.group(2)) == len(built.first_run.executed) and m.group(3) == "0"
    assert len(SUMMARY.findall(built.first_run.out)) == 1

    again = built.doit("bundle")   # a no-op: every step up to date, and nothing else said
    m = SUMMARY.search(again.out)
    assert m and m.group(2) == "0" and m.group(3) == "18", again.out
    assert again.out.splitlines()[4:] == [m.group(0)], again.out   # the banner, the summary


def test_a_pipe_gets_one_line_a_step(built):
    """Off a terminal: the banner, one line per step when it is done, numbered, the size table,
    the summary; no other line (doit's `.  task`, the executor's `ok`)."""
    lines = built.first_run.out.splitlines()
    table = lines.index(next(ln for ln in lines if ln.startswith("size check: ")))
    table_end = lines.index(next(ln for ln in lines[table:] if ln.startswith("total ")))
    steps = lines[4:table] + lines[table_end + 1:-1]
    assert lines[0].startswith(BANNER) and SUMMARY.match(lines[-1]), built.first_run.out
    matched = [STEP_LINE.match(ln) for ln in steps]
    assert all(matched), built.first_run.out
    assert [int(m.group(1)) for m in matched] == list(range(1, 19))
    assert {m.group(2) for m in matched} == {"18"}
    assert len({m.group(3) for m in matched}) == 18 == len(built.first_run.executed)
    assert len(lines) == 4 + 18 + (table_end - table + 1) + 1


def screen(raw: str) -> list:
    """The lines a terminal shows for `raw`: each line as its last rewrite left it."""
    shown = []
    for line in raw.replace("\r\n", "\n").split("\n"):
        shown.append(line.rsplit("\r", 1)[-1].replace("\x1b[K", ""))
    return [ln for ln in shown if ln]


def test_a_terminal_gets_one_status_line_that_rewrites_itself(built):
    """Under a pty: the steps' counters are all written, each rewriting the one status line
    (carriage return, erase line), none ends a line; the screen keeps the banner, what the steps
    print (the size table, a notice) and the summary, no step line."""
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios
    next((built.build_dir() / "bin").glob("*_3_of_4.bin")).unlink()
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "doit", "bundle"], cwd=built.root,
                            stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    raw = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:   # EIO: the child closed the pty
            break
        if not data:
            break
        raw += data
    os.close(master)
    assert proc.wait(timeout=600) == 0, raw
    text = raw.decode()
    assert "\r\x1b[K[1/18] compile:part_3_of_4" in text and "\r\x1b[K[2/18] bundle" in text
    assert not re.search(r"\[\d+/18\][^\r\n]*\r?\n", text), text   # no step line is kept
    shown = screen(text)
    assert shown[0].startswith(BANNER) and SUMMARY.match(shown[-1]), shown
    assert SUMMARY.match(shown[-1]).group(2) == "2", shown
    assert not [ln for ln in shown if re.match(r"\[\d+/18\]", ln)], shown
    assert any(ln.startswith("size check: ") for ln in shown), shown


def test_a_failed_run_names_the_task_that_failed_and_its_log(project):
    project.doit("inputs")
    encodings = next((project.root / "build" / "qwen2-tiny" / "inputs").glob("*2_of_4.encodings"))
    encodings.write_text("not json")
    run = project.doit("bundle", check=False)
    assert run.code != 0
    last = run.out.rstrip("\n").splitlines()[-1]
    m = re.match(r"hexbundle: FAILED: task (convert:part_2_of_4_\w+) \(log: (\S+)\); "
                 r"\d+ built, \d+ up to date, [\d.]+ s$", last)
    assert m, f"last line: {last!r}\n{run.out}"
    log = project.root / m.group(2)
    assert log.is_file() and "not valid JSON" in log.read_text()
    assert m.group(2) == ("build/qwen2-tiny/iq9075/four/reference/logs/"
                          f"{m.group(1).replace(':', '__')}.log")


# ---------------------------------------------------------------------------------------------
# verify's verdict

def test_verify_prints_its_verdict_and_report_even_when_up_to_date(built):
    first = built.doit("verify")
    second = built.doit("verify")
    assert "verify" in first.executed and "verify" not in second.executed
    assert second.up_to_date == 19, second.out
    for run in (first, second):
        assert f"verify: PASSED ({REPORT})" in run.out, run.out
        assert run.out.rstrip("\n").splitlines()[-1].startswith(
            f"hexbundle: verify: PASSED ({REPORT}), bundle {BUNDLE}")


# ---------------------------------------------------------------------------------------------
# the banner

def test_inspect_and_import_export_do_not_print_the_default_models_banner(built, tmp_path):
    assert built.first_run.out.startswith(BANNER) and "qwen2-tiny, plan four" in \
        built.first_run.out
    inspect = built.doit("inspect", "--path", "build/qwen2-tiny/inputs")
    imported = built.doit("import_export", "--dir",
                          str(ROOT / "tests" / "data" / "qaihm" / "export-2cl"), "--name", "two")
    for run in (inspect, imported):
        assert BANNER not in run.out and "qwen2-tiny, plan" not in run.out, run.out
        assert "NOT deployable" not in run.out
    # their own verdict is the last line (the run's summary only follows a failure)
    assert inspect.out.rstrip("\n").splitlines()[-1] == "8 graphs, 8 encodings files, 0 problems"
    failed = built.doit("inspect", "--path", str(tmp_path / "gone"), check=False)
    assert failed.code != 0 and BANNER not in failed.out
    assert failed.out.rstrip("\n").splitlines()[-1].startswith(
        "hexbundle: FAILED: task inspect (its message is above)"), failed.out


# ---------------------------------------------------------------------------------------------
# progress

def test_progress_lines_carry_bytes_rate_and_eta_when_not_a_tty(built, tmp_path):
    """Held mid-compile (a first weight written), the step's lines say how far it is."""
    next(built.bundle().parent.joinpath("bin").glob("*_2_of_4.bin")).unlink()
    held = Held(built, ["bundle"], pause_at="compile", tmp=tmp_path / "held",
                env={"HEXBUNDLE_PROGRESS_EVERY": "0.1"})
    held.wait_for(lambda: (held.dir / "paused").exists(), "pause point")
    held.wait_for(lambda: PROGRESS.search(held.out_path.read_text()), "progress line")
    (held.dir / "release").touch()
    run = held.finish()
    assert run.code == 0, run.out + run.err
    line = PROGRESS.search(run.out)
    assert line.group(1) == "part_2_of_4", line.group(0)
    # once the step's meter is open (held at the pause point, a weight written), every line of
    # the step carries bytes; a heartbeat before the meter opens is allowed (a 0.1 s tick)
    after = run.out.split(line.group(0), 1)[1]
    step_lines = [ln for ln in after.splitlines() if ln.startswith("  .. compile:part_2_of_4")]
    assert not any("still running" in ln for ln in step_lines), after
    assert SUMMARY.search(run.out)


def test_a_step_containers_progress_lines_are_relayed_not_logged():
    from hexbundle.steps.docker_executor import _Relay
    from hexbundle.support import progress
    got, log = [], io.StringIO()
    relay = _Relay(log, lambda snap, closed: got.append((snap.what, snap.done, closed)))
    line = progress.Snapshot("x.bin DLC weights", 5 << 20, 10 << 20, 2.0).to_line()
    relay.feed("convert x\n" + line[:12])
    relay.feed(line[12:] + "\ndone in 1.0s\n", final=False)
    relay.feed("", final=True)
    assert log.getvalue() == "convert x\ndone in 1.0s\n"
    assert got == [("x.bin DLC weights", 5 << 20, False)]
    snap = progress.Snapshot("w", 5 << 20, 10 << 20, 2.0)
    assert snap.describe() == "w 5.0 MiB / 10.0 MiB (50%), 2.5 MiB/s, ETA 2s"


# ---------------------------------------------------------------------------------------------
# SIGTERM

def test_sigterm_mid_step_exits_non_zero_with_a_message_and_no_temp_file(project, tmp_path):
    held = Held(project, ["bundle"], pause_at="compile", tmp=tmp_path / "held")
    held.wait_for(lambda: (held.dir / "paused").exists(), "pause point")
    assert leftovers(project.root / "build"), "held mid-write: a temp file should be there"
    held.proc.send_signal(signal.SIGTERM)
    stopped = held.finish()
    assert stopped.code != 0
    assert "hexbundle: terminated (SIGTERM)" in stopped.err, stopped.out + stopped.err
    assert "Traceback" not in stopped.out + stopped.err
    assert re.search(r"^hexbundle: stopped by SIGTERM during compile:", stopped.out, re.M)
    assert leftovers(project.root / "build") == [], "SIGTERM left a temp file"

    rerun = project.doit("bundle")
    assert rerun.executed and "left by an interrupted run" not in rerun.err


# ---------------------------------------------------------------------------------------------
# fetched, built, up to date: the summary's counts (in this process, real doit tasks)

def test_the_summary_counts_a_step_fetched_from_the_cache_apart(tmp_path, monkeypatch):
    """A step that ran is counted by the origin record it left (formats.origins, written by
    graph.remote_steps: "remote-cache" on a hit): fetched, not built; a full cache hit's
    summary is no longer "N steps ran". (The end-to-end hit: tests/test_remote_cache.py.)"""
    from doit.task import Task
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import BUILD_ROOT_ENV, Layout
    from hexbundle.formats.origins import write_origin
    from hexbundle.graph import reporter
    monkeypatch.setenv(BUILD_ROOT_ENV, str(tmp_path / "build"))
    layout = Layout(load_build(ROOT, {}))
    write_origin(layout.records, "compile:part_1_of_4", {"origin": "remote-cache"}, [])
    write_origin(layout.records, "compile:part_2_of_4", {"origin": "local"}, [])
    names = ["compile:part_1_of_4", "compile:part_2_of_4", "compile:part_3_of_4"]
    tasks = {n: Task(n, [(lambda: None, [], {})]) for n in names}
    tasks["bundle"] = Task("bundle", [(lambda: None, [], {})], task_dep=names)
    monkeypatch.setattr(reporter, "_layout", layout)
    out = io.StringIO()
    shows = reporter.Reporter(out, {})
    shows.initialize(tasks, ["bundle"])
    shows.skip_uptodate(tasks["compile:part_3_of_4"])
    for name in names[:2] + ["bundle"]:
        shows.execute_task(tasks[name])
        shows.add_success(tasks[name])
    lines = out.getvalue().splitlines()[-3:]
    assert re.fullmatch(r"\[1/4\] compile:part_1_of_4 fetched [\d.]+s", lines[0]), lines
    assert re.fullmatch(r"\[2/4\] compile:part_2_of_4 \[reference/local\] [\d.]+s", lines[1])
    assert re.fullmatch(r"\[3/4\] bundle \[reference/local\] [\d.]+s", lines[2]), lines
    assert re.search(r": 2 built, 1 fetched, 1 up to date, [\d.]+ s$", shows.summary())


# ---------------------------------------------------------------------------------------------
# the steps on a remote executor, in the status line (in this process, a pty as the terminal)

def test_a_terminal_status_line_shows_the_remote_steps_and_their_stage(monkeypatch):
    """remote/executed.py tells support.inflight each step's stage from its own thread; on a
    terminal the reporter draws them all in the one status line (no line of their own), the
    oldest first, and stops listening when the run ends. (Off a terminal each stage is a line:
    tests/test_remote_execution.py.)"""
    import fcntl
    import pty
    import select
    import struct
    import sys
    import termios
    import threading
    from doit.task import Task
    from hexbundle.graph import reporter
    from hexbundle.support import console, inflight
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    tty = os.fdopen(slave, "w")
    monkeypatch.setattr(sys, "__stdout__", tty)
    monkeypatch.setattr(console, "_quiet", False)
    monkeypatch.setattr(console, "_to_stderr", False)
    monkeypatch.setattr(reporter, "_layout", None)
    one, two = "convert:part_1_of_4_prompt", "convert:part_2_of_4_prompt"
    tasks = {n: Task(n, [(lambda: None, [], {})]) for n in (one, two)}
    tasks["bundle"] = Task("bundle", [(lambda: None, [], {})], task_dep=[one, two])
    shows = reporter.Reporter(io.StringIO(), {})
    shows.initialize(tasks, ["bundle"])
    try:
        assert shows.terminal
        for name in (one, two):
            shows.execute_task(tasks[name])
        told = []
        for task, stage in ((one, "queued"), (two, "queued"), (one, "executing")):
            step = threading.Thread(target=lambda t, s: told.append(inflight.set_stage(t, s)),
                                    args=(task, stage))
            step.start()   # as a step's thread of doit -n 2 does
            step.join()
        inflight.done(one)
        inflight.done(two)
    finally:
        shows.complete_run()
    assert told == [True, True, True]       # shown: remote/executed.py says no line of its own
    assert not inflight.set_stage(one, "queued")   # the run is over: nobody draws it
    inflight.done(one)
    tty.flush()
    raw = b""
    while select.select([master], [], [], 0)[0]:
        raw += os.read(master, 65536)
    tty.close()
    os.close(master)
    drawn = [d.replace("\x1b[K", "") for d in raw.decode().split("\r") if d.strip("\x1b[K")]
    assert drawn == [f"[1/3] {one}", f"[2/3] {two}",
                     f"[2/3] remote: {one} queued",
                     f"[2/3] remote: {one} queued, {two} queued",
                     f"[2/3] remote: {one} executing, {two} queued",
                     f"[2/3] remote: {two} queued"], drawn
    assert "\n" not in raw.decode(), raw   # all on the one status line
