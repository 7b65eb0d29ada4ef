"""AIMET encodings loader: the legacy "0.6.1" dict schema and the "1.0.0" list schema.

Both schemas become the same `Encodings` object. Convention (both schemas): q is an unsigned
integer in [0, 2^bw - 1] and real = (q + offset) * scale.

Bad input never escapes as KeyError/TypeError/ValueError: every problem is an `EncodingsError`
naming the file, the tensor and the key, because a user fixes these files by hand or re-exports.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from hexbundle.support.errors import EncodingsError

INT_BITWIDTHS = (4, 8, 16)
FLOAT_BITWIDTHS = (16, 32)
SUPPORTED_V1_ENC_TYPES = ("PER_TENSOR", "PER_CHANNEL")
BLOCKWISE_V1_ENC_TYPES = ("PER_BLOCK", "LPBQ")
# Python floats: comparing a huge double against np.float32 would warn about overflow.
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True, eq=False)
class ParamEncoding:
    """One tensor's encoding. Float encodings carry empty scale/offset arrays."""

    name: str
    bitwidth: int
    dtype: str                 # "int" | "float"
    symmetric: bool
    scale: np.ndarray          # float32 (C,)
    offset: np.ndarray         # int32 (C,)
    per_channel: bool

    @property
    def channels(self) -> int:
        return int(self.scale.shape[0])

    @property
    def is_int(self) -> bool:
        return self.dtype == "int"


@dataclass(frozen=True)
class Encodings:
    source: str                # file name, for error messages
    schema: str                # "0.6.1" (legacy) | "1.0.0"
    params: dict = field(default_factory=dict)        # name -> ParamEncoding
    activations: dict = field(default_factory=dict)   # name -> ParamEncoding


def load_encodings(path: Union[str, Path]) -> Encodings:
    """Read and validate an AIMET encodings JSON file (either schema)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise EncodingsError(f"{path}: encodings file not found; export it with AIMET "
                             f"next to the ONNX or fix the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EncodingsError(f"{path}: cannot read encodings file ({exc})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise EncodingsError(f"{path}: not valid JSON ({exc}); re-export the encodings") from None
    return parse_encodings(data, source=str(path))


def parse_encodings(data: Any, source: str = "<encodings>") -> Encodings:
    """Validate already-decoded JSON. `source` names the file in error messages."""
    if not isinstance(data, dict):
        raise EncodingsError(f"{source}: top level must be a JSON object, got {_kind(data)}")
    schema = _detect_schema(data, source)
    for key in ("param_encodings", "activation_encodings"):
        if key not in data:
            raise EncodingsError(f"{source}: missing top-level key '{key}' "
                                 f"(use an empty {'list' if schema == '1.0.0' else 'object'} if none)")
    parse_section = _parse_v1_section if schema == "1.0.0" else _parse_legacy_section
    return Encodings(source=source, schema=schema,
                     params=parse_section(data["param_encodings"], "param_encodings", source),
                     activations=parse_section(data["activation_encodings"], "activation_encodings", source))


def subset_encodings(data: dict, params: set, activations: set) -> dict:
    """The entries of an encodings file (either schema, as decoded JSON) for the given tensors,
    in the same schema and order: the encodings of one part cut out of an unsplit graph's."""
    out = {k: v for k, v in data.items() if k not in ("param_encodings", "activation_encodings")}
    for key, names in (("param_encodings", params), ("activation_encodings", activations)):
        section = data.get(key, [] if isinstance(data.get("param_encodings"), list) else {})
        if isinstance(section, list):
            out[key] = [e for e in section if isinstance(e, dict) and e.get("name") in names]
        else:
            out[key] = {n: e for n, e in section.items() if n in names}
    return out


# --- schema detection --------------------------------------------------------------------------

def _detect_schema(data: dict, source: str) -> str:
    version = data.get("version")
    if version is None:
        # Old AIMET 1.x files often omit the version; the section shape tells them apart.
        return "1.0.0" if isinstance(data.get("param_encodings"), list) else "0.6.1"
    if not isinstance(version, str):
        raise EncodingsError(f"{source}: key 'version' must be a string like \"1.0.0\", got {_kind(version)}")
    if version.startswith("1."):
        return "1.0.0"
    if version.startswith("0."):
        return "0.6.1"
    raise EncodingsError(f"{source}: unsupported encodings version '{version[:40]}'; "
                         f"hexbundle reads 0.6.1 (AIMET 1.x) and 1.0.0 (AIMET 2.x)")


