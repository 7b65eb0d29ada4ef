"""The synthetic model's AIMET encodings (inputs/synthetic.py's generator): every weight's from
its range (per output channel for the linears and the LM head, per tensor for the embedding,
float for biases and norms), every float input and output's from a fixed range; the file's
entries and bytes are formats/encodings.py's.
"""
from __future__ import annotations

import numpy as np

from hexbundle.config.model import Graph, Model
from hexbundle.formats import encodings
from hexbundle.inputs.synthetic_graph import TensorSpec, graph_inputs, graph_outputs
from hexbundle.inputs.synthetic_weights import DrawnWeight, weight_specs
from hexbundle.runtime.conventions import (ATTENTION_MASK, KEY_PREFIX, MASK_VALUE, POSITION_COS,
                                           POSITION_SIN, is_kv)

# Symmetric activation ranges [-r, r] by tensor role; generous for the generated weights.
ACTIVATION_RANGES = {"hidden": 64.0, "logits": 32.0, "past_key": 16.0, "past_value": 16.0,
                     "rope": 1.0}


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
