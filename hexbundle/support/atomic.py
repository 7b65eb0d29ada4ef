"""Atomic file output: write a temp file beside the target, fsync, rename.

A reader never sees half a file, and a killed writer leaves only a `.<name>.*.tmp` file, which
the next run sweeps (hexbundle.graph.runguard). Every small writer of the project goes through here.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
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


def json_bytes(obj) -> bytes:
    """Indented JSON, keys in the order given, ASCII, newline-terminated: the bytes of every JSON
    file hexbundle writes for people and runtimes to read (bundle configs, manifest, reports)."""
    return (json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=True) + "\n").encode()


def write_json(path, obj) -> None:
    write_atomic(path, json_bytes(obj))


def swap_in(staging: Path, final: Path) -> None:
    """Replace `final` by `staging`: the old bundle stays whole until the new one is complete.

    Where the kernel can (Linux renameat2 RENAME_EXCHANGE), the two directories trade places in
    one step, so `final` is at every instant either the whole old or the whole new bundle.
    Elsewhere, two renames: a kill between them leaves the old bundle in .bundle-old.*, which the
    next run puts back (hexbundle.graph.runguard.restore_interrupted_swaps).
    """
    if not final.exists():
        os.rename(staging, final)
        return
    if exchange_dirs(staging, final):
        shutil.rmtree(staging)   # it now holds the old bundle
        return
    old = Path(tempfile.mkdtemp(dir=final.parent, prefix=".bundle-old."))
    os.rmdir(old)
    os.rename(final, old)
    os.rename(staging, final)
    shutil.rmtree(old)


_RENAME_EXCHANGE = 2


_AT_FDCWD = -100


def exchange_dirs(a: Path, b: Path) -> bool:
    """Atomically swap two paths; False where the OS or filesystem cannot (then nothing moved)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):   # not Linux, or a libc without renameat2 (< glibc 2.28)
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))
