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
