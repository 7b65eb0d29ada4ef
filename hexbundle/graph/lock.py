"""The build lock: one run at a time in a build root.

fcntl.flock on build/.hexbundle/lock, held until the process ends, whatever way it ends; it
records the holder's pid and run id (support.run). A second run waits, saying for whom, up to
HEXBUNDLE_LOCK_TIMEOUT seconds (default 600; 0 = refuse at once), then refuses (LockBusy).
Taken by graph.runguard.guard_run for the commands that write; read-only ones never touch
it.
"""
from __future__ import annotations

import errno
import fcntl
import math
import os
import sys
import time
from pathlib import Path

from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import LinkedStateError, open_state, read_state, require_own_file
from hexbundle.support.run import run_id

LOCK_TIMEOUT_ENV = "HEXBUNDLE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 600.0
POLL_S = 0.2

_held = None   # the lock's open file: the lock lasts as long as this process


class LockBusy(HexbundleError):
    """Another hexbundle run holds the build directory."""


def lock_timeout() -> float:
    text = os.environ.get(LOCK_TIMEOUT_ENV, "")
    if not text.strip():
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise HexbundleError(f"environment variable {LOCK_TIMEOUT_ENV}={text!r}: expected a "
                             "finite number of seconds, 0 or more (0 = do not wait); unset it "
                             f"for the default ({DEFAULT_LOCK_TIMEOUT_S:.0f}s)")
    return value


def hold_lock(path: Path, root: Path) -> None:
    """Take the build lock, waiting for another run up to the timeout; LockBusy if it stays."""
    global _held
    if _held is not None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # Kept open for the life of the process (the lock lives with it); not truncated before we
    # hold the lock, so the holder's pid stays readable. O_NOFOLLOW: check_state_shapes refused
    # a link already, and one put there since is refused too, never written through.
    try:
        fd = open_state(path, os.O_RDWR | os.O_CREAT)
    except LinkedStateError:
        raise HexbundleError(f"{path}: hexbundle keeps a file there (the build lock), but it is "
                             "a symbolic link: move it away or remove it, then run again") \
            from None
    try:   # pid and run id are written into it: never into a file linked from elsewhere
        require_own_file(fd, path)
    except OSError as exc:
        os.close(fd)
        raise HexbundleError(f"{path}: hexbundle keeps its build lock there, but it is "
                             f"{exc.strerror}: remove it (no run holds a lock in such a file), "
                             "then run again") from None
    fh = os.fdopen(fd, "r+")
    timeout = lock_timeout()
    deadline = time.monotonic() + timeout
    announced = False
    while not _try_lock(fh):
        holder = _holder(path)
        where = rel(path.parent.parent, root)   # the build root, holding .hexbundle/
        if time.monotonic() >= deadline:
            fh.close()
            waited = f" after {timeout:.0f}s" if timeout else ""
            raise LockBusy(f"another hexbundle run (pid {holder}) is using {where}/ (lock "
                           f"{rel(path, root)}){waited}; wait for it to finish or stop it, or "
                           f"set {LOCK_TIMEOUT_ENV}=<seconds> to wait longer")
        if not announced:
            print(f"hexbundle: waiting for another hexbundle run (pid {holder}) on {where}/ "
                  f"(up to {timeout:.0f}s; {LOCK_TIMEOUT_ENV} sets it)", file=sys.stderr,
                  flush=True)
            announced = True
        time.sleep(POLL_S)
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()} {run_id()}\n")
    fh.flush()
    _held = fh


def _try_lock(fh) -> bool:
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def _holder(path: Path) -> str:
    """The pid the lock file records (before the run id)."""
    try:
        return (read_state(path).decode(errors="replace").split() or ["?"])[0]
    except OSError:
        return "?"


def rel(path: Path, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)

