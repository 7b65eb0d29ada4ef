"""What verify does to keep its peak RSS down holds the same values: its sequences written a
chunk at a time and read back mapped (formats/npyrows.py) hold exactly the rows the chunks'
concatenation holds, a chunk of another type is refused; a session's fork copies exactly its
cached entries (runtime/sessions.py)."""
import numpy as np
import pytest

from hexbundle.checks.verify import SequenceRows
from hexbundle.formats.npyrows import RowsWriter, mapped_afresh
from hexbundle.runtime.sessions import _cached_copy
from hexbundle.support.errors import FormatError


def _chunks():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((n, 3, 5)).astype(np.float32) for n in (4, 2, 1, 1)]


def test_spilled_rows_equal_the_concatenation(tmp_path):
    spilled, kept = SequenceRows(8, tmp_path / "s.npy"), SequenceRows(8)
    for chunk in _chunks():
        spilled.add(chunk)
        kept.add(chunk)
    got, want = spilled.array(), kept.array()
    assert isinstance(got, np.memmap) and not isinstance(want, np.memmap)
    assert got.dtype == want.dtype and got.shape == want.shape == (8, 3, 5)
    assert np.array_equal(got, want)
    again = mapped_afresh(got)
    assert again is not got and np.array_equal(again, want)
    assert mapped_afresh(want) is want
    with pytest.raises(ValueError):
        got[0, 0, 0] = 1.0   # read-only: a comparison cannot change a kept sequence


def test_a_sabotaged_chunk_shows(tmp_path):
    spilled = SequenceRows(8, tmp_path / "s.npy")
    chunks = _chunks()
    chunks[2] = chunks[2] + np.float32(1e-3)
    for chunk in chunks:
        spilled.add(chunk)
    assert not np.array_equal(spilled.array(), np.concatenate(_chunks()))


def test_a_chunk_of_another_type_is_refused(tmp_path):
    writer = RowsWriter(tmp_path / "s.npy", 3)
    writer.add(np.zeros((2, 4), np.float32))
    with pytest.raises(FormatError, match=r"s\.npy: a chunk of float64 after float32"):
        writer.add(np.zeros((1, 4), np.float64))


@pytest.mark.parametrize("axis", [2, 3])
def test_a_fork_copies_exactly_the_cached_entries(axis):
    cache = np.zeros((1, 2, 4, 6), np.float32)
    cached = [slice(None)] * 4
    cached[axis] = slice(0, 3)
    cache[tuple(cached)] = np.random.default_rng(1).standard_normal(cache[tuple(cached)].shape)
    later = [slice(None)] * 4
    later[axis] = slice(3, None)
    cache[tuple(later)] = 7.0   # entries past n_past: not the fork's
    copy = _cached_copy(cache, axis, 3)
    assert copy.shape == cache.shape and not np.shares_memory(copy, cache)
    assert np.array_equal(copy[tuple(cached)], cache[tuple(cached)])
    assert not copy[tuple(later)].any()
