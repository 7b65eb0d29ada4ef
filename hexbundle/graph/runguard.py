"""What makes a `doit` run safe to kill, to interrupt and to start twice.

Called once when dodo.py loads (hexbundle.graph.session.load), for every command that may run
tasks or change the dependency DB (all but list, help, info, dumpdb, tabcompletion):

1. A lock on the build directory (fcntl.flock on build/.hexbundle/lock, held until the process
   ends, whatever way it ends; it records the holder's pid and run id, support.run). A second
   run waits, saying for whom, up to HEXBUNDLE_LOCK_TIMEOUT seconds (default 600; 0 = refuse at
   once), then refuses.
2. Clean-up after a run that was killed: first its step containers (docker executor), which
   outlive a kill -9 of the run and would go on writing into the build root, are removed and
   waited for (steps.docker_executor.remove_leftovers); then a directory swap cut in half is
   undone (the previous bundle goes back), and the temp files and directories of our writers
   are removed. Every writer takes its temp names from hexbundle.support.atomic, so one rule
   (is_temp_name) finds them all, and nothing else is removed. Only under the lock: a live
   run's temp files and containers are never touched.
3. The dependency DB is hexbundle's doit backend (graph.db): written atomically (temp, fsync,
   rename) instead of in place, and after every task that succeeds rather than only at the end
   of the run, so a killed run keeps the work it finished. A DB that is nevertheless unreadable
   is set aside here (every task then runs again) instead of stopping every later run. Each
   variant has a DB of its own, and the model's own steps (inputs) keep their records in the
   model's DB: copied into the variant's here, before doit opens it, written back by a save that
   changed them (graph.db; graph.variants says why).
4. Ctrl-C ends the run with one line, not a traceback; so does SIGTERM (kill, systemd, a CI
   runner's timeout), which is raised as Ctrl-C is (Terminated, a KeyboardInterrupt): every
   writer's temp file is removed on the way out, the step containers too, and the run exits
   143 (128 + SIGTERM).
"""
from __future__ import annotations

import errno
import fcntl
import getopt
import json
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Optional

from hexbundle.config.layout import DB_DIR, DOIT_DB, STATE_DIR
from hexbundle.graph.db import pair_with_model, save_file
from hexbundle.graph.variants import seeded, split_records
from hexbundle.support.atomic import aside_name, atomic_output, discard, is_temp_name, put_back
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import (LinkedStateError, kind_of, open_state, read_state,
                                     require_own_file)
from hexbundle.support.run import run_id

LOCK_TIMEOUT_ENV = "HEXBUNDLE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 600.0
POLL_S = 0.2
# doit commands that neither run tasks nor write the DB: no lock, no clean-up.
READ_ONLY_COMMANDS = {"list", "help", "info", "dumpdb", "tabcompletion", "--help", "--version"}
RUN_READ_ONLY_FLAGS = {"--dry-run", "--help", "-h"}   # graph.commands.Run
RUN_FLAGS = RUN_READ_ONLY_FLAGS | {"--explain"}       # every flag graph.commands.Run adds

_held = None   # the lock's open file: the lock lasts as long as this process


class LockBusy(HexbundleError):
    """Another hexbundle run holds the build directory."""


# ---------------------------------------------------------------------------------------------
# entry point

def command_name(argv: list) -> str:
    """The argument doit takes its command from (doit 0.37, DoitMain.run): the first one after
    the dodo-finding options (-f FILE, -d DIR, -k, which may come first) and the `key=value`
    variables; "" if none. Not one of doit's commands means `run`."""
    try:
        _, args = getopt.getopt(argv[1:], "f:d:k", ["file=", "dir=", "seek-file"])
    except getopt.GetoptError:   # doit then looks at the arguments as given
        args = argv[1:]
    args = [a for a in args if a.startswith("-") or "=" not in a]
    return args[0] if args else ""


def command_writes(argv: list) -> bool:
    """Anything but a read-only command means a run (or a command that writes the DB). A run
    with --dry-run or a task's --help (graph.commands) runs nothing and writes nothing."""
    if any(arg in RUN_READ_ONLY_FLAGS for arg in argv[1:]):
        return False
    return command_name(argv) not in READ_ONLY_COMMANDS


