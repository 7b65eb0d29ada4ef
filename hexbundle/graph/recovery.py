"""Recovery: what a killed run, an older hexbundle or a hand edit left in the build root.

Run under the build lock (graph.lock) by graph.runguard.guard_run, before doit opens the DB:
- hexbundle's own state where something of another kind stands is refused by name;
- the build root is claimed (a marker) only when it is new, empty or the project's build/:
  nothing in a directory that held other files is ever removed;
- the step containers of a killed run (docker executor), which outlive a kill -9 and would go
  on writing into the build root, are removed and waited for;
- a directory swap cut in half is undone (the previous bundle goes back), and the temp files
  and directories of our writers are removed: every writer takes its temp names from
  support.atomic, so one rule (is_temp_name) finds them all, and nothing else is removed;
- an unreadable or misshapen dependency DB, and the one DB of an older hexbundle, are set aside
  (every task then runs again) instead of stopping every later run;
- a bundle/ symlink is set aside, and output directories linked out of the build root refused.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

from hexbundle.config.layout import DB_DIR, STATE_DIR
from hexbundle.support.atomic import aside_name, atomic_output, discard, is_temp_name, put_back
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import kind_of
from hexbundle.support.jsondoc import read_state_json


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
        doc = read_state_json(marker)   # never through a symbolic link
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


def rel(path: Path, root: Path) -> str:
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
    return remove_leftovers(layout, notice)


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
                notice(f"put back the previous {rel(final, root)} (a run was killed while "
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
        listed = ", ".join(rel(p, root) for p in removed[:5])
        more = f" and {len(removed) - 5} more" if len(removed) > 5 else ""
        notice(f"removed {len(removed)} temporary file(s) left by an interrupted run: "
                f"{listed}{more}")
    return removed


def notice(msg: str) -> None:
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
    where = rel(db, root)
    if db.is_symlink() or not db.is_file():
        aside = _aside(db, "damaged")
        os.replace(db, aside)
        kind = "a symlink" if aside.is_symlink() else "a directory" if aside.is_dir() else \
            "not a regular file"
        notice(f"{where} was {kind}, not hexbundle's DB; set aside as {aside.name}: every task "
                "runs again this time")
        return aside
    try:
        data = read_state_json(db)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        data = None
    if isinstance(data, dict) and all(_record_ok(v) for v in data.values()):
        return None
    aside = _aside(db, "damaged")
    if not isinstance(data, dict):
        os.replace(db, aside)
        notice(f"{where} was unreadable (damaged outside hexbundle?); set aside as "
                f"{aside.name}: every task runs again this time")
        return aside
    bad = sorted(k for k, v in data.items() if not _record_ok(v))
    shutil.copy2(db, aside)
    with atomic_output(db, "w", user_errors=False) as fh:
        json.dump({k: v for k, v in data.items() if k not in bad}, fh)
    notice(f"{where} had {len(bad)} record(s) of the wrong shape ({', '.join(bad[:3])}"
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
    notice(f"{rel(bundle, root)} was a symlink (to {os.readlink(aside)}), not a directory; "
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
    notice(f"{rel(db, root)} is the one dependency DB of an older hexbundle, set aside as "
            f"{aside.name}: each variant (model, device, plan, backend) now keeps its own under "
            f"{rel(db.parent / DB_DIR, root)}/, and its outputs in <model>/<device>/<plan>/"
            "<backend>/ of the build root; the former <model>/<device>/{dlc,bin,bundle,logs} are "
            "no longer used (delete them). Every step runs once more")
    return aside

