"""doit's file checkers: hexbundle's XXH3 checker, and doit's stock MD5 checker for `doit bench`.

Why not doit's stock MD5 checker for builds: MD5 runs at ~0.5 GiB/s (a 30 GB model costs a
minute per check); it re-hashes a file once per task that reads it; and since up-to-date tasks
never refresh their stored state, a file that was merely touched is re-hashed on every later
run. XXH3Checker asks the shared digest cache (support.hashing): one hash per change of bytes.
"""
from __future__ import annotations

import os
import sys

from doit.dependency import FileChangedChecker

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


def comparison_checker(name: str):
    """(checker, DB file name) for HEXBUNDLE_BENCH_CHECKER: doit's stock MD5 checker, unchanged,
    with its hashing recorded in $HEXBUNDLE_HASH_TRACE like ours (to count what it hashes)."""
    if name != "md5":
        print(f"hexbundle: HEXBUNDLE_BENCH_CHECKER={name!r}: the only comparison checker is "
              "'md5' (doit's stock MD5Checker); unset it for builds", file=sys.stderr)
        sys.exit(3)
    from doit import dependency
    if os.environ.get(TRACE_ENV) and not getattr(dependency.get_file_md5, "traced", False):
        original = dependency.get_file_md5

        def get_file_md5(path):
            with open(os.environ[TRACE_ENV], "a") as fh:
                fh.write(os.path.abspath(path) + "\n")
            return original(path)
        get_file_md5.traced = True
        dependency.get_file_md5 = get_file_md5   # MD5Checker looks it up at call time
    return dependency.MD5Checker, MD5_DOIT_DB


def stock_checker():
    """doit's stock MD5 checker (the bench's digest row compares ours with it)."""
    from doit.dependency import MD5Checker
    return MD5Checker