def guard_run(layout, argv: list, db_name: str = DOIT_DB) -> None:
    """Everything above, for this doit process (a no-op for read-only commands). `db_name`: the
    DB file of the run's checker (doit-db-md5.json for `doit bench`'s baseline)."""
    if not command_writes(argv):
        return
    root, build = layout.root, layout.build_root
    report_interrupts_cleanly()   # first: Ctrl-C while waiting for the lock is clean too
    check_state_shapes(layout)
    owned = claim_build_root(layout)   # before the lock creates .hexbundle/ in it
    hold_lock(layout.lock, root)
    remove_leftover_containers(layout)   # first: nothing of the killed run writes any more
    if owned:
        restore_interrupted_swaps(build, root)
        sweep_temp_files(build, root)
    else:
        _notice(f"{build} is not a build root hexbundle made (it held other files when first "
                f"used, and no {_rel(layout.root_marker, root)} written for it): nothing in it is cleaned "
                "up after an interrupted run; use a new or empty directory as the build root")
    set_aside_former_db(layout.former_doit_db, root)
    variant_db, model_db = layout.doit_db(db_name), layout.model_db(db_name)
    set_aside_damaged_db(model_db, root)
    set_aside_damaged_db(variant_db, root)
    seed_variant_db(variant_db, model_db)
    bundle = getattr(layout, "bundle_dir", None)
    if bundle is not None:
        set_aside_bundle_link(bundle, root)
        refuse_linked_output_dirs(layout)


# ---------------------------------------------------------------------------------------------
# 0. whose build root, and hexbundle's state in it

def check_state_shapes(layout) -> None:
    """hexbundle's own state where something of another kind stands (the lock a directory, the
    DB or container records a file): a message naming it and what to do, never a traceback.
    Nothing is removed: it may be the user's. A symbolic link is refused wherever a directory of
    the state or a file written in place stands (it would take hexbundle's writes outside the
    build root): the state directory, the lock, the marker, and every directory on the way to
    the variant's DB (db/<model>/<device>/<plan>/<backend>/); the files replaced whole (the DBs,
    the caches) are set aside when they are links (set_aside_damaged_db, support.hashing,
    graph.codekey)."""
    expected = [(layout.build_root, "a directory"), (layout.state_dir, "a directory"),
                (layout.lock, "a file"), (layout.root_marker, "a file"),
                (layout.db_dir, "a directory"), (layout.containers_dir, "a directory")]
    expected += [(path, "a directory") for path in _db_dirs(layout)]
    for path, kind in expected:
        if not os.path.lexists(path):
            continue
        is_dir = path.is_dir() and not path.is_symlink()
        link = kind == "a file" and path.is_symlink()   # the lock is written: never through one
        if link or (kind == "a directory") != is_dir or (kind == "a file" and not path.is_file()):
            found = ("a symbolic link" if path.is_symlink() else "a directory" if is_dir
                     else "a file" if path.is_file() else "not a regular file")
            raise HexbundleError(f"{path}: hexbundle keeps {kind} there ({_purpose(layout, path)})"
                                 f", but it is {found}: move it away or remove it, then run again")


def _db_dirs(layout) -> list:
    """The directories under db/ that hold the variant's DB and its model's: db/<model>/,
    db/<model>/<device>/, ... (none for a layout of the project alone)."""
    variant = getattr(layout, "variant", None) if getattr(layout, "cfg", None) else None
    return [layout.db_dir.joinpath(*variant[:n]) for n in range(1, len(variant) + 1)] \
        if variant else []


def _purpose(layout, path: Path) -> str:
    if path in _db_dirs(layout):
        return "the dependency DBs"
    return {layout.build_root: "the build root", layout.state_dir: "hexbundle's state",
            layout.lock: "the build lock", layout.db_dir: "the dependency DBs",
            layout.root_marker: "the mark of a build root hexbundle made",
            layout.containers_dir: "the records of the step containers"}[path]


def root_identity(build: Path) -> dict:
    """What the marker records of the build root it marks: its path, device and inode."""
    st = os.stat(build)
    return {"path": str(build), "device": st.st_dev, "inode": st.st_ino}


def marker_matches(marker: Path, build: Path) -> bool:
    """The marker was written for this very directory: a copy of it (into a shared directory,
    another disk) or a directory moved or recreated under the same name does not vouch."""
    try:
        doc = json.loads(read_state(marker))   # never through a symbolic link
        return isinstance(doc, dict) and doc.get("root") == root_identity(build)
    except (OSError, ValueError, RecursionError):
        return False


