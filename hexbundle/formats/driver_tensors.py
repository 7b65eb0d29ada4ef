"""The tensor files the ortqnn driver (backends/ortqnn_driver.c, `run` mode) reads and writes:
one file per tensor, `<index>.bin`, its raw bytes in C order, little-endian as the host; the
inputs in the model's input order; each output described on the driver's stdout as
`output <index> <name> <ONNX element type> <dims...>`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hexbundle.support.errors import FormatError

# ONNX element type (TensorProto.DataType) -> numpy dtype
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
               7: "int64", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}


def write_inputs(directory: Path, arrays: list) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for index, array in enumerate(arrays):
        (directory / f"{index}.bin").write_bytes(np.ascontiguousarray(array).tobytes())


def read_outputs(stdout: str, directory: Path) -> list:
    """The outputs the driver's stdout describes, read from directory, as numpy arrays."""
    outputs = []
    for line in stdout.splitlines():
        if not line.startswith("output "):
            continue
        _, index, name, element, *dims = line.split()
        if int(element) not in ONNX_DTYPES:
            raise FormatError(f"output {name}: ONNX element type {element} not read here")
        path = directory / f"{index}.bin"
        data = np.frombuffer(path.read_bytes(), ONNX_DTYPES[int(element)])
        shape = [int(d) for d in dims]
        if data.size != int(np.prod(shape, dtype=np.int64)):
            raise FormatError(f"{path}: {data.size} values, not the {shape} the driver stated")
        outputs.append(data.reshape(shape))
    return outputs
