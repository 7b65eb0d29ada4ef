"""The container layout shared by the DLC and the context binary (see docs/formats.md).

    [preamble, padded to 4096][blob][pad]...[blob][pad][canonical JSON header]

Blobs come first and the header last so a writer can stream tensors one at a time (never holding
a model in memory) and record each blob's XXH3-128 digest as it goes. Every blob starts on a
4096-byte boundary so a reader can mmap the file and hand out numpy views without copying.

This module also holds the two record types both formats use: tensor records (a weight in one
blob: data, scales, offsets) and graph records (topology blob + I/O + weight names).
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import numpy as np
import xxhash

from hexbundle.formats import FORMAT_VERSION
from hexbundle.support import atomic, progress, testhooks
from hexbundle.support.errors import FormatError, HexbundleError, output_error
from hexbundle.support.jsondoc import parse_json

ALIGN = 4096
PREAMBLE = struct.Struct("<8sIIQQQ24x")   # magic, version, flags, header_offset, header_length, blob_count
assert PREAMBLE.size == 64

# Stored element types. uint4 is stored in uint8 bytes, packed two per byte or one per byte.
STORAGE_DTYPES = {"uint4": np.uint8, "uint8": np.uint8, "uint16": np.uint16,
                  "float16": np.float16, "float32": np.float32}
QUANT_DTYPE_FOR_BITWIDTH = {4: "uint4", 8: "uint8", 16: "uint16"}
QUANT_PARAM_ALIGN = 4         # scales/offsets start 4-aligned inside the blob (float32/int32 views)
_WRITE_CHUNK = 64 << 20       # bytes per write/hash call: big buffers hash fast, bounded memory
# Elements per block when a tensor is streamed (encoded, packed, hashed, written): 8-32 MiB of
# data, so a multi-GB tensor costs a few blocks of memory. Even, so blocks pack to whole bytes.
STREAM_BLOCK_ELEMENTS = 1 << 23


def align_up(n: int, alignment: int = ALIGN) -> int:
    return -(-n // alignment) * alignment


def container_size(blob_nbytes: list, header_length: int) -> int:
    """Exact file size for blobs of these sizes and a header of this many bytes."""
    return ALIGN + sum(align_up(n) for n in blob_nbytes) + header_length


def canonical_json(obj: Any) -> bytes:
    """The header encoding: sorted keys, no whitespace, ASCII only, no NaN (deterministic bytes)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


# =================================================================================================
# Container writer / reader
# =================================================================================================

@dataclass(frozen=True)
class BlobEntry:
    name: str
    offset: int
    nbytes: int
    xxh3_128: str

    def to_json(self) -> dict:
        return {"name": self.name, "offset": self.offset, "nbytes": self.nbytes, "xxh3_128": self.xxh3_128}


# A blob table entry's digest (XXH3-128, hex) is of fixed length, so a planned header's length
# is known before any byte is hashed.
DIGEST_PLACEHOLDER = "0" * 32

# The key a file was made for ("made_for": the build step's output key, steps/outputkey.py, a
# SHA-256 in lower-case hex): a fetched output recording another key is refused. Of fixed length
# too, so a planned header's length does not depend on it; a file written outside a build step
# records UNKEYED, which no step's key equals.
UNKEYED = "0" * 64


