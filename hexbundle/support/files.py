"""Files that must be regular files before anything opens them, and hexbundle's own files,
which are never opened through a symbolic link.

Opening a FIFO for reading blocks until a writer appears, and a device can stream forever: a
named pipe where tokenizer.json, an encodings file, an ONNX or its .data belongs hung whole
builds. Every reader of a model input asks `require_regular_file` first (a stat, which never
blocks), so such a path is refused at once, naming it.

hexbundle's own files (its state under <build root>/.hexbundle/, a step's log and records) are
another matter: a symbolic link in their place would have hexbundle read, or write, a file
outside the build root (issue 26, item 4). They are read with `read_state` and opened for
writing in place with `open_in_place`, both O_NOFOLLOW; whole-file writes go through
support.atomic, whose rename replaces a link itself, never its target. The directories on the
way are checked before use (graph.runguard).
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from hexbundle.support.errors import InputError


def require_regular_file(path: Path, what: str) -> None:
    """InputError naming `path` unless it is a regular file (a symlink to one is fine)."""
    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except ValueError:   # a NUL in the name: no such file can exist
        raise InputError(f"{path!r}: {what}: not a valid file name") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else
                "a directory" if stat.S_ISDIR(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise InputError(f"{path}: the {what} is {kind}, not a regular file; put the file "
                         "itself there")


# ---------------------------------------------------------------------------------------------
# hexbundle's own files: never through a symbolic link

_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class LinkedStateError(OSError):
    """One of hexbundle's own files is a symbolic link: it was not opened (errno ELOOP). An
    OSError, so a reader that takes an unreadable file as none never follows it."""


def _refuse_link(path, exc: OSError) -> None:
    """Raise LinkedStateError for the ELOOP of O_NOFOLLOW on a link; else nothing."""
    if exc.errno == errno.ELOOP and os.path.islink(path):
        raise LinkedStateError(errno.ELOOP, "a symbolic link, not followed", str(path)) from None


def link_target(path) -> str:
    """Where a symbolic link points, for a message ("?" if it is gone meanwhile)."""
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def read_state(path) -> bytes:
    """The bytes of one of hexbundle's own files, never through a symbolic link nor from
    anything but a regular file (opened O_NOFOLLOW | O_NONBLOCK: a FIFO does not block).

    FileNotFoundError if there is none; LinkedStateError for a link (nothing is read); another
    OSError if it cannot be read or is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
    except OSError as exc:
        _refuse_link(path, exc)
        raise
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return fh.read()


def open_state(path, flags: int, mode: int = 0o666) -> int:
    """os.open of one of hexbundle's own files with O_NOFOLLOW (the build lock): a descriptor,
    or LinkedStateError for a link."""
    try:
        return os.open(path, flags | _NOFOLLOW, mode)
    except OSError as exc:
        _refuse_link(path, exc)
        raise


def open_in_place(path, mode: str = "w"):
    """A file object writing `path` from its start (a step's log, written as the step runs),
    never through a symbolic link: a link in its place is removed first (the link alone, its
    target is left as it is), and the file is opened O_NOFOLLOW, so a link put there meanwhile
    is refused, not followed. mode: "w" or "wb"."""
    assert mode in ("w", "wb")
    # A new file every time (O_EXCL after removing the name): what was there -- a symbolic link,
    # a hard link to a file elsewhere, a FIFO that would block the open, an old log -- loses its
    # name and is never written (as root for the docker executor, writing through a planted
    # hard link replaced a file outside the build root with a step's log).
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for _ in range(3):   # a name made again meanwhile (a step of a parallel run): once more
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        try:
            return os.fdopen(open_state(path, flags), mode)
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, "made again while it was being replaced", str(path))


def require_own_file(fd: int, path) -> os.stat_result:
    """The stat of an open file hexbundle made for itself: a regular file with one name. Another
    name (a hard link planted to a file elsewhere) or another kind of file is refused, an OSError
    naming the path; nothing has been written."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    if st.st_nlink != 1:
        raise OSError(errno.EMLINK, f"a file with {st.st_nlink} names (a hard link to it is "
                      "elsewhere), not hexbundle's own", str(path))
    return st