# --- legacy 0.6.1: {tensor: [enc, ...one per channel...]} ---------------------------------------

def _parse_legacy_section(section: Any, key: str, source: str) -> dict:
    if not isinstance(section, dict):
        raise EncodingsError(f"{source}: '{key}' must be an object mapping tensor names to "
                             f"encoding lists (legacy 0.6.1 schema), got {_kind(section)}")
    return {name: _parse_legacy_tensor(name, encs, f"{source}: {key}['{name}']")
            for name, encs in section.items()}


def _parse_legacy_tensor(name: str, encs: Any, where: str) -> ParamEncoding:
    if isinstance(encs, dict):
        encs = [encs]   # some exporters write a single object for per-tensor encodings
    if not isinstance(encs, list) or not encs:
        raise EncodingsError(f"{where}: must be a non-empty list of encodings, got {_kind(encs)}")
    for i, enc in enumerate(encs):
        if not isinstance(enc, dict):
            raise EncodingsError(f"{where}[{i}]: must be an object, got {_kind(enc)}")
    first = encs[0]
    dtype = _legacy_dtype(first, where)
    bitwidth = _bitwidth(first, "bitwidth", dtype, where)
    symmetric = _legacy_symmetric(first, where + "[0]")
    for i, enc in enumerate(encs[1:], start=1):
        # Per-channel lists must agree on everything except scale and offset.
        if (_legacy_dtype(enc, f"{where}[{i}]") != dtype
                or _bitwidth(enc, "bitwidth", dtype, f"{where}[{i}]") != bitwidth
                or _legacy_symmetric(enc, f"{where}[{i}]") != symmetric):
            raise EncodingsError(f"{where}[{i}]: dtype/bitwidth/is_symmetric differ from channel 0; "
                                 f"all channels of one tensor must share them")
    if dtype == "float":
        return _float_encoding(name, bitwidth, symmetric)
    scales = [_require(enc, "scale", f"{where}[{i}]") for i, enc in enumerate(encs)]
    offsets = [_require(enc, "offset", f"{where}[{i}]") for i, enc in enumerate(encs)]
    scale, offset = _scale_offset_arrays(scales, offsets, bitwidth, where)
    return ParamEncoding(name, bitwidth, "int", symmetric, scale, offset, per_channel=len(encs) > 1)


def _legacy_dtype(enc: dict, where: str) -> str:
    dtype = enc.get("dtype", "int")  # AIMET 1.x omitted dtype for int encodings in early versions
    if not isinstance(dtype, str) or dtype.lower() not in ("int", "float"):
        raise EncodingsError(f"{where}: key 'dtype' must be \"int\" or \"float\", got {_short(dtype)}")
    return dtype.lower()


def _legacy_symmetric(enc: dict, where: str) -> bool:
    """AIMET 1.x writes is_symmetric as the STRING "True"/"False"; accept those and real booleans."""
    value = enc.get("is_symmetric", False)
    if isinstance(value, bool):
        return value
    if value in ("True", "true"):
        return True
    if value in ("False", "false"):
        return False
    raise EncodingsError(f"{where}: key 'is_symmetric' must be \"True\"/\"False\" or a boolean, "
                         f"got {_short(value)}")


# --- v1.0.0: [{"name", "bw", "dtype", "enc_type", "is_sym", "scale": [...], "offset": [...]}] ----

def _parse_v1_section(section: Any, key: str, source: str) -> dict:
    if not isinstance(section, list):
        raise EncodingsError(f"{source}: '{key}' must be a list of encoding objects "
                             f"(1.0.0 schema), got {_kind(section)}")
    result = {}
    for i, entry in enumerate(section):
        where = f"{source}: {key}[{i}]"
        if not isinstance(entry, dict):
            raise EncodingsError(f"{where}: must be an object, got {_kind(entry)}")
        name = _require(entry, "name", where)
        if not isinstance(name, str) or not name:
            raise EncodingsError(f"{where}: key 'name' must be a non-empty string, got {_short(name)}")
        where = f"{source}: {key}[{i}] ('{name}')"
        if name in result:
            raise EncodingsError(f"{where}: tensor listed twice; keep one entry")
        result[name] = _parse_v1_entry(name, entry, where)
    return result


