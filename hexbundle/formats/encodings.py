"""AIMET encodings: the loader of the legacy "0.6.1" dict schema, the "1.0.0" list schema and the
"2.0.0" schema (one `encodings` list, ONNX-QDQ style fields), and the 1.0.0 writer the input
generators use (encodings_document, encodings_bytes).

Every schema becomes the same `Encodings` object. Convention: q is an unsigned integer in
[0, 2^bw - 1] and real = (q + offset) * scale, per tensor, per channel, or per block of
`block_size` elements along the block axis; offset may be fractional (1.0.0 `zero_point_shift`,
2.0.0 fractional `y_zero_point`). An LPBQ encoding becomes a per-block one whose block scales
are the per-channel float scale times the per-block integer scale (products computed in float64,
then float32, as AIMET does), at the compressed bitwidth.

Bad input never escapes as KeyError/TypeError/ValueError: every problem is an `EncodingsError`
naming the file, the tensor and the key, because a user fixes these files by hand or re-exports.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import xxhash

from hexbundle.support.errors import EncodingsError
from hexbundle.support.files import require_regular_file
from hexbundle.support.jsondoc import JsonDocError, parse_json

INT_BITWIDTHS = (4, 8, 16)
FLOAT_BITWIDTHS = (16, 32)
SUPPORTED_V1_ENC_TYPES = ("PER_TENSOR", "PER_CHANNEL", "PER_BLOCK", "LPBQ")
# 2.0.0 output_dtype -> (dtype, bitwidth, signed)
V2_DTYPES = {f"{sign}int{bw}": ("int", bw, sign == "") for bw in (4, 8, 16, 32) for sign in ("", "u")}
V2_DTYPES.update({"float16": ("float", 16, True), "float32": ("float", 32, True)})
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
    scale: np.ndarray          # float32 (G,): one per tensor, channel, or block ([channel][block])
    offset: np.ndarray         # float32 (G,): integral unless a zero point was shifted
    per_channel: bool          # per channel or per block
    enc_type: str = ""         # PER_TENSOR | PER_CHANNEL | PER_BLOCK | LPBQ ("" for floats)
    block_size: int = 0        # > 0: per block of this many elements along the block axis
    axis: Optional[int] = None         # the channel axis, where the file says it (2.0.0)
    block_axis: Optional[int] = None   # the block axis, where the file says it (2.0.0)
    lpbq: Optional[tuple] = None       # (per-channel float scale, per-block int scales, decompressed bw)

    @property
    def channels(self) -> int:
        """How many (scale, offset) groups: tensor 1, channels C, blocks C x B."""
        return int(self.scale.shape[0])

    @property
    def is_blockwise(self) -> bool:
        return self.block_size > 0

    @property
    def is_int(self) -> bool:
        return self.dtype == "int"


@dataclass(frozen=True)
class Encodings:
    source: str                # file name, for error messages
    schema: str                # "0.6.1" (legacy) | "1.0.0"
    params: dict = field(default_factory=dict)        # name -> ParamEncoding
    activations: dict = field(default_factory=dict)   # name -> ParamEncoding
    derived: tuple = ()        # activations carried through data-movement ops (not in the file)

    def for_graph(self, initializers: set) -> "Encodings":
        """The encodings as a graph with these initializers sees them. An encoding named after
        an initializer is that weight's: 2.0.0 lists weights and activations in one list, and
        AIMET lists some weights (RMSNorm's) among the activations in every version. An int32
        weight encoding is a bias's, which QNN requantizes from its inputs' scales: the bias
        stays float."""
        params = dict(self.params)
        activations = {}
        for name, enc in self.activations.items():
            if name not in initializers:
                activations[name] = enc
            elif name not in params:
                params[name] = enc
        params = {n: _float_encoding(n, 32, e.symmetric) if e.is_int and e.bitwidth == 32 else e
                  for n, e in params.items()}
        return replace(self, params=params, activations=activations)


def require_encodings_file(path: Path) -> None:
    """InputError naming `path` if something other than a regular file is there (a FIFO would
    block a read until something writes to it); a missing file is load_encodings' to name."""
    if path.exists():
        require_regular_file(path, "AIMET encodings file")


def load_encodings(path: Union[str, Path]) -> Encodings:
    """Read and validate an AIMET encodings JSON file (either schema). The same bytes are
    parsed once per process (_PARSED)."""
    path = Path(path)
    require_encodings_file(path)
    try:
        raw = read_encodings_bytes(path)
    except FileNotFoundError:
        raise EncodingsError(f"{path}: encodings file not found; export it with AIMET "
                             f"next to the ONNX or fix the path") from None
    except OSError as exc:
        raise EncodingsError(f"{path}: cannot read encodings file ({exc})") from None
    key = xxhash.xxh3_128_digest(raw)
    kept = _PARSED.pop(key, None) or _read_only(
        parse_encodings(read_encodings_json(path, raw), source=str(path)))
    _PARSED[key] = kept
    while len(_PARSED) > _PARSED_KEPT:
        del _PARSED[next(iter(_PARSED))]
    # the file it was read from this time, for messages
    return kept if kept.source == str(path) else replace(kept, source=str(path))


# A 70B model's per-channel encodings are some hundred MiB of JSON
ENCODINGS_MAX_BYTES = 4 << 30

# Content digest -> Encodings, the newest last. A part's prompt and token graphs are exported
# with byte-identical encodings, and the bundle task plans every graph (checks.sizes), so one
# process meets the same bytes again and again: on the 7B shape each file is 6-9 MB of JSON
# (~0.12 s to parse). Keyed on the bytes themselves, so an edited file is parsed afresh.
_PARSED: dict = {}
_PARSED_KEPT = 4


def _read_only(encodings: Encodings) -> Encodings:
    """A kept parse's arrays made read-only, so no reader can change what another one sees."""
    for enc in (*encodings.params.values(), *encodings.activations.values()):
        for array in (enc.scale, enc.offset, *(a for a in (enc.lpbq or ()) if
                                               isinstance(a, np.ndarray))):
            array.flags.writeable = False
    return encodings


def read_encodings_bytes(path: Path) -> bytes:
    """The file's bytes, if it is no larger than any encodings file; EncodingsError otherwise."""
    size = path.stat().st_size
    if size > ENCODINGS_MAX_BYTES:
        raise EncodingsError(f"{path}: {size} bytes, more than any encodings file (at most "
                             f"{ENCODINGS_MAX_BYTES >> 30} GiB); re-export the encodings")
    return path.read_bytes()


def read_encodings_json(path: Path, raw: Optional[bytes] = None):
    """The file (or its bytes `raw`, already read) decoded within support.jsondoc's bounds (NaN
    and Infinity kept: the sections' reader names the tensor and channel that holds one);
    EncodingsError otherwise."""
    try:
        return parse_json(read_encodings_bytes(path) if raw is None else raw, str(path),
                          "re-export the encodings",
                          max_bytes=ENCODINGS_MAX_BYTES, allow_nan=True)
    except JsonDocError as exc:
        raise EncodingsError(str(exc)) from None


def parse_encodings(data: Any, source: str = "<encodings>") -> Encodings:
    """Validate already-decoded JSON. `source` names the file in error messages."""
    if not isinstance(data, dict):
        raise EncodingsError(f"{source}: top level must be a JSON object, got {_kind(data)}")
    schema = _detect_schema(data, source)
    if schema == "2.0.0":
        return _parse_v2(data, source)
    for key in ("param_encodings", "activation_encodings"):
        if key not in data:
            raise EncodingsError(f"{source}: missing top-level key '{key}' "
                                 f"(use an empty {'list' if schema == '1.0.0' else 'object'} if none)")
    parse_section = _parse_v1_section if schema == "1.0.0" else _parse_legacy_section
    return Encodings(source=source, schema=schema,
                     params=parse_section(data["param_encodings"], "param_encodings", source),
                     activations=parse_section(data["activation_encodings"], "activation_encodings", source))


def encodings_header(path: Union[str, Path]) -> dict:
    """The top-level keys of an encodings file other than its sections (version, producer,
    quantizer_args, ...): what says which AIMET wrote it."""
    try:
        data = read_encodings_json(Path(path))
    except OSError as exc:
        raise EncodingsError(f"{path}: cannot read the encodings ({exc}); re-export them") from None
    if not isinstance(data, dict):
        raise EncodingsError(f"{path}: a JSON {type(data).__name__}, not an encodings object")
    return {k: v for k, v in data.items() if not k.endswith("_encodings")}


# ============================================================================ the writer (1.0.0)

def symmetric_per_channel(amax: np.ndarray, bw: int) -> dict:
    """One scale per output channel (`amax` its largest |value| per channel), offset -2^(bw-1)."""
    qmax = 2 ** (bw - 1) - 1
    scales = np.maximum(np.asarray(amax, np.float32).astype(np.float64) / qmax,
                        np.finfo(np.float32).tiny)
    return {"enc_type": "PER_CHANNEL", "is_sym": True, "bw": bw,
            "scale": [float(s) for s in scales], "offset": [-(2 ** (bw - 1))] * len(scales)}


def asymmetric_per_tensor(lo: float, hi: float, bw: int) -> dict:
    """Range [lo, hi] widened to include 0; offset = round(lo / scale) (so q = 0 is ~lo)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = max((hi - lo) / (2 ** bw - 1), float(np.finfo(np.float32).tiny))
    return {"enc_type": "PER_TENSOR", "is_sym": False, "bw": bw,
            "scale": [scale], "offset": [int(round(lo / scale))]}


def symmetric_per_tensor(r: float, bw: int) -> dict:
    return {"enc_type": "PER_TENSOR", "is_sym": True, "bw": bw,
            "scale": [r / (2 ** (bw - 1) - 1)], "offset": [-(2 ** (bw - 1))]}


def int_entry(name: str, encoding: dict) -> dict:
    """A 1.0.0 list entry of an integer encoding (one of the three above)."""
    return {"name": name, "dtype": "INT", **encoding}


def float_entry(name: str, bw: int) -> dict:
    """A 1.0.0 list entry of a tensor kept float at `bw` bits."""
    return {"name": name, "dtype": "FLOAT", "enc_type": "PER_TENSOR", "bw": bw}


def encodings_document(activations: list, params: list, quantizer_args: dict) -> dict:
    """An AIMET 1.0.0 encodings document of these entries (int_entry / float_entry)."""
    return {"version": "1.0.0", "activation_encodings": activations, "param_encodings": params,
            "excluded_layers": [], "quantizer_args": quantizer_args}


def encodings_bytes(doc: dict) -> bytes:
    """The bytes of an encodings file as hexbundle writes one (both input generators)."""
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


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


# The ops qai-hub-models' propagate_memory_encodings (utils/aimet/encodings.py, 0.65) carries
# an encoding through, from the first input to every output
MEMORY_OPS = frozenset({"Concat", "Split", "Transpose", "Cast", "Reshape", "Slice", "Squeeze",
                        "Unsqueeze", "Expand"})


def adapt_checkpoint_encodings(data: dict, gather: Optional[tuple], nodes: list) -> dict:
    """What qai-hub-models 0.65 does to a dynamic checkpoint's encodings before it splits
    (templates/qwen3 and llama3 `_adapt_aimet_encodings`, the same for both families):
    the first Gather's output (the embedding) gets the embedding weight's encoding, or a 16-bit
    float one when the activations are not quantized (w4); every activation entry whose name
    holds "weight" is copied into the param encodings; then encodings are carried through
    memory ops until nothing changes. `gather`: (output, weight) of the first Gather or None;
    `nodes`: (op_type, inputs, outputs) in graph order. Lists (1.0.0) only, as Qualcomm's."""
    acts, params = data.get("activation_encodings"), data.get("param_encodings")
    if not isinstance(acts, list) or not isinstance(params, list):
        return data
    acts = {e["name"]: e for e in acts if isinstance(e, dict) and "name" in e}
    params = {e["name"]: e for e in params if isinstance(e, dict) and "name" in e}
    if gather is not None:
        output, weight = gather
        if not any(e.get("dtype") == "INT" for e in acts.values()):   # w4: float activations
            acts[output] = {"bw": 16, "dtype": "FLOAT", "enc_type": "PER_TENSOR", "name": output}
        elif weight in acts:
            acts[output] = dict(copy.deepcopy(acts[weight]), name=output)
    for name, entry in list(acts.items()):
        if "weight" in name:
            params[name] = copy.deepcopy(entry)
    changed = True
    while changed:
        changed = False
        for op_type, inputs, outputs in nodes:
            if outputs[0] in acts or op_type not in MEMORY_OPS or not inputs \
                    or inputs[0] not in acts:
                continue
            for output in outputs:
                acts[output] = dict(copy.deepcopy(acts[inputs[0]]), name=output)
                changed = True
    return dict(data, activation_encodings=list(acts.values()),
                param_encodings=list(params.values()))


def fill_cut_encodings(data: dict, first_input: dict, cut_tensors: list) -> dict:
    """qai-hub-models' fill_input_encodings_of_split (0.65 split_onnx_utils): a cut tensor
    with no activation encoding gets the encoding of its producer's first input, walking up
    until one has an encoding. `first_input`: tensor -> the first input of the node that makes
    it. Only the 0.6.1 dict schema changes: in the list schemas Qualcomm's copy keeps the
    source tensor's `name`, so re-keyed by name it lands back on that tensor (a no-op there)."""
    acts, params = data.get("activation_encodings"), data.get("param_encodings", {})
    if not isinstance(acts, dict) or not isinstance(params, dict):
        return data
    out = dict(data, activation_encodings=dict(acts))
    for tensor in cut_tensors:
        if tensor in acts or tensor not in first_input:
            continue
        source = first_input[tensor]
        if source not in first_input:
            continue   # Qualcomm's walk starts only from a computed tensor
        while source not in acts and source not in params:
            if source not in first_input:
                raise EncodingsError(f"no encoding on the way up from the cut tensor {tensor!r} "
                                     f"(reached {source!r}, which no node computes)")
            source = first_input[source]
        out["activation_encodings"][tensor] = acts.get(source, params.get(source))
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
    if version.startswith("2."):
        return "2.0.0"
    raise EncodingsError(f"{source}: unsupported encodings version '{version[:40]}'; "
                         f"hexbundle reads 0.6.1, 1.0.0 and 2.0.0 (as aimet-onnx 2.x exports)")


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
    return ParamEncoding(name, bitwidth, "int", symmetric, scale, offset, per_channel=len(encs) > 1,
                         enc_type="PER_CHANNEL" if len(encs) > 1 else "PER_TENSOR")


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
    return _parse_named_list(section, key, source, _parse_v1_entry)


def _parse_named_list(section: list, key: str, source: str, parse_entry) -> dict:
    """name -> encoding for a list of {"name": ..., ...} entries (1.0.0 sections, 2.0.0)."""
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
        result[name] = parse_entry(name, entry, where)
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
    if enc_type not in SUPPORTED_V1_ENC_TYPES:
        raise EncodingsError(f"{where}: key 'enc_type' must be one of "
                             f"{', '.join(SUPPORTED_V1_ENC_TYPES)}, got {_short(enc_type)}")
    if enc_type == "LPBQ":
        return _parse_v1_lpbq(name, entry, bitwidth, symmetric, where)
    scales = _as_list(_require(entry, "scale", where), "scale", where)
    offsets = _as_list(_require(entry, "offset", where), "offset", where)
    if enc_type == "PER_TENSOR" and len(scales) != 1:
        raise EncodingsError(f"{where}: PER_TENSOR needs exactly one scale, got {len(scales)}")
    offsets = _shifted(offsets, entry.get("zero_point_shift"), where)
    scale, offset = _scale_offset_arrays(scales, offsets, bitwidth, where)
    return ParamEncoding(name, bitwidth, "int", symmetric, scale, offset,
                         per_channel=enc_type != "PER_TENSOR", enc_type=enc_type,
                         block_size=_block_size(entry, where) if enc_type == "PER_BLOCK" else 0)


def _shifted(offsets: list, shift: Any, where: str) -> list:
    """1.0.0 writes a fractional zero point as an integer offset + `zero_point_shift` (one value
    or one per channel): the real offset is their sum."""
    if shift is None:
        return offsets
    shifts = _as_list(shift, "zero_point_shift", where)
    if len(shifts) == 1:
        shifts = shifts * len(offsets)
    if len(shifts) != len(offsets) or not all(_is_number(x) and math.isfinite(x) for x in shifts):
        raise EncodingsError(f"{where}: key 'zero_point_shift' must be one number or one per "
                             f"offset ({len(offsets)}), got {_short(shift)}")
    return [o + x if _is_number(o) else o for o, x in zip(offsets, shifts)]


def _block_size(entry: dict, where: str) -> int:
    value = _require(entry, "block_size", where)
    if not _is_integral(value) or int(value) < 1:
        raise EncodingsError(f"{where}: key 'block_size' must be a positive integer, got {_short(value)}")
    return int(value)


def _parse_v1_lpbq(name: str, entry: dict, bitwidth: int, symmetric: bool, where: str) -> ParamEncoding:
    """LPBQ: `bw` is the decompressed width, `compressed_bw` the stored one; the block scale is
    scale[c] * per_block_int_scale[c][b]."""
    compressed = _require(entry, "compressed_bw", where)
    if not _is_integral(compressed) or int(compressed) not in INT_BITWIDTHS or compressed >= bitwidth:
        raise EncodingsError(f"{where}: key 'compressed_bw' is {_short(compressed)}; it must be one of "
                             f"{', '.join(map(str, INT_BITWIDTHS))} and below 'bw' ({bitwidth})")
    if not symmetric:
        raise EncodingsError(f"{where}: LPBQ with is_sym false: hexbundle reads symmetric LPBQ "
                             "only (what AIMET exports); re-export symmetric")
    channel_scale = _as_list(_require(entry, "scale", where), "scale", where)
    int_scales = _as_list(_require(entry, "per_block_int_scale", where), "per_block_int_scale", where)
    return _lpbq_encoding(name, channel_scale, int_scales, int(compressed), bitwidth,
                          _block_size(entry, where), where)


def _lpbq_encoding(name, channel_scale: list, int_scales: list, compressed: int, decompressed: int,
                   block_size: int, where: str, axis=None, block_axis=None) -> ParamEncoding:
    """int_scales in [channel][block] order, len C x B."""
    channels = len(channel_scale)
    if not all(_is_valid_float32_scale(x) for x in channel_scale):
        raise EncodingsError(f"{where}: the per-channel float scales must be finite, > 0 and "
                             "representable in float32")
    if not channels or len(int_scales) % channels:
        raise EncodingsError(f"{where}: {len(int_scales)} per-block int scales do not divide into "
                             f"the {channels} channels of 'scale'")
    limit = 2 ** (decompressed - compressed)
    if not all(_is_integral(x) and 1 <= x <= limit for x in int_scales):
        bad = next(x for x in int_scales if not (_is_integral(x) and 1 <= x <= limit))
        raise EncodingsError(f"{where}: key 'per_block_int_scale' holds {_short(bad)}; each must be "
                             f"an integer in [1, {limit}] (2^(bw - compressed_bw))")
    blocks = len(int_scales) // channels
    cs = np.asarray(channel_scale, dtype=np.float64)
    ints = np.asarray(int_scales, dtype=np.float64).reshape(channels, blocks)
    effective = (cs[:, None] * ints).reshape(-1)
    offsets = [-(2 ** (compressed - 1))] * effective.size
    scale, offset = _scale_offset_arrays(effective.tolist(), offsets, compressed, where)
    return ParamEncoding(name, compressed, "int", True, scale, offset, per_channel=True,
                         enc_type="LPBQ", block_size=block_size, axis=axis, block_axis=block_axis,
                         lpbq=(cs, ints.astype(np.uint8), decompressed))   # cs: float64, as written


def _as_list(value: Any, key: str, where: str) -> list:
    if isinstance(value, list):
        return value
    if _is_number(value):
        return [value]
    raise EncodingsError(f"{where}: key '{key}' must be a list of numbers, got {_kind(value)}")


# --- v2.0.0: {"encodings": [{"name", "output_dtype", "y_scale", "y_zero_point", "axis", ...}]} ---
#
# One list for every tensor: whether an entry is a weight's or an activation's is the graph's to
# say (`Encodings.for_graph`). Signed dtypes hold q_s = q - 2^(bw-1): real = (q_s - zp) * scale,
# so in hexbundle's unsigned convention offset = -2^(bw-1) - zp (unsigned: offset = -zp).
# y_scale has the weight's rank where it is per block, the block axis reduced (e.g. [in/B][out]).

def _parse_v2(data: dict, source: str) -> Encodings:
    entries = data.get("encodings")
    if not isinstance(entries, list):
        raise EncodingsError(f"{source}: '2.0.0' encodings need a top-level 'encodings' list, got "
                             f"{_kind(entries)}")
    result = _parse_named_list(entries, "encodings", source, _parse_v2_entry)
    return Encodings(source=source, schema="2.0.0", params={}, activations=result)


def _parse_v2_entry(name: str, entry: dict, where: str) -> ParamEncoding:
    dtype_name = _require(entry, "output_dtype", where)
    if not isinstance(dtype_name, str) or dtype_name not in V2_DTYPES:
        raise EncodingsError(f"{where}: key 'output_dtype' is {_short(dtype_name)}; hexbundle reads "
                             f"{', '.join(sorted(V2_DTYPES))}")
    dtype, bitwidth, signed = V2_DTYPES[dtype_name]
    if dtype == "float":
        return _float_encoding(name, bitwidth, False)
    axis, block_size = entry.get("axis"), entry.get("block_size")
    if axis is not None and (not _is_integral(axis) or axis < 0):
        raise EncodingsError(f"{where}: key 'axis' must be a non-negative integer, got {_short(axis)}")
    if block_size is not None:
        block_size = _block_size(entry, where)
        if axis is None:
            raise EncodingsError(f"{where}: 'block_size' without 'axis'; the block axis is needed")
    if "per_block_int_scale" in entry:
        return _parse_v2_lpbq(name, entry, bitwidth, block_size, int(axis), where)
    scale = _array(_require(entry, "y_scale", where), "y_scale", where)
    zero = _array(entry.get("y_zero_point", 0), "y_zero_point", where)
    groups, channel_axis = _v2_groups(scale, block_size, axis, where)
    try:
        zeros = groups(np.broadcast_to(zero, scale.shape))
    except ValueError:
        raise EncodingsError(f"{where}: key 'y_zero_point' of shape {list(zero.shape)} does not "
                             f"match 'y_scale' of shape {list(scale.shape)}") from None
    base = -(2 ** (bitwidth - 1)) if signed else 0
    offsets = [base - z if _is_number(z) else z for z in zeros]
    symmetric = signed and all(_is_number(z) and z == 0 for z in zeros)
    scale_flat, offset_flat = _scale_offset_arrays(groups(scale), offsets, bitwidth, where)
    kind = "PER_BLOCK" if block_size else ("PER_CHANNEL" if scale.ndim else "PER_TENSOR")
    return ParamEncoding(name, bitwidth, "int", symmetric, scale_flat, offset_flat,
                         per_channel=kind != "PER_TENSOR", enc_type=kind, block_size=block_size or 0,
                         axis=channel_axis, block_axis=int(axis) if block_size else None)


def _v2_groups(scale: np.ndarray, block_size, axis, where: str):
    """(flatten, channel axis): a function flattening an array shaped like y_scale into
    hexbundle's group order ([channel][block] for blocks), and the channel axis."""
    if not block_size:
        if scale.ndim > 1:
            raise EncodingsError(f"{where}: key 'y_scale' has {scale.ndim} dimensions without "
                                 "'block_size'; per-channel scales are one list")
        return (lambda a: list(np.asarray(a, dtype=object).reshape(-1))), \
            (int(axis) if scale.ndim and axis is not None else None)
    axis = int(axis)
    if scale.ndim < 2 or axis >= scale.ndim:
        raise EncodingsError(f"{where}: per-block 'y_scale' must have the weight's rank with the "
                             f"block axis {axis} reduced, got {scale.ndim} dimension(s)")
    others = [d for d in range(scale.ndim) if d != axis and scale.shape[d] > 1]
    channel = others[0] if others else next(d for d in range(scale.ndim) if d != axis)
    if len(others) > 1:
        raise EncodingsError(f"{where}: per-block 'y_scale' of shape {list(scale.shape)} varies "
                             "along more than one axis besides the block axis")

    def flatten(a):
        a = np.asarray(a, dtype=object)
        return list(np.moveaxis(a, (channel, axis), (0, 1)).reshape(-1))
    return flatten, channel


def _parse_v2_lpbq(name: str, entry: dict, compressed: int, block_size, axis: int,
                   where: str) -> ParamEncoding:
    if not block_size:
        raise EncodingsError(f"{where}: 'per_block_int_scale' without 'block_size'")
    channel_scale = _array(_require(entry, "per_channel_float_scale", where),
                           "per_channel_float_scale", where)
    ints = _array(entry["per_block_int_scale"], "per_block_int_scale", where)
    if ints.ndim < 2 or axis >= ints.ndim:
        raise EncodingsError(f"{where}: 'per_block_int_scale' must have the weight's rank (at "
                             f"least 2, more than 'axis' {axis}), got {ints.ndim} dimension(s)")
    flatten, channel = _v2_groups(ints, block_size, axis, where)
    decompressed = 2 * compressed    # AIMET's 2.0.0 LPBQ: decompressed = 2 x compressed
    return _lpbq_encoding(name, list(channel_scale.reshape(-1)), flatten(ints), compressed,
                          decompressed, block_size, where, axis=channel, block_axis=axis)


# --- shared validation ---------------------------------------------------------------------------

def _array(value: Any, key: str, where: str) -> np.ndarray:
    """A number or a rectangular nested list of numbers, as an object array (exact values)."""
    try:
        array = np.array(value, dtype=object)
    except (ValueError, TypeError):
        array = None
    if array is None or not all(_is_number(x) for x in array.reshape(-1)):
        raise EncodingsError(f"{where}: key '{key}' must be a number or a rectangular list of "
                             f"numbers, got {_short(value)}")
    return array


def _float_encoding(name: str, bitwidth: int, symmetric: bool) -> ParamEncoding:
    return ParamEncoding(name, bitwidth, "float", symmetric, np.zeros(0, np.float32),
                         np.zeros(0, np.float32), per_channel=False)


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
    if _channels_valid(scales, offsets, low, high):
        return np.asarray(scales, dtype=np.float32), np.asarray(offsets, dtype=np.float32)
    for c, (scale, offset) in enumerate(zip(scales, offsets)):
        if not _is_valid_float32_scale(scale):
            raise EncodingsError(f"{where}: key 'scale' channel {c} is {_short(scale)}; scales must "
                                 f"be finite, > 0 and representable in float32")
        # fractional only through a shifted zero point (1.0.0 zero_point_shift, 2.0.0 y_zero_point)
        if not _is_number(offset) or not math.isfinite(offset) or not low - 1 < offset < high + 1 \
                or offset * 2 != int(offset * 2):
            raise EncodingsError(f"{where}: key 'offset' channel {c} is {_short(offset)}; for "
                                 f"{bitwidth}-bit it must be an integer (or a half, with a shifted "
                                 f"zero point) in [{low}, {high}]")
    return np.asarray(scales, dtype=np.float32), np.asarray(offsets, dtype=np.float32)


def _channels_valid(scales: list, offsets: list, low: int, high: int) -> bool:
    """True only if every channel passes _scale_offset_arrays' checks, judged on whole arrays
    (a 7B graph has ~10^5 channels: the loop over them was most of reading its encodings). Any
    doubt (a value not exactly an int or a float, an int too large for a double) is False: the
    loop then judges channel by channel and names the first bad one."""
    numbers = {int, float}
    if not set(map(type, scales)) <= numbers or not set(map(type, offsets)) <= numbers:
        return False
    try:
        scale = np.asarray(scales, dtype=np.float64)
        offset = np.asarray(offsets, dtype=np.float64)
    except OverflowError:
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        twice = offset * 2
        return bool(np.isfinite(scale).all() and (scale >= _FLOAT32_TINY).all()
                    and (scale <= _FLOAT32_MAX).all() and np.isfinite(offset).all()
                    and ((offset > low - 1) & (offset < high + 1)).all()
                    and (twice == np.trunc(twice)).all())


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