def made_for_field(key: str) -> str:
    """The header's "made_for" value: a 64-digit lower-case hex key (ValueError otherwise: a
    programming error, never a user's input)."""
    if not (isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
        raise ValueError(f"made_for must be 64 lower-case hex digits, not {key!r}")
    return key


def header_bytes(header_fields: dict, blobs: Iterable) -> bytes:
    """The header as written: the format's fields and the blob table (BlobEntry, in order)."""
    assert "blobs" not in header_fields
    return canonical_json({**header_fields, "blobs": [b.to_json() for b in blobs]})


@dataclass(frozen=True)
class ContainerLayout:
    """Where everything of a container goes: its blobs (placeholder digests) and its header."""

    blobs: tuple                     # BlobEntry, in file order
    header_offset: int
    header_length: int

    @property
    def size(self) -> int:
        return self.header_offset + self.header_length


def plan_layout(blobs: Iterable, header_fields: dict) -> ContainerLayout:
    """The layout ContainerWriter gives blobs of these sizes ((name, nbytes), in the order they
    are added) under these header fields: the writer places each blob by the same rule
    (`next_offset`) and composes its header with `header_bytes`."""
    table, offset = [], ALIGN
    for name, nbytes in blobs:
        table.append(BlobEntry(name, offset, nbytes, DIGEST_PLACEHOLDER))
        offset = next_offset(offset, nbytes)
    return ContainerLayout(tuple(table), offset, len(header_bytes(header_fields, table)))


def next_offset(offset: int, nbytes: int) -> int:
    """Where the blob after one of `nbytes` at `offset` starts: every blob is page-aligned."""
    return offset + align_up(nbytes)


class ContainerWriter:
    """Streams blobs into a temp file next to `path`; `finish` adds the header and renames atomically.

    Use as a context manager: on an exception the temp file is removed and `path` is untouched.
    """

    def __init__(self, path: Union[str, Path], magic: bytes):
        assert len(magic) == 8
        self.path = Path(path)
        self.magic = magic
        self.blobs: list = []
        self._names: set = set()
        try:   # mode 0o666: the umask decides, as for any new file
            fd, self._tmp_path = atomic.create_temp(self.path)
        except OSError as exc:
            raise HexbundleError(f"{self.path}: cannot create the output file ({exc.strerror}); "
                                 f"check that {self.path.parent} exists and is writable") from None
        self._file = os.fdopen(fd, "wb")
        self._file.write(bytes(ALIGN))   # preamble placeholder; rewritten by finish()
        self._position = ALIGN

    def __enter__(self) -> "ContainerWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def add_blob(self, name: str, chunks: Iterable) -> BlobEntry:
        """Append one blob made of `chunks` (bytes-like or numpy arrays), hashing as it streams."""
        if name in self._names:
            raise ValueError(f"duplicate blob name {name!r}")
        digest = xxhash.xxh3_128()
        nbytes = 0
        try:
            for chunk in chunks:
                for piece in _byte_pieces(chunk):
                    digest.update(piece)
                    self._file.write(piece)
                    nbytes += len(piece)
            padding = align_up(nbytes) - nbytes
            self._file.write(bytes(padding))
        except OSError as exc:   # disk full, file-size limit: a clean error, no temp file left
            self.abort()
            raise output_error(self.path, exc) from None
        entry = BlobEntry(name, self._position, nbytes, digest.hexdigest())
        self._position = next_offset(self._position, nbytes)
        self.blobs.append(entry)
        self._names.add(name)
        if len(self.blobs) == 2:   # the topology and a first weight: bytes done, more to come
            testhooks.pause_point()   # tests kill or interrupt a half-written file here
        return entry

    def finish(self, header_fields: dict) -> int:
        """Write header + preamble, fsync, rename over `path`. Returns the file size."""
        header = header_bytes(header_fields, self.blobs)
        try:
            self._file.write(header)
            self._file.seek(0)
            self._file.write(PREAMBLE.pack(self.magic, FORMAT_VERSION, 0, self._position,
                                           len(header), len(self.blobs)))
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            atomic.commit(self._tmp_path, self.path, sync_dir=True)
        except OSError as exc:
            self.abort()
            raise output_error(self.path, exc) from None
        return self._position + len(header)

    def abort(self) -> None:
        try:
            if not self._file.closed:
                self._file.close()
        except OSError:
            pass   # flushing what a full disk refused fails again; the file is discarded anyway
        finally:
            atomic.discard(self._tmp_path)


def _byte_pieces(chunk):
    """Yield the chunk as contiguous byte memoryviews of bounded size (no copies when contiguous)."""
    if isinstance(chunk, np.ndarray):
        chunk = np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)
    view = memoryview(chunk).cast("B")
    for start in range(0, len(view), _WRITE_CHUNK):
        yield view[start:start + _WRITE_CHUNK]


