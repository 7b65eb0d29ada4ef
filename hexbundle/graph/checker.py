"""doit's file checkers: hexbundle's XXH3 checker, and doit's stock MD5 checker for `doit bench`.

Why not doit's stock MD5 checker for builds: MD5 runs at ~0.5 GiB/s (a 30 GB model costs a
minute per check); it re-hashes a file once per task that reads it; and since up-to-date tasks
never refresh their stored state, a file that was merely touched is re-hashed on every later
run. XXH3Checker asks the shared digest cache (support.hashing): one hash per change of bytes.
"""
from __future__ import annotations

import os
import sys

from doit.dependency import FileChangedChecker, MD5Checker

from hexbundle.config.layout import MD5_DOIT_DB
from hexbundle.support import hashing
from hexbundle.support.hashing import TRACE_ENV


class XXH3Checker(FileChangedChecker):
    """doit checker: stat fast path, then XXH3-128 through the shared digest cache.

    State saved per (task, file): [size, mtime_ns, ctime_ns, inode, recorded_ns, digest] (a list:
    it goes through JSON); a stat match is trusted only if recorded after the file's last tick
    (hashing.racy). A state of another shape (another checker's) counts as changed.
    """

    def check_modified(self, file_path, file_stat, state):
        return hashing.state_changed(file_path, file_stat, state)

    def get_state(self, dep, current_state):
        new = hashing.file_state(dep)
        if (isinstance(current_state, list) and len(current_state) == 6
                and current_state[:4] == new[:4] and current_state[5] == new[5]
                and not hashing.racy(os.stat(dep), current_state[4])):
            return None   # unchanged and trusted: keep it (no DB write)
        return new


class TracedMD5Checker(MD5Checker):
    """doit's stock MD5Checker, its decisions unchanged (each call is MD5Checker's), with the
    files it MD5-hashes recorded in $HEXBUNDLE_HASH_TRACE, as ours records its digests (the bench
    counts what each checker hashed). A subclass, not a patch of doit: the trace names a file
    where MD5Checker's method is about to hash it, by MD5Checker's own conditions (doit 0.37;
    tests/test_doit_extension.py checks the trace against doit's get_file_md5 calls). Used for
    every run of the comparison, traced or not: doit records the checker's class name and reruns
    every task when it changes."""

    def check_modified(self, file_path, file_stat, state):
        try:
            timestamp, size, _ = state
        except (TypeError, ValueError):   # not MD5Checker's state: doit's own error, below
            timestamp, size = file_stat.st_mtime, None
        if file_stat.st_mtime != timestamp and file_stat.st_size == size:
            _trace(file_path)
        return super().check_modified(file_path, file_stat, state)

    def get_state(self, dep, current_state):
        if not (current_state and current_state[0] == os.path.getmtime(dep)):
            _trace(dep)
        return super().get_state(dep, current_state)


def _trace(path) -> None:
    trace = os.environ.get(TRACE_ENV)
    if trace:
        with open(trace, "a") as fh:
            fh.write(os.path.abspath(path) + "\n")


def comparison_checker(name: str):
    """(checker, DB file name) for HEXBUNDLE_BENCH_CHECKER: doit's stock MD5 checker, unchanged,
    with its hashing recorded in $HEXBUNDLE_HASH_TRACE like ours (to count what it hashes)."""
    if name != "md5":
        print(f"hexbundle: HEXBUNDLE_BENCH_CHECKER={name!r}: the only comparison checker is "
              "'md5' (doit's stock MD5Checker); unset it for builds", file=sys.stderr)
        sys.exit(3)
    return TracedMD5Checker, MD5_DOIT_DB


def stock_checker():
    """doit's stock MD5 checker (the bench's digest row compares ours with it)."""
    return MD5Checker
