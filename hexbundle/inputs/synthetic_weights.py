"""The synthetic model's weights (inputs/synthetic.py's generator): which weights a part has, the
role that decides how each is drawn, and their values, a pure function of (seed, name): every
split plan cuts the same model, and a tensor drawn in blocks of rows equals it drawn whole
(inputs/generate.py streams full-size weights that way).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from hexbundle.config.model import Model, Part, part_weights

_DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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
