"""What makes a `doit` run safe to kill, to interrupt and to start twice.

Called once when dodo.py loads (hexbundle.graph.session.load), for every command that may run
tasks or change the dependency DB (all but list, help, info, dumpdb, tabcompletion):

1. A lock on the build directory (fcntl.flock on build/.hexbundle/lock, held until the process
   ends, whatever way it ends). A second run waits, saying for whom, up to
   HEXBUNDLE_LOCK_TIMEOUT seconds (default 600; 0 = refuse at once), then refuses.
2. Clean-up after a run that was killed: a directory swap cut in half is undone (the previous
   bundle goes back), and the temp files and directories of our writers are removed. Every
   writer takes its temp names from hexbundle.support.atomic, so one rule (is_temp_name) finds
   them all, and nothing else is removed. Only under the lock: a live run's temp files are
   never touched.
3. The dependency DB (doit's JSON backend) is written atomically (temp, fsync, rename) instead
   of in place, and after every task that succeeds rather than only at the end of the run, so
   a killed run keeps the work it finished. A DB that is nevertheless unreadable is set aside
   (every task then runs again) instead of stopping every later run.
4. Ctrl-C ends the run with one line, not a traceback.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

from hexbundle.config.layout import STATE_DIR
from hexbundle.support.atomic import atomic_output, discard, is_temp_name, put_back
from hexbundle.support.errors import HexbundleError

LOCK_TIMEOUT_ENV = "HEXBUNDLE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 600.0
POLL_S = 0.2
# doit commands that neither run tasks nor write the DB: no lock, no clean-up.
READ_ONLY_COMMANDS = {"list", "help", "info", "dumpdb", "tabcompletion", "--help", "--version"}

_held = None   # the lock's open file: the lock lasts as long as this process


class LockBusy(HexbundleError):
    """Another hexbundle run holds the build directory."""


# ---------------------------------------------------------------------------------------------
# entry point

def command_writes(argv: list) -> bool:
    """doit takes its command from the first argument only; anything else means `run`."""
    return (argv[1] if len(argv) > 1 else "") not in READ_ONLY_COMMANDS


def guard_run(layout, argv: list) -> None:
    """Everything above, for this doit process (a no-op for read-only commands)."""
    if not command_writes(argv):
        return
    root, build = layout.root, layout.build_root
    report_interrupts_cleanly()   # first: Ctrl-C while waiting for the lock is clean too
    hold_lock(layout.lock, root)
    restore_interrupted_swaps(build, root)
    sweep_temp_files(build, root)
    set_aside_damaged_db(layout.doit_db(), root)
    make_doit_db_durable()


# ---------------------------------------------------------------------------------------------
# 1. the lock

def lock_timeout() -> float:
    text = os.environ.get(LOCK_TIMEOUT_ENV, "")
    if not text:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise HexbundleError(f"environment variable {LOCK_TIMEOUT_ENV}={text!r}: expected a "
                             "number of seconds (0 = do not wait)") from None
    return max(value, 0.0)


def hold_lock(path: Path, root: Path) -> None:
    """Take the build lock, waiting for another run up to the timeout; LockBusy if it stays."""
    global _held
    if _held is not None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # Kept open for the life of the process (the lock lives with it); "a+" never truncates before
    # we hold the lock, so the holder's pid stays readable.
    fh = open(path, "a+")  # noqa: SIM115
    timeout = lock_timeout()
    deadline = time.monotonic() + timeout
    announced = False
    while not _try_lock(fh):
        holder = _holder(path)
        where = _rel(path.parent.parent, root)   # the build root, holding .hexbundle/
        if time.monotonic() >= deadline:
            fh.close()
            waited = f" after {timeout:.0f}s" if timeout else ""
            raise LockBusy(f"another hexbundle run (pid {holder}) is using {where}/ (lock "
                           f"{_rel(path, root)}){waited}; wait for it to finish or stop it, or "
                           f"set {LOCK_TIMEOUT_ENV}=<seconds> to wait longer")
        if not announced:
            print(f"hexbundle: waiting for another hexbundle run (pid {holder}) on {where}/ "
                  f"(up to {timeout:.0f}s; {LOCK_TIMEOUT_ENV} sets it)", file=sys.stderr,
                  flush=True)
            announced = True
        time.sleep(POLL_S)
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
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
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"


def _rel(path: Path, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------
# 2. clean-up after a killed run

def _own_tree(build: Path):
    """os.walk of this build root, minus nested build roots (a release's scratch build has its
    own .hexbundle/ and lock, and its own runs clean it)."""
    for dirpath, dirnames, filenames in os.walk(build):
        dirnames[:] = [d for d in dirnames if not Path(dirpath, d, STATE_DIR).is_dir()]
        yield Path(dirpath), dirnames, filenames


def restore_interrupted_swaps(build: Path, root: Path) -> list:
    """A run killed between the two renames of a directory swap (support.atomic.swap_in: the
    bundle, the offline kit) leaves no <dir> but the whole previous one in
    .<dir>.<pid>.<token>.old: put it back. Returns the restored directories."""
    restored = []
    if not build.is_dir():
        return restored
    for dirpath, dirnames, _ in _own_tree(build):
        for name in sorted(dirnames):
            final = put_back(dirpath / name)
            if final is not None:
                restored.append(final)
                _notice(f"put back the previous {_rel(final, root)} (a run was killed while "
                        "replacing it)")
    return restored


def sweep_temp_files(build: Path, root: Path) -> list:
    """Remove what our writers leave when killed: every file or directory with a temp name
    (support.atomic.is_temp_name: staging and scratch directories, half-written files, a
    previous directory already replaced).

    Returns the removed paths. Nothing else under build/ is touched.
    """
    removed = []
    if not build.is_dir():
        return removed
    for dirpath, dirnames, filenames in _own_tree(build):
        for name in list(dirnames):
            if is_temp_name(name):
                discard(dirpath / name)
                dirnames.remove(name)
                removed.append(dirpath / name)
        for name in filenames:
            if is_temp_name(name):
                discard(dirpath / name)
                removed.append(dirpath / name)
    if removed:
        listed = ", ".join(_rel(p, root) for p in removed[:5])
        more = f" and {len(removed) - 5} more" if len(removed) > 5 else ""
        _notice(f"removed {len(removed)} temporary file(s) left by an interrupted run: "
                f"{listed}{more}")
    return removed


def _notice(msg: str) -> None:
    print(f"hexbundle: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# 3. the dependency DB

def set_aside_damaged_db(db: Path, root: Path) -> Optional[Path]:
    """doit refuses to start on an unreadable DB; set it aside so the run rebuilds instead."""
    if not db.is_file():
        return None
    try:
        ok = isinstance(json.loads(db.read_text()), dict)
    except (OSError, ValueError, UnicodeDecodeError):
        ok = False
    if ok:
        return None
    aside = db.with_name(db.name + ".damaged")
    os.replace(db, aside)
    _notice(f"{_rel(db, root)} was unreadable (damaged outside hexbundle?); set aside as "
            f"{aside.name}: every task runs again this time")
    return aside


def atomic_dump(self) -> None:
    """doit's JsonDB.dump, but temp + fsync + rename: a kill never leaves half a DB."""
    with atomic_output(self.name, "w", user_errors=False) as fh:
        fh.write(self.codec.encode(self._db))


def make_doit_db_durable() -> None:
    """Write doit's JSON DB atomically (doit 0.37 opens it with 'w' and writes in place)."""
    from doit.dependency import JsonDB
    JsonDB.dump = atomic_dump


def save_progress() -> None:
    """Persist the DB now (after each successful task): a killed run keeps its finished work."""
    from doit.dependency import JsonDB
    from doit.globals import Globals
    manager = Globals.dep_manager
    backend = getattr(manager, "backend", None)
    if isinstance(backend, JsonDB) and JsonDB.dump is atomic_dump:
        backend.dump()


# ---------------------------------------------------------------------------------------------
# 4. Ctrl-C

def report_interrupts_cleanly() -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):
            print("\nhexbundle: interrupted; the steps that finished are saved and the next "
                  "`doit bundle` carries on from there", file=sys.stderr, flush=True)
            return
        previous(kind, value, tb)

    sys.excepthook = hook
