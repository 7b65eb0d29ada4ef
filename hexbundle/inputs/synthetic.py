"""Generate the input files of a small Qwen2- or Qwen3-architecture model, laid out like a
qai-hub-models export.

For every graph of a part (prompt, then token) this writes `<graph>.onnx` (float32, opset 17,
standard ops only), its external weights `<graph>.data` and its AIMET v1.0.0 `<graph>.encodings`,
plus a byte-level BPE `tokenizer.json`. Everything is a pure function of (model, part, seed):
generating twice gives byte-identical files, so doit can trust file hashes.

Conventions
-----------
* The runtime conventions -- the KV window and layouts, the additive attention mask, the RoPE
  cos/sin inputs and every input's name -- are written down once, in
  hexbundle.runtime.conventions; the graphs declare their inputs and outputs with it
  (`graph_inputs`, `graph_outputs`) and compute with them. Inside a graph: query head h is
  served by kv head h // (nh / nkv) (HF repeat_kv); cos/sin are duplicated to width d
  (concat([c, c])) and RoPE is applied with the rotate-half convention of HF Qwen2; the new keys
  are stored after RoPE, pre-transposed for q @ K.
* Families (config.model.FAMILIES). qwen2: q/k/v projections add a bias. qwen3 (HF
  modeling_qwen3): no q/k/v bias; every query and key head is RMS-normalized over head_dim
  (q_norm, k_norm) after the projection and before RoPE; the value heads are not.
* Tied embeddings (`tie_word_embeddings`): the LM head is the embedding matrix. As in Qualcomm's
  export it is a separate initializer of the last part, a 1x1 Conv weight [vocab, hidden, 1, 1]
  (qai-hub-models' ConvInplaceLinear), holding the embedding's values row for row: both are drawn
  from the embedding's random stream, at the embedding's unit scale. The logits then reach about
  hidden_size (the input token's own row), so their activation range is hidden_size.
* Weights are a function of (seed, initializer name) only, so every split plan cuts the SAME
  model and the prompt and token graphs of a part hold identical weight bytes. All HF weights
  (even small biases and norms) live in the external .data file, 64-byte aligned, in
  `weight_names` order; the small helper constants (reshape shapes, slice bounds, eps, 1/sqrt(d))
  are inline initializers named "/const/...".
* Encodings. Every HF weight has exactly one param encoding: decoder linears INT per output
  channel symmetric (decoder_linear_bitwidth), lm_head INT per output channel symmetric
  (lm_head_bitwidth), embedding INT per tensor asymmetric (embedding_bitwidth); biases and norm
  weights are listed as {"dtype": "FLOAT", "bw": float_bitwidth}. The "/const/..." helpers are not
  listed. Activation encodings: every float graph input and output, 16-bit per tensor, from fixed
  ranges (ACTIVATION_RANGES), never from a calibration run (that would tie bytes to onnxruntime).
  Convention: q in [0, 2^bw - 1], real = (q + offset) * scale.
"""
from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from hexbundle.config.layout import graph_files
from hexbundle.config.model import Graph, Model, Part, boundary_tensor, part_weights
from hexbundle.formats import encodings, tokenizer, weightdata
from hexbundle.runtime.conventions import (ATTENTION_MASK, KEY_PREFIX, KEY_SEQ_AXIS, MASK_VALUE,
                                           POSITION_COS, POSITION_SIN, VALUE_SEQ_AXIS, is_kv,
                                           key_shape, kv_names, mask_shape, past_slots, rope_shape,
                                           value_shape)
from hexbundle.support.atomic import atomic_output

OPSET = 17
IR_VERSION = 8              # pinned: onnx.helper would stamp the installed onnx's newest IR
PRODUCER = "hexbundle.inputs.synthetic"

# Symmetric activation ranges [-r, r] by tensor role; generous for the generated weights.
ACTIVATION_RANGES = {"hidden": 64.0, "logits": 32.0, "past_key": 16.0, "past_value": 16.0,
                     "rope": 1.0}

_DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class DrawnWeight:
    """A weight of the part and the role that decides how it is drawn (config.model.WeightSpec
    says how it is stored)."""

    name: str
    shape: tuple
    kind: str   # "linear" | "bias" | "norm" | "embedding" | "lm_head"
    tied: bool = False   # the embedding or the LM head of a model whose two are one matrix

    @property
    def stream(self) -> str:
        """Whose random numbers the weight is drawn from: tied weights share the embedding's."""
        return "model.embed_tokens.weight" if self.tied else self.name

    @property
    def channel_axis(self) -> int:
        """The output channel axis (per-channel encodings): a 1x1 Conv weight [out, in, 1, 1]
        has it first, a MatMul weight [in, out] last."""
        return 0 if len(self.shape) == 4 else len(self.shape) - 1


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: type  # numpy scalar type
    shape: tuple


def weight_specs(model: Model, part: Part) -> list:
    """The part's weights (names and shapes from hexbundle.config.model.part_weights, the one place the
    architecture's tensors are listed), each with the role that decides how it is drawn."""
    tied = model.architecture.tie_word_embeddings
    return [DrawnWeight(w.name, w.shape, _role(w.name),
                        tied and _role(w.name) in ("embedding", "lm_head"))
            for w in part_weights(model.architecture, model.quantization, part)]


def _role(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "embedding"
    if name == "lm_head.weight":
        return "lm_head"
    if name.endswith(".bias"):
        return "bias"
    return "norm" if "norm" in name else "linear"


def weight_names(model: Model, part: Part) -> list:
    """Initializer names of the part's weights (shared by both graphs), in .data file order."""
    return [w.name for w in weight_specs(model, part)]


def input_hidden_name(model: Model, part: Part) -> str:
    """Name of the hidden state this part receives: the previous part's boundary tensor."""
    _check_part(part)
    first = part.layers[0] if part.layers else model.architecture.num_layers
    previous = Part(index=part.index - 1, count=part.count, layers=(first - 1,) if first else (),
                    has_embedding=(part.index - 1 == 1), has_head=False)
    return boundary_tensor(previous)


def graph_inputs(model: Model, graph: Graph) -> list:
    """The graph's inputs in order, as the real export declares them."""
    a, part, s = model.architecture, graph.part, graph.ar
    past = past_slots(s, graph.context_length)
    if part.has_embedding:
        specs = [TensorSpec("input_ids", np.int32, (1, s))]
    else:
        specs = [TensorSpec(input_hidden_name(model, part), np.float32, (1, s, a.hidden_size))]
    if part.layers:
        specs += [TensorSpec(ATTENTION_MASK, np.float32, mask_shape(s, graph.context_length)),
                  TensorSpec(POSITION_COS, np.float32, rope_shape(s, a.pos_id_dim)),
                  TensorSpec(POSITION_SIN, np.float32, rope_shape(s, a.pos_id_dim))]
    for layer in part.layers:
        key, value = kv_names(layer, "in")
        specs += [TensorSpec(key, np.float32, key_shape(a.num_kv_heads, a.head_dim, past)),
                  TensorSpec(value, np.float32, value_shape(a.num_kv_heads, a.head_dim, past))]
    return specs


def graph_outputs(model: Model, graph: Graph) -> list:
    """The graph's outputs in order: new KV entries per layer, then the hidden state or logits."""
    a, part, s = model.architecture, graph.part, graph.ar
    specs = []
    for layer in part.layers:
        key, value = kv_names(layer, "out")
        specs += [TensorSpec(key, np.float32, key_shape(a.num_kv_heads, a.head_dim, s)),
                  TensorSpec(value, np.float32, value_shape(a.num_kv_heads, a.head_dim, s))]
    if part.has_head:
        specs.append(TensorSpec("logits", np.float32, (1, s, a.vocab_size)))
    else:
        specs.append(TensorSpec(boundary_tensor(part), np.float32, (1, s, a.hidden_size)))
    return specs


def _check_part(part: Part) -> None:
    if not (part.has_embedding or part.layers or part.has_head):
        raise ValueError(f"{part.tag}: a part needs the embedding, decoder layers or the head")


# --------------------------------------------------------------------------- weights


def make_weights(model: Model, part: Part, seed: int) -> dict:
    """name -> float32 array. Depends only on (seed, name, shape): plan- and graph-independent."""
    return {spec.name: _draw_weight(spec, model, seed) for spec in weight_specs(model, part)}


def _draw_weight(spec: DrawnWeight, model: Model, seed: int) -> np.ndarray:
    noise = weight_rng(spec.stream, seed).standard_normal(spec.shape, dtype=np.float32)
    return finish_weight(spec, noise)


def weight_rng(name: str, seed: int) -> np.random.Generator:
    """The weight's own random stream. Drawing a tensor in row chunks from it gives the same
    values as drawing it whole (hexbundle.inputs.generate streams full-size weights that way)."""
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


def finish_weight(spec: DrawnWeight, noise: np.ndarray) -> np.ndarray:
    """Standard-normal float32 noise (the whole tensor or a block of its rows) -> the weight's
    values, in place. Element-wise, so a block gives exactly the values of the whole tensor."""
    if spec.kind == "norm":
        noise *= np.float32(0.1)
        noise += np.float32(1.0)
    elif spec.kind == "bias":
        noise *= np.float32(0.1)
    elif spec.kind != "embedding" and not spec.tied:   # a tied LM head IS the embedding
        # 1/sqrt(fan_in) keeps q.k and the MLP at unit scale; the residual writers (o, down)
        # are halved so the residual stream grows slowly with depth.
        gain = 0.5 if spec.name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
        noise *= np.float32(gain / math.sqrt(spec.shape[0]))
    return noise


# --------------------------------------------------------------------------- ONNX graph


class _GraphBuilder:
    """Accumulates nodes and inline constants with unique, readable names."""

    def __init__(self):
        self.nodes = []
        self.constants = {}
        self._counter = Counter()

    def const(self, name: str, value: np.ndarray) -> str:
        full = f"/const/{name}"
        if full not in self.constants:
            self.constants[full] = onnx.numpy_helper.from_array(np.asarray(value), full)
        return full

    def op(self, op_type: str, inputs: list, scope: str, out: str | None = None, **attrs) -> str:
        self._counter[(scope, op_type)] += 1
        node_name = f"/{scope}/{op_type}_{self._counter[(scope, op_type)]}"
        out = out or f"{node_name}_output_0"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=node_name, **attrs))
        return out


