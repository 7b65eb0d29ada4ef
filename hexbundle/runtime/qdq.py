"""The export's quantized model, independent of the build: its float ONNX with every encoding of
its AIMET encodings file applied, run by onnxruntime (`doit verify`'s reference).

From a graph's ONNX and encodings file, `write_qdq_model` writes a QDQ model:
  - every weight with an encoding replaced by its quantize-dequantize under AIMET's formula
    (q = clip(round(w / scale - offset), 0, 2^bw - 1), w' = (q + offset) * scale: a shifted,
    fractional offset before rounding, so it stays on its integer grid; an integral one after,
    as the weights check and the build compute it: grid_integers), per tensor,
    per channel or per block, computed here with numpy from the float weights (not from the
    bin: the bin is what is judged); a float16 encoding rounds the weight to float16;
  - after every tensor with an activation encoding (graph inputs, node outputs), a
    com.microsoft QuantizeLinear -> DequantizeLinear pair (uint8/uint16, zero point = -offset:
    onnxruntime's own rounding and saturation), or for an encoding those cannot express (a
    fractional offset, another bit width) the same formula in ONNX float ops; a float16
    activation encoding as a Cast to float16 and back.
onnxruntime runs it with graph optimizations off, so no fusion changes what a node computes.

The channel axis of a per-channel weight is the file's (2.0.0) or, for the older schemas, the
consumer's: the output channels of a MatMul's second input (last axis), a Gemm's (by transB),
a Conv's weight (axis 0) and a Gather's table (axis 0) -- read here from the graph, not taken
from the backend's weight plan, so the reference does not share the build's decisions.

Weights without an int encoding are float weights: those larger than the containers' small
constants are stored at the build's float precision (`float_bitwidth`, 16 by default: QAIRT's
float_precision), so the reference rounds them to float16 too; small constants stay float32, as
in the topology. (The build's unencoded_weights = "int8" policy is not the export's
specification: the reference keeps those float, and verify's float-drift row shows its effect.)

Two roundings, two correct references: `HALF_EVEN` (numpy's and onnxruntime's QuantizeLinear,
round half to even) and `AIMET` (AIMET's quantizer, floor(x / s - o + 0.5): half up), for
weights and activations alike. They part ways exactly at the ties the weights check lets a bin
resolve either way, so what a tie can do to an output is inside the floor they measure. Both
are faithful to the encodings; what separates them is the
noise floor of the comparison itself, which `doit verify` measures per run and gates the bundle
against (checks/verify.py), instead of a constant tuned on one export.
"""
from __future__ import annotations

from pathlib import Path
from dataclasses import replace
from typing import Optional

import numpy as np

from hexbundle.formats.container import SMALL_CONSTANT_ELEMENTS
from hexbundle.formats import encodings
from hexbundle.formats.encodings import load_encodings
from hexbundle.formats.onnxfile import initializer_values, load_structure
from hexbundle.runtime.onnx_graph import OnnxGraph
from hexbundle.support.errors import VerifyError

MS_DOMAIN = "com.microsoft"
DATA_FILE = "weights.data"
QDQ_TYPES = {8: np.uint8, 16: np.uint16}
HALF_EVEN, AIMET = "half-even", "aimet"    # the two roundings (module docstring)
ROUNDINGS = (HALF_EVEN, AIMET)
INLINE_BYTES = 1024   # smaller tensors are kept in the model file


# ============================================================================ weights


def weight_axis(graph, name: str, shape: tuple, channels: int, axis) -> int:
    """The channel axis of a per-channel weight encoding (see the module docstring)."""
    if axis is not None:
        return int(axis)
    for node in graph.node:
        for index, used in enumerate(node.input):
            if used != name:
                continue
            if node.op_type == "MatMul" and index == 1:
                return len(shape) - 1
            if node.op_type == "Gemm" and index == 1:
                trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
                return 0 if trans_b else len(shape) - 1
            if (node.op_type == "Conv" and index == 1) or (node.op_type == "Gather" and index == 0):
                return 0
    matching = [d for d, size in enumerate(shape) if size == channels]
    if len(matching) == 1:
        return matching[0]
    raise VerifyError(f"weight '{name}' {list(shape)}: {channels} channel encodings and no "
                      "consumer that says which axis is the channel axis")


