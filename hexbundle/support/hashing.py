"""Content digests: XXH3-128 of a file, sha256 for releases, and the persistent digest cache.

A file is hashed at most once per change of its bytes: the cache maps (path, size, mtime_ns,
ctime_ns, inode) to the digest, shared by every task and every run (doit's checker built on it is
hexbundle.graph.checker). A remote cache (hexbundle.remote) names blobs by SHA-256: the cache
keeps it beside the XXH3 (a fourth field of the entry), and one read of the bytes gives both
(`with_sha256`; `sha256` re-reads a file whose entry has the XXH3 only, once).

ctime is in the key because no user call can set it: an in-place edit of the same size followed by
`touch -r`, `cp -p` or `os.utime` restores the mtime, never the ctime. And a stat match is only
trusted for an entry recorded after the file's last change had left its timestamp tick (git's
"racy clean"): a second write in the same tick leaves size, mtime and ctime as they were.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import xxhash

from hexbundle.support.atomic import atomic_output, set_aside_link
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import LinkedStateError
from hexbundle.support.jsondoc import read_state_json

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


def file_digests(path) -> tuple:
    """(XXH3-128, SHA-256) of a file's bytes, hex, from one read."""
    xxh, sha = xxhash.xxh3_128(), hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            xxh.update(view[:n])
            sha.update(view[:n])
    return xxh.hexdigest(), sha.hexdigest()


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
    # An edit changes the ctime (whatever it does to the mtime); a replace (write temp + rename)
    # changes the inode.
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _coarse_tick_ns() -> int:
    try:   # Linux stamps files from the coarse clock: one tick of it (1-10 ms)
        res = time.clock_getres(time.CLOCK_REALTIME_COARSE)
    except (AttributeError, OSError):
        res = 0.0
    return max(int(res * 1e9), 10_000_000)


COARSE_TICK_NS = _coarse_tick_ns()
now_ns = time.time_ns   # the clock entries are recorded with (tests replace it)


def tick_ns(stamp_ns: int) -> int:
    """The timestamp granularity a file's times may have: 2 s when they are whole seconds (ext3,
    HFS+, FAT), else a tick of the coarse clock."""
    return 2_000_000_000 if stamp_ns % 1_000_000_000 == 0 else COARSE_TICK_NS


def racy(st, recorded_ns) -> bool:
    """True if an entry recorded at recorded_ns cannot vouch for the file's bytes by its stat: the
    file last changed in the same tick (or later), so a second same-size write in that tick would
    leave the stat as it was (git's "racy clean")."""
    changed = max(st.st_mtime_ns, st.st_ctime_ns)
    return not isinstance(recorded_ns, int) or recorded_ns < changed + tick_ns(changed)


def _valid_entry(entry) -> bool:
    """[[size, mtime_ns, ctime_ns, inode], digest, recorded_ns] (+ [sha256] when known)"""
    return (isinstance(entry, list) and len(entry) in (3, 4) and isinstance(entry[0], list)
            and len(entry[0]) == 4 and all(type(v) is int for v in entry[0])
            and isinstance(entry[1], str) and type(entry[2]) is int
            and (len(entry) == 3 or isinstance(entry[3], str) and len(entry[3]) == 64))


def _old_entry(entry) -> bool:
    """[[size, mtime_ns, inode], digest], written before ctime was in the key: hashed again."""
    return (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)
            and len(entry[0]) == 3 and all(type(v) is int for v in entry[0])
            and isinstance(entry[1], str))