def _rms_norm(b: _GraphBuilder, x: str, weight: str, eps: float, scope: str, out=None) -> str:
    squared = b.op("Pow", [x, b.const("two", np.array(2.0, np.float32))], scope)
    mean = b.op("ReduceMean", [squared], scope, axes=[-1], keepdims=1)
    var = b.op("Add", [mean, b.const("rms_eps", np.array(eps, np.float32))], scope)
    normed = b.op("Div", [x, b.op("Sqrt", [var], scope)], scope)
    return b.op("Mul", [normed, weight], scope, out=out)


def _linear(b: _GraphBuilder, x: str, prefix: str, scope: str, bias: bool) -> str:
    y = b.op("MatMul", [x, f"{prefix}.weight"], scope)
    return b.op("Add", [y, f"{prefix}.bias"], scope) if bias else y


def _rotate(b: _GraphBuilder, t: str, cos: str, sin: str, half: int, scope: str) -> str:
    """RoPE, rotate-half: t * cos + concat(-t2, t1) * sin, on the last axis (width 2 * half)."""
    axis = b.const("axis_last", np.array([3], np.int64))
    zero, mid = b.const("zero", np.array([0], np.int64)), b.const("half", np.array([half], np.int64))
    end = b.const("full", np.array([2 * half], np.int64))
    t1 = b.op("Slice", [t, zero, mid, axis], scope)
    t2 = b.op("Slice", [t, mid, end, axis], scope)
    rotated = b.op("Concat", [b.op("Neg", [t2], scope), t1], scope, axis=-1)
    return b.op("Add", [b.op("Mul", [t, cos], scope), b.op("Mul", [rotated, sin], scope)], scope)


