"""Digests and the checker: stat fast path, one hash per change of bytes, persisted cache."""
import json
import os

import pytest
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


def edit_in_place_keeping_mtime(path, data):
    before = os.stat(path)
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == \
        (before.st_size, before.st_mtime_ns, before.st_ino)


def test_same_size_edit_with_the_mtime_put_back_is_rehashed(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 1000)
    cache = hashing.DigestCache(tmp_path / "cache.json")
    first = cache.digest(path)
    edit_in_place_keeping_mtime(path, b"b" * 1000)
    assert cache.digest(path) == hashing.file_digest(path) != first
    again = hashing.DigestCache(tmp_path / "cache.json")   # and in a later run
    assert again.digest(path) == hashing.file_digest(path)


def test_an_entry_recorded_in_the_files_own_tick_is_rehashed(tmp_path, monkeypatch):
    """git's racy clean: a second same-size write in the same timestamp tick leaves the whole
    stat as it was (here: the same stat result passed again), so such an entry is not trusted."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 1000)
    st = os.stat(path)
    cache = hashing.DigestCache(tmp_path / "cache.json")
    monkeypatch.setattr(hashing, "now_ns", lambda: max(st.st_mtime_ns, st.st_ctime_ns))
    monkeypatch.setattr(hashing.time, "sleep", lambda s: None)
    assert cache.digest(path, st) == hashing.bytes_digest(b"a" * 1000)
    path.write_bytes(b"b" * 1000)                  # same tick: the stat does not change
    assert cache.digest(path, st) == hashing.bytes_digest(b"b" * 1000)
    assert cache.hashed == 2

    # recorded after the tick: the stat match is trusted, nothing is hashed
    later = max(st.st_mtime_ns, st.st_ctime_ns) + 10**10
    monkeypatch.setattr(hashing, "now_ns", lambda: later)
    cache.digest(path, st)
    assert cache.hashed == 3
    cache.digest(path, st)
    assert cache.hashed == 3


def test_a_just_written_file_waits_out_its_tick_once(tmp_path):
    """The entry of a file hashed right after it was written is trusted by the next run."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 1000)
    hashing.DigestCache(tmp_path / "cache.json").digest(path)
    again = hashing.DigestCache(tmp_path / "cache.json")
    again.digest(path)
    assert again.hashed == 0


@pytest.mark.parametrize("entry", [[1], [], "x", 5, None, [["a", 1, 2, 3], "d", 1],
                                   [[1, 2, 3, 4], 7, 1], [[1, 2, 3, 4], "d"]])
def test_a_malformed_cache_entry_is_set_aside_with_one_line(tmp_path, capsys, entry):
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 1000)
    other = tmp_path / "g.bin"
    other.write_bytes(b"c" * 10)
    cache_file = tmp_path / "cache.json"
    cache_file.write_text(json.dumps({str(path): entry}))
    cache = hashing.DigestCache(cache_file)
    assert cache.digest(path) == hashing.bytes_digest(b"a" * 1000)
    assert cache.digest(other) == hashing.bytes_digest(b"c" * 10)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and str(cache_file) in lines[0] and "set aside" in lines[0], lines
    aside = tmp_path / "cache.json.set-aside"
    assert lines[0].count(str(aside)) == 1
    assert json.loads(aside.read_text()) == {str(path): entry}
    hashing.DigestCache(cache_file).digest(path)   # the next run: clean, quiet
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("content", ["[]", "[[1, 2]]", "42", '"text"', "null", "{not json"])
def test_a_cache_file_that_is_not_a_json_object_is_set_aside(tmp_path, capsys, content):
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 1000)
    cache_file = tmp_path / "cache.json"
    cache_file.write_text(content)
    cache = hashing.DigestCache(cache_file)
    assert cache.digest(path) == hashing.bytes_digest(b"a" * 1000)
    lines = capsys.readouterr().err.splitlines()
    aside = tmp_path / "cache.json.set-aside"
    assert len(lines) == 1 and str(cache_file) in lines[0] and str(aside) in lines[0], lines
    assert aside.read_text() == content
    assert isinstance(json.loads(cache_file.read_text()), dict)
