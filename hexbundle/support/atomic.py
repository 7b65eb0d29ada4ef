"""Atomic file output: write a temp file beside the target, fsync, rename.

A reader never sees half a file, and a killed writer leaves only a `.<name>.*.tmp` file, which
the next run sweeps (hexbundle.runguard). Every small writer of the project goes through here.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from hexbundle.support.errors import output_error


@contextlib.contextmanager
def atomic_output(path, mode: str = "wb", user_errors: bool = True):
    """Yield a file object; on success it replaces `path`, on any failure nothing is left.

    user_errors: an OSError (full disk, file-size limit) becomes an OutputError naming the file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if user_errors and isinstance(exc, OSError):
            raise output_error(path, exc) from None
        raise


def write_atomic(path, data: bytes) -> None:
    with atomic_output(path) as fh:
        fh.write(data)