def _attention(b, model: Model, x: str, layer: int, rope: tuple, out_names: tuple) -> str:
    """Self-attention of one layer on normed x (1,S,H); returns the o_proj output (1,S,H)."""
    a = model.architecture
    nkv, group, d = a.num_kv_heads, a.num_attention_heads // a.num_kv_heads, a.head_dim
    p, scope = f"model.layers.{layer}.self_attn", f"model/layers.{layer}/self_attn"
    q = _linear(b, x, f"{p}.q_proj", scope, bias=a.qkv_bias)
    k = _linear(b, x, f"{p}.k_proj", scope, bias=a.qkv_bias)
    v = _linear(b, x, f"{p}.v_proj", scope, bias=a.qkv_bias)
    # q -> (nkv, group, S, d): query head h = kv * group + g, so MatMul broadcasts over the
    # kv layout (nkv, 1, ...) -- GQA without materialising repeated keys.
    q = b.op("Reshape", [q, b.const("q_heads", np.array([-1, nkv, group, d], np.int64))], scope)
    q = b.op("Transpose", [q], scope, perm=[1, 2, 0, 3])
    k = b.op("Reshape", [k, b.const("kv_heads", np.array([1, -1, nkv, d], np.int64))], scope)
    k = b.op("Transpose", [k], scope, perm=[2, 0, 1, 3])                       # (nkv,1,S,d)
    v = b.op("Reshape", [v, b.const("kv_heads", np.array([1, -1, nkv, d], np.int64))], scope)
    key_out, value_out = out_names
    v = b.op("Transpose", [v], scope, out=value_out, perm=[2, 0, 1, 3])        # (nkv,1,S,d)
    if a.qk_norm:   # per head: the last axis is head_dim in both layouts
        q = _rms_norm(b, q, f"{p}.q_norm.weight", a.rms_norm_eps, f"{scope}/q_norm")
        k = _rms_norm(b, k, f"{p}.k_norm.weight", a.rms_norm_eps, f"{scope}/k_norm")
    cos, sin = rope
    q = _rotate(b, q, cos, sin, d // 2, scope)
    k = _rotate(b, k, cos, sin, d // 2, scope)
    k = b.op("Transpose", [k], scope, out=key_out, perm=[0, 1, 3, 2])          # (nkv,1,d,S)
    past_key, past_value = kv_names(layer, "in")
    keys = b.op("Concat", [past_key, k], scope, axis=KEY_SEQ_AXIS)             # (nkv,1,d,CL)
    values = b.op("Concat", [past_value, v], scope, axis=VALUE_SEQ_AXIS)       # (nkv,1,CL,d)
    scores = b.op("MatMul", [q, keys], scope)                                  # (nkv,g,S,CL)
    scores = b.op("Mul", [scores, b.const("attn_scale", np.array(1.0 / math.sqrt(d), np.float32))], scope)
    scores = b.op("Add", [scores, ATTENTION_MASK], scope)
    probs = b.op("Softmax", [scores], scope, axis=-1)
    context = b.op("MatMul", [probs, values], scope)                           # (nkv,g,S,d)
    context = b.op("Transpose", [context], scope, perm=[2, 0, 1, 3])           # (S,nkv,g,d)
    merged = b.op("Reshape", [context, b.const("merge_heads", np.array([1, -1, nkv * group * d], np.int64))], scope)
    return _linear(b, merged, f"{p}.o_proj", scope, bias=False)


def _decoder_layer(b, model: Model, x: str, layer: int, rope: tuple, out: str | None) -> str:
    eps, p, scope = model.architecture.rms_norm_eps, f"model.layers.{layer}", f"model/layers.{layer}"
    normed = _rms_norm(b, x, f"{p}.input_layernorm.weight", eps, f"{scope}/input_layernorm")
    attn = _attention(b, model, normed, layer, rope, kv_names(layer, "out"))
    x = b.op("Add", [x, attn], scope)
    normed = _rms_norm(b, x, f"{p}.post_attention_layernorm.weight", eps, f"{scope}/post_attention_layernorm")
    mlp = f"{scope}/mlp"
    gate = b.op("MatMul", [normed, f"{p}.mlp.gate_proj.weight"], mlp)
    silu = b.op("Mul", [gate, b.op("Sigmoid", [gate], mlp)], mlp)
    up = b.op("MatMul", [normed, f"{p}.mlp.up_proj.weight"], mlp)
    down = b.op("MatMul", [b.op("Mul", [silu, up], mlp), f"{p}.mlp.down_proj.weight"], mlp)
    return b.op("Add", [x, down], scope, out=out)


def _conv_lm_head(b: _GraphBuilder, x: str, out: str) -> str:
    """logits (1,S,V) from x (1,S,H) through the 1x1 Conv weight [V, H, 1, 1], in the layout
    qai-hub-models' ConvInplaceLinear uses: (1,S,H) -> (1,H,1,S) -> Conv -> (1,V,1,S) -> (1,S,V)."""
    height = b.const("lm_head_height_axis", np.array([2], np.int64))
    channels_first = b.op("Transpose", [x], "lm_head", perm=[0, 2, 1])
    image = b.op("Unsqueeze", [channels_first, height], "lm_head")
    conv = b.op("Conv", [image, "lm_head.weight"], "lm_head", kernel_shape=[1, 1])
    flat = b.op("Squeeze", [conv, height], "lm_head")
    return b.op("Transpose", [flat], "lm_head", out=out, perm=[0, 2, 1])


def build_graph(model: Model, graph: Graph, weight_tensors: list) -> onnx.ModelProto:
    """The ONNX model of one graph; `weight_tensors` are the (external) weight initializers."""
    part, a = graph.part, model.architecture
    _check_part(part)
    b = _GraphBuilder()
    final_name = "logits" if part.has_head else boundary_tensor(part)
    n_stages = int(part.has_embedding) + len(part.layers) + int(part.has_head)
    stage = 0

    def out_name():   # the last stage writes the graph output, the others internal tensors
        return final_name if stage == n_stages else None

    if part.has_embedding:
        stage += 1
        x = b.op("Gather", ["model.embed_tokens.weight", "input_ids"], "model/embed_tokens",
                 out=out_name(), axis=0)
    else:
        x = input_hidden_name(model, part)
    if part.layers:
        # cos/sin come at width d/2; every layer uses them duplicated to width d.
        rope = (b.op("Concat", [POSITION_COS, POSITION_COS], "model/rotary_emb", axis=-1),
                b.op("Concat", [POSITION_SIN, POSITION_SIN], "model/rotary_emb", axis=-1))
    for layer in part.layers:
        stage += 1
        x = _decoder_layer(b, model, x, layer, rope, out_name())
    if part.has_head:
        stage += 1
        x = _rms_norm(b, x, "model.norm.weight", a.rms_norm_eps, "model/norm")
        if a.tie_word_embeddings:
            _conv_lm_head(b, x, out_name())
        else:
            b.op("MatMul", [x, "lm_head.weight"], "lm_head", out=out_name())

    def value_info(spec):
        return helper.make_tensor_value_info(spec.name, helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype)),
                                             list(spec.shape))

    g = helper.make_graph(b.nodes, graph.name,
                          [value_info(s) for s in graph_inputs(model, graph)],
                          [value_info(s) for s in graph_outputs(model, graph)],
                          initializer=list(weight_tensors) + list(b.constants.values()))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
    m.ir_version = IR_VERSION
    return m


