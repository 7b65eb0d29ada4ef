"""Progress lines for the user, safe from any thread.

doit's python-actions swap sys.stdout for a capturing writer per action; with `-n 2` two threads
swap it concurrently and a write can land in another thread's StringIO (seen: a segfault). So
progress goes to the real stdout, under a lock, never through sys.stdout.
"""
import contextlib
import sys
import threading

_lock = threading.Lock()
_thread = threading.local()   # .silent: this thread's lines are dropped (console.silenced)
# Set once per run by the run command (graph.commands): `-v 0`/`-v 1` hide progress (doit's
# verbosity: task output captured); under `-r json` it goes to stderr, stdout being the JSON.
_quiet = False
_to_stderr = False


def configure(quiet: bool = False, to_stderr: bool = False) -> None:
    global _quiet, _to_stderr
    _quiet, _to_stderr = quiet, to_stderr


def quiet() -> bool:
    return _quiet


@contextlib.contextmanager
def silenced():
    """Drop this thread's lines for a while: a check asked a second time (graph.explain asks
    doit's up-to-date items again, to say why) must not print its line twice."""
    before = getattr(_thread, "silent", False)
    _thread.silent = True
    try:
        yield
    finally:
        _thread.silent = before


def say(msg: str) -> None:
    """A progress line for the user on the real stdout (stderr under `-r json`; none at -v 0/1)."""
    if _quiet or getattr(_thread, "silent", False):
        return
    stream = sys.__stderr__ if _to_stderr else sys.__stdout__
    with _lock:
        _write(stream, msg)


def _write(stream, msg: str) -> None:
    """A line; above the live progress bars when there are some (steps.executor, on a TTY)."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None and getattr(tqdm.tqdm, "_instances", None):
        tqdm.tqdm.write(msg, file=stream)
        stream.flush()
        return
    stream.write(msg + "\n")
    stream.flush()


def warn(msg: str) -> None:
    """A warning line on the real stderr (same lock: lines never interleave)."""
    stream = sys.__stderr__
    with _lock:
        _write(stream, msg)
