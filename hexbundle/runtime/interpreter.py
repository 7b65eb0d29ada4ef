"""A CPU runner for hexbundle context binaries, and the runtime conventions Genie applies around them.

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

The runtime conventions (`PartSession`; tinygen generates graphs that obey them)
--------------------------------------------------------------------------------
* KV window. A graph with AR = S and context CL sees CL key/value slots: slots [0, P) with
  P = CL - S hold the past (the `past_key_<L>_in` / `past_value_<L>_in` inputs), slots [P, CL)
  hold the S new entries computed by this call. Valid past entries are RIGHT-aligned: with
  `n_past` valid entries they sit in slots [P - n_past, P), right before the new ones; the slots
  before are padding (zeros; the mask hides them). `past_*_out` carry only the S new entries;
  the runtime appends the first n_valid of them to its cache.
* Layouts. past_key (nkv, 1, d, T): keys pre-transposed, the sequence on the LAST axis;
  past_value (nkv, 1, T, d): the sequence on axis -2. Keys are stored after RoPE.
* attention_mask (1, 1, S, CL) is ADDITIVE: 0.0 where a query may attend, MASK_VALUE where it
  may not (`causal_mask`).
* position_ids_cos / _sin (1, 1, S, d/2): cos/sin of position * theta^(-2i/d) (`rope_inputs`);
  theta and d/2 come from the bundle's genie_config.json (`rope-theta`, `pos-id-dim`), as on
  the device.
* Prefill runs the prompt graph (AR 128) over the prompt in chunks of AR tokens; the last chunk
  is right-padded (padding rows are causal too, their outputs and KV entries are dropped).
  Decode runs the token graph (AR 1) one token at a time. Positions are absolute: token t of
  the sequence has position t.
* Chaining. A part's inputs are: its main input (input_ids for part 1, else the hidden state of
  the previous part), the mask, cos/sin and the past KV of its own layers. Its main output (the
  output that is not a `past_*_out`) feeds the next part's main input.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol

import numpy as np
from onnx import numpy_helper

from hexbundle.support.errors import VerifyError
from hexbundle.formats.container import QuantParams, dequantize
from hexbundle.formats.ctxbin import CtxBinReader

MASK_VALUE = -10000.0        # additive mask for "may not attend"; exp(-10000) == 0 in float32
BLOCK_ELEMENTS = 1 << 22     # floats dequantized at a time for MatMul by a weight (16 MiB)

KEY_PREFIX, VALUE_PREFIX = "past_key_", "past_value_"
RUNTIME_INPUTS = ("attention_mask", "position_ids_cos", "position_ids_sin")


# ============================================================================ runtime helpers


def rope_inputs(positions: np.ndarray, head_dim: int, theta: float):
    """(cos, sin), each float32 (1, 1, S, head_dim/2), for the given absolute positions (S,).

    angle[s, i] = positions[s] * theta^(-2i/head_dim), i < head_dim/2 (computed in float64).
    """
    positions = np.asarray(positions, dtype=np.float64).reshape(-1)
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    angles = positions[:, None] * inv_freq[None, :]
    shape = (1, 1, positions.size, head_dim // 2)
    return (np.cos(angles).astype(np.float32).reshape(shape),
            np.sin(angles).astype(np.float32).reshape(shape))


def causal_mask(ar: int, context_length: int, n_past: int) -> np.ndarray:
    """Additive attention mask float32 (1, 1, ar, context_length) for one call of a graph.

    Window: slots [0, P) past (P = context_length - ar), slots [P, context_length) the `ar` new
    entries. The n_past valid past entries are the LAST n_past past slots [P - n_past, P).
    Query row i may attend to every valid past slot and to new slots P + j for j <= i: 0.0 there,
    MASK_VALUE elsewhere. Padded query rows (a prompt shorter than ar, right-padded) are causal
    too and their outputs are simply ignored by the caller.
    """
    past = context_length - ar
    if not 0 <= n_past <= past:
        raise ValueError(f"n_past={n_past} does not fit the {past} past slots of the window")
    allowed = np.zeros((ar, context_length), dtype=bool)
    allowed[:, past - n_past:past] = True
    allowed[:, past:] = np.tri(ar, dtype=bool)
    mask = np.where(allowed, np.float32(0.0), np.float32(MASK_VALUE)).astype(np.float32)
    return mask.reshape(1, 1, ar, context_length)


def fake_quantize(x: np.ndarray, encoding: dict) -> np.ndarray:
    """x rounded to a per-tensor activation encoding {bitwidth, scale: [s], offset: [o]}."""
    scale = np.float32(encoding["scale"][0])
    offset = np.float32(encoding["offset"][0])
    q = np.clip(np.round(x / scale) - offset, 0, 2 ** encoding["bitwidth"] - 1)
    return ((q + offset) * scale).astype(np.float32)


# ============================================================================ the graph runner


@dataclass(frozen=True)
class IoInfo:
    """A graph input or output as the session layer needs it."""

    name: str
    dtype: str            # numpy dtype name
    shape: tuple


class Executor(Protocol):
    """What PartSession drives: a bin graph (GraphRunner) or a float ONNX (verify.OnnxGraph)."""

    name: str
    inputs: list          # IoInfo
    outputs: list         # IoInfo

    def run(self, feeds: dict) -> dict: ...


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
                    f"{', '.join(sorted(SUPPORTED_OPS))}); extend hexbundle/runtime.py for it")

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


# ============================================================================ the part session


@dataclass(frozen=True)
class RopeSettings:
    """What the runtime needs to build cos/sin: from genie_config.json (`rope-theta`, `pos-id-dim`)."""

    theta: float
    pos_id_dim: int


class PartSession:
    """One part as the runtime drives it: its prompt and token graphs and the KV cache of its layers.

    `run(kind, x, n_valid)` feeds x (the first n_valid rows are real, the rest padding) through
    the `kind` graph with the mask, cos/sin and past KV built from the cache, appends the n_valid
    new KV entries to the cache and returns the main output's n_valid rows.
    """

    def __init__(self, label: str, graphs: dict, rope: RopeSettings):
        self.label = label
        self.graphs = graphs                  # kind ("prompt" | "token") -> Executor
        self.rope = rope
        first = graphs["prompt"]
        self.main_input = _main_name(first.inputs, label, "input")
        self.main_output = _main_name(first.outputs, label, "output")
        self.layers = [s.name[len(KEY_PREFIX):-3] for s in first.inputs
                       if s.name.startswith(KEY_PREFIX) and s.name.endswith("_in")]
        self.capacity = max(self._geometry(g)[1] for g in graphs.values())
        self._keys, self._values, self.n_past = {}, {}, 0
        for layer in self.layers:
            k = _spec(first.inputs, f"{KEY_PREFIX}{layer}_in", label).shape
            v = _spec(first.inputs, f"{VALUE_PREFIX}{layer}_in", label).shape
            self._keys[layer] = np.zeros(tuple(k[:-1]) + (self.capacity,), np.float32)
            self._values[layer] = np.zeros(tuple(v[:-2]) + (self.capacity, v[-1]), np.float32)

    def _geometry(self, graph: Executor) -> tuple:
        """(AR, CL) of a graph: AR from its main input, CL from its mask (no mask: no cache)."""
        ar = int(_spec(graph.inputs, self.main_input, self.label).shape[1])
        mask = [s for s in graph.inputs if s.name == "attention_mask"]
        return ar, int(mask[0].shape[-1]) if mask else ar

    def ar(self, kind: str) -> int:
        return self._geometry(self.graphs[kind])[0]

    def run(self, kind: str, x: np.ndarray, n_valid: int) -> np.ndarray:
        graph = self.graphs[kind]
        ar, cl = self._geometry(graph)
        past = cl - ar
        if not 0 < n_valid <= ar or x.shape[0] != n_valid:
            raise ValueError(f"{self.label}: {x.shape[0]} rows, n_valid {n_valid}, AR {ar}")
        if self.layers and self.n_past > past:
            raise VerifyError(f"{self.label}: {self.n_past} cached tokens do not fit the {past} "
                              f"past slots of {graph.name}; the context ({cl}) is full")
        spec = _spec(graph.inputs, self.main_input, self.label)
        padded = np.zeros((ar,) + x.shape[1:], dtype=np.dtype(spec.dtype))
        padded[:n_valid] = x
        feeds = {self.main_input: padded.reshape(spec.shape)}
        if self.layers:
            positions = self.n_past + np.arange(ar)
            cos, sin = rope_inputs(positions, 2 * self.rope.pos_id_dim, self.rope.theta)
            feeds.update(attention_mask=causal_mask(ar, cl, self.n_past),
                         position_ids_cos=cos, position_ids_sin=sin)
            for layer in self.layers:
                feeds[f"{KEY_PREFIX}{layer}_in"] = self._past(self._keys[layer], -1, past)
                feeds[f"{VALUE_PREFIX}{layer}_in"] = self._past(self._values[layer], -2, past)
        outputs = graph.run(feeds)
        for layer in self.layers:
            self._append(self._keys[layer], outputs[f"{KEY_PREFIX}{layer}_out"], -1, n_valid)
            self._append(self._values[layer], outputs[f"{VALUE_PREFIX}{layer}_out"], -2, n_valid)
        self.n_past += n_valid if self.layers else 0
        main = outputs[self.main_output]
        return main.reshape((ar,) + main.shape[2:])[:n_valid]

    def _past(self, cache: np.ndarray, axis: int, past: int) -> np.ndarray:
        """The past input: zeros, with the n_past cached entries right-aligned before slot P."""
        shape = list(cache.shape)
        shape[axis] = past
        window = np.zeros(shape, np.float32)
        if self.n_past:
            dst = [slice(None)] * cache.ndim
            dst[axis] = slice(past - self.n_past, past)
            src = [slice(None)] * cache.ndim
            src[axis] = slice(0, self.n_past)
            window[tuple(dst)] = cache[tuple(src)]
        return window

    def _append(self, cache: np.ndarray, new: np.ndarray, axis: int, n_valid: int) -> None:
        dst = [slice(None)] * cache.ndim
        dst[axis] = slice(self.n_past, self.n_past + n_valid)
        src = [slice(None)] * new.ndim
        src[axis] = slice(0, n_valid)
        cache[tuple(dst)] = new[tuple(src)]

    def kv_entry(self, position: int) -> np.ndarray:
        """Every layer's cached key and value at `position`, flattened into one vector."""
        if not self.layers:
            return np.zeros(0, np.float32)
        if not 0 <= position < self.n_past:
            raise ValueError(f"{self.label}: position {position} is not cached ({self.n_past})")
        return np.concatenate([np.concatenate([self._keys[layer][..., position].reshape(-1),
                                               self._values[layer][..., position, :].reshape(-1)])
                               for layer in self.layers])

    def fork(self, n_past: int) -> "PartSession":
        """A copy whose cache holds only the first n_past entries (for the prompt/token check)."""
        if self.layers and not 0 <= n_past <= self.n_past:
            raise ValueError(f"{self.label}: cannot fork at {n_past} of {self.n_past} entries")
        other = object.__new__(PartSession)
        other.__dict__.update(self.__dict__)
        other._keys = {k: v.copy() for k, v in self._keys.items()}
        other._values = {k: v.copy() for k, v in self._values.items()}
        other.n_past = n_past if self.layers else 0
        return other


def _main_name(specs: list, label: str, what: str) -> str:
    names = [s.name for s in specs if not s.name.startswith((KEY_PREFIX, VALUE_PREFIX))
             and s.name not in RUNTIME_INPUTS]
    if len(names) != 1:
        raise VerifyError(f"{label}: expected exactly one {what} besides the mask, cos/sin and "
                          f"the KV cache, found {names or 'none'}")
    return names[0]


def _spec(specs: list, name: str, label: str) -> IoInfo:
    for s in specs:
        if s.name == name:
            return s
    raise VerifyError(f"{label}: the graph has no '{name}'")
