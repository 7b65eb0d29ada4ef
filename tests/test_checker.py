"""doit's file checker (hexbundle.graph.checker): stat fast path, then XXH3 through the cache."""
import os

from hexbundle.graph.checker import XXH3Checker
from hexbundle.support import hashing


def test_checker_detects_changes_but_not_touches(tmp_path):
    hashing.use_cache(tmp_path / "cache.json")
    path = tmp_path / "f.bin"
    path.write_bytes(b"1234" * 100)
    checker = XXH3Checker()
    state = checker.get_state(str(path), None)
    assert checker.check_modified(str(path), os.stat(path), state) is False
    os.utime(path, ns=(10**9, 10**9))
    assert checker.check_modified(str(path), os.stat(path), state) is False
    path.write_bytes(b"4321" * 100)
    assert checker.check_modified(str(path), os.stat(path), state) is True
    path.write_bytes(b"1234" * 101)
    assert checker.check_modified(str(path), os.stat(path), state) is True
    assert checker.check_modified(str(path), os.stat(path), ("md5", "state")) is True


def test_checker_sees_a_same_size_edit_with_the_mtime_put_back(tmp_path):
    hashing.use_cache(tmp_path / "cache.json")
    path = tmp_path / "f.bin"
    path.write_bytes(b"1234" * 100)
    checker = XXH3Checker()
    state = checker.get_state(str(path), None)
    before = os.stat(path)
    with open(path, "r+b") as fh:
        fh.write(b"4321")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert checker.check_modified(str(path), os.stat(path), state) is True


def test_checker_rehashes_a_state_recorded_in_the_files_own_tick(tmp_path, monkeypatch):
    hashing.use_cache(tmp_path / "cache.json")
    path = tmp_path / "f.bin"
    path.write_bytes(b"1234" * 100)
    st = os.stat(path)
    monkeypatch.setattr(hashing, "now_ns", lambda: max(st.st_mtime_ns, st.st_ctime_ns))
    monkeypatch.setattr(hashing.time, "sleep", lambda s: None)
    checker = XXH3Checker()
    state = checker.get_state(str(path), None)
    path.write_bytes(b"4321" * 100)      # same tick: the stat (passed again) does not change
    assert checker.check_modified(str(path), st, state) is True


def test_checker_trusts_a_stat_recorded_after_the_tick(tmp_path, monkeypatch):
    hashing.use_cache(tmp_path / "cache.json")
    path = tmp_path / "f.bin"
    path.write_bytes(b"1234" * 100)
    checker = XXH3Checker()
    state = checker.get_state(str(path), None)
    assert checker.get_state(str(path), state) is None     # unchanged: no DB write
    trace = tmp_path / "trace.txt"
    monkeypatch.setenv(hashing.TRACE_ENV, str(trace))
    hashing.use_cache(tmp_path / "other-cache.json")       # an empty cache: would have to hash
    assert checker.check_modified(str(path), os.stat(path), state) is False
    assert not trace.exists()