def external_tensors(shapes: dict, location: str) -> list:
    """TensorProtos (float32, shapes: name -> shape) pointing into `location`, at the offsets
    `data_layout` gives."""
    tensors = []
    for name, (offset, nbytes) in data_layout(shapes).items():
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shapes[name]))
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        tensors.append(t)
    return tensors


def data_layout(shapes: dict) -> dict:
    """name -> (offset, nbytes) of float32 weights in the .data file (formats/weightdata.py)."""
    return weightdata.plan_layout(shapes)


def _shapes(weights: dict) -> dict:
    return {name: array.shape for name, array in weights.items()}


def _write_data(path: Path, weights: dict) -> None:
    layout = data_layout(_shapes(weights))
    with open_input_file(path) as f:
        for name, array in weights.items():
            f.write(weightdata.padding(f, layout[name][0]))
            f.write(weightdata.stored(array))


# --------------------------------------------------------------------------- encodings


class WeightRange:
    """What a weight's encoding is computed from, accumulated over blocks of rows: the largest
    |value| per output channel (linear, lm_head: the last axis) or min and max (embedding)."""

    def __init__(self, spec: DrawnWeight):
        self.spec = spec
        self.amax = self.lo = self.hi = None

    def update(self, rows: np.ndarray) -> None:
        if self.spec.kind in ("linear", "lm_head") and self.spec.channel_axis == 0:
            # a block of output channels: their maxima follow the ones seen so far
            block = np.abs(rows).reshape(rows.shape[0], -1).max(axis=1)
            self.amax = block if self.amax is None else np.concatenate([self.amax, block])
        elif self.spec.kind in ("linear", "lm_head"):
            block = np.abs(rows).max(axis=0)
            self.amax = block if self.amax is None else np.maximum(self.amax, block)
        elif self.spec.kind == "embedding":
            lo, hi = rows.min(), rows.max()
            self.lo = lo if self.lo is None else min(self.lo, lo)
            self.hi = hi if self.hi is None else max(self.hi, hi)


def weight_range(spec: DrawnWeight, w: np.ndarray) -> WeightRange:
    r = WeightRange(spec)
    r.update(w)
    return r


