"""A no-op run's stamp: `doit bundle` run again on a tree where nothing it reads has changed
says so from one stat of each file it read, as ninja and make do, instead of resolving the
config, making every task and checking every key again (issue 51, bench row 2).

A run that ended with every selected step up to date (nothing built, nothing failed) writes
the stamp, build/.hexbundle/noop/<command>.json: the command (its arguments, the working
directory, the interpreter and the environment) and the stat (mtime_ns, size, inode, ctime_ns;
None for a missing file) of everything its up-to-date decision read:

  every task's file_dep and targets, and the directories holding them (a file added or
  removed changes its directory); the bundle directory's tree (bundle_in_place lists it);
  the project's configs/ tree, dodo.py and pyproject.toml, the hexbundle package's tree and
  doit's where they are imported from (the step keys are made of the config and the code,
  doit decides); the dependency DBs (doit's records, graph.db).

The same command finds its stamp, and when every stat is the same it prints the run's banner
and summary again and exits: nothing it read can have changed. Any difference (a touched
input, an edited config or module, another setting or environment variable, a `doit forget`)
and the run goes the full way. Every run that may write removes the stamps first
(graph.session.start_guard), so a stamp never outlives a run that changed something.

Written only where that list is every input of the decision: the local executor (no toolchain
image, whose ID the engine answers) and no remote cache or executor (whose answers are no file
here), without doit options (-n, --explain, ... print or decide otherwise), and not for the
bench's stock-doit baseline (HEXBUNDLE_BENCH_CHECKER: it measures doit as it comes). Every
backend: the files a toolchain version reads besides the code and configs/ are watched too
(backends.toolchain_files: ortqnn's kit pins), and the runtime files a bundle copies (the
ortqnn wheel, a local SDK's) are the bundle step's declared inputs. Other builds check
everything every run, as before. HEXBUNDLE_HASH_TRACE is left out of the environment: it names
where to list hashed files, and a no-op run hashes none.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

from hexbundle.support.hashing import TRACE_ENV

STAMP_DIR = "noop"
FORMAT = 1
CODE_FILES = ("dodo.py", "pyproject.toml")


def command_key(argv: list) -> dict:
    """What a stamp holds for: the command, where and with what it runs."""
    env = {k: v for k, v in os.environ.items() if k != TRACE_ENV}
    return {"argv": list(argv), "cwd": os.getcwd(), "python": sys.executable,
            "version": sys.version, "env": dict(sorted(env.items()))}


def _name(key: dict) -> str:
    from hexbundle.support.hashing import bytes_digest
    return bytes_digest(json.dumps(key, sort_keys=True).encode()) + ".json"


def stamp_dir(state_dir: Path) -> Path:
    return Path(state_dir) / STAMP_DIR


def _stat(path: Path):
    try:
        return os.stat(path, follow_symlinks=False)
    except OSError:
        return None


def stat_of(path: Path):
    s = _stat(path)
    return None if s is None else [s.st_mtime_ns, s.st_size, s.st_ino, s.st_ctime_ns]


def usable(argv: list) -> bool:
    """A plain `doit [settings] TASK...`: no doit option, which may print or decide otherwise."""
    return not any(arg.startswith("-") for arg in argv[1:])


def replay(state_dir: Path, argv: list, write=print) -> bool:
    """If this command's stamp holds (every stat the same), write its banner and summary again
    and return True; else False (the run goes the full way)."""
    import time
    started = time.monotonic()
    if not usable(argv):
        return False
    from hexbundle.support.errors import HexbundleError
    from hexbundle.support.jsondoc import read_state_json
    key = command_key(argv)
    path = stamp_dir(state_dir) / _name(key)
    try:
        doc = read_state_json(path)   # never through a link; within bounds
    except (OSError, ValueError, HexbundleError):
        return False
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("key") != key:
        return False
    stats, lines, summary = doc.get("stats"), doc.get("lines"), doc.get("summary")
    if not (isinstance(stats, dict) and isinstance(lines, list) and isinstance(summary, str)
            and all(isinstance(line, str) for line in lines)):
        return False
    if any(stat_of(Path(p)) != s for p, s in stats.items()):
        return False
    for line in lines:
        write(line)
    write(f"{summary}{time.monotonic() - started:.1f} s")
    return True


_held = {"off": False}


def record_none() -> None:
    """This run writes no stamp (graph.session: the bench's stock-doit baseline)."""
    _held["off"] = True


def forget(state_dir: Path) -> None:
    """A run that may write: every stamp goes (what it recorded may change)."""
    directory = stamp_dir(state_dir)
    if not directory.is_dir():
        return
    for path in directory.glob("*.json"):
        try:
            path.unlink()
        except OSError:
            pass


def watched(layout, tasks) -> list:
    """Everything the up-to-date decision of a run of `tasks` (doit's Task objects) reads (see
    the module docstring)."""
    from hexbundle.backends import toolchain_files
    paths = set(toolchain_files(layout.cfg.backend, layout.root))
    for task in tasks:
        for name in list(task.file_dep) + list(task.targets):
            path = Path(name) if Path(name).is_absolute() else layout.root / name
            paths.update((path, path.parent))
    import doit

    import hexbundle
    trees = [layout.root / "configs", Path(hexbundle.__file__).parent,
             Path(doit.__file__).parent, layout.bundle_dir, layout.db_dir]
    for tree in trees:
        if tree.is_dir():
            paths.add(tree)
            for dirpath, dirnames, filenames in os.walk(tree):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                paths.update(Path(dirpath, n) for n in dirnames + filenames)
    paths.update(layout.root / f for f in CODE_FILES)
    return sorted(paths)


def record(layout, tasks, argv: list, lines: list, summary: str) -> None:
    """After a run that built nothing: the stamp (a note: any failure to write it is silent,
    the next run checks everything)."""
    from hexbundle.support import hashing
    from hexbundle.support.atomic import write_json
    from hexbundle.support.errors import HexbundleError
    cfg = layout.cfg
    if (cfg.executor != "local" or cfg.remote.cache
            or cfg.remote.executor or not usable(argv) or summary is None or _held["off"]):
        return
    key = command_key(argv)
    recorded = hashing.now_ns()   # before the stats: a change after one is a change after this
    found = {str(p): _stat(p) for p in watched(layout, tasks)}
    # A file changed in the last clock tick could change again unseen by its stat (git's
    # "racy clean"): no stamp then; the next no-op run writes it.
    if any(s is not None and hashing.racy(s, recorded) for s in found.values()):
        return
    stats = {p: None if s is None else [s.st_mtime_ns, s.st_size, s.st_ino, s.st_ctime_ns]
             for p, s in found.items()}
    try:
        stamp_dir(layout.state_dir).mkdir(parents=True, exist_ok=True)
        write_json(stamp_dir(layout.state_dir) / _name(key),
                   {"format": FORMAT, "key": key, "lines": lines, "summary": summary,
                    "stats": stats})
    except (OSError, HexbundleError):   # a note: the next run checks everything
        pass


def summary_prefix(summary: str) -> Optional[str]:
    """The summary line without its elapsed time ("..., 0.1 s"), to say again with the replay's."""
    head, sep, _ = summary.rpartition(", ")
    return head + sep if sep else None