def _broadcast(groups: np.ndarray, shape: tuple, axis: int, block_axis, block_size: int):
    """Per-channel (C,) or per-block (C*B,) values, [channel][block], shaped to broadcast
    against a tensor of `shape`."""
    if not block_size:
        out = [1] * len(shape)
        out[axis] = groups.size
        return groups.reshape(out)
    blocks = shape[block_axis] // block_size
    table = np.repeat(groups.reshape(shape[axis], blocks), block_size, axis=1)
    if axis > block_axis:
        table = table.T
    out = [1] * len(shape)
    out[axis], out[block_axis] = shape[axis], shape[block_axis]
    return table.reshape(out)


def weight_grid(enc, graph, name: str, shape: tuple):
    """(scale, offset) of an int weight encoding, shaped to broadcast against the weight."""
    scale, offset = enc.scale.astype(np.float32), enc.offset.astype(np.float32)
    if enc.is_blockwise:
        axis = weight_axis(graph, name, shape, -1, enc.axis)
        block_axis = enc.block_axis if enc.block_axis is not None else (1 if axis == 0 else 0)
        return (_broadcast(scale, shape, axis, block_axis, enc.block_size),
                _broadcast(offset, shape, axis, block_axis, enc.block_size))
    if enc.channels > 1:
        axis = weight_axis(graph, name, shape, enc.channels, enc.axis)
        return _broadcast(scale, shape, axis, None, 0), _broadcast(offset, shape, axis, None, 0)
    return scale.reshape(()), offset.reshape(())


def round_to_grid(x: np.ndarray, rounding: str = HALF_EVEN) -> np.ndarray:
    """x rounded to integers: half to even, or AIMET's half up (floor(x + 0.5))."""
    return np.round(x) if rounding == HALF_EVEN else np.floor(x + np.float32(0.5))


def grid_integers(block: np.ndarray, scale, offset, rounding: str = HALF_EVEN) -> np.ndarray:
    """round(w / s - o) before clipping, in the frame the weights check (checks/exact.py
    aimet_quantize) and the reference backend compute it: w / s in float32, and with an integral
    offset rounded before the offset is subtracted. Subtracting a 16-bit offset first would move
    w / s by up to 2^-9 (float32 keeps 8 fraction bits at 32768), turning a near-tie into a tie
    (or a tie into none) that both roundings then resolve alike: two references agreeing with
    each other and not with the integers the weights check accepts (issue 46, the Qwen3 kv16
    export's 16-bit embedding). In this frame a tie is a tie for every reader, and the two
    roundings part ways on it."""
    t = np.divide(block, scale, dtype=np.float32)
    if np.all(offset == np.floor(offset)):
        return round_to_grid(t, rounding) - offset
    return round_to_grid(t - offset, rounding)


def _encoded(block: np.ndarray, enc, grid, rows: slice, rounding: str = HALF_EVEN) -> np.ndarray:
    """A block of rows (axis 0) of a weight as its encoding specifies it, float32."""
    if enc is None or not enc.is_int:
        if enc is not None and enc.bitwidth == 16:   # a float16 encoding
            return block.astype(np.float16).astype(np.float32)
        return block
    scale, offset = (g[rows] if g.ndim and g.shape[0] > 1 else g for g in grid)
    q = np.clip(grid_integers(block, scale, offset, rounding), 0, 2 ** enc.bitwidth - 1)
    return ((q + offset) * scale).astype(np.float32)


def _integers(block: np.ndarray, enc, grid, rows: slice, signed: bool,
              rounding: str = HALF_EVEN) -> np.ndarray:
    """A block of rows of a weight as its encoding's integers q (AIMET's formula, 0..2^bw-1),
    shifted by 2^(bw-1) when `signed` (a symmetric encoding: zero point 0)."""
    scale, offset = (g[rows] if g.ndim and g.shape[0] > 1 else g for g in grid)
    q = np.clip(grid_integers(block, scale, offset, rounding), 0, 2 ** enc.bitwidth - 1)
    return q - 2 ** (enc.bitwidth - 1) if signed else q


