"""An ONNX model file as hexbundle reads it: the structure without the weights, and each
initializer's values, located, checked and read in blocks of rows.

`load_structure` parses the .onnx alone (a 7B part's .onnx is small; its weights are external)
after checking it is a regular file, and checks that every name it holds is text: protobuf hands
a string field that is not UTF-8 back as bytes, which every later step would trip over.

An initializer's values are inline in the proto or a window of an external data file: the
`location` (a file name relative to the ONNX's directory), `offset` and `length` the ONNX
records. `initializer_values` locates that window and checks it against the file without
reading it (the file is a regular file next to the ONNX, the length is what dtype x shape
needs, the window lies inside the file); `TensorValues.rows` reads it in blocks of rows through
short-lived np.memmap windows, so a 2 GB tensor never sits in memory whole.

The readers are the export scan (formats/qaihm.py), the input validation (inputs/validate.py),
the local split, the reference backend and the size model; the generator and the local split
write such files (inputs/synthetic.py, inputs/split.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from hexbundle.support.errors import InputError
from hexbundle.support import progress
from hexbundle.support.files import require_regular_file

BLOCK_ELEMENTS = 1 << 22   # rows per block ~ 16 MiB of float32 temporaries


@dataclass(frozen=True)
class TensorValues:
    """Where an initializer's values are: a validated window of its external data file, or the
    inline array. Read in blocks of rows, never whole (`rows`), except for small constants."""

    name: str
    shape: tuple
    dtype: np.dtype
    data_path: Optional[Path] = None      # external data
    offset: int = 0
    inline: Optional[np.ndarray] = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def row_elements(self) -> int:
        """Elements per row of axis 0 (a 0-d tensor is one row of one element)."""
        return max(1, int(np.prod(self.shape[1:], dtype=np.int64)))

    def whole(self) -> np.ndarray:
        """All values at once: only for small tensors (constants inlined in the topology)."""
        if self.inline is not None:
            return self.inline
        if self.nbytes == 0:
            return np.zeros(self.shape, self.dtype)
        return np.array(np.memmap(self.data_path, dtype=self.dtype, mode="r",
                                  offset=self.offset, shape=self.shape))

    def mapped(self) -> np.ndarray:
        """The values as a read-only view, not read until indexed (a memmap of the external
        data; the inline array): a few elements of a large tensor without reading it all."""
        if self.inline is not None or self.nbytes == 0:
            return self.whole()
        return np.memmap(self.data_path, dtype=self.dtype, mode="r", offset=self.offset,
                         shape=self.shape)

    def rows(self, block_elements: Optional[int] = None) -> Iterator[tuple]:
        """(row slice, float32 block) over axis 0; a 0-d tensor is one block of one row.
        Blocks are read-only (float32 external data comes as the mapped window itself).

        External data is mapped one block at a time (a window is unmapped once the consumer
        lets go of it), so reading a 2 GB tensor keeps ~one block resident, not the file."""
        shape = self.shape if self.shape else (1,)
        n_rows = shape[0]
        rows_per_block = max(1, (block_elements or BLOCK_ELEMENTS) // self.row_elements)
        row_bytes = self.row_elements * self.dtype.itemsize
        for start in range(0, n_rows, rows_per_block):
            rows = slice(start, min(start + rows_per_block, n_rows))
            if self.inline is not None:
                block = np.asarray(self.inline.reshape(shape)[rows], dtype=np.float32)
            else:
                block = np.memmap(self.data_path, dtype=self.dtype, mode="r",
                                  offset=self.offset + start * row_bytes,
                                  shape=(rows.stop - start, *shape[1:]))
                if block.dtype != np.float32:
                    block = np.asarray(block, dtype=np.float32)
            progress.advance((rows.stop - start) * row_bytes)   # read from the file
            yield rows, block
            del block


# The keys of an external-data record that ONNX defines (onnx/onnx.proto, TensorProto).
EXTERNAL_DATA_KEYS = ("location", "offset", "length", "checksum")

def load_structure(onnx_path: Path) -> onnx.ModelProto:
    """The model proto without its weights (they are read later, one by one, via memmap)."""
    if not Path(onnx_path).exists():
        raise InputError(f"{onnx_path}: ONNX model not found; export it or fix the path")
    require_regular_file(onnx_path, "ONNX model")
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:   # protobuf/onnx raise a variety of types for a damaged file
        raise InputError(f"{onnx_path}: cannot parse ONNX model ({type(exc).__name__}: {exc}); "
                         "re-export it") from None
    where = _non_text_field(model)
    if where:
        raise InputError(f"{onnx_path}: {where} is not UTF-8 text; re-export the model (ONNX "
                         "names and external-data locations are UTF-8 strings)")
    return model


def _non_text_field(model: onnx.ModelProto) -> str:
    """Where a name the build reads is bytes rather than text (protobuf's answer for a string
    field that is not UTF-8), or ""."""
    graph = model.graph
    for entry in model.opset_import:
        if not isinstance(entry.domain, str):
            return f"an opset_import domain ({entry.domain!r})"
    for kind, values in (("graph input", graph.input), ("graph output", graph.output),
                         ("value_info", graph.value_info)):
        for index, value in enumerate(values):
            if not isinstance(value.name, str):
                return f"the name of {kind} {index} ({value.name!r})"
    for index, init in enumerate(graph.initializer):
        where = _tensor_non_text(init, f"initializer {index}")
        if where:
            return where
    for index, node in enumerate(graph.node):
        label = f"node {index}"
        for field in ("name", "op_type", "domain"):
            if not isinstance(getattr(node, field), str):
                return f"the {field} of {label} ({getattr(node, field)!r})"
        for side in ("input", "output"):
            for position, name in enumerate(getattr(node, side)):
                if not isinstance(name, str):
                    return f"{side} {position} of {label} ({name!r})"
        for attribute in node.attribute:
            if not isinstance(attribute.name, str):
                return f"an attribute name of {label} ({attribute.name!r})"
            if attribute.type == onnx.AttributeProto.TENSOR:
                where = _tensor_non_text(attribute.t, f"the tensor of {label}")
                if where:
                    return where
    return ""


def _tensor_non_text(tensor: onnx.TensorProto, label: str) -> str:
    if not isinstance(tensor.name, str):
        return f"the name of {label} ({tensor.name!r})"
    for entry in tensor.external_data:
        if not isinstance(entry.key, str) or not isinstance(entry.value, str):
            return (f"the external data {entry.key!r} of tensor '{tensor.name}' "
                    f"({entry.value!r})")
    return ""


def tensor_dtype(init: onnx.TensorProto, onnx_path: Path) -> np.dtype:
    """The numpy dtype of a tensor's values (little-endian, as ONNX stores them)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).newbyteorder("<")
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{onnx_path}: tensor '{init.name}' has data type {init.data_type}, "
                         "which is no ONNX tensor type numpy can hold; re-export the "
                         "model") from None


