"""Progress lines for the user, safe from any thread; on a terminal, one status line.

doit's python-actions swap sys.stdout for a capturing writer per action; with `-n 2` two threads
swap it concurrently and a write can land in another thread's StringIO (seen: a segfault). So
progress goes to the real stdout, under a lock, never through sys.stdout.

On a terminal a run shows one status line that rewrites itself, as ninja's does (`[5/18]
compile:part_3_of_4 weights 42% 1.2 GiB/s`): the reporter (graph.reporter) numbers the steps
(`counter`), the running step's monitor (support.monitor) says how far it is (`status`); a line
said meanwhile, or anything printed (StatusAware wraps sys.stdout), goes above it.
"""
import contextlib
import os
import sys
import threading
from typing import Optional

_lock = threading.Lock()
_thread = threading.local()   # .silent: this thread's lines are dropped (console.silenced)
# Set once per run by the run command (graph.commands): `-v 0`/`-v 1` hide progress (doit's
# verbosity: task output captured); under `-r json` it goes to stderr, stdout being the JSON.
_quiet = False
_to_stderr = False
_status = ""        # the status line on the terminal now ("" when none is shown)
_counters: dict = {}   # a running task -> "[5/18]" (graph.reporter)
ERASE = "\r\x1b[K"   # back to the line's start, erase to its end


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
        shown = _status
        _erase()
        _write(stream, msg)
        if shown:
            _draw(shown)


def terminal() -> bool:
    """Progress goes to a terminal a status line can be drawn on (a pty of no width, as `script`
    gives, is not one)."""
    stream = sys.__stdout__
    try:
        return (not _quiet and not _to_stderr and bool(stream) and stream.isatty()
                and os.get_terminal_size(stream.fileno()).columns > 0)
    except (ValueError, OSError):
        return False


def set_counter(task: str, counter: Optional[str]) -> None:
    """The reporter's number of a running task (`[5/18]`); None when it is done."""
    if counter is None:
        _counters.pop(task, None)
    else:
        _counters[task] = counter


def counter(task: str) -> Optional[str]:
    """`[5/18]` while the reporter runs `task`; None for work it does not number (a sub-step,
    a command without the reporter): that work says its own lines."""
    return _counters.get(task)


def status(text: str) -> None:
    """Rewrite the status line (a terminal only; elsewhere nothing)."""
    if not terminal():
        return
    with _lock:
        _draw(text)


def clear_status() -> None:
    with _lock:
        _erase()


def _draw(text: str) -> None:
    global _status
    try:
        width = os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (ValueError, OSError):
        return
    line = text[:max(1, width - 1)]   # never wraps: a wrapped line cannot be rewritten
    sys.__stdout__.write(ERASE + line)
    sys.__stdout__.flush()
    _status = line


def _erase() -> None:
    global _status
    if _status:
        sys.__stdout__.write(ERASE)
        sys.__stdout__.flush()
        _status = ""


class StatusAware:
    """sys.stdout while a status line may be shown: what a task prints (the size table, a
    verdict) erases the status line first, so it starts at the line's start."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        if _status and text:
            with _lock:
                _erase()
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _write(stream, msg: str) -> None:
    stream.write(msg + "\n")
    stream.flush()


def warn(msg: str) -> None:
    """A warning line on the real stderr (same lock: lines never interleave)."""
    stream = sys.__stderr__
    with _lock:
        _write(stream, msg)


def printable(text: str) -> str:
    """Text from outside (a board, a server) as it may reach the user's terminal: every control
    character but tab, C1 included (ESC, CSI, BEL, CR, ...: a terminal would act on them: retitle,
    recolour, move the cursor, hide a line), shown as \\xNN / \\uNNNN instead; the rest as is."""
    return "".join(ch if ch == "\t" or not _is_control(ch) else
                   (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
                   for ch in text)


def _is_control(ch: str) -> bool:
    # Cc (C0, DEL, C1), and the bidi overrides and line/paragraph separators (Zl, Zp, Cf bidi)
    # that reorder or split what the user reads
    code = ord(ch)
    return code < 0x20 or 0x7f <= code < 0xa0 or ch in "\u2028\u2029" \
        or 0x202a <= code <= 0x202e or 0x2066 <= code <= 0x2069