def quantize_dequantize_weight(values: np.ndarray, enc, graph, name: str) -> np.ndarray:
    """The weight as its encoding specifies it (AIMET's formula), float32."""
    w = np.asarray(values, np.float32)
    grid = weight_grid(enc, graph, name, w.shape) if enc.is_int else None
    return _encoded(w, enc, grid, slice(None))


# ============================================================================ activations


def _qdq_nodes(source: str, target: str, enc, graph, rounding: str = HALF_EVEN) -> list:
    """Nodes taking `source` to `target` through the activation encoding `enc` (AIMET's
    rounding: always the float-op form, QuantizeLinear rounds half to even)."""
    from onnx import TensorProto, helper, numpy_helper
    if not enc.is_int:
        return [helper.make_node("Cast", [source], [target + "__f16"], to=TensorProto.FLOAT16),
                helper.make_node("Cast", [target + "__f16"], [target], to=TensorProto.FLOAT)]
    scale = np.asarray(enc.scale, np.float32)
    offset = np.asarray(enc.offset, np.float32)
    if scale.size != 1:
        raise VerifyError(f"activation encoding of '{source}' has {scale.size} channels; the "
                          "reference reads per-tensor activation encodings")
    s_name, z_name = target + "__scale", target + "__zero_point"
    kind = QDQ_TYPES.get(enc.bitwidth)
    if rounding == HALF_EVEN and kind is not None and float(offset[0]).is_integer() \
            and 0 <= -offset[0] <= np.iinfo(kind).max:
        graph.initializer.extend([numpy_helper.from_array(scale[0], s_name),
                                  numpy_helper.from_array(np.array(-offset[0], kind), z_name)])
        return [helper.make_node("QuantizeLinear", [source, s_name, z_name], [target + "__q"],
                                 domain=MS_DOMAIN),
                helper.make_node("DequantizeLinear", [target + "__q", s_name, z_name], [target],
                                 domain=MS_DOMAIN)]
    # AIMET's formula in float ops: (clip(round(x / s - o), 0, qmax) + o) * s
    o_name, lo, hi = target + "__offset", target + "__lo", target + "__hi"
    graph.initializer.extend([numpy_helper.from_array(scale[0], s_name),
                              numpy_helper.from_array(offset[0], o_name),
                              numpy_helper.from_array(np.float32(0), lo),
                              numpy_helper.from_array(np.float32(2 ** enc.bitwidth - 1), hi)])
    t = target
    if rounding == HALF_EVEN:
        to_grid = [helper.make_node("Round", [t + "__u"], [t + "__r"])]
    else:   # floor(u + 0.5)
        half = t + "__half"
        graph.initializer.append(numpy_helper.from_array(np.float32(0.5), half))
        to_grid = [helper.make_node("Add", [t + "__u", half], [t + "__h"]),
                   helper.make_node("Floor", [t + "__h"], [t + "__r"])]
    # NaN saturates to the grid's bottom, as QuantizeLinear (and a fixed-point unit) has it: an
    # RMSNorm of a zero padding row quantizes its eps away (0 / 0), and a NaN kept here reaches
    # the real rows through attention (masked weight 0 x NaN), so the two references would differ
    # by that, not by their rounding
    return [helper.make_node("Div", [source, s_name], [t + "__d"]),
            helper.make_node("Sub", [t + "__d", o_name], [t + "__u"]),
            *to_grid,
            helper.make_node("IsNaN", [t + "__r"], [t + "__nan"]),
            helper.make_node("Where", [t + "__nan", lo, t + "__r"], [t + "__n"]),
            helper.make_node("Clip", [t + "__n", lo, hi], [t + "__c"]),
            helper.make_node("Add", [t + "__c", o_name], [t + "__a"]),
            helper.make_node("Mul", [t + "__a", s_name], [t])]