def claim_build_root(layout) -> bool:
    """True if the build root is hexbundle's own, so the clean-up may walk it: it carries the
    marker written for it (layout.root_marker, naming its path, device and inode), or it is the
    project's build/ (or inside it), or it is new or empty now (then the marker is written). A
    directory that already held other files (a shared scratch directory) is never claimed,
    whatever marker was copied into it: nothing in it is removed."""
    from hexbundle.support.atomic import write_json
    build, marker = layout.build_root, layout.root_marker
    if build.is_dir() and marker_matches(marker, build):
        return True
    default = layout.root / "build"
    ours = build == default or default in build.parents
    if not ours:
        try:
            ours = all(entry.name == STATE_DIR for entry in build.iterdir())
        except FileNotFoundError:
            ours = True
        except OSError:
            return False
    if ours:
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_json(marker, {"hexbundle": "build root", "project": str(layout.root),
                            "root": root_identity(build),
                            "claimed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return ours


# ---------------------------------------------------------------------------------------------
# 1. the lock

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


def remove_leftover_containers(layout) -> list:
    """The step containers a killed run left (steps.docker_executor.remove_leftovers)."""
    if getattr(layout, "cfg", None) is None:
        return []
    from hexbundle.steps.docker_executor import remove_leftovers
    return remove_leftovers(layout, _notice)


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

_aside = aside_name   # a free name beside a file to move it to (support.atomic)


def set_aside_damaged_db(db: Path, root: Path) -> Optional[Path]:
    """doit refuses to start on an unreadable DB, and stops with a traceback on an entry that
    is not a task record: set such a DB aside (what is left of it, the well-formed records, is
    kept) so the run carries on, rebuilding what it must. Anything but a regular file there
    (a directory, say) is moved aside as it is. Returns where the damaged one went, or None."""
    if not (db.exists() or db.is_symlink()):
        return None
    where = _rel(db, root)
    if db.is_symlink() or not db.is_file():
        aside = _aside(db, "damaged")
        os.replace(db, aside)
        kind = "a symlink" if aside.is_symlink() else "a directory" if aside.is_dir() else \
            "not a regular file"
        _notice(f"{where} was {kind}, not hexbundle's DB; set aside as {aside.name}: every task "
                "runs again this time")
        return aside
    try:
        data = json.loads(read_state(db))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        data = None
    if isinstance(data, dict) and all(_record_ok(v) for v in data.values()):
        return None
    aside = _aside(db, "damaged")
    if not isinstance(data, dict):
        os.replace(db, aside)
        _notice(f"{where} was unreadable (damaged outside hexbundle?); set aside as "
                f"{aside.name}: every task runs again this time")
        return aside
    bad = sorted(k for k, v in data.items() if not _record_ok(v))
    shutil.copy2(db, aside)
    with atomic_output(db, "w", user_errors=False) as fh:
        json.dump({k: v for k, v in data.items() if k not in bad}, fh)
    _notice(f"{where} had {len(bad)} record(s) of the wrong shape ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}); the DB was set aside as {aside.name} and "
            "those tasks run again")
    return aside


def _record_ok(record) -> bool:
    """A task's record as doit reads it: an object; its values (`_values_:`) an object, its
    dependencies (`deps:`) a list of names. (File states of another shape are the checker's to
    judge: XXH3Checker takes them as changed.)"""
    if not isinstance(record, dict):
        return False
    deps = record.get("deps:", [])
    return (isinstance(record.get("_values_:", {}), dict) and isinstance(deps, list)
            and all(isinstance(d, str) for d in deps))


def refuse_linked_output_dirs(layout) -> None:
    """The directories steps write into are inside the build root, every component of them: a
    symlink on the way (bin/ linked elsewhere, say) would send outputs outside it, where nothing
    of hexbundle's clean-up or locking reaches; and each is a directory (dlc/ a file: the step
    could not make it). Named, with what to do; nothing is followed nor removed."""
    build = layout.build_root
    for directory in (layout.inputs_dir, layout.dlc_dir, layout.bin_dir, layout.logs_dir,
                      layout.origins_dir, layout.verify_report.parent):
        try:
            parts = directory.relative_to(build).parts
        except ValueError:
            continue   # not under the build root (an export's own directory): not ours
        path = build
        for part in parts:
            path = path / part
            if path.is_symlink():
                raise HexbundleError(
                    f"{path}: a symbolic link (to {os.readlink(path)}) where hexbundle writes "
                    f"its outputs: they would land outside the build root {build}. Replace it "
                    "by a directory (or set HEXBUNDLE_BUILD_ROOT to the disk it points to)")
            if os.path.lexists(path) and not path.is_dir():   # dlc/ a file: mkdir would fail
                raise HexbundleError(
                    f"{path}: hexbundle keeps a directory there (its outputs), but it is "
                    f"{kind_of(os.lstat(path).st_mode)}: move it away or remove it, then run "
                    "again")


def set_aside_bundle_link(bundle: Path, root: Path) -> Optional[Path]:
    """bundle/ is a directory hexbundle replaces whole; a symlink there (made by hand) would be
    swapped out from under its target. Move the link aside (its target is left alone) so the
    bundle is built again as a directory."""
    if not bundle.is_symlink():
        return None
    aside = _aside(bundle, "link")
    os.replace(bundle, aside)
    _notice(f"{_rel(bundle, root)} was a symlink (to {os.readlink(aside)}), not a directory; "
            f"set aside as {aside.name}: the bundle is assembled again")
    return aside


def set_aside_former_db(db: Path, root: Path) -> Optional[Path]:
    """hexbundle kept one DB per build root (.hexbundle/doit-db.json) before variants were kept
    side by side; nothing reads it now. Set it aside with one line, saying where the state and the
    outputs are now, so it is not mistaken for the state of a build."""
    if not (db.exists() or db.is_symlink()):
        return None
    aside = _aside(db, "former")
    os.replace(db, aside)
    _notice(f"{_rel(db, root)} is the one dependency DB of an older hexbundle, set aside as "
            f"{aside.name}: each variant (model, device, plan, backend) now keeps its own under "
            f"{_rel(db.parent / DB_DIR, root)}/, and its outputs in <model>/<device>/<plan>/"
            "<backend>/ of the build root; the former <model>/<device>/{dlc,bin,bundle,logs} are "
            "no longer used (delete them). Every step runs once more")
    return aside


def seed_variant_db(variant_db: Path, model_db: Path) -> None:
    """Give doit the model's steps' records in the variant's DB before it opens it (graph.variants):
    a variant built for the first time finds the model's inputs up to date. The variant's file
    keeps a copy of them, so it is rewritten only when another variant changed them. Both files
    were checked by set_aside_damaged_db just before."""
    model, variant = _read_db(model_db), _read_db(variant_db)
    records = seeded(variant, model)
    if records != variant:
        save_file(variant_db, lambda: json.dumps(records))
    pair_with_model(variant_db, model_db, split_records(model)[0])


def seeded_view(backend, layout, db_name: str = DOIT_DB) -> None:
    """The seeding of seed_variant_db, in memory only (doit's DB backend, through its set and
    remove): what `doit --dry-run` reads, writing nothing."""
    variant = _read_db(layout.doit_db(db_name))
    records = seeded(variant, _read_db(layout.model_db(db_name)))
    for task in set(variant) - set(records):
        backend.remove(task)
    for task, record in records.items():
        for key, value in record.items():
            backend.set(task, key, value)


def _read_db(db: Path) -> dict:
    """A DB's records; {} if there is none, or if it is a symbolic link (never read: a run sets
    it aside first; `doit --dry-run` takes it as empty)."""
    try:
        return json.loads(read_state(db))
    except (FileNotFoundError, LinkedStateError):
        return {}


# ---------------------------------------------------------------------------------------------
# 4. Ctrl-C

class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: it unwinds the run, so every temp file is removed."""


def _terminate(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # once: the clean-up is not cut short
    raise Terminated()


def report_interrupts_cleanly() -> None:
    if getattr(sys.excepthook, "hexbundle", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        if issubclass(kind, Terminated):
            print("\nhexbundle: terminated (SIGTERM); temporary files removed, the steps that "
                  "finished are saved and the next `doit bundle` carries on from there",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(128 + signal.SIGTERM)   # as a process killed by it reports (143)
        if issubclass(kind, KeyboardInterrupt):
            print("\nhexbundle: interrupted; the steps that finished are saved and the next "
                  "`doit bundle` carries on from there", file=sys.stderr, flush=True)
            return
        previous(kind, value, tb)

    hook.hexbundle = True
    sys.excepthook = hook
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:   # not one a caller set
        signal.signal(signal.SIGTERM, _terminate)