def _param_encoding(r: WeightRange, model: Model) -> dict:
    spec, q = r.spec, model.quantization
    if spec.kind == "linear":
        enc = encodings.symmetric_per_channel(r.amax, q.decoder_linear_bitwidth)
    elif spec.kind == "lm_head":
        enc = encodings.symmetric_per_channel(r.amax, q.lm_head_bitwidth)
    elif spec.kind == "embedding":
        enc = encodings.asymmetric_per_tensor(r.lo, r.hi, q.embedding_bitwidth)
    else:   # biases and norm weights stay float
        return encodings.float_entry(spec.name, q.float_bitwidth)
    return encodings.int_entry(spec.name, enc)


def _activation_role(name: str) -> str:
    if name == "logits":
        return "logits"
    if is_kv(name):
        return "past_key" if name.startswith(KEY_PREFIX) else "past_value"
    if name in (POSITION_COS, POSITION_SIN):
        return "rope"
    return "hidden"


def _activation_range(role: str, model: Model) -> float:
    a = model.architecture
    if role == "logits" and a.tie_word_embeddings:
        # normed hidden (norm sqrt(H)) . a unit-scale embedding row (norm sqrt(H)): up to H,
        # nearly reached by the input token's own row while the embedding dominates the residual
        return float(a.hidden_size)
    return ACTIVATION_RANGES[role]


def _activation_encoding(spec: TensorSpec, model: Model) -> dict:
    bw = model.quantization.activation_bitwidth
    if spec.name == ATTENTION_MASK:
        enc = encodings.asymmetric_per_tensor(MASK_VALUE, 0.0, bw)
    else:
        enc = encodings.symmetric_per_tensor(_activation_range(_activation_role(spec.name), model),
                                             bw)
    return encodings.int_entry(spec.name, enc)


def build_encodings(model: Model, graph: Graph, weights: dict) -> dict:
    """The AIMET v1.0.0 encodings of one graph."""
    return encodings_from_ranges(model, graph, {spec.name: weight_range(spec, weights[spec.name])
                                                for spec in weight_specs(model, graph.part)})


def encodings_from_ranges(model: Model, graph: Graph, ranges: dict) -> dict:
    """The AIMET v1.0.0 encodings of one graph from its weights' ranges (name -> WeightRange)."""
    q = model.quantization
    params = [_param_encoding(ranges[spec.name], model) for spec in weight_specs(model, graph.part)]
    io = [s for s in graph_inputs(model, graph) + graph_outputs(model, graph) if s.dtype == np.float32]
    return encodings.encodings_document(
        [_activation_encoding(s, model) for s in io], params,
        {"activation_bitwidth": q.activation_bitwidth, "dtype": "int", "is_symmetric": True,
         "param_bitwidth": q.decoder_linear_bitwidth, "per_channel_quantization": True,
         "quant_scheme": "post_training_tf"})


# --------------------------------------------------------------------------- files


def open_input_file(path: Path):
    """A binary file object whose bytes replace `path` when complete (support.atomic): readers
    never see halves; a full disk is a clean error naming the file, nothing partial kept. Not
    fsynced and the umask decides the mode, as these inputs always were."""
    return atomic_output(path, "wb", sync=False, perms=None)


def write_input_file(path: Path, data: bytes) -> None:
    with open_input_file(path) as f:
        f.write(data)


def part_files(model: Model, part: Part, out_dir: Path) -> list:
    """The paths generate_part writes, in its order, each once: per graph .onnx, the part's
    .data (shared by its graphs), .encodings."""
    paths = [path for g in model.graphs(part) for path in graph_files(out_dir, g)]
    return [p for i, p in enumerate(paths) if p not in paths[:i]]