# HTP computes these with the activation input's width at the output: a 16-bit input and an
# 8-bit output (a V projection feeding the 8-bit KV cache, in qai-hub-models' 0.60+ checkpoints)
# is not an op it has; QNN's converters put a Convert after the op, which rounds twice.
WIDTH_KEEPING_OPS = ("Conv", "MatMul", "Gemm")


def widened(enc, bitwidth: int = 16):
    """`enc`'s grid refined to `bitwidth` bits over the same range: every point of `enc`'s grid
    is one of its points (scale / 2^k, offset x 2^k), so a value on the narrow grid passes
    through unchanged and rounding to it first moves a value only by under half a narrow step."""
    k = 2 ** (bitwidth - enc.bitwidth)
    return replace(enc, bitwidth=bitwidth, scale=np.asarray(enc.scale, np.float32) / k,
                   offset=np.asarray(enc.offset, np.float32) * k)


def _narrowing_op(node, activations: dict) -> bool:
    """A node HTP cannot compute as encoded: a width-keeping op whose activation input is
    encoded wider than its output."""
    if node.op_type not in WIDTH_KEEPING_OPS or not node.input:
        return False
    source, out = activations.get(node.input[0]), activations.get(node.output[0])
    return (source is not None and out is not None and source.is_int and out.is_int
            and source.bitwidth > out.bitwidth)


def insert_activation_qdq(graph, activations: dict, rounding: str = HALF_EVEN,
                          htp_widths: bool = False) -> int:
    """A QDQ after every tensor of `activations` the graph has; returns how many. Consumers read
    the quantized tensor; a graph output keeps its name (its producer's output is renamed).
    `htp_widths` (the form a compiler takes): an op that would narrow its activation's width
    (WIDTH_KEEPING_OPS) writes its output at the input's width first, then requantizes it to
    its own encoding, as QNN's Convert does."""
    outputs = {o.name for o in graph.output}
    graph_inputs = {i.name for i in graph.input}
    renamed, nodes, count = {}, [], 0
    for name in sorted(graph_inputs & set(activations)):
        renamed[name] = name + "__qdq"
        nodes += _qdq_nodes(name, renamed[name], activations[name], graph, rounding)
        count += 1
    for node in list(graph.node):
        narrowing = htp_widths and _narrowing_op(node, activations)
        wide = activations.get(node.input[0]) if narrowing else None
        node.input[:] = [renamed.get(i, i) for i in node.input]
        nodes.append(node)
        for index, out in enumerate(node.output):
            if out not in activations:
                continue
            source = out
            if out in outputs:
                node.output[index] = source = out + "__float"
            if wide is not None and index == 0:
                nodes += _qdq_nodes(source, out + "__wide",
                                    widened(activations[out], wide.bitwidth), graph, rounding)
                source = out + "__wide"
            if out not in outputs:
                renamed[out] = out + "__qdq"
            nodes += _qdq_nodes(source, renamed.get(out, out), activations[out], graph, rounding)
            count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return count


# The QNN EP builds a Reciprocal as ElementWiseDivide(1, x) with the constant 1 quantized on x's
# own encoding (onnxruntime-qnn's reciprocal_op_builder). Where x's range stays below 1 (the
# Sqrt of an RMSNorm's mean square: [0, 0.026] in a Qwen3 export) the 1 saturates to x's largest
# value, so HTP computes x_max / x: off by the factor 1 / x_max (39 there; measured on the
# simulator, issue 48). The compiler's form divides by a constant 1 of its own encoding instead.
ONE = "hexbundle__one"
ONE_SCALE = np.float32(2.0 ** -15)    # 16 bits over [0, 2): 1.0 is the integer 32768, exactly


