"""A CPU runner for hexbundle context binaries: one graph of a bin, run by a numpy interpreter.

Verify and `scripts/generate.py` run a bundle on the host with this module: each graph of a .bin
is executed by a small numpy interpreter of the ONNX topology stored in the bin
(`CtxBinReader.topology`), with the weights read from the bin itself (not from the ONNX), so what
runs is what the device would load.

The graph runner (`GraphRunner`)
--------------------------------
* Op set: the ops of the generated Qwen2 graphs and of qai-hub-models exports (Constant, Conv,
  Cast, Squeeze/Unsqueeze, Identity, ...; `SUPPORTED_OPS`, opset 17 semantics). Any other op is refused
  when the runner is built, naming the bin, graph, node and op; there is no fallback. An op that
  fails while running names the node, op and its input tensors.
* Weights stay in the mmap of the bin until the node that consumes them runs. MatMul by a weight
  (and a 1x1 Conv, the same product) works through it in column blocks (<= `BLOCK_ELEMENTS`
  floats at a time), as ((x @ q) + sum(x) * offset) * scale, the dequantization formula moved
  past the product; Gather from a weight (the embedding) dequantizes only the gathered rows; any
  other use dequantizes the whole tensor.
  Every value (weight or activation) is dropped after its last consumer, so memory is bounded by
  one part and in practice by the largest tensor, never by the model.
* Dequantization is the file format's: real = (q + offset[c]) * scale[c] (docs/formats.md).
* Device numerics (on by default, `quantize_io`): every float tensor that has an activation
  encoding in the bin -- graph inputs, every node's output, graph outputs -- is rounded to it as
  the HTP holds it (AIMET's formula: q = clip(round(x / scale - offset), 0, 2^bw - 1),
  x' = (q + offset) * scale; 16-bit hidden states, the 8-bit KV path where the encodings say so,
  signed 2.0.0 zero points already in this unsigned form; a float encoding rounds to float16).
  Between encoded tensors the runner computes in float32, as the HTP accumulates wider than it
  stores. Off: float32 throughout (tests compare the weights alone with onnxruntime).

A part session (`hexbundle.runtime.sessions`) drives the runner with the inputs the runtime
conventions (`hexbundle.runtime.conventions`) define.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from onnx import helper, numpy_helper

from hexbundle.formats.container import QuantParams, dequantize
from hexbundle.formats.ctxbin import CtxBinReader
from hexbundle.runtime.sessions import IoInfo
from hexbundle.support.errors import VerifyError

BLOCK_ELEMENTS = 1 << 22     # floats dequantized at a time for MatMul by a weight (16 MiB)


# ============================================================================ device I/O


def fake_quantize(x: np.ndarray, encoding: dict, name: str = "") -> np.ndarray:
    """x rounded to an activation encoding {bitwidth, dtype, scale: [...], offset: [...]}: one
    (scale, offset) per tensor, or one per channel of the last axis."""
    if encoding.get("dtype", "int") != "int":   # a float encoding: the device keeps float16
        return x.astype(np.float16).astype(np.float32)
    scale = np.asarray(encoding["scale"], np.float32)
    offset = np.asarray(encoding["offset"], np.float32)
    if scale.size != 1 and (x.ndim == 0 or x.shape[-1] != scale.size):
        raise VerifyError(f"activation encoding of '{name}' has {scale.size} channels but the "
                          f"tensor is {list(x.shape)}: per-channel activations are read along "
                          "the last axis")
    if scale.size == 1:
        scale, offset = scale[0], offset[0]
    # A quantized tensor holds no NaN: a 0/0 (an RMSNorm of a padded, all-zero row whose
    # mean square + eps rounds to 0) is taken as 0, an infinity saturates (np.clip).
    x = np.where(np.isnan(x), np.float32(0), x)
    q = np.clip(np.round(x / scale - offset), 0, 2 ** encoding["bitwidth"] - 1)
    return ((q + offset) * scale).astype(np.float32)


# ============================================================================ the graph runner


class _Weight:
    """A weight still in the bin's mmap; ops that know better read only what they need."""

    def __init__(self, reader: CtxBinReader, graph: str, name: str):
        self.reader, self.graph, self.name = reader, graph, name

    def values(self) -> np.ndarray:
        return self.reader.weight(self.graph, self.name)

    def quant(self) -> Optional[QuantParams]:
        return self.reader.quant_params(self.graph, self.name)

    def full(self) -> np.ndarray:
        return self.reader.dequantize(self.graph, self.name)


