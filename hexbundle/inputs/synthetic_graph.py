"""The synthetic model's ONNX graphs (inputs/synthetic.py's generator): each graph's inputs and
outputs as the real export declares them (the runtime conventions, hexbundle.runtime.conventions)
and its nodes, standard ops at opset 17, with its weights as external tensors.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from hexbundle.config.model import Graph, Model, Part, boundary_tensor
from hexbundle.formats import weightdata
from hexbundle.runtime.conventions import (ATTENTION_MASK, KEY_SEQ_AXIS, POSITION_COS,
                                           POSITION_SIN, VALUE_SEQ_AXIS,
                                           key_shape, kv_names, mask_shape, past_slots, rope_shape,
                                           value_shape)

OPSET = 17
IR_VERSION = 8              # pinned: onnx.helper would stamp the installed onnx's newest IR
PRODUCER = "hexbundle.inputs.synthetic"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: type  # numpy scalar type
    shape: tuple


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
    formats/weightdata.plan_layout gives."""
    tensors = []
    for name, (offset, nbytes) in weightdata.plan_layout(shapes).items():
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shapes[name]))
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        tensors.append(t)
    return tensors