class ContainerReader:
    """mmap-backed reader: validates the preamble, header and blob table; hands out views."""

    def __init__(self, path: Union[str, Path], magic: bytes, kind: str, rebuild: str = ""):
        self.path = Path(path)
        self.kind = kind
        self.rebuild = rebuild   # the step that rebuilds this file, e.g. "doit convert"
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < PREAMBLE.size:
                    raise self.error(f"truncated ({size} bytes, smaller than the 64-byte preamble)")
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise FormatError(f"{self.path}: {kind} not found; build it first") from None
        except OSError as exc:
            raise FormatError(f"{self.path}: cannot open {kind} ({exc})") from None
        self.size = size
        self.header = self._read_header(magic)
        self.blobs = self._read_blob_table()

    def error(self, what: str) -> FormatError:
        return FormatError(f"{self.path}: {what}; this {self.kind} is corrupt or from another tool, rebuild it")

    def _read_header(self, magic: bytes) -> dict:
        got_magic, version, flags, header_offset, header_length, blob_count = \
            PREAMBLE.unpack_from(self._mmap, 0)
        if got_magic != magic:
            raise self.error(f"bad magic {got_magic!r} (expected {magic!r})")
        if version != FORMAT_VERSION:
            raise FormatError(f"{self.path}: format version {version} is not supported "
                              f"(this hexbundle reads version {FORMAT_VERSION}); rebuild it")
        if flags != 0:
            raise self.error(f"unknown flags 0x{flags:x}")
        if header_offset < ALIGN or header_offset % ALIGN or header_offset + header_length != self.size:
            raise self.error(f"header at {header_offset}+{header_length} does not end the "
                             f"{self.size}-byte file (truncated?)")
        try:
            header = parse_json(bytes(self._mmap[header_offset:header_offset + header_length]),
                                "header")
        except ValueError as exc:   # support.jsondoc's JsonDocError: not JSON, or out of bounds
            raise self.error(f"header is not valid JSON ({exc})") from None
        if not isinstance(header, dict) or not isinstance(header.get("blobs"), list):
            raise self.error("header has no 'blobs' list")
        if len(header["blobs"]) != blob_count:
            raise self.error(f"preamble says {blob_count} blobs, header lists {len(header['blobs'])}")
        self._header_offset = header_offset
        return header

    @property
    def layout(self) -> ContainerLayout:
        """Where the file holds its blobs and header (plan_layout's prediction, as read)."""
        return ContainerLayout(tuple(self.blobs.values()), self._header_offset,
                               self.size - self._header_offset)

    def _read_blob_table(self) -> dict:
        blobs, end_of_previous = {}, ALIGN
        for i, raw in enumerate(self.header["blobs"]):
            entry = self._parse_blob_entry(raw, i)
            if entry.name in blobs:
                raise self.error(f"blob '{entry.name}' listed twice")
            if entry.offset < end_of_previous or entry.offset + entry.nbytes > self._header_offset:
                raise self.error(f"blob '{entry.name}' at {entry.offset}+{entry.nbytes} overlaps "
                                 f"another blob or the header")
            end_of_previous = entry.offset + entry.nbytes
            blobs[entry.name] = entry
        return blobs

    def _parse_blob_entry(self, raw: Any, index: int) -> BlobEntry:
        try:
            entry = BlobEntry(raw["name"], raw["offset"], raw["nbytes"], raw["xxh3_128"])
        except (TypeError, KeyError):
            raise self.error(f"blob entry {index} lacks name/offset/nbytes/xxh3_128") from None
        valid = (isinstance(entry.name, str) and _is_uint(entry.offset) and _is_uint(entry.nbytes)
                 and entry.offset % ALIGN == 0 and isinstance(entry.xxh3_128, str)
                 and len(entry.xxh3_128) == 32)
        if not valid:
            raise self.error(f"blob entry {index} ({str(raw)[:80]}) is malformed")
        return entry

    def blob(self, name: str) -> np.ndarray:
        """A read-only uint8 view of a blob (no copy)."""
        entry = self.blobs.get(name)
        if entry is None:
            raise self.error(f"header refers to blob '{name}', which is not in the blob table")
        return np.frombuffer(self._mmap, dtype=np.uint8, count=entry.nbytes, offset=entry.offset)

    def release(self, offset: int, nbytes: int) -> None:
        """Drop the whole pages of [offset, offset + nbytes) from this process's memory: they
        stay in the page cache and fault back in if touched again, but streaming through a
        multi-GB file no longer keeps all of it resident (RSS stays at about one block)."""
        if not hasattr(self._mmap, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return   # not on this platform: the pages are dropped when the file is closed
        start = align_up(offset, mmap.PAGESIZE)
        end = (offset + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start:
            self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def blob_stream(self, record: "TensorRecord") -> Callable[[], Iterator[np.ndarray]]:
        """A `TensorStream.blocks` factory over a stored tensor: consecutive flat views of its
        elements, each block's pages released once the consumer asks for the next one.

        The blob's XXH3-128 is verified on the way: each block is hashed as it is handed out, the
        rest of the blob (scales, offsets) after the last one, and a mismatch raises FormatError
        at the end of the blob -- before a writer consuming the stream can commit its output."""
        entry = self.blobs[record.blob]

        def blocks() -> Iterator[np.ndarray]:
            digest = xxhash.xxh3_128()
            if record.packed:   # unpacking needs the whole tensor; readers of packed data are small
                raw = self.blob(record.blob)
                digest.update(raw[:record.data_nbytes])
                progress.advance(record.data_nbytes)
                yield tensor_values(record, raw).reshape(-1)
            else:
                values = tensor_values(record, self.blob(record.blob)).reshape(-1)
                itemsize = values.dtype.itemsize
                for start in range(0, values.size, STREAM_BLOCK_ELEMENTS):
                    block = values[start:start + STREAM_BLOCK_ELEMENTS]
                    digest.update(block.view(np.uint8))
                    progress.advance(block.nbytes)
                    yield block
                    self.release(entry.offset + start * itemsize, block.nbytes)
            rest = entry.offset + record.data_offset + record.data_nbytes
            digest.update(self._mmap[rest:entry.offset + entry.nbytes])
            self._check_digest(entry, digest.hexdigest(), f"tensor '{record.name}'")
        return blocks

    def verified_blob(self, name: str) -> np.ndarray:
        """`blob`, after checking the blob's XXH3-128 (for blobs read whole, e.g. a topology)."""
        view = self.blob(name)
        self._check_digest(self.blobs[name], xxhash.xxh3_128(view).hexdigest())
        return view

    def _check_digest(self, entry: BlobEntry, computed: str, what: str = "") -> None:
        if computed == entry.xxh3_128:
            return
        holds = f" ({what})" if what else ""
        rebuild = f"rebuild it ({self.rebuild})" if self.rebuild else "rebuild it"
        raise FormatError(f"{self.path}: blob '{entry.name}'{holds} does not match its recorded "
                          f"XXH3-128 (stored {entry.xxh3_128}, computed {computed}): this "
                          f"{self.kind} was changed after it was written; {rebuild}")

    def check_tensor_blob(self, record: "TensorRecord") -> None:
        """A tensor record's blob must exist and be exactly as long as its layout says."""
        entry = self.blobs.get(record.blob)
        if entry is None:
            raise self.error(f"tensor '{record.name}' refers to missing blob '{record.blob}'")
        if entry.nbytes != record.blob_nbytes:
            raise self.error(f"tensor '{record.name}' needs {record.blob_nbytes} bytes, "
                             f"its blob '{record.blob}' has {entry.nbytes}")

    def verify_digests(self) -> None:
        """Recompute every blob's XXH3-128; FormatError naming the first mismatching blob. Each
        piece's pages are given back once hashed: checking a fetched 1 GiB DLC must not leave
        the whole file resident in the process."""
        for entry in self.blobs.values():
            digest = xxhash.xxh3_128()
            for start in range(entry.offset, entry.offset + entry.nbytes, _WRITE_CHUNK):
                end = min(start + _WRITE_CHUNK, entry.offset + entry.nbytes)
                digest.update(self._mmap[start:end])
                self.release(start, end - start)
            if digest.hexdigest() != entry.xxh3_128:
                raise self.error(f"blob '{entry.name}' digest mismatch "
                                 f"(stored {entry.xxh3_128}, computed {digest.hexdigest()})")

    def close(self) -> None:
        try:
            self._mmap.close()
        except BufferError:
            pass   # numpy views still point into the map; it is unmapped when they are collected


def _is_uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# =================================================================================================
# Tensor records: one weight = one blob  [data][pad to 4][scales f32 x G][offsets f32 x G]
# (G groups: 1 per tensor, C per channel, C x B per block; offsets are float32 because a shifted
# zero point makes them fractional, and every integer offset of up to 24 bits is exact in it)
# =================================================================================================

@dataclass(frozen=True, eq=False)
class QuantParams:
    """real = (q + offset[g]) * scale[g] for the element's group g: per tensor (axis None), per
    channel c along `axis`, or per block: group (c, b) in [channel][block] order, b = the index
    along `block_axis` // block_size."""

    bitwidth: int
    axis: Optional[int]
    scale: np.ndarray      # float32 (G,)
    offset: np.ndarray     # float32 (G,)
    symmetric: bool
    block_axis: Optional[int] = None
    block_size: int = 0

    @property
    def channels(self) -> int:
        """The number of groups G (the name predates blocks: it sizes the scale table)."""
        return int(self.scale.shape[0])

    def groups_for(self, shape: tuple) -> int:
        """G that a tensor of `shape` needs with this layout."""
        if self.axis is None:
            return 1
        if self.block_size:
            return shape[self.axis] * (shape[self.block_axis] // self.block_size)
        return shape[self.axis]

    def expanded(self, shape: tuple, rows: Optional[slice] = None) -> tuple:
        """(scale, offset) as float32 arrays broadcastable against the tensor (or against its
        rows `rows` along axis 0): scalars per tensor, one axis per channel, blocks repeated
        along the block axis."""
        if self.axis is None:
            return self.scale[0], self.offset[0].astype(np.float32)
        ndim = len(shape)
        if not self.block_size:
            bshape = [1] * ndim
            bshape[self.axis] = -1
            scale, offset = self.scale, self.offset.astype(np.float32)
            if rows is not None and self.axis == 0:
                scale, offset = scale[rows], offset[rows]
            return scale.reshape(bshape), offset.reshape(bshape)
        channels, length = shape[self.axis], shape[self.block_axis]
        full = [1] * ndim
        full[self.axis], full[self.block_axis] = channels, length
        out = []
        for table in (self.scale, self.offset.astype(np.float32)):
            # [channel][block] -> [channel][element] -> the two axes in the tensor's order
            grid = np.repeat(table.reshape(channels, -1), self.block_size, axis=1)
            arr = (grid if self.axis < self.block_axis else grid.T).reshape(full)
            if rows is not None and arr.shape[0] > 1:
                arr = arr[rows]
            out.append(arr)
        return out[0], out[1]


@dataclass(frozen=True, eq=False)
class Tensor:
    """A weight ready to be stored: `values` are unpacked elements in the logical (ONNX) shape."""

    name: str
    dtype: str                       # key of STORAGE_DTYPES
    values: np.ndarray
    quant: Optional[QuantParams] = None


@dataclass(frozen=True, eq=False)
class TensorStream:
    """A weight to store whose values arrive in blocks, so it is never whole in memory.

    `blocks()` returns a fresh iterator over the stored (unpacked) elements in C order, as
    consecutive arrays of any shape and size; `quant` is known up front (it comes from the
    encodings, not from the values)."""

    name: str
    dtype: str                       # key of STORAGE_DTYPES
    shape: tuple
    blocks: Callable[[], Iterable[np.ndarray]]
    quant: Optional[QuantParams] = None


def as_stream(tensor: Union[Tensor, TensorStream]) -> TensorStream:
    """A Tensor (whole array) as a TensorStream of flat views; a TensorStream as it is."""
    if isinstance(tensor, TensorStream):
        return tensor
    values = np.ascontiguousarray(tensor.values, dtype=STORAGE_DTYPES.get(tensor.dtype, None))

    def blocks() -> Iterator[np.ndarray]:
        flat = values.reshape(-1)
        for start in range(0, flat.size, STREAM_BLOCK_ELEMENTS):
            yield flat[start:start + STREAM_BLOCK_ELEMENTS]
    return TensorStream(tensor.name, tensor.dtype, tuple(int(d) for d in values.shape), blocks,
                        tensor.quant)


@dataclass(frozen=True)
class QuantInfo:
    bitwidth: int
    axis: Optional[int]
    channels: int              # groups G (see QuantParams)
    symmetric: bool
    block_axis: Optional[int] = None
    block_size: int = 0

    def to_json(self) -> dict:
        out = {"bitwidth": self.bitwidth, "axis": self.axis, "channels": self.channels,
               "symmetric": self.symmetric}
        if self.block_size:   # per-tensor/per-channel records stay as they were
            out.update(block_axis=self.block_axis, block_size=self.block_size)
        return out


@dataclass(frozen=True)
class TensorRecord:
    """Header description of one stored weight; sub-offsets are relative to the blob start."""

    name: str
    blob: str
    shape: tuple
    dtype: str
    packed: bool
    quant: Optional[QuantInfo]
    data_offset: int
    data_nbytes: int
    scales_offset: Optional[int]
    offsets_offset: Optional[int]

    @property
    def count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def blob_nbytes(self) -> int:
        if self.quant is None:
            return self.data_nbytes
        return self.offsets_offset + 4 * self.quant.channels

    def to_json(self) -> dict:
        channels = self.quant.channels if self.quant else 0
        return {"name": self.name, "blob": self.blob, "shape": list(self.shape), "dtype": self.dtype,
                "packed": self.packed, "quant": self.quant.to_json() if self.quant else None,
                "data": {"offset": self.data_offset, "nbytes": self.data_nbytes},
                "scales": None if self.quant is None else {"offset": self.scales_offset, "nbytes": 4 * channels},
                "offsets": None if self.quant is None else {"offset": self.offsets_offset, "nbytes": 4 * channels}}


def data_nbytes(shape, dtype: str, packed: bool) -> int:
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == "uint4" and packed:
        return (count + 1) // 2
    return count * np.dtype(STORAGE_DTYPES[dtype]).itemsize


def tensor_blob_nbytes(shape, dtype: str, packed: bool, channels: int) -> int:
    """Bytes of one tensor blob before page padding (what the size model needs per weight)."""
    nbytes = data_nbytes(shape, dtype, packed)
    if channels:
        nbytes = align_up(nbytes, QUANT_PARAM_ALIGN) + 8 * channels
    return nbytes


def encode_tensor(tensor: Union[Tensor, TensorStream], blob: str, pack: bool):
    """-> (TensorRecord, data, tail): `data` an iterator over the stored data (packed two per
    byte iff uint4 and `pack`), computed block by block as it is consumed; `tail` the small
    [pad, scales, offsets] chunks of a quantized tensor ([] for floats). The blob is data + tail."""
    stream = as_stream(tensor)
    _check_stream(stream)
    packed = pack and stream.dtype == "uint4"
    nbytes = data_nbytes(stream.shape, stream.dtype, packed)
    quant, scales_at, offsets_at, tail = None, None, None, []
    if stream.quant is not None:
        q = stream.quant
        quant = QuantInfo(q.bitwidth, q.axis, q.channels, q.symmetric, q.block_axis, q.block_size)
        scales_at = align_up(nbytes, QUANT_PARAM_ALIGN)
        offsets_at = scales_at + 4 * q.channels
        tail = [bytes(scales_at - nbytes), np.asarray(q.scale, "<f4"), np.asarray(q.offset, "<f4")]
    record = TensorRecord(stream.name, blob, tuple(int(d) for d in stream.shape), stream.dtype,
                          packed, quant, 0, nbytes, scales_at, offsets_at)
    return record, _stored_data(stream, packed), tail


def _stored_data(stream: TensorStream, packed: bool) -> Iterator[np.ndarray]:
    """The stream's elements as storage-dtype arrays; packed pairs carry an odd element over."""
    dtype = STORAGE_DTYPES[stream.dtype]
    count = int(np.prod(stream.shape, dtype=np.int64))
    seen, carry = 0, None
    for block in stream.blocks():
        flat = np.ascontiguousarray(block, dtype=dtype).reshape(-1)
        seen += flat.size
        if stream.dtype == "uint4" and flat.size and int(flat.max()) > 15:
            raise ValueError(f"{stream.name}: uint4 values above 15")
        if not packed:
            yield flat
            continue
        if carry is not None:
            flat, carry = np.concatenate([carry, flat]), None
        if flat.size % 2:
            flat, carry = flat[:-1], flat[-1:].copy()
        if flat.size:
            yield pack_uint4(flat)
    if carry is not None:
        yield pack_uint4(carry)
    if seen != count:
        raise ValueError(f"{stream.name}: {seen} values streamed for shape {list(stream.shape)}")


def _check_stream(tensor: TensorStream) -> None:
    """Writer-side sanity checks: a bad tensor here is a hexbundle bug, not a user error."""
    if tensor.dtype not in STORAGE_DTYPES:
        raise ValueError(f"{tensor.name}: unknown dtype {tensor.dtype!r}")
    q = tensor.quant
    if (q is None) != tensor.dtype.startswith("float"):
        raise ValueError(f"{tensor.name}: quantized dtypes need quant params, float dtypes none")
    if q is not None:
        if QUANT_DTYPE_FOR_BITWIDTH.get(q.bitwidth) != tensor.dtype:
            raise ValueError(f"{tensor.name}: bitwidth {q.bitwidth} stored as {tensor.dtype}")
        expected = q.groups_for(tuple(tensor.shape))
        if q.channels != expected or q.offset.shape != q.scale.shape:
            raise ValueError(f"{tensor.name}: {q.channels} channels for axis {q.axis} of {tensor.shape}")


def parse_tensor_record(raw: Any, where: str) -> TensorRecord:
    """Validate one header record (raises FormatError naming `where` and the tensor)."""
    try:
        record = _tensor_record_from_json(raw)
    except (TypeError, KeyError, ValueError, AttributeError):
        raise FormatError(f"{where}: malformed tensor record {str(raw)[:120]}; rebuild the file") from None
    expected = tensor_blob_nbytes(record.shape, record.dtype, record.packed,
                                  record.quant.channels if record.quant else 0)
    if (record.data_nbytes != data_nbytes(record.shape, record.dtype, record.packed)
            or record.blob_nbytes != expected
            or (record.quant and record.scales_offset != record.offsets_offset - 4 * record.quant.channels)):
        raise FormatError(f"{where}: tensor '{record.name}' sub-offsets/sizes disagree with its "
                          f"shape {list(record.shape)} and dtype {record.dtype}; rebuild the file")
    return record


def _tensor_record_from_json(raw: dict) -> TensorRecord:
    shape = tuple(raw["shape"])
    if not all(_is_uint(d) for d in shape) or raw["dtype"] not in STORAGE_DTYPES:
        raise ValueError("shape/dtype")
    if not isinstance(raw["packed"], bool) or (raw["packed"] and raw["dtype"] != "uint4"):
        raise ValueError("packed")
    quant = None
    if raw["quant"] is not None:
        q = raw["quant"]
        quant = QuantInfo(q["bitwidth"], q["axis"], q["channels"], q["symmetric"],
                          q.get("block_axis"), q.get("block_size", 0))
        axis_ok = quant.axis is None or (_is_uint(quant.axis) and quant.axis < len(shape))
        block_ok = not quant.block_size or (
            _is_uint(quant.block_axis) and quant.block_axis < len(shape) and quant.axis is not None
            and quant.block_axis != quant.axis and _is_uint(quant.block_size)
            and shape[quant.block_axis] % quant.block_size == 0)
        channels = -1
        if axis_ok and block_ok:
            channels = 1 if quant.axis is None else shape[quant.axis] * (
                shape[quant.block_axis] // quant.block_size if quant.block_size else 1)
        if (not axis_ok or quant.channels != channels
                or QUANT_DTYPE_FOR_BITWIDTH.get(quant.bitwidth) != raw["dtype"]):
            raise ValueError("quant")
    elif not raw["dtype"].startswith("float"):
        raise ValueError("quantized dtype without quant")
    data = raw["data"]
    scales = raw["scales"] or {}
    offsets = raw["offsets"] or {}
    if not isinstance(raw["name"], str) or not isinstance(raw["blob"], str) or data["offset"] != 0:
        raise ValueError("names/data offset")
    sub_offsets = [data["nbytes"]] + ([scales["offset"], offsets["offset"]] if quant else [])
    if not all(_is_uint(v) for v in sub_offsets):
        raise ValueError("sub-offsets")
    return TensorRecord(raw["name"], raw["blob"], shape, raw["dtype"], raw["packed"], quant,
                        0, data["nbytes"], scales.get("offset"), offsets.get("offset"))


def tensor_values(record: TensorRecord, blob: np.ndarray) -> np.ndarray:
    """Stored elements in the logical shape: a view for unpacked data, an unpacked copy if packed."""
    raw = blob[record.data_offset:record.data_offset + record.data_nbytes]
    if record.packed:
        return unpack_uint4(raw, record.count).reshape(record.shape)
    return raw.view(STORAGE_DTYPES[record.dtype]).reshape(record.shape)


# Float initializers up to this many elements without an int encoding are constants (eps,
# scalars, small biases): a backend keeps them inside the topology as they are; larger ones are
# weights with a blob of their own, stored at the build's float precision (float_precision).
SMALL_CONSTANT_ELEMENTS = 64


def tensor_blocks(record: TensorRecord, blob: np.ndarray, block_elements: int) -> Iterator[np.ndarray]:
    """Stored elements in flat order, `block_elements` at a time (packed 4-bit unpacked one block
    at a time): a reader that compares a large tensor never holds it whole."""
    raw = blob[record.data_offset:record.data_offset + record.data_nbytes]
    if record.packed:
        step = max(2, block_elements - block_elements % 2)   # whole bytes: an even count
        for start in range(0, record.count, step):
            n = min(step, record.count - start)
            yield unpack_uint4(raw[start // 2:(start + n + 1) // 2], n)
        return
    values = raw.view(STORAGE_DTYPES[record.dtype])
    for start in range(0, record.count, block_elements):
        yield values[start:start + block_elements]


def tensor_quant_params(record: TensorRecord, blob: np.ndarray) -> Optional[QuantParams]:
    if record.quant is None:
        return None
    q = record.quant
    scale = blob[record.scales_offset:record.scales_offset + 4 * q.channels].view("<f4")
    offset = blob[record.offsets_offset:record.offsets_offset + 4 * q.channels].view("<f4")
    return QuantParams(q.bitwidth, q.axis, scale, offset, q.symmetric, q.block_axis, q.block_size)


def dequantize(values: np.ndarray, quant: Optional[QuantParams]) -> np.ndarray:
    """float32 real values: (q + offset[g]) * scale[g] for each element's group; floats widen."""
    if quant is None:
        return values.astype(np.float32)
    scale, offset = quant.expanded(values.shape)
    return (values.astype(np.float32) + offset) * scale


def pack_uint4(values: np.ndarray) -> np.ndarray:
    """Two 4-bit values per byte: element 2i in the LOW nibble, 2i+1 in the HIGH nibble."""
    flat = np.ascontiguousarray(values, dtype=np.uint8).reshape(-1)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])   # odd count: pad a zero nibble
    # Each pair as one little-endian uint16 (lo | hi << 8): OR-ing in itself shifted right by 4
    # puts hi into bits 4-7 of the low byte (3.5x faster than strided slices; values <= 15).
    pairs = flat.view("<u2")
    return (pairs | (pairs >> 4)).astype(np.uint8)


def unpack_uint4(packed: np.ndarray, count: int) -> np.ndarray:
    out = np.empty(packed.size * 2, dtype=np.uint8)
    out[0::2] = packed & 0x0F
    out[1::2] = packed >> 4
    return out[:count]


# =================================================================================================
# Graph records: topology blob + I/O + the weights a graph uses
# =================================================================================================

@dataclass(frozen=True)
class IoSpec:
    name: str
    dtype: str                  # numpy dtype name, e.g. "float32", "int32"
    shape: Optional[tuple]      # dims: int, str (symbolic) or None (unknown); None: unknown rank

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype,
                "shape": None if self.shape is None else list(self.shape)}

    @staticmethod
    def from_json(raw: dict) -> "IoSpec":
        shape = raw["shape"]
        return IoSpec(str(raw["name"]), str(raw["dtype"]), None if shape is None else tuple(shape))


@dataclass(frozen=True)
class GraphInfo:
    name: str
    inputs: tuple               # IoSpec
    outputs: tuple              # IoSpec
    weights: tuple              # tensor names, in storage order
    opset_import: tuple         # (domain, version) pairs, needed to rebuild an ONNX model
    ir_version: int
    topology_blob: str = ""
    activations: Any = None     # {tensor: {bitwidth, dtype, symmetric, scale, offset}} or None

    def to_json(self) -> dict:
        return {"name": self.name, "topology": self.topology_blob,
                "inputs": [s.to_json() for s in self.inputs],
                "outputs": [s.to_json() for s in self.outputs],
                "weights": list(self.weights),
                "opset_import": [{"domain": d, "version": v} for d, v in self.opset_import],
                "ir_version": self.ir_version,
                "activations": self.activations or {}}


def parse_graph_record(raw: Any, where: str) -> GraphInfo:
    try:
        info = GraphInfo(
            name=raw["name"], topology_blob=raw["topology"],
            inputs=tuple(IoSpec.from_json(s) for s in raw["inputs"]),
            outputs=tuple(IoSpec.from_json(s) for s in raw["outputs"]),
            weights=tuple(raw["weights"]),
            opset_import=tuple((o["domain"], o["version"]) for o in raw["opset_import"]),
            ir_version=raw["ir_version"], activations=raw.get("activations") or {})
    except (TypeError, KeyError, AttributeError):
        raise FormatError(f"{where}: malformed graph record {str(raw)[:120]}; rebuild the file") from None
    if not isinstance(info.name, str) or not all(isinstance(w, str) for w in info.weights):
        raise FormatError(f"{where}: malformed graph record for {str(info.name)[:60]}; rebuild the file")
    return info


def activation_encodings_json(activations: dict) -> dict:
    """Activation encodings as header JSON (float32 scales become exact Python floats)."""
    return {name: {"bitwidth": enc.bitwidth, "dtype": enc.dtype, "symmetric": enc.symmetric,
                   "scale": [float(s) for s in enc.scale],
                   "offset": [int(o) if float(o).is_integer() else float(o) for o in enc.offset]}
            for name, enc in sorted(activations.items())}


class FormatReader:
    """What the DLC and context-binary readers share: header fields, the container, digests,
    lifetime, and parsing a topology blob into an ONNX GraphProto."""

    _container: "ContainerReader"

    @property
    def header(self) -> dict:
        return self._container.header

    @property
    def producer(self) -> dict:
        return self.header.get("producer", {})

    @property
    def deployable(self) -> bool:
        return bool(self.header.get("deployable"))

    @property
    def made_for(self) -> Optional[str]:
        """The key the file records it was made for (None: it records none, or not as 64
        lower-case hex digits: an older hexbundle's file, or not one of ours)."""
        key = self.header.get("made_for")
        try:
            return made_for_field(key)
        except ValueError:
            return None

    @property
    def size(self) -> int:
        return self._container.size

    @property
    def layout(self) -> ContainerLayout:
        return self._container.layout

    @property
    def blobs(self) -> dict:
        return self._container.blobs

    def parse_topology(self, blob: str, what: str):
        import onnx
        graph = onnx.GraphProto()
        try:
            graph.ParseFromString(self._container.blob(blob).tobytes())
        except Exception:   # protobuf's DecodeError is not exported uniformly across versions
            raise self._container.error(f"{what} is not a valid ONNX GraphProto") from None
        return graph

    def verify_digests(self) -> None:
        self._container.verify_digests()

    def release_pages(self) -> None:
        """Drop the file's pages from this process's memory (they fault back in if touched):
        a caller done with the bin for now keeps its mmap, not its RSS."""
        self._container.release(0, self._container.size)

    def close(self) -> None:
        self._container.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
