"""The part session: one part of a bundle as the runtime drives it, with its KV cache.

A `PartSession` holds a part's prompt and token graphs -- any `GraphExecutor`: a context
binary's graph (`hexbundle.runtime.interpreter.GraphRunner`) or the float ONNX
(`hexbundle.runtime.onnx_graph.OnnxGraph`) -- and feeds them as Genie does, with the mask,
cos/sin and past KV built by the runtime conventions (`hexbundle.runtime.conventions`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hexbundle.runtime.conventions import (ATTENTION_MASK, KEY_SEQ_AXIS, POSITION_COS,
                                           POSITION_SIN, RUNTIME_INPUTS, VALUE_SEQ_AXIS,
                                           causal_mask, is_kv, kv_layers, kv_names, past_slots,
                                           rope_inputs)
from hexbundle.support.errors import VerifyError


@dataclass(frozen=True)
class IoInfo:
    """A graph input or output as the session layer needs it."""

    name: str
    dtype: str            # numpy dtype name
    shape: tuple


class GraphExecutor(Protocol):
    """What PartSession drives: a bin graph (GraphRunner) or a float ONNX (OnnxGraph)."""

    name: str
    inputs: list          # IoInfo
    outputs: list         # IoInfo

    def run(self, feeds: dict) -> dict: ...


@dataclass(frozen=True)
class RopeSettings:
    """What the runtime needs to build cos/sin: from genie_config.json (`rope-theta`,
    `pos-id-dim`, a positional-encoding block's `rope-scaling`) for a bundle, from the model's
    architecture for the float ONNX and the reference."""

    theta: float
    pos_id_dim: int
    scaling: object = None        # config.model.RopeScaling, or None: plain RoPE


class PartSession:
    """One part as the runtime drives it: its prompt and token graphs and the KV cache of its layers.

    `run(kind, x, n_valid)` feeds x (the first n_valid rows are real, the rest padding) through
    the `kind` graph with the mask, cos/sin and past KV built from the cache, appends the n_valid
    new KV entries to the cache and returns the main output's n_valid rows.
    """

    def __init__(self, label: str, graphs: dict, rope: RopeSettings):
        self.label = label
        self.graphs = graphs                  # kind ("prompt" | "token") -> GraphExecutor
        self.rope = rope
        first = graphs["prompt"]
        self.main_input = _main_name(first.inputs, label, "input")
        self.main_output = _main_name(first.outputs, label, "output")
        self.layers = kv_layers(s.name for s in first.inputs)
        self.capacity = max(self._geometry(g)[1] for g in graphs.values())
        self._keys, self._values, self.n_past = {}, {}, 0
        for layer in self.layers:
            key_in, value_in = kv_names(layer, "in")
            k = _spec(first.inputs, key_in, label).shape
            v = _spec(first.inputs, value_in, label).shape
            self._keys[layer] = np.zeros(_resized(k, KEY_SEQ_AXIS, self.capacity), np.float32)
            self._values[layer] = np.zeros(_resized(v, VALUE_SEQ_AXIS, self.capacity), np.float32)

    def _geometry(self, graph: GraphExecutor) -> tuple:
        """(AR, CL) of a graph: AR from its main input, CL from its mask (no mask: no cache)."""
        ar = int(_spec(graph.inputs, self.main_input, self.label).shape[1])
        mask = [s for s in graph.inputs if s.name == ATTENTION_MASK]
        return ar, int(mask[0].shape[-1]) if mask else ar

    def ar(self, kind: str) -> int:
        return self._geometry(self.graphs[kind])[0]

    def run(self, kind: str, x: np.ndarray, n_valid: int) -> np.ndarray:
        graph = self.graphs[kind]
        ar, cl = self._geometry(graph)
        past = past_slots(ar, cl)
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
            cos, sin = rope_inputs(positions, 2 * self.rope.pos_id_dim, self.rope.theta,
                                   self.rope.scaling)
            feeds.update({ATTENTION_MASK: causal_mask(ar, cl, self.n_past),
                          POSITION_COS: cos, POSITION_SIN: sin})
            for layer in self.layers:
                key_in, value_in = kv_names(layer, "in")
                feeds[key_in] = self._past(self._keys[layer], KEY_SEQ_AXIS, past)
                feeds[value_in] = self._past(self._values[layer], VALUE_SEQ_AXIS, past)
        outputs = graph.run(feeds)
        for layer in self.layers:
            key_out, value_out = kv_names(layer, "out")
            self._append(self._keys[layer], outputs[key_out], KEY_SEQ_AXIS, n_valid)
            self._append(self._values[layer], outputs[value_out], VALUE_SEQ_AXIS, n_valid)
        self.n_past += n_valid if self.layers else 0
        main = outputs[self.main_output]
        return main.reshape((ar,) + main.shape[2:])[:n_valid]

    def _past(self, cache: np.ndarray, axis: int, past: int) -> np.ndarray:
        """The past input: zeros, with the n_past cached entries right-aligned before slot P."""
        window = np.zeros(_resized(cache.shape, axis, past), np.float32)
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
        return np.concatenate([np.concatenate(
            [np.take(self._keys[layer], position, axis=KEY_SEQ_AXIS).reshape(-1),
             np.take(self._values[layer], position, axis=VALUE_SEQ_AXIS).reshape(-1)])
            for layer in self.layers])

    def fork(self, n_past: int) -> "PartSession":
        """A copy whose cache holds only the first n_past entries (for the prompt/token check)."""
        if self.layers and not 0 <= n_past <= self.n_past:
            raise ValueError(f"{self.label}: cannot fork at {n_past} of {self.n_past} entries")
        other = object.__new__(PartSession)
        other.__dict__.update(self.__dict__)
        other._keys = {k: _cached_copy(v, KEY_SEQ_AXIS, n_past) for k, v in self._keys.items()}
        other._values = {k: _cached_copy(v, VALUE_SEQ_AXIS, n_past)
                         for k, v in self._values.items()}
        other.n_past = n_past if self.layers else 0
        return other


def _cached_copy(cache: np.ndarray, axis: int, n_past: int) -> np.ndarray:
    """A cache's first n_past entries in a new cache of its capacity. The rest stays np.zeros'
    untouched pages, which take no memory: a whole copy made every slot resident (16 MiB a
    layer at the 7B shape's 4096 slots, per fork, while a part's reference weights are in)."""
    copy = np.zeros(cache.shape, cache.dtype)   # calloc: untouched (np.zeros_like writes)
    cached = [slice(None)] * cache.ndim
    cached[axis] = slice(0, n_past)
    copy[tuple(cached)] = cache[tuple(cached)]
    return copy


def _resized(shape, axis: int, n: int) -> tuple:
    """`shape` with its `axis` set to n."""
    shape = list(shape)
    shape[axis] = n
    return tuple(shape)


def _main_name(specs: list, label: str, what: str) -> str:
    names = [s.name for s in specs if not is_kv(s.name) and s.name not in RUNTIME_INPUTS]
    if len(names) != 1:
        raise VerifyError(f"{label}: expected exactly one {what} besides the mask, cos/sin and "
                          f"the KV cache, found {names or 'none'}")
    return names[0]


def _spec(specs: list, name: str, label: str) -> IoInfo:
    for s in specs:
        if s.name == name:
            return s
    raise VerifyError(f"{label}: the graph has no '{name}'")
