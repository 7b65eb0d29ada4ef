"""A CPU runner for hexbundle context binaries: one graph of a bin, run by a numpy interpreter.

Verify and `scripts/generate.py` run a bundle on the host with this module: each graph of a .bin
is executed by a small numpy interpreter of the ONNX topology stored in the bin
(`CtxBinReader.topology`), with the weights read from the bin itself (not from the ONNX), so what
runs is what the device would load.

The graph runner (`GraphRunner`)
--------------------------------
* Op set: exactly the ops the generated Qwen2 graphs use (`SUPPORTED_OPS`, opset 17 semantics).
  Any other op is refused when the runner is built, naming the bin, graph, node and op; there is
  no fallback.
* Weights stay in the mmap of the bin until the node that consumes them runs. MatMul by a weight
  works through it in column blocks (<= `BLOCK_ELEMENTS` floats at a time), as
  ((x @ q) + sum(x) * offset) * scale, the dequantization formula moved past the product; Gather
  from a weight (the embedding) dequantizes only the gathered rows; any other use dequantizes
  the whole tensor.
  Every value (weight or activation) is dropped after its last consumer, so memory is bounded by
  one part and in practice by the largest tensor, never by the model.
* Dequantization is the file format's: real = (q + offset[c]) * scale[c] (docs/formats.md).
* Device I/O (on by default, `quantize_io`): every float graph input and output that has an
  activation encoding in the bin is rounded to it (q = clip(round(x / scale) - offset, 0,
  2^bw - 1), x' = (q + offset) * scale), as the HTP sees uint16 tensors at graph boundaries:
  hidden states between parts, KV cache entries, mask, cos/sin and logits. Inside a graph the
  runner computes in float32.

A part session (`hexbundle.runtime.sessions`) drives the runner with the inputs the runtime
conventions (`hexbundle.runtime.conventions`) define.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from onnx import numpy_helper

from hexbundle.formats.container import QuantParams, dequantize
from hexbundle.formats.ctxbin import CtxBinReader
from hexbundle.runtime.sessions import IoInfo
from hexbundle.support.errors import VerifyError

BLOCK_ELEMENTS = 1 << 22     # floats dequantized at a time for MatMul by a weight (16 MiB)


# ============================================================================ device I/O


def fake_quantize(x: np.ndarray, encoding: dict) -> np.ndarray:
    """x rounded to a per-tensor activation encoding {bitwidth, scale: [s], offset: [o]}."""
    scale = np.float32(encoding["scale"][0])
    offset = np.float32(encoding["offset"][0])
    q = np.clip(np.round(x / scale) - offset, 0, 2 ** encoding["bitwidth"] - 1)
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
            if a.type == a.INT:
                return a.i
            if a.type == a.INTS:
                return list(a.ints)
            if a.type == a.FLOAT:
                return a.f
            raise VerifyError(f"node {node.name}: attribute {name} has an unsupported type")
    return default


def _matmul(node, a, b):
    if isinstance(a, _Weight):
        a = a.full()
    if not isinstance(b, _Weight):
        return np.matmul(a, b)
    values, quant = b.values(), b.quant()
    if values.ndim != 2 or (quant is not None and quant.axis not in (None, 1)):
        return np.matmul(a, b.full())
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
    if axis != 0:
        return np.take(data.full(), indices, axis=axis)
    bad = (indices < 0) | (indices >= values.shape[0])
    if bad.any():
        raise VerifyError(f"graph {data.graph}: Gather from '{data.name}' got index "
                          f"{int(indices[bad][0])}, outside [0, {values.shape[0]}); the token ids "
                          f"must be < n-vocab")
    rows = values[indices.reshape(-1)]
    return dequantize(rows, _sliced(data.quant(), 0, indices.reshape(-1))).reshape(
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


def _elementwise(fn) -> Callable:
    return lambda node, *args: fn(*[_dense(a) for a in args])


# op type -> fn(node, *inputs); inputs are arrays or _Weight (only MatMul and Gather see those).
SUPPORTED_OPS = {
    "MatMul": _matmul,
    "Gather": _gather,
    "Add": _elementwise(np.add),
    "Mul": _elementwise(np.multiply),
    "Div": _elementwise(np.divide),
    "Pow": _elementwise(lambda x, y: np.power(x, y).astype(x.dtype)),
    "Sqrt": _elementwise(np.sqrt),
    "Neg": _elementwise(np.negative),
    # tanh form: no overflow warning for large |x| (1 / (1 + exp(-x)) overflows exp)
    "Sigmoid": _elementwise(lambda x: (0.5 * (1.0 + np.tanh(0.5 * x))).astype(x.dtype)),
    "Softmax": lambda node, x: _softmax(node, _dense(x)),
    "ReduceMean": lambda node, *a: _reduce_mean(node, *[_dense(v) for v in a]),
    "Concat": lambda node, *a: np.concatenate([_dense(v) for v in a], axis=_attr(node, "axis")),
    "Slice": lambda node, *a: _slice(node, *[_dense(v) for v in a]),
    "Reshape": lambda node, *a: _reshape(node, *[_dense(v) for v in a]),
    "Transpose": lambda node, x: np.transpose(_dense(x), _attr(node, "perm")),
}


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
            values[spec.name] = self._boundary(spec.name, np.asarray(feeds[spec.name]))
        for index, node in enumerate(self.nodes):
            args = [self._fetch(values, name) if name else None for name in node.input]
            while args and args[-1] is None:   # trailing optional inputs left empty
                args.pop()
            result = SUPPORTED_OPS[node.op_type](node, *args)
            values[node.output[0]] = result
            for name in node.input:
                if self._last_use.get(name) == index:
                    values.pop(name, None)     # drop as soon as no later node needs it
        return {o.name: self._boundary(o.name, values[o.name]) for o in self.outputs}

    def _fetch(self, values: dict, name: str):
        if name in values:
            return values[name]
        if name in self.constants:
            return self.constants[name]
        return _Weight(self.reader, self.name, name)

    def _boundary(self, name: str, x: np.ndarray) -> np.ndarray:
        """A tensor crossing the graph boundary: rounded to its activation encoding if any."""
        encoding = (self.info.activations or {}).get(name)
        if not self.quantize_io or encoding is None or not np.issubdtype(x.dtype, np.floating):
            return x
        if encoding.get("dtype", "int") != "int" or len(encoding["scale"]) != 1:
            return x.astype(np.float32)
        return fake_quantize(x.astype(np.float32), encoding)