def _parse_v1_entry(name: str, entry: dict, where: str) -> ParamEncoding:
    dtype = _require(entry, "dtype", where)
    if not isinstance(dtype, str) or dtype.upper() not in ("INT", "FLOAT"):
        raise EncodingsError(f"{where}: key 'dtype' must be \"INT\" or \"FLOAT\", got {_short(dtype)}")
    dtype = dtype.lower()
    bitwidth = _bitwidth(entry, "bw", dtype, where)
    symmetric = entry.get("is_sym", False)
    if not isinstance(symmetric, bool):
        raise EncodingsError(f"{where}: key 'is_sym' must be true or false, got {_short(symmetric)}")
    if dtype == "float":
        return _float_encoding(name, bitwidth, symmetric)
    enc_type = _require(entry, "enc_type", where)
    if enc_type in BLOCKWISE_V1_ENC_TYPES:
        raise EncodingsError(f"{where}: enc_type {enc_type} (block-wise) is not supported; "
                             f"re-export with PER_CHANNEL or PER_TENSOR")
    if enc_type not in SUPPORTED_V1_ENC_TYPES:
        raise EncodingsError(f"{where}: key 'enc_type' must be one of "
                             f"{', '.join(SUPPORTED_V1_ENC_TYPES)}, got {_short(enc_type)}")
    scales = _as_list(_require(entry, "scale", where), "scale", where)
    offsets = _as_list(_require(entry, "offset", where), "offset", where)
    if enc_type == "PER_TENSOR" and len(scales) != 1:
        raise EncodingsError(f"{where}: PER_TENSOR needs exactly one scale, got {len(scales)}")
    scale, offset = _scale_offset_arrays(scales, offsets, bitwidth, where)
    return ParamEncoding(name, bitwidth, "int", symmetric, scale, offset,
                         per_channel=enc_type == "PER_CHANNEL")


def _as_list(value: Any, key: str, where: str) -> list:
    if isinstance(value, list):
        return value
    if _is_number(value):
        return [value]
    raise EncodingsError(f"{where}: key '{key}' must be a list of numbers, got {_kind(value)}")


# --- shared validation ---------------------------------------------------------------------------

def _float_encoding(name: str, bitwidth: int, symmetric: bool) -> ParamEncoding:
    return ParamEncoding(name, bitwidth, "float", symmetric, np.zeros(0, np.float32),
                         np.zeros(0, np.int32), per_channel=False)


def _require(obj: dict, key: str, where: str) -> Any:
    if key not in obj:
        raise EncodingsError(f"{where}: missing key '{key}'")
    return obj[key]


def _bitwidth(enc: dict, key: str, dtype: str, where: str) -> int:
    value = _require(enc, key, where)
    allowed = INT_BITWIDTHS if dtype == "int" else FLOAT_BITWIDTHS
    if not _is_integral(value) or int(value) not in allowed:
        raise EncodingsError(f"{where}: key '{key}' is {_short(value)}; {dtype} encodings must use "
                             f"one of {', '.join(map(str, allowed))} bits")
    return int(value)


def _scale_offset_arrays(scales: list, offsets: list, bitwidth: int, where: str):
    if len(scales) != len(offsets):
        raise EncodingsError(f"{where}: {len(scales)} scales but {len(offsets)} offsets; "
                             f"each channel needs one of each")
    if not scales:
        raise EncodingsError(f"{where}: key 'scale' is empty; give at least one scale")
    low, high = -(2 ** bitwidth - 1), 0   # q + offset must be able to reach 0 for q in [0, 2^bw-1]
    for c, (scale, offset) in enumerate(zip(scales, offsets)):
        if not _is_valid_float32_scale(scale):
            raise EncodingsError(f"{where}: key 'scale' channel {c} is {_short(scale)}; scales must "
                                 f"be finite, > 0 and representable in float32")
        if not _is_integral(offset) or not low <= offset <= high:
            raise EncodingsError(f"{where}: key 'offset' channel {c} is {_short(offset)}; for "
                                 f"{bitwidth}-bit it must be an integer in [{low}, {high}]")
    return np.asarray(scales, dtype=np.float32), np.asarray([int(o) for o in offsets], dtype=np.int32)


def _is_valid_float32_scale(value: Any) -> bool:
    if not _is_number(value):
        return False
    try:
        as_float = float(value)
    except OverflowError:          # a JSON integer too large for a double
        return False
    return math.isfinite(as_float) and _FLOAT32_TINY <= as_float <= _FLOAT32_MAX


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integral(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or (math.isfinite(value) and value == int(value))


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else _kind(value)
    return text if len(text) <= 60 else text[:57] + "..."
