"""The process's own standard output and error, as a build needs them: a place to say things
that may go away without stopping the build.

`doit bundle | head` closes the pipe after ten lines; the next print raised BrokenPipeError (a
traceback, the build stopped half way). stdout at /dev/full raised ENOSPC, a closed stdout
(`>&-`) left sys.stdout None, and doit's reporter failed on both. Guarded, a lost reader is what
git and ninja make of it: nothing more is written there and nothing is said (the build goes on
and ends as it would have); a full or broken output is said once on stderr. The file descriptor
itself is pointed at /dev/null once lost, so that neither the interpreter's last flush nor a
step started later writes into the dead pipe, and a closed one is opened on /dev/null at once,
so that no file hexbundle opens takes its number (fd 1 or 2) for a child to write into.
"""
from __future__ import annotations

import errno
import io
import os
import sys

STREAMS = (("stdout", 1, "standard output"), ("stderr", 2, "standard error"))


class GuardedOutput:
    """A text stream whose write and flush never raise OSError: on the first failure the stream is
    lost (its descriptor pointed at /dev/null) and said so on stderr unless the reader simply
    went away (EPIPE)."""

    def __init__(self, raw, fd: int, what: str):
        self._raw, self._fd, self._what = raw, fd, what
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._raw.write(text)
            except OSError as exc:
                self._lose(exc)
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._raw.flush()
            except OSError as exc:
                self._lose(exc)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def _lose(self, exc: OSError) -> None:
        self.lost = True
        _onto_devnull(self._fd)
        try:
            self._raw.flush()   # what the buffer holds goes to /dev/null, not to a later flush
        except (OSError, ValueError):
            pass
        if exc.errno != errno.EPIPE:
            _say_lost(self._what, exc.strerror or str(exc))

    def __getattr__(self, name):
        return getattr(self._raw, name)


def _onto_devnull(fd: int) -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)


def _say_lost(what: str, why: str) -> None:
    if what == "standard error":
        return   # nowhere left to say it
    try:
        sys.__stderr__.write(f"hexbundle: cannot write to {what} ({why}): the rest of this "
                             "run's messages there are dropped; the build goes on (its outputs "
                             "are files)\n")
        sys.__stderr__.flush()
    except (OSError, AttributeError, ValueError):
        pass


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def guard() -> None:
    """Guard stdout and stderr (sys.stdout and sys.__stdout__ both: hexbundle's console writes to
    the latter); once per process, before anything is written."""
    for name, fd, what in STREAMS:
        raw = getattr(sys, name)
        if isinstance(raw, GuardedOutput):
            continue
        if raw is None or _closed(fd):
            _onto_devnull(fd)
            raw = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), line_buffering=True,
                                   errors="backslashreplace")
            stream = GuardedOutput(raw, fd, what)
            stream.lost = True
            _say_lost(what, "it is closed")
        else:
            stream = GuardedOutput(raw, fd, what)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