def generate_part(model: Model, part: Part, out_dir: Path, seed: int) -> list:
    """Write <graph>.onnx and <graph>.encodings for each graph of the part, and the part's one
    .data both graphs record."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = make_weights(model, part, seed)
    _write_data(graph_files(out_dir, model.graphs(part)[0])[1], weights)   # first: the ONNX refer to it
    for graph in model.graphs(part):
        onnx_path, data_path, encodings_path = graph_files(out_dir, graph)
        proto = build_graph(model, graph, external_tensors(_shapes(weights), data_path.name))
        write_input_file(onnx_path, proto.SerializeToString(deterministic=True))
        write_input_file(encodings_path,
                         encodings.encodings_bytes(build_encodings(model, graph, weights)))
    return part_files(model, part, out_dir)


# --------------------------------------------------------------------------- tokenizer

# Training text for the BPE merges: plain English and Chinese, so both scripts get real merges.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model can still say hello to the world.
Hello, how are you today? I am fine, thank you. What is the weather like in the city this morning?
Large language models predict the next token from the tokens that came before it.
The prompt is processed in chunks of one hundred and twenty eight tokens, then one token at a time.
Each decoder layer has attention and a feed forward network with a gated linear unit.
The key and value cache keeps the past so that every new token only needs one pass.
Quantization stores weights with four bits and activations with sixteen bits on the device.
Please answer the question in English or in Chinese, and keep the answer short and clear.
There are three apples on the table, and she gives two of them to her brother.
Today is a good day to learn something new about computers, numbers and language.
The river flows through the valley, past the old bridge and the green fields of rice.
He wrote a letter to his friend, telling her about the mountains and the long winter.
Numbers such as 1, 2, 3, 42, 100 and 2024 appear in text as well as words do.
Where is the train station? Turn left at the second street and walk for five minutes.
你好，世界！今天天气很好，我们一起去公园散步吧。
大语言模型根据前面的词预测下一个词，一次生成一个词。
请用中文回答这个问题，回答要简短清楚。
我喜欢读书，也喜欢听音乐和看电影。
这个模型很小，但是它的结构和真正的大模型一样。
每一层都有注意力机制和前馈网络，最后输出每个词的概率。
量化以后，权重只用四位存储，激活值用十六位表示。
北京是中国的首都，上海是一个很大的城市。
桌子上有三个苹果，她给了弟弟两个，还剩一个。
春天来了，花开了，小鸟在树上唱歌，孩子们在草地上玩耍。
学习一门新的语言需要时间和耐心，每天练习一点就会进步。
谢谢你的帮助，我们明天见。
"""

_PRETOKENIZE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def _byte_to_unicode() -> dict:
    """GPT-2's byte -> printable character map used by byte-level BPE (bytes in id order)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _learn_merges(text: str, max_merges: int) -> list:
    """Greedy BPE: merge the most frequent adjacent pair; ties go to the smallest pair string."""
    to_char = _byte_to_unicode()
    words = Counter(tuple(to_char[b] for b in piece.encode("utf-8")) for piece in _PRETOKENIZE.findall(text))
    merges = []
    while len(merges) < max_merges:
        pairs = Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += freq
        if not pairs:
            break   # every pre-token is a single symbol: the corpus is used up
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        words = Counter({_merge_pair(word, best): freq for word, freq in words.items()})
    return merges


def _merge_pair(word: tuple, pair: tuple) -> tuple:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def generated_special_ids(first_free: int, special_tokens: dict) -> dict:
    """{role: id}: the specials take the ids right after the BPE vocabulary, in the dict's order.

    As in Qwen's own tokenizer.json: the tokenizers library numbers an added token that is not in
    model.vocab from the vocabulary's end, whatever id added_tokens writes, so any gap would make
    the file contradict itself. The logits width (vocab_size) may be wider than the tokenizer."""
    return {role: first_free + i for i, role in enumerate(special_tokens)}


def tokenizer_json(vocab_size: int, special_tokens: dict) -> dict:
    """The Hugging Face tokenizer.json content (byte-level BPE) for a model's vocab_size: the
    corpus's merges up to it (a small model's vocabulary fills up, a 7B-sized one does not),
    then the specials."""
    budget = vocab_size - len(special_tokens) - 256
    if budget < 0:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for 256 byte "
                         f"tokens and {len(special_tokens)} special tokens")
    vocab = {ch: i for i, ch in enumerate(_byte_to_unicode().values())}
    merges = _learn_merges(_CORPUS, budget)
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))   # two merges may spell one token: one id
    ids = generated_special_ids(len(vocab), special_tokens)
    return tokenizer.byte_level_bpe(vocab, merges, [(ids[role], content)
                                                    for role, content in special_tokens.items()])


def generate_tokenizer(vocab_size: int, path: Path, special_tokens: dict) -> Path:
    """Write a byte-level BPE tokenizer.json: every id < vocab_size, specials at the top ids."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_input_file(path, tokenizer.tokenizer_bytes(tokenizer_json(vocab_size, special_tokens)))
    return path
