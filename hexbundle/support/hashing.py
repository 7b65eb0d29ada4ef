"""Content digests: XXH3-128 of a file, sha256 for releases, and the persistent digest cache.

A file is hashed at most once per change of its bytes: the cache maps (path, size, mtime_ns,
inode) to the digest, shared by every task and every run (doit's checker built on it is
hexbundle.graph.checker).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Optional

import xxhash

from hexbundle.support.atomic import atomic_output

CHUNK = 1 << 20  # 1 MiB reads: xxh3 reaches ~15 GiB/s from page cache (8 KiB reads: ~4 GiB/s)

# Set to a file path to have every hashing recorded (one line per file): tests and the
# benchmark use it to show that a run hashed nothing.
TRACE_ENV = "HEXBUNDLE_HASH_TRACE"


def file_digest(path) -> str:
    """XXH3-128 of a file's bytes, hex. Streams with one reusable 1 MiB buffer."""
    h = xxhash.xxh3_128()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


def sha256_file(path) -> str:
    """sha256 of a file (releases, SHA256SUMS, pins: for interoperability; xxh3 stays the key)."""
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def new_hasher():
    """The project's content digest (xxh3-128), fed incrementally."""
    return xxhash.xxh3_128()


def bytes_digest(data: bytes) -> str:
    return xxhash.xxh3_128(data).hexdigest()


def stat_key(st: os.stat_result) -> list:
    # mtime in ns and the inode: an edit or a replace (write temp + rename) changes one of them.
    return [st.st_size, st.st_mtime_ns, st.st_ino]


class DigestCache:
    """path -> (stat key, digest), persisted as JSON; safe to share between threads."""

    def __init__(self, path: Optional[Path] = None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._entries = self._load()
        self.hashed = 0  # files hashed by this process (for reports and tests)
        self._save_failed = False

    def _load(self) -> dict:
        if not self.path or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # a damaged cache only costs re-hashing
        if not isinstance(data, dict):
            return {}
        # Entries of files that are gone (a bundle's staging directory) would pile up forever.
        return {k: v for k, v in data.items() if os.path.lexists(k)}

    def digest(self, path, st: Optional[os.stat_result] = None) -> str:
        key = os.path.abspath(path)
        st = st or os.stat(path)
        want = stat_key(st)
        with self._lock:
            entry = self._entries.get(key)
            if entry and entry[0] == want:
                return entry[1]
            linked = self._hard_link_digest(st, want)
            if linked is not None:
                self._entries[key] = [want, linked]
                self._save()
                return linked
        digest = file_digest(path)
        self._trace(key)
        with self._lock:
            self.hashed += 1
            self._entries[key] = [want, digest]
            self._save()
        return digest

    def _hard_link_digest(self, st: os.stat_result, want: list) -> Optional[str]:
        """The digest recorded under another name of the same file (the bundle's bins are hard
        links to bin/): same device and inode, same size and mtime -> same bytes, no re-hash."""
        for other, (key, digest) in self._entries.items():
            if key != want:
                continue
            try:
                if os.path.samestat(os.stat(other), st):
                    return digest
            except OSError:
                continue
        return None

    def _trace(self, key: str) -> None:
        trace = os.environ.get(TRACE_ENV)
        if trace:
            with open(trace, "a") as fh:
                fh.write(key + "\n")

    def _save(self) -> None:
        # Written after every new digest (small; tens of files) so a killed run keeps its work.
        if not self.path:
            return
        try:   # not fsynced (a lost cache only costs re-hashing); mode 0600, as always
            with atomic_output(self.path, "w", user_errors=False, sync=False, perms=0o600) as fh:
                json.dump(self._entries, fh, sort_keys=True)
        except OSError as exc:   # disk full: the digests stay in memory; later runs re-hash
            if not self._save_failed:
                self._save_failed = True
                print(f"hexbundle: warning: cannot save the digest cache {self.path} "
                      f"({exc.strerror}); unchanged files will be hashed again next run",
                      file=sys.stderr, flush=True)


_cache = DigestCache()


def use_cache(path: Path) -> DigestCache:
    """Point the process-wide cache at a file (graph.session for a doit run, steps.runner for a
step: the layout's digest_cache)."""
    global _cache
    if _cache.path != Path(path):
        _cache = DigestCache(path)
    return _cache


def cache() -> DigestCache:
    return _cache


def digest(path) -> str:
    """The digest of a file through the shared cache: hashed only if its bytes may have changed."""
    return _cache.digest(path)