def reciprocals_as_divisions(graph) -> int:
    """Each Reciprocal(x) of `graph` replaced by Div(1, x) with the 1 an integer constant and its
    own DequantizeLinear (16 bits, 1.0 exact): the same values in float (both are 1 / x), and
    what HTP computes correctly whatever x's range. Returns how many."""
    from onnx import helper, numpy_helper
    count, nodes = 0, []
    for node in graph.node:
        if node.op_type != "Reciprocal":
            nodes.append(node)
            continue
        if not count:
            graph.initializer.extend([
                numpy_helper.from_array(np.array(round(1 / ONE_SCALE), np.uint16), ONE + "__q"),
                numpy_helper.from_array(ONE_SCALE, ONE + "__scale"),
                numpy_helper.from_array(np.array(0, np.uint16), ONE + "__zero_point")])
            nodes.append(helper.make_node("DequantizeLinear", [ONE + "__q", ONE + "__scale",
                                                               ONE + "__zero_point"], [ONE],
                                          name=ONE + "__dq", domain=MS_DOMAIN))
        nodes.append(helper.make_node("Div", [ONE, node.input[0]], list(node.output),
                                      name=node.name or None))
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return count


# ============================================================================ integer weights
# A compiler takes a weight as its integers and a DequantizeLinear (ONNX's QDQ form), not as
# fake-quantized floats: `integer_weights` writes each int-encoded weight so. The integers are
# the same AIMET formula as the float form's, so both models compute the same values.

INT_TYPES = {   # (bitwidth, signed) -> ONNX element type, numpy storage type
    (4, True): ("INT4", np.int8), (4, False): ("UINT4", np.uint8),
    (8, True): ("INT8", np.int8), (8, False): ("UINT8", np.uint8),
    (16, True): ("INT16", np.int16), (16, False): ("UINT16", np.uint16)}


def _signed(enc) -> bool:
    """A symmetric encoding (every offset -2^(bw-1)): stored signed, zero point 0, the form HTP
    takes per channel."""
    return bool(np.all(enc.offset == -2 ** (enc.bitwidth - 1)))


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """4-bit integers two to a byte, the first in the low nibble (ONNX's INT4/UINT4 layout; an
    odd count ends in a half-used byte)."""
    flat = np.append(q.reshape(-1).astype(np.int16) & 0xF, np.zeros(q.size % 2, np.int16))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def _dequantize_node(init, enc, graph, onnx_path: Path, shape: tuple):
    """The DequantizeLinear that gives the graph back the weight `init` names, from its integers
    (renamed init.name + '__q') and its scale and zero point; sets init's integer type."""
    from onnx import TensorProto, helper, numpy_helper
    if enc.is_blockwise:
        raise VerifyError(f"{onnx_path}: weight '{init.name}' has a per-block encoding; the "
                          "integer-weight QDQ model takes per-tensor and per-channel encodings")
    if not np.all(enc.offset == np.round(enc.offset)):
        raise VerifyError(f"{onnx_path}: weight '{init.name}' has a fractional offset, which a "
                          "DequantizeLinear zero point cannot express")
    signed = _signed(enc)
    type_name, storage = INT_TYPES[(enc.bitwidth, signed)]
    zero_point = np.zeros(enc.channels, storage) if signed else (-enc.offset).astype(storage)
    scale, attrs = enc.scale.astype(np.float32), {}
    if enc.channels > 1:
        attrs["axis"] = weight_axis(graph, init.name, shape, enc.channels, enc.axis)
    else:
        scale, zero_point = scale.reshape(()), zero_point.reshape(())
    s_name, z_name = init.name + "__scale", init.name + "__zero_point"
    element_type = getattr(TensorProto, type_name)
    zero_bytes = _pack_nibbles(zero_point) if enc.bitwidth == 4 else zero_point
    graph.initializer.extend([
        numpy_helper.from_array(scale, s_name),
        helper.make_tensor(z_name, element_type, zero_point.shape,
                           np.ascontiguousarray(zero_bytes).tobytes(), raw=True)])
    init.data_type = element_type
    return helper.make_node("DequantizeLinear", [init.name + "__q", s_name, z_name],
                            [init.name], name=init.name + "__dq", domain=MS_DOMAIN, **attrs)