def initializer_values(init: onnx.TensorProto, onnx_path: Path) -> TensorValues:
    """Locate and validate the initializer's values without reading them."""
    onnx_path = Path(onnx_path)
    dtype = tensor_dtype(init, onnx_path)
    shape = tuple(int(d) for d in init.dims)
    if any(d < 0 for d in shape):
        raise InputError(f"{onnx_path}: tensor '{init.name}' has a negative dimension "
                         f"{list(shape)}; re-export the model")
    if init.data_location != onnx.TensorProto.EXTERNAL:
        try:
            inline = numpy_helper.to_array(init)
        except Exception as exc:   # onnx raises several types for a malformed inline tensor
            raise InputError(f"{onnx_path}: tensor '{init.name}': its inline values do not "
                             f"match its shape {list(shape)} and type ({exc}); re-export the "
                             "model") from None
        return TensorValues(init.name, shape, dtype, inline=inline)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    entries = {e.key: e.value for e in init.external_data}
    location = entries.get("location", "")
    data_path = onnx_path.parent / location
    where = f"{onnx_path}: tensor '{init.name}' (external data {location!r})"
    keys = [e.key for e in init.external_data]
    odd = sorted({k for k in keys if k not in EXTERNAL_DATA_KEYS or keys.count(k) > 1})
    if odd:   # onnxruntime refuses such a record ("model format error"); onnx.checker does not
        raise InputError(f"{where}: its external-data record has the key(s) {odd} (unknown or "
                         f"given twice; ONNX defines {list(EXTERNAL_DATA_KEYS)}); re-export "
                         "the model")
    try:
        offset = int(entries.get("offset", 0))
        length = int(entries.get("length", expected))
    except ValueError:
        raise InputError(f"{where}: offset/length are not integers; re-export the model") from None
    if not location or Path(location).is_absolute() or ".." in Path(location).parts:
        raise InputError(f"{where}: the data file must be a relative path next to the ONNX")
    if Path(location).name in ("", ".", "..") or data_path.is_dir():
        raise InputError(f"{where}: the location names a directory, not a data file; "
                         "re-export the model")
    if not _is_file_name(location):
        raise InputError(f"{where}: the location is not a valid file name (a NUL or an "
                         "undecodable byte in it); re-export the model")
    if length != expected:
        raise InputError(f"{where}: length {length} does not match shape {list(shape)} "
                         f"({expected} bytes); re-export the model")
    if not data_path.exists():
        raise InputError(f"{where}: data file {data_path} is missing; copy it next to the ONNX")
    require_regular_file(data_path, f"external data of tensor '{init.name}'")
    file_size = data_path.stat().st_size
    if offset < 0 or offset + expected > file_size:
        raise InputError(f"{where}: needs bytes {offset}..{offset + expected} but {data_path} has "
                         f"only {file_size}; the data file is truncated or from another export")
    return TensorValues(init.name, shape, dtype, data_path=data_path, offset=offset)


def _is_file_name(location: str) -> bool:
    """No NUL (no file system takes it) and encodable (a surrogate-escaped byte is not text)."""
    if "\0" in location:
        return False
    try:
        location.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
