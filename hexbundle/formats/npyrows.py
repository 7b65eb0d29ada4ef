"""A sequence of rows in a .npy file (numpy's format), written a chunk of rows at a time and read
back as a read-only memmap: `doit verify` keeps its sequences there (checks/verify.py
SequenceRows), so a sequence held while later sessions run is page cache, not its memory.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hexbundle.support.errors import FormatError


class RowsWriter:
    """`total` rows, their shape and type taken from the first chunk, to `path` as they come."""

    def __init__(self, path: Path, total: int):
        self.path, self.total = Path(path), total
        self._file, self._dtype = None, None

    def add(self, chunk: np.ndarray) -> None:
        if self._file is None:
            self._dtype = chunk.dtype
            self._file = open(self.path, "wb")
            np.lib.format.write_array_header_1_0(self._file, {
                "descr": np.lib.format.dtype_to_descr(chunk.dtype), "fortran_order": False,
                "shape": (self.total,) + chunk.shape[1:]})
        if chunk.dtype != self._dtype:
            raise FormatError(f"{self.path}: a chunk of {chunk.dtype} after {self._dtype}: the "
                              "prompt and token graphs' main outputs differ in type")
        self._file.write(np.ascontiguousarray(chunk).tobytes())

    def close(self) -> np.ndarray:
        """The rows written, mapped read-only."""
        self._file.close()
        return read_mapped(self.path)


def read_mapped(path: Path) -> np.ndarray:
    return np.load(path, mmap_mode="r")


def mapped_afresh(a: np.ndarray) -> np.ndarray:
    """An array read_mapped gave, mapped again: the pages read through the old map are no longer
    the process's (RSS). Any other array as it is."""
    return read_mapped(a.filename) if isinstance(a, np.memmap) else a