def _dense(value) -> np.ndarray:
    return value.full() if isinstance(value, _Weight) else value


def _sliced(quant: Optional[QuantParams], axis: int, index) -> Optional[QuantParams]:
    """Quant params for a slice (or a gather) of the tensor along `axis`."""
    if quant is None or quant.axis != axis:
        return quant
    return QuantParams(quant.bitwidth, quant.axis, quant.scale[index], quant.offset[index],
                       quant.symmetric)


def _attr(node, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return _attribute_value(node, a)
    return default


def _attribute_value(node, a):
    """An attribute as Python/numpy: ints, floats, their lists, strings and tensors (Constant)."""
    if a.type == a.INT:
        return a.i
    if a.type == a.INTS:
        return list(a.ints)
    if a.type == a.FLOAT:
        return a.f
    if a.type == a.FLOATS:
        return list(a.floats)
    if a.type == a.STRING:
        return a.s.decode()
    if a.type == a.TENSOR:
        return numpy_helper.to_array(a.t)
    raise VerifyError(f"node {node.name} ({node.op_type}): attribute {a.name} has an unsupported "
                      f"type {a.type}")


def _matmul(node, a, b):
    if isinstance(a, _Weight):
        a = a.full()
    if not isinstance(b, _Weight):
        return np.matmul(a, b)
    values, quant = b.values(), b.quant()
    if values.ndim != 2 or (quant is not None and (quant.axis not in (None, 1) or quant.block_size)):
        return np.matmul(a, b.full())   # per-block weights: dequantized whole (format's formula)
    return _matmul_by_columns(a, values, quant)


def _matmul_by_columns(a: np.ndarray, values: np.ndarray, quant: Optional[QuantParams]):
    """a @ W for W = (q + offset[c]) * scale[c] (per output column c, or per tensor), a block of
    columns at a time, as ((a @ q) + sum(a) * offset) * scale: the same values without
    materialising the dequantized block (two passes over it instead of six)."""
    rows, cols = values.shape
    out = np.empty(a.shape[:-1] + (cols,), dtype=np.float32)
    a_sum = a.sum(axis=-1, keepdims=True, dtype=np.float32) if quant is not None else None
    step = max(1, BLOCK_ELEMENTS // max(rows, 1))
    for start in range(0, cols, step):
        block = slice(start, min(cols, start + step))
        product = np.matmul(a, values[:, block].astype(np.float32))
        if quant is not None:
            q = _sliced(quant, 1, block)
            product += a_sum * q.offset.astype(np.float32)
            product *= q.scale.astype(np.float32)
        out[..., block] = product
    return out


def _gather(node, data, indices):
    axis = _attr(node, "axis", 0)
    indices = np.asarray(indices)
    if not isinstance(data, _Weight):
        return np.take(data, indices, axis=axis)
    values = data.values()
    quant = data.quant()
    if axis != 0 or (quant is not None and quant.block_size):   # blocks: dequantize whole
        return np.take(data.full(), indices, axis=axis)
    bad = (indices < 0) | (indices >= values.shape[0])
    if bad.any():
        raise VerifyError(f"graph {data.graph}: Gather from '{data.name}' got index "
                          f"{int(indices[bad][0])}, outside [0, {values.shape[0]}); the token ids "
                          f"must be < n-vocab")
    rows = values[indices.reshape(-1)]
    return dequantize(rows, _sliced(quant, 0, indices.reshape(-1))).reshape(
        indices.shape + values.shape[1:])


def _slice(node, data, starts, ends, axes=None, steps=None):
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[int(axis)] = slice(int(start), int(end), int(step))
    return data[tuple(index)]


def _reshape(node, data, shape):
    shape = [int(s) for s in shape]
    if not _attr(node, "allowzero", 0):
        shape = [data.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return data.reshape(shape)


def _reduce_mean(node, data, axes=None):
    axes = _attr(node, "axes") if axes is None else [int(a) for a in axes]
    keepdims = bool(_attr(node, "keepdims", 1))
    return np.mean(data, axis=None if axes is None else tuple(axes), keepdims=keepdims,
                   dtype=np.float32)


def _softmax(node, x):
    axis = _attr(node, "axis", -1)
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def _divide(a, b):
    """ONNX Div: true division for floats, truncation toward zero for integers (numpy's //
    floors, and np.divide would turn int64 shape arithmetic into float64)."""
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        quotient = np.abs(a) // np.abs(b)
        return np.where((a < 0) != (b < 0), -quotient, quotient).astype(a.dtype)
    return np.divide(a, b)


def _constant(node):
    """Constant (opset 13+): exactly one of value (a TensorProto), value_float(s), value_int(s)."""
    for a in node.attribute:
        if a.name == "value":
            if a.t.data_location == a.t.EXTERNAL:
                raise VerifyError(f"node {node.name} (Constant): its value tensor '{a.t.name}' is "
                                  f"in external data, which a topology cannot carry; reconvert "
                                  f"the part (convert inlines it)")
            return numpy_helper.to_array(a.t)
        if a.name in ("value_float", "value_floats"):
            return np.array(_attribute_value(node, a), dtype=np.float32)
        if a.name in ("value_int", "value_ints"):
            return np.array(_attribute_value(node, a), dtype=np.int64)
    names = ", ".join(a.name for a in node.attribute) or "none"
    raise VerifyError(f"node {node.name} (Constant): attribute(s) {names}; the CPU runner "
                      f"implements value, value_float(s) and value_int(s)")


def _cast(node, x):
    to = _attr(node, "to")
    try:
        dtype = helper.tensor_dtype_to_np_dtype(to)
    except (KeyError, ValueError):
        raise VerifyError(f"node {node.name} (Cast): 'to' = {to} is not a known tensor "
                          f"type") from None
    return np.asarray(x).astype(dtype)


def _unsqueeze(node, x, axes=None):
    """Unsqueeze: axes is an input from opset 13 (an attribute before); negative axes count
    from the end of the OUTPUT shape, as np.expand_dims does."""
    axes = _attr(node, "axes") if axes is None else axes
    if axes is None:
        raise VerifyError(f"node {node.name} (Unsqueeze): no axes input or attribute")
    return np.expand_dims(x, tuple(int(a) for a in np.ravel(axes)))


def _squeeze(node, x, axes=None):
    """Squeeze: without axes, every dimension of size 1 goes."""
    axes = _attr(node, "axes") if axes is None else axes
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(int(a) for a in np.ravel(axes)))


# ---------------------------------------------------------------------------- Conv


def _conv(node, x, w, bias=None):
    """Conv, ONNX semantics (NCHW, weight O x C/group x kH x kW). Exports from qai-hub-models
    run every projection as a 1x1 stride-1 unpadded Conv: that case is a matrix product and goes
    through the weight's quantized values as MatMul does; anything else is a direct convolution
    with the weight dequantized whole."""
    x = _dense(x)
    kernel = tuple((w.values() if isinstance(w, _Weight) else w).shape[2:])
    spatial = x.ndim - 2
    group = _attr(node, "group", 1)
    strides = _attr(node, "strides", [1] * spatial)
    dilations = _attr(node, "dilations", [1] * spatial)
    pads = _conv_pads(node, x.shape[2:], kernel, strides, dilations)
    declared = _attr(node, "kernel_shape")
    if declared is not None and tuple(declared) != kernel:
        raise VerifyError(f"node {node.name} (Conv): kernel_shape {declared} but weight "
                          f"'{node.input[1]}' has spatial shape {list(kernel)}")
    if group == 1 and set(kernel) <= {1} and set(strides) <= {1} and not any(pads):
        out = _pointwise_conv(x, w)
    else:
        out = _direct_conv(node, x, _dense(w), group, strides, dilations, pads)
    if bias is not None:
        out += _dense(bias).astype(out.dtype).reshape((1, -1) + (1,) * spatial)
    return out


def _conv_pads(node, in_shape, kernel, strides, dilations) -> list:
    """[begin_1, .., begin_n, end_1, .., end_n] from pads or auto_pad."""
    spatial = len(in_shape)
    auto_pad = _attr(node, "auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        return list(_attr(node, "pads", [0] * 2 * spatial))
    if auto_pad == "VALID":
        return [0] * 2 * spatial
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise VerifyError(f"node {node.name} (Conv): auto_pad {auto_pad!r} is not an ONNX value")
    begins, ends = [], []
    for size, k, s, d in zip(in_shape, kernel, strides, dilations):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(total - begins[-1])
    return begins + ends


def _pointwise_conv(x: np.ndarray, w) -> np.ndarray:
    """A 1x1 stride-1 group-1 Conv as (positions x C) @ (C x O): with a quantized weight, its
    per-output-channel (axis 0) encoding becomes a per-column one of the transposed matrix."""
    n, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
    positions = np.moveaxis(x.reshape(n, c, -1), 1, 2)                   # N x P x C
    if isinstance(w, _Weight):
        values, quant = w.values(), w.quant()
        matrix = values.reshape(values.shape[0], c).T                     # C x O, a view
        if quant is None or (quant.axis in (None, 0) and not quant.block_size):
            columns = None if quant is None else QuantParams(
                quant.bitwidth, None if quant.axis is None else 1, quant.scale, quant.offset,
                quant.symmetric)
            out = _matmul_by_columns(positions, matrix, columns)
        else:
            out = np.matmul(positions, w.full().reshape(values.shape[0], c).T)
    else:
        out = np.matmul(positions, w.reshape(w.shape[0], c).T)
    return np.moveaxis(out, 2, 1).reshape((n, out.shape[-1]) + spatial)


def _direct_conv(node, x, w, group, strides, dilations, pads) -> np.ndarray:
    """General 1-D/2-D Conv: one strided window of the padded input per kernel tap, contracted
    with that tap's weights, group by group (1-D runs as 2-D with a unit height)."""
    spatial = x.ndim - 2
    if spatial == 1:
        x, w = x[:, :, None, :], w[:, :, None, :]
        strides, dilations = [1] + list(strides), [1] + list(dilations)
        pads = [0, pads[0], 0, pads[1]]
    elif spatial != 2:
        raise VerifyError(f"node {node.name} (Conv): {spatial}-D convolution of "
                          f"'{node.input[0]}'; the CPU runner implements 1-D and 2-D")
    n, c, h, width = x.shape
    o, c_group, kh, kw = w.shape
    if c != c_group * group or o % group:
        raise VerifyError(f"node {node.name} (Conv): input '{node.input[0]}' has {c} channels and "
                          f"weight '{node.input[1]}' shape {list(w.shape)}, not valid for "
                          f"group={group}")
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    (sh, sw), (dh, dw) = strides, dilations
    out_h = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, out_h, out_w), dtype=np.result_type(x, w))
    o_group = o // group
    for i in range(kh):
        for j in range(kw):
            window = padded[:, :, i * dh:i * dh + sh * (out_h - 1) + 1:sh,
                            j * dw:j * dw + sw * (out_w - 1) + 1:sw]
            for g in range(group):
                out[:, g * o_group:(g + 1) * o_group] += np.einsum(
                    "nchw,oc->nohw", window[:, g * c_group:(g + 1) * c_group],
                    w[g * o_group:(g + 1) * o_group, :, i, j])
    return out[:, :, 0, :] if spatial == 1 else out


def _elementwise(fn) -> Callable:
    return lambda node, *args: fn(*[_dense(a) for a in args])


def _dense_args(fn) -> Callable:
    return lambda node, *args: fn(node, *[_dense(a) for a in args])


# op type -> fn(node, *inputs); inputs are arrays or _Weight (MatMul, Gather and Conv read those
# through the quantized values; every other op sees them dequantized whole).
SUPPORTED_OPS = {
    "MatMul": _matmul,
    "Gather": _gather,
    "Conv": _conv,
    "Constant": _constant,
    # a weight passes through as it is, so a MatMul or Conv behind it still streams it
    "Identity": lambda node, x: x,
    "Add": _elementwise(np.add),
    "Sub": _elementwise(np.subtract),
    "Mul": _elementwise(np.multiply),
    "Div": _elementwise(_divide),
    "Pow": _elementwise(lambda x, y: np.power(x, y).astype(x.dtype)),
    "Sqrt": _elementwise(np.sqrt),
    # a torch.export (dynamo) RMSNorm: x * Reciprocal(Sqrt(mean + eps)) (0.65 checkpoints)
    "Reciprocal": _elementwise(np.reciprocal),
    "Neg": _elementwise(np.negative),
    # tanh form: no overflow warning for large |x| (1 / (1 + exp(-x)) overflows exp)
    "Sigmoid": _elementwise(lambda x: (0.5 * (1.0 + np.tanh(0.5 * x))).astype(x.dtype)),
    "Softmax": _dense_args(_softmax),
    "ReduceMean": _dense_args(_reduce_mean),
    "Concat": lambda node, *a: np.concatenate([_dense(v) for v in a], axis=_attr(node, "axis")),
    "Slice": _dense_args(_slice),
    "Reshape": _dense_args(_reshape),
    "Transpose": lambda node, x: np.transpose(_dense(x), _attr(node, "perm")),
    "Cast": _dense_args(_cast),
    "Unsqueeze": _dense_args(_unsqueeze),
    "Squeeze": _dense_args(_squeeze),
}


def _describe(value) -> str:
    if value is None:
        return "(absent)"
    if isinstance(value, _Weight):
        return f"weight {list(value.values().shape)}"
    value = np.asarray(value)
    return f"{value.dtype}{list(value.shape)}"


class GraphRunner:
    """One graph of a context binary, run on the CPU (see the module docstring)."""

    def __init__(self, reader: CtxBinReader, graph_name: str, *, quantize_io: bool = True):
        self.reader = reader
        self.info = reader.graph(graph_name)
        self.name = graph_name
        self.quantize_io = quantize_io
        self.where = f"{reader.path.name}: graph {graph_name}"
        topology = reader.topology(graph_name)
        self.nodes = list(topology.node)
        self.constants = {init.name: numpy_helper.to_array(init) for init in topology.initializer}
        self.weights = set(self.info.weights)
        self.inputs = [IoInfo(s.name, s.dtype, tuple(s.shape or ())) for s in self.info.inputs]
        self.outputs = [IoInfo(s.name, s.dtype, tuple(s.shape or ())) for s in self.info.outputs]
        self._check_ops()
        self._last_use = self._plan_lifetimes()

    def _check_ops(self) -> None:
        for node in self.nodes:
            if node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPS:
                raise VerifyError(
                    f"{self.where}: node {node.name} is a {node.domain + '.' if node.domain else ''}"
                    f"{node.op_type}, which the CPU runner does not implement (it runs "
                    f"{', '.join(sorted(SUPPORTED_OPS))}); extend "
                    f"hexbundle/runtime/interpreter.py for it")

    def _plan_lifetimes(self) -> dict:
        """name -> index of the last node reading it (graph outputs live to the end)."""
        known = {i.name for i in self.inputs} | set(self.constants) | self.weights
        last = {}
        for index, node in enumerate(self.nodes):
            for name in node.input:
                if name and name not in known:
                    raise VerifyError(f"{self.where}: node {node.name} reads '{name}', which no "
                                      f"earlier node, input, constant or weight provides")
                if name:
                    last[name] = index
            known.update(o for o in node.output if o)
        missing = [o.name for o in self.outputs if o.name not in known]
        if missing:
            raise VerifyError(f"{self.where}: graph output '{missing[0]}' is produced by no node")
        for o in self.outputs:
            last[o.name] = len(self.nodes)
        return last

    def run(self, feeds: dict) -> dict:
        values = {}
        for spec in self.inputs:
            if spec.name not in feeds:
                raise VerifyError(f"{self.where}: input '{spec.name}' was not given")
            values[spec.name] = self._encoded(spec.name, np.asarray(feeds[spec.name]))
        for index, node in enumerate(self.nodes):
            args = [self._fetch(values, name) if name else None for name in node.input]
            while args and args[-1] is None:   # trailing optional inputs left empty
                args.pop()
            values[node.output[0]] = self._encoded(node.output[0], self._apply(node, args))
            for name in node.input:
                if self._last_use.get(name) == index:
                    values.pop(name, None)     # drop as soon as no later node needs it
        return {o.name: self._encoded(o.name, _dense(values[o.name])) for o in self.outputs}

    def _apply(self, node, args: list):
        """One node; a failure names the bin, graph, node, op and its input tensors."""
        try:
            return SUPPORTED_OPS[node.op_type](node, *args)
        except VerifyError as exc:
            raise VerifyError(f"{self.where}: {exc}") from None
        except (ValueError, IndexError, TypeError, ArithmeticError) as exc:
            inputs = ", ".join(f"'{name}' {_describe(arg)}" for name, arg in zip(node.input, args))
            raise VerifyError(f"{self.where}: node {node.name} ({node.op_type}) failed on "
                              f"{inputs or 'no inputs'}: {exc}") from None

    def _fetch(self, values: dict, name: str):
        if name in values:
            return values[name]
        if name in self.constants:
            return self.constants[name]
        return _Weight(self.reader, self.name, name)

    def _encoded(self, name: str, x):
        """A float tensor with an activation encoding, rounded to it (device numerics); a weight
        passed through (Identity) keeps its own, stored encoding."""
        encoding = (self.info.activations or {}).get(name)
        if not self.quantize_io or encoding is None or isinstance(x, _Weight) \
                or not np.issubdtype(np.asarray(x).dtype, np.floating):
            return x
        try:
            return fake_quantize(np.asarray(x, np.float32), encoding, name)
        except VerifyError as exc:
            raise VerifyError(f"{self.where}: {exc}") from None