FLOAT_WEIGHT_BITWIDTH = 16   # integer_weights: a float weight's own range, per tensor


def derived_encodings(ranges: dict, bitwidth: int) -> dict:
    """name -> (lo, hi) as asymmetric per-tensor int encodings (formats/encodings.py's own)."""
    if not ranges:
        return {}
    entries = [encodings.int_entry(n, encodings.asymmetric_per_tensor(lo, hi, bitwidth))
               for n, (lo, hi) in sorted(ranges.items())]
    doc = encodings.encodings_document(entries, [], {})
    return encodings.parse_encodings(doc, "derived encodings").activations


def _float_weight_encoding(init, values):
    """An int encoding for a float weight the export left float (a norm's scale, a bias, a
    constant): its own range at FLOAT_WEIGHT_BITWIDTH bits, since a compiler's integer graph
    has no float tensor."""
    lo = hi = 0.0
    for _, block in values.rows():
        if block.size:
            lo, hi = min(lo, float(block.min())), max(hi, float(block.max()))
    return derived_encodings({init.name: (lo, hi)}, FLOAT_WEIGHT_BITWIDTH)[init.name]


def _integer_blocks(values, enc, grid, signed: bool, rounding: str, onnx_path: Path, name: str):
    """The weight's integers, a block of rows at a time, in their stored bytes."""
    _, storage = INT_TYPES[(enc.bitwidth, signed)]
    for rows, block in values.rows():
        q = _integers(block, enc, grid, rows, signed, rounding).astype(storage)
        if enc.bitwidth == 4:
            if q.size % 2:
                raise VerifyError(f"{onnx_path}: 4-bit weight '{name}' has a block of rows of "
                                  f"{q.size} values; two to a byte needs an even count")
            yield _pack_nibbles(q)
        else:
            yield q


# ============================================================================ the model


