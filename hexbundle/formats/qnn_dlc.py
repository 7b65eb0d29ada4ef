"""Qualcomm's DLC as QAIRT writes it (read from real ones: QAIRT 2.51.0's QnnIr.dll through ONNX
Runtime's QNN EP, option dump_qnn_ir_dlc; the ortqnn backend's convert logs one per graph).

A zip64 archive whose members are stored (not compressed) with their CRC fields 0, so Python's
zipfile reads its directory but refuses its members: they are read here from each member's
local header. Members: `model` (the graph), `model.params`, `model.params.bin` (the weights),
`dlc.metadata2.3.0` and `dlc.metadata.history.2.3.0` (JSON; the history names the tool and its
`converterVersion`, the QAIRT build without the leading "v": `2.51.0.260929181845`). The
metadata carry the time of writing, so two DLCs of one graph differ in those bytes.

This is not hexbundle's own DLC container (formats/dlc.py, the reference backend's).
"""
from __future__ import annotations

import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hexbundle.support.errors import FormatError
from hexbundle.support.jsondoc import parse_json

HISTORY = "dlc.metadata.history.2.3.0"
_LOCAL_HEADER = struct.Struct("<4s22xHH")   # signature ... name length, extra length
_LOCAL_SIGNATURE = b"PK\x03\x04"


@dataclass(frozen=True)
class QnnDlcInfo:
    members: dict            # name -> stored size
    tool: str                # "qnn-net-run" (QnnIr through the EP)
    converter_version: str   # "2.51.0.260929181845"


def _member(fh, info: zipfile.ZipInfo, where: str) -> bytes:
    if info.compress_type != zipfile.ZIP_STORED:
        raise FormatError(f"{where}: member {info.filename} is compressed; QAIRT stores them")
    fh.seek(info.header_offset)
    signature, name_len, extra_len = _LOCAL_HEADER.unpack(fh.read(_LOCAL_HEADER.size))
    if signature != _LOCAL_SIGNATURE:
        raise FormatError(f"{where}: member {info.filename} has no local header")
    fh.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
    return fh.read(info.file_size)


def read_qnn_dlc(path) -> QnnDlcInfo:
    where = str(path)
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise FormatError(f"{where}: not a DLC archive ({exc}); rebuild it") from None
    by_name = {i.filename: i for i in infos}
    if HISTORY not in by_name or "model" not in by_name:
        raise FormatError(f"{where}: a DLC holds `model` and `{HISTORY}`; this one has "
                          + ", ".join(sorted(by_name)))
    with open(Path(path), "rb") as fh:
        # out of bounds or not JSON: support.jsondoc's error, naming the member and the key
        history = parse_json(_member(fh, by_name[HISTORY], where), f"{where}: {HISTORY}",
                             "rebuild it")
        try:
            generation = history["dlcGenerationInfo"][-1]["converterCommand"]
            if not isinstance(generation, dict):
                raise TypeError
        except (KeyError, IndexError, TypeError):
            raise FormatError(f"{where}: {HISTORY} is not the JSON QAIRT writes") from None
    return QnnDlcInfo({i.filename: i.file_size for i in infos}, str(generation.get("tool", "")),
                      str(generation.get("converterVersion", "")))
