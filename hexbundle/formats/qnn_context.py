"""Qualcomm's QNN HTP context binary (`*_qnn.bin`, what QnnHtp's contextGetBinary writes and
Genie loads), as read from real ones: QAIRT 2.51.0's x64 QnnHtp.dll through ONNX Runtime's QNN
EP (the ortqnn backend; fixtures in tests/data/qualcomm/, made by the script there).

Header, as observed (docs/formats.md "QNN context binary"):
  0x00  four u32 words, big-endian: 2, 3, 0, 1
  0x10  u64 little-endian: metadata size (a flatbuffer from 0x28)
  0x18  u64 little-endian: payload offset (4096)
  0x20  u64 little-endian: payload size; payload offset + payload size = the file's size
The payload holds each graph's HTP program, the weights and, per graph, the compiler's option
string (`...;soc_type=QCS9100;arch=73;...;vtcm_size=8388608;...`) and the build string of the
QnnHtp that made it (formats/qairt_version.py reads that). The SoC name is QAIRT's own:
soc_model 77 gives QCS9100, 52 SA8255 (not the product table's QCS9075 / SA8775P).

This is not hexbundle's HXCTXBIN (formats/ctxbin.py, the reference backend's stand-in).
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

from hexbundle.support.errors import FormatError

MAGIC_WORDS = (2, 3, 0, 1)
_WORDS = struct.Struct(">4I")
_SIZES = struct.Struct("<3Q")
HEADER_SIZE = _WORDS.size + _SIZES.size   # 0x28
_TARGET = re.compile(rb";soc_type=([A-Za-z0-9_]+);arch=(\d+);")
_VTCM = re.compile(rb";vtcm_size=(\d+);")
_SCAN = 4 << 20


@dataclass(frozen=True)
class QnnContextHeader:
    metadata_size: int
    payload_offset: int
    payload_size: int


@dataclass(frozen=True)
class QnnContextFacts:
    header: QnnContextHeader
    targets: tuple       # distinct (soc_type, arch) of the graphs' option strings, e.g. (("QCS9100", 73),)
    vtcm_sizes: tuple    # distinct vtcm_size values (bytes)
    graph_options: int   # how many option strings (one per graph compiled in)


def parse_header(data: bytes, file_size: int, where: str) -> QnnContextHeader:
    if len(data) < HEADER_SIZE or _WORDS.unpack_from(data) != MAGIC_WORDS:
        raise FormatError(f"{where}: not a QNN context binary (its first words are not "
                          f"{MAGIC_WORDS}, big-endian u32)")
    header = QnnContextHeader(*_SIZES.unpack_from(data, _WORDS.size))
    if header.payload_offset + header.payload_size != file_size \
            or header.metadata_size > header.payload_offset:
        raise FormatError(f"{where}: QNN context binary header says metadata {header.metadata_size}"
                          f" B, payload {header.payload_size} B at {header.payload_offset}, but "
                          f"the file has {file_size} B: truncated or damaged; rebuild it")
    return header


def is_qnn_context(path) -> bool:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_WORDS.size)
    except OSError:
        return False
    return len(data) == _WORDS.size and _WORDS.unpack(data) == MAGIC_WORDS


def read_qnn_context(path) -> QnnContextFacts:
    """The header and the compile targets a real context binary states (read in pieces)."""
    path = Path(path)
    size = path.stat().st_size
    targets, vtcm, count, tail = [], [], 0, b""
    with open(path, "rb") as fh:
        header = parse_header(fh.read(HEADER_SIZE), size, str(path))
        fh.seek(0)
        while True:
            piece = fh.read(_SCAN)
            if not piece:
                break
            data = tail + piece
            for m in _TARGET.finditer(data):
                if m.end() > len(tail):   # one wholly in the tail was counted last piece
                    count += 1
                    target = (m.group(1).decode(), int(m.group(2)))
                    if target not in targets:
                        targets.append(target)
            for m in _VTCM.finditer(data):
                if int(m.group(1)) not in vtcm:
                    vtcm.append(int(m.group(1)))
            tail = data[-128:]
    return QnnContextFacts(header, tuple(targets), tuple(vtcm), count)


_WORD = struct.Struct("<I")


def metadata_words(path) -> tuple:
    """The metadata (the flatbuffer after the header) as little-endian u32 words (its size
    fields are u32 at 4-byte alignment: a part's buffers stay under the DSP's 4 GiB address
    space). Its schema is not published; what is known, from bins compiled from the same graphs with 4-bit weights
    packed and stored as bytes (tests/test_ortqnn.py): the metadata have the same length and
    differ only in size words, the largest change being the weights' buffer size, by exactly
    the weights' bytes (the payload size and each graph's program size change too)."""
    path = Path(path)
    with open(path, "rb") as fh:
        header = parse_header(fh.read(HEADER_SIZE), path.stat().st_size, str(path))
        meta = fh.read(header.metadata_size)
    if len(meta) != header.metadata_size:
        raise FormatError(f"{path}: QNN context binary metadata cut short; rebuild it")
    return tuple(w for (w,) in _WORD.iter_unpack(meta[:len(meta) - len(meta) % _WORD.size]))


def weights_shrink(larger, smaller) -> int:
    """Bytes by which the weights' buffer of `smaller` is less than that of `larger`, two bins
    compiled from the same graphs: the largest drop of a metadata word that can be a size in
    the payload (both values at most `larger`'s payload size; a hash or a flag word can take
    any value), 0 when none drops. The payload's own size is not the weights' buffer: the
    metadata repeat it (a word equal to each file's payload size), and it shrinks by the
    weights plus the programs' difference, rounded to pages: measured on qwen2.5-7b-shape part
    2, the payload shrank by 349,585,408 B, the weights' buffer by 349,569,024 B (exactly the
    declared 4-bit saving); on the tiny model the two coincide. The weights' buffer word
    counts whole 4096-byte pages (every value measured is a page multiple), so a drop smaller
    than a page can read 0 and any drop is the page-rounded one (docs/backends.md, issue 48).
    FormatError when their metadata differ in length: not the same graphs."""
    a, b = metadata_words(larger), metadata_words(smaller)
    if len(a) != len(b):
        raise FormatError(f"{smaller}: its metadata ({len(b)} words) are not laid out as "
                          f"{larger}'s ({len(a)}): not a compile of the same graphs")
    payload = read_qnn_context(larger).header.payload_size
    its_payload = (payload, read_qnn_context(smaller).header.payload_size)
    return max((x - y for x, y in zip(a, b) if y < x <= payload and (x, y) != its_payload),
               default=0)