class DigestCache:
    """path -> [stat key, digest, recorded_ns], persisted as JSON; safe to share between threads."""

    def __init__(self, path: Optional[Path] = None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._entries = self._load()
        self.hashed = 0  # files hashed by this process (for reports and tests)
        self._save_failed = False
        self.with_sha256 = False   # set while a remote cache is in use: every read gives both

    def _load(self) -> dict:
        if not self.path:
            return {}
        try:   # never through a symbolic link (support.files.read_state)
            data = read_state_json(self.path)
        except LinkedStateError:
            set_aside_link(self.path, "the digest cache", "files will be hashed again")
            return {}
        except OSError:
            return {}  # none, or unreadable: a lost cache only costs re-hashing
        except (ValueError, RecursionError):   # not JSON, or nested past the parser's depth
            data = None
        aside = self.path.with_name(self.path.name + ".set-aside")
        if not isinstance(data, dict):
            try:
                os.replace(self.path, aside)
                where = f"set aside as {aside}"
            except OSError as exc:
                where = f"ignored (cannot move it: {exc.strerror})"
            print(f"hexbundle: warning: the digest cache {self.path} is not a JSON object: "
                  f"{where}; files will be hashed again", file=sys.stderr, flush=True)
            return {}
        bad = {k: v for k, v in data.items() if not _valid_entry(v) and not _old_entry(v)}
        if bad:
            try:
                with atomic_output(aside, "w", user_errors=False, sync=False, perms=0o600) as fh:
                    json.dump(bad, fh, sort_keys=True)
                where = f"set aside in {aside}"
            except OSError as exc:
                where = f"dropped (cannot write {aside}: {exc.strerror})"
            print(f"hexbundle: warning: the digest cache {self.path}: {len(bad)} "
                  f"entr{'y' if len(bad) == 1 else 'ies'} of the wrong shape (first: "
                  f"{next(iter(bad))}) {where}; those files will be hashed again",
                  file=sys.stderr, flush=True)
        # Entries of files that are gone (a bundle's staging directory) would pile up forever.
        return {k: v for k, v in data.items() if _valid_entry(v) and os.path.lexists(k)}

    def digest(self, path, st: Optional[os.stat_result] = None) -> str:
        return self._entry(path, st, self.with_sha256)[1]

    def sha256(self, path, st: Optional[os.stat_result] = None) -> str:
        """The file's SHA-256 (hex), through the cache: read once per change of its bytes."""
        return self._entry(path, st, True)[3]

    def _entry(self, path, st: Optional[os.stat_result], sha256: bool) -> list:
        """The trusted entry of the file (hashed if its bytes may have changed, or if `sha256`
        is asked for and the entry has only the XXH3)."""
        key = os.path.abspath(path)
        st = st or os.stat(path)
        want = stat_key(st)
        with self._lock:
            entry = self._entries.get(key)
            if (entry and entry[0] == want and not racy(st, entry[2])
                    and (len(entry) == 4 or not sha256)):
                return entry
            linked = self._hard_link_digest(st, want)
            if linked is not None and (len(linked) == 4 or not sha256):
                self._entries[key] = linked
                self._save()
                return linked
        recorded = now_ns()
        changed = max(st.st_mtime_ns, st.st_ctime_ns)
        if racy(st, recorded) and tick_ns(changed) <= 50_000_000:
            # Just written: wait out its tick (a few ms), so the entry is not racy next run.
            time.sleep(max(0, changed + tick_ns(changed) - recorded) / 1e9)
            st = os.stat(path)
            want = stat_key(st)
            recorded = now_ns()
        entry = [want, *file_digests(path)] if sha256 else [want, file_digest(path)]
        entry.insert(2, recorded)
        self._trace(key)
        with self._lock:
            self.hashed += 1
            self._entries[key] = entry
            self._save()
        return entry

    def record(self, path, digest: str, sha256: str) -> None:
        """Enter the digests of a file this process just wrote and hashed while writing it (a
        blob fetched from a remote cache): the file is not read again. Waits out the file's
        timestamp tick first, so the entry is not racy."""
        st = os.stat(path)
        changed = max(st.st_mtime_ns, st.st_ctime_ns)
        wait = changed + tick_ns(changed) - now_ns()
        if 0 < wait <= 50_000_000:
            time.sleep(wait / 1e9)
        recorded = now_ns()
        if racy(st, recorded):
            return   # a coarse clock (2 s ticks): let the next reader hash it
        with self._lock:
            self._entries[os.path.abspath(path)] = [stat_key(st), digest, recorded, sha256]
            self._save()

    def _hard_link_digest(self, st: os.stat_result, want: list) -> Optional[list]:
        """The digest recorded under another name of the same file (the bundle's bins are hard
        links to bin/): same device and inode, same stat key -> same bytes, no re-hash."""
        for other, entry in self._entries.items():
            if entry[0] != want or racy(st, entry[2]):
                continue
            try:
                if os.path.samestat(os.stat(other), st):
                    return list(entry)
            except OSError:
                continue
        return None

    def vouched_since(self, path, st, digest: str) -> Optional[int]:
        """When the cache's entry for `path` was recorded, if it vouches that the bytes of this
        stat are `digest` (same key, not racy); else None."""
        with self._lock:
            entry = self._entries.get(os.path.abspath(path))
        if entry and entry[0] == stat_key(st) and entry[1] == digest and not racy(st, entry[2]):
            return entry[2]
        return None

    def carry_over(self, paths) -> "CarryOver":
        """For our own hard-link operations on `paths` (see CarryOver)."""
        return CarryOver(self, paths)

    def _adopt(self, known: dict, names) -> None:
        stats = {}
        for name in names:
            try:
                stats[os.path.abspath(name)] = os.stat(name)
            except OSError:
                continue
        if not stats:
            return
        latest = max(max(st.st_mtime_ns, st.st_ctime_ns) for st in stats.values())
        wait = latest + tick_ns(latest) - now_ns()
        if 0 < wait <= 50_000_000:
            time.sleep(wait / 1e9)   # let the link's ctime leave its tick: else racy next run
        recorded = now_ns()
        with self._lock:
            for key in stats:
                try:
                    st = os.stat(key)
                except OSError:
                    continue
                was = known.get((st.st_dev, st.st_ino))
                if was and was[:2] == (st.st_size, st.st_mtime_ns):
                    self._entries[key] = [stat_key(st), was[2], recorded, *was[3:]]
            self._save()

    def _trace(self, key: str) -> None:   # the file was checked at start-up (check_trace_file)
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


class CarryOver:
    """Hard-linking a file, or removing one of its names, changes its ctime but not its bytes
    (the bundle's bins are hard links to bin/). The digests of `paths` are taken (trusted, or
    hashed) up front; adopt(names) then records them for those of `names` that are still the
    same inodes with the same size and mtime, so our own link operations cost no re-hash."""

    def __init__(self, cache: DigestCache, paths):
        self.cache = cache
        self.known = {}
        for path in paths:
            st = os.stat(path)
            entry = cache._entry(path, st, False)
            self.known[(st.st_dev, st.st_ino)] = (st.st_size, st.st_mtime_ns, *entry[1:2],
                                                  *entry[3:])

    def adopt(self, names) -> None:
        self.cache._adopt(self.known, names)


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


def cached_sha256(path) -> str:
    """The SHA-256 of a file through the shared cache (a remote cache's blob name)."""
    return _cache.sha256(path)




def file_state(path) -> list:
    """[size, mtime_ns, ctime_ns, inode, recorded_ns, digest]: what the doit checker and the
    target records keep per file. recorded_ns is read before the stat (so it never post-dates the
    bytes the stat stands for), or is the time of the cache entry that vouches for them."""
    recorded = now_ns()
    st = os.stat(path)
    digest = _cache.digest(path, st)
    # A file just written is hashed once its tick is over (DigestCache.digest): from then on
    # the cache vouches for its stat, and so can the state.
    vouched = _cache.vouched_since(path, st, digest)
    return stat_key(st) + [max(recorded, vouched or 0), digest]


def state_changed(path, st, state) -> bool:
    """True if the file's bytes differ from a file_state() (or the state is of another shape).
    The stat key is trusted when the state was recorded after the file's tick; otherwise, and
    for a state from before ctime was in the key ([size, mtime_ns, inode, digest]), the digest
    cache decides (hashing only if its own entry cannot vouch for the bytes)."""
    if not isinstance(state, list) or len(state) not in (4, 6) or not isinstance(state[-1], str):
        return True
    if len(state) == 6 and state[:4] == stat_key(st) and not racy(st, state[4]):
        return False
    if st.st_size != state[0]:
        return True
    return _cache.digest(path, st) != state[-1]


def check_trace_file(environ=None) -> None:
    """$HEXBUNDLE_HASH_TRACE, when set, must be a file this run can append to: checked once at
    start-up, so that a wrong one is a message naming it, not a traceback at the first hash."""
    trace = (os.environ if environ is None else environ).get(TRACE_ENV)
    if not trace:
        return
    # checked without creating it: a run that hashes nothing leaves no trace file (what the
    # bench and the tests count on)
    path, problem = Path(trace), ""
    if path.exists():
        try:   # it exists: opening it to append creates nothing
            with open(path, "a"):
                pass
        except OSError as exc:
            problem = f"cannot append to it ({exc.strerror or exc})"
    elif not (path.parent.is_dir() and os.access(path.parent, os.W_OK | os.X_OK)):
        problem = f"cannot append to it (its directory {path.parent} cannot take a new file)"
    if problem:
        raise HexbundleError(f"{TRACE_ENV}={trace}: {problem}; point it at a file you can write "
                             "(e.g. /tmp/hashed.txt) or unset it")