class WeightStore:
    """The weights file of one or more reference graphs in a directory: a tensor is written once
    (a part's prompt and token graphs share their weights), a block of rows at a time."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / DATA_FILE
        self._file = open(self.path, "wb")
        self._written = {}   # (name, source, encoding) -> (offset, length)

    def put(self, key, blocks) -> tuple:
        if key not in self._written:
            offset = self._file.tell()
            for block in blocks:
                self._file.write(np.ascontiguousarray(block).tobytes())
            length = self._file.tell() - offset
            self._file.write(b"\0" * (-length % 64))
            self._written[key] = (offset, length)
        return self._written[key]

    def close(self) -> None:
        self._file.close()


def _source_key(init, values, enc, rounding: str, float_bitwidth: int) -> tuple:
    where = (str(values.data_path), values.offset) if values.inline is None else \
        values.inline.tobytes()
    encoding = None if enc is None else (enc.bitwidth, enc.dtype, enc.scale.tobytes(),
                                         enc.offset.tobytes(), enc.block_size, enc.axis)
    return init.name, where, encoding, rounding, float_bitwidth


def _stored_float(block: np.ndarray, float_bitwidth: int) -> np.ndarray:
    """A float weight as the build stores it: float16 at float_bitwidth 16, else as it is."""
    return block.astype(np.float16).astype(block.dtype) if float_bitwidth == 16 else block


def _float_weight(init, values, e) -> bool:
    """A float weight with a blob of its own and no int encoding (a float one, or none)."""
    count = int(np.prod(values.shape, dtype=np.int64))
    return (e is None or (not e.is_int and e.bitwidth == 32)) \
        and count > SMALL_CONSTANT_ELEMENTS


def write_qdq_model(onnx_path: Path, encodings_path: Path, out_dir: Path,
                    store: Optional[WeightStore] = None, name: str = "model",
                    rounding: str = HALF_EVEN, float_bitwidth: int = 32,
                    integer_weights: bool = False, activations: Optional[dict] = None) -> Path:
    """The QDQ model of one graph (module docstring), written to out_dir/<name>.onnx with its
    weights in out_dir/weights.data (`store`: shared with other graphs in out_dir), streamed a
    block of rows at a time: memory stays near one block, not the largest weight.
    `integer_weights`: each int-encoded weight as its integers + a DequantizeLinear (the form a
    compiler takes: backends/ortqnn.py), not as fake-quantized floats; a float weight gets an
    encoding of its own range (_float_weight_encoding); a Reciprocal becomes a Div of an exact
    1 (reciprocals_as_divisions). `activations`: encodings of tensors the
    file leaves unencoded, added to its own (the file's win)."""
    import onnx
    from onnx import TensorProto
    model = load_structure(onnx_path)
    graph = model.graph
    enc = load_encodings(encodings_path).for_graph({i.name for i in graph.initializer})
    own = store is None
    store = store or WeightStore(out_dir)
    dequantize = []
    try:
        for init in list(graph.initializer):
            values = initializer_values(init, onnx_path)
            e = enc.params.get(init.name)
            floating = np.issubdtype(values.dtype, np.floating)
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                          "uint64_data", "string_data"):
                init.ClearField(field)
            del init.external_data[:]
            narrow = floating and _float_weight(init, values, e)
            integer = floating and integer_weights
            if integer and (e is None or not e.is_int):
                e = _float_weight_encoding(init, values)
            if values.nbytes <= INLINE_BYTES and not integer:   # shape constants: onnxruntime infers from them
                whole = values.whole()
                data = _encoded(whole.astype(np.float32), e, e.is_int and weight_grid(
                    e, graph, init.name, whole.shape), slice(None), rounding).astype(whole.dtype) \
                    if floating and e is not None else whole
                data = _stored_float(data, float_bitwidth) if narrow else data
                init.data_location = TensorProto.DEFAULT
                init.raw_data = np.ascontiguousarray(data).tobytes()
                continue
            if integer:
                grid = weight_grid(e, graph, init.name, values.shape)
                signed = _signed(e)
                dequantize.append(_dequantize_node(init, e, graph, onnx_path, values.shape))
                blocks = _integer_blocks(values, e, grid, signed, rounding, onnx_path, init.name)
                key = (*_source_key(init, values, e, rounding, float_bitwidth), "integers")
                init.name += "__q"
            elif floating:
                grid = weight_grid(e, graph, init.name, values.shape) \
                    if e is not None and e.is_int else None
                blocks = ((_stored_float(block, float_bitwidth) if narrow else
                           _encoded(block, e, grid, rows, rounding)).astype(values.dtype)
                          for rows, block in values.rows())
            else:
                blocks = iter([values.whole()])
            if not integer:
                key = _source_key(init, values, e, rounding, float_bitwidth)
            offset, length = store.put(key, blocks)
            init.data_location = TensorProto.EXTERNAL
            for key, value in (("location", DATA_FILE), ("offset", str(offset)),
                               ("length", str(length))):
                entry = init.external_data.add()
                entry.key, entry.value = key, value
    finally:
        if own:
            store.close()
    if dequantize:
        nodes = dequantize + list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes)
        model.ir_version = max(model.ir_version, 10)   # INT4/UINT4 tensors need IR 10
    if integer_weights:   # after the weights: its constant is already integers
        reciprocals_as_divisions(graph)
    insert_activation_qdq(graph, {**(activations or {}), **enc.activations}, rounding,
                          htp_widths=integer_weights)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
    path = out_dir / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def qdq_graph(onnx_path: Path, encodings_path: Path, out_dir: Path,
              store: Optional[WeightStore] = None, name: str = "model",
              rounding: str = HALF_EVEN, float_bitwidth: int = 32,
              integer_weights: bool = False, activations: Optional[dict] = None) -> OnnxGraph:
    """The reference of one graph, as a part session's graph executor. `integer_weights` and
    `activations` as write_qdq_model's: the form the ortqnn backend compiles (its references)."""
    return OnnxGraph(write_qdq_model(onnx_path, encodings_path, out_dir, store, name, rounding,
                                     float_bitwidth, integer_weights, activations),
                     optimize=False, source=onnx_path)
