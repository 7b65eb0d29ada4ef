"""Input files that must be regular files before anything opens them.

Opening a FIFO for reading blocks until a writer appears, and a device can stream forever: a
named pipe where tokenizer.json, an encodings file, an ONNX or its .data belongs hung whole
builds. Every reader of a model input asks `require_regular_file` first (a stat, which never
blocks), so such a path is refused at once, naming it.
"""
from __future__ import annotations

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
