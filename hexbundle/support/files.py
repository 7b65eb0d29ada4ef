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

A file a user names on the command line (--model-config, --tokenizer, a bundle's JSON) is read
with `read_named_file` alone: a regular file (a symbolic link to one is followed: Hugging Face's
cache is made of links), no larger than a cap that fits its kind, opened O_NONBLOCK and read no
further than the cap, so /dev/zero, a FIFO or a directory is refused at once, naming the
argument, instead of being read until memory runs out or waiting forever.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from hexbundle.support.errors import HexbundleError, InputError


def require_regular_file(path: Path, what: str) -> None:
    """InputError naming `path` unless it is a regular file (a symlink to one is fine)."""
    mode = _stat_mode(path, what, str(path))
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: the {what} is {kind_of(mode)}, not a regular file; put the "
                         "file itself there")


def kind_of(mode: int) -> str:
    """What kind of file `mode` is, for a message."""
    return ("a file" if stat.S_ISREG(mode) else
            "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else
            "a directory" if stat.S_ISDIR(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else
            "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file")


def _stat_mode(path, what: str, shown: str, missing: str = "") -> int:
    """os.stat's mode (links followed), or an InputError saying why there is none."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        dangling = os.path.islink(path)
        raise InputError(f"{shown}: {missing or 'no such file'}: {what} not found" + (
            f" (a symbolic link to {link_target(path)}, which does not exist)" if dangling
            else "")) from None
    except ValueError:   # a NUL in the name: no such file can exist
        raise InputError(f"{shown!r}: {what}: not a valid file name") from None
    except OSError as exc:   # ENAMETOOLONG, ELOOP, EACCES on the way, ENOTDIR
        raise InputError(f"{shown}: cannot read the {what} ({exc.strerror})") from None


# ---------------------------------------------------------------------------------------------
# files a user names: read whole, regular files only, capped by kind

# A model's config.json, a bundle's genie_config.json or its HTP extensions config: a few KiB.
JSON_CONFIG_MAX_BYTES = 4 << 20
# tokenizer.json: Qwen2.5's 7 MiB, Llama 3's 9 MiB, Gemma's 33 MiB.
TOKENIZER_MAX_BYTES = 64 << 20


def named(path, argument: str = "") -> str:
    """How a message names a path: with the command-line argument that gave it, if any."""
    return f"{argument} {path}" if argument else str(path)


def require_named_file(path, what: str, max_bytes: int, argument: str = "") -> None:
    """InputError unless a user-named path is a regular file (links followed) of at most
    `max_bytes`, naming the argument: a stat, which never blocks."""
    shown = named(path, argument)
    mode = _stat_mode(path, what, shown)
    if not stat.S_ISREG(mode):
        raise InputError(f"{shown}: the {what} is {kind_of(mode)}, not a regular file; give the "
                         "file itself")
    size = os.stat(path).st_size
    if size > max_bytes:
        raise InputError(_too_big(shown, what, size, max_bytes))


def read_named_file(path, what: str, max_bytes: int, argument: str = "") -> bytes:
    """The bytes of a file a user named (`argument`: the option that named it, for messages):
    InputError unless it is a regular file of at most `max_bytes`. Never blocks (O_NONBLOCK: a
    FIFO swapped in after the stat does not hang) and never reads past the cap (a file that
    grows meanwhile, or a device swapped in, is refused all the same)."""
    shown = named(path, argument)
    require_named_file(path, what, max_bytes, argument)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{shown}: cannot read the {what} ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):   # replaced between the stat and the open
            raise InputError(f"{shown}: the {what} is {kind_of(st.st_mode)}, not a regular "
                             "file; give the file itself")
        if st.st_size > max_bytes:
            raise InputError(_too_big(shown, what, st.st_size, max_bytes))
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise InputError(f"{shown}: cannot read the {what} ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise InputError(_too_big(shown, what, len(data), max_bytes))
    return data


def _too_big(shown: str, what: str, size: int, max_bytes: int) -> str:
    return (f"{shown}: {size} bytes, more than any {what} (at most {max_bytes >> 20} MiB): "
            "give the right file")


def read_named_text(path, what: str, max_bytes: int, argument: str = "") -> str:
    """read_named_file as UTF-8 text."""
    data = read_named_file(path, what, max_bytes, argument)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{named(path, argument)}: the {what} is not UTF-8 text (byte "
                         f"{exc.start})") from None


@contextlib.contextmanager
def about_argument(argument: str, value):
    """A HexbundleError raised inside names the command-line argument it is about (`argument`:
    an option, or a positional's name such as ARCHIVE), once: the user sees which of the paths
    they gave is wrong, whatever the error is about within it."""
    try:
        yield
    except HexbundleError as exc:
        text = str(exc)
        if text.startswith(argument):
            raise
        shown = f"{argument} {text}" if text.startswith(str(value)) else \
            f"{named(value, argument)}: {text}"
        raise type(exc)(shown) from None


def require_named_path(path, what: str, argument: str = "") -> None:
    """InputError unless a user-named path is a regular file or a directory (links followed)."""
    mode = _stat_mode(path, what, named(path, argument))
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise InputError(f"{named(path, argument)}: the {what} is {kind_of(mode)}, not a file "
                         "or a directory")


def require_named_dir(path, what: str, argument: str = "") -> None:
    """InputError unless a user-named path is a directory (links followed), naming it."""
    mode = _stat_mode(path, what, named(path, argument), "no such directory")
    if not stat.S_ISDIR(mode):
        raise InputError(f"{named(path, argument)}: the {what} is {kind_of(mode)}, not a "
                         "directory")


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


def read_state(path, limit: int = -1) -> bytes:
    """The bytes of one of hexbundle's own files, never through a symbolic link nor from
    anything but a regular file (opened O_NOFOLLOW | O_NONBLOCK: a FIFO does not block); at
    most `limit` bytes when given (support.jsondoc reads one more than its cap, to refuse).

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
        return fh.read(limit)


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
