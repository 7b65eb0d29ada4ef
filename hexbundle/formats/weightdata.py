"""The external data file (<graph>.data) the input generators write: float32 little-endian
weights, one after another in the given order, each starting DATA_ALIGNMENT-aligned (mmap
friendly), zero padding between them and none after the last. The ONNX records each weight's
window (location, offset, length; formats/onnxfile.py reads them back).

plan_layout is the writers' layout and the disk check's size model alike; no onnx import, so
sizing a part costs nothing.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

DATA_ALIGNMENT = 64         # byte alignment of each weight in the .data file
FLOAT = "<f4"               # every weight's stored element


def plan_layout(shapes: dict) -> dict:
    """name -> (offset, nbytes) of each weight (shapes: name -> shape, in file order)."""
    layout, offset = {}, 0
    for name, shape in shapes.items():
        offset = -(-offset // DATA_ALIGNMENT) * DATA_ALIGNMENT
        nbytes = np.dtype(FLOAT).itemsize * math.prod(shape)
        layout[name] = (offset, nbytes)
        offset += nbytes
    return layout


def data_size(shapes: dict) -> int:
    """The file's size: the end of its last weight."""
    return max((offset + nbytes for offset, nbytes in plan_layout(shapes).values()), default=0)


def padding(fh, offset: int) -> bytes:
    """The zero bytes that bring a file being written (at fh.tell()) to a weight's offset."""
    return bytes(offset - fh.tell())


def stored(values: np.ndarray) -> memoryview:
    """A block of a weight's values as the file stores them (float32 little-endian bytes)."""
    return memoryview(np.ascontiguousarray(values, dtype=FLOAT)).cast("B")


def negate_in_place(path: Path, offset: int, nbytes: int) -> None:
    """Flip the sign of the float32 values of a window of the file, in place (twice restores
    the bytes): the bench's edit of one weight."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        values = np.frombuffer(fh.read(nbytes), dtype=FLOAT)
        fh.seek(offset)
        fh.write((-values).astype(FLOAT).tobytes())
