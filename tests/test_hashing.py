"""Digests and the checker: stat fast path, one hash per change of bytes, persisted cache."""
import os

import xxhash

from hexbundle.support import hashing


def test_file_digest_is_xxh3_128_of_the_bytes(tmp_path):
    data = os.urandom(3 * hashing.CHUNK + 17)  # crosses buffer boundaries
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert hashing.file_digest(path) == xxhash.xxh3_128(data).hexdigest()


def test_cache_hashes_once_per_change_of_bytes(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 1000)
    cache = hashing.DigestCache(tmp_path / "cache.json")
    first = cache.digest(path)
    cache.digest(path)
    assert cache.hashed == 1
    os.utime(path, ns=(1, 1))                    # a touch: same bytes, new mtime
    assert cache.digest(path) == first and cache.hashed == 2
    cache.digest(path)
    assert cache.hashed == 2
    path.write_bytes(b"b" * 1000)                # same size, new bytes
    assert cache.digest(path) != first


def test_cache_persists_across_processes(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 5000)
    hashing.DigestCache(tmp_path / "cache.json").digest(path)
    again = hashing.DigestCache(tmp_path / "cache.json")
    again.digest(path)
    assert again.hashed == 0
