"""The runtime conventions: what Genie feeds a graph of a part besides its main input, and how.

This module is the one place they are written down. The part session
(`hexbundle.runtime.sessions.PartSession`) builds its inputs with it, as Genie does on the
device; the synthetic Qwen2 generator (`hexbundle.inputs.synthetic`) declares and consumes the
same inputs in its graphs.

* KV window. A graph with AR = S and context CL sees CL key/value slots: slots [0, P) with
  P = CL - S (`past_slots`) hold the past (the `past_key_<L>_in` / `past_value_<L>_in` inputs),
  slots [P, CL) hold the S new entries computed by this call. Valid past entries are
  RIGHT-aligned: with `n_past` valid entries they sit in slots [P - n_past, P), right before the
  new ones; the slots before are padding (zeros; the mask hides them). `past_*_out` carry only
  the S new entries (as the real export); the runtime appends the first n_valid of them to its
  cache.
* Layouts. past_key (nkv, 1, d, T) (`key_shape`): keys pre-transposed for q @ K, the sequence on
  the last axis (`KEY_SEQ_AXIS`); past_value (nkv, 1, T, d) (`value_shape`): the sequence on
  axis 2 (`VALUE_SEQ_AXIS`). Keys are stored AFTER RoPE.
* attention_mask (1, 1, S, CL) (`mask_shape`) is ADDITIVE: 0.0 where a query may attend,
  MASK_VALUE where it may not (`causal_mask`).
* position_ids_cos / _sin (1, 1, S, d/2) (`rope_shape`): cos/sin of position * theta^(-2i/d)
  (`rope_inputs`), Llama 3's scaled frequencies where the model has rope scaling
  (`rope_inv_freq`); theta, d/2 and the scaling come from the bundle's genie_config.json (`rope-theta`,
  `pos-id-dim`), as on the device.
* Prefill runs the prompt graph (AR 128) over the prompt in chunks of AR tokens; the last chunk
  is right-padded (padding rows are causal too, their outputs and KV entries are dropped).
  Decode runs the token graph (AR 1) one token at a time. Positions are absolute: token t of
  the sequence has position t.
* Chaining. A part's inputs are: its main input (input_ids for part 1, else the hidden state of
  the previous part), the mask, cos/sin (`RUNTIME_INPUTS`) and the past KV of its own layers.
  Its main output (the output that is not a `past_*_out`) feeds the next part's main input.
"""
from __future__ import annotations

import numpy as np

MASK_VALUE = -10000.0        # additive mask for "may not attend"; exp(-10000) == 0 in float32

ATTENTION_MASK = "attention_mask"
POSITION_COS, POSITION_SIN = "position_ids_cos", "position_ids_sin"
RUNTIME_INPUTS = (ATTENTION_MASK, POSITION_COS, POSITION_SIN)

KEY_PREFIX, VALUE_PREFIX = "past_key_", "past_value_"
KEY_SEQ_AXIS = 3             # past_key (nkv, 1, d, T): the sequence is the last axis
VALUE_SEQ_AXIS = 2           # past_value (nkv, 1, T, d)


# ============================================================================ names and shapes


def kv_names(layer: int, side: str) -> tuple:
    """(key, value) names of a layer's KV cache: the past inputs (side "in") or the new entries
    (side "out")."""
    if side not in ("in", "out"):
        raise ValueError(f"side {side!r}: 'in' or 'out'")
    return f"{KEY_PREFIX}{layer}_{side}", f"{VALUE_PREFIX}{layer}_{side}"


def kv_layers(input_names) -> list:
    """The layers (as written in the names) whose past key is among a graph's inputs, in order."""
    return [name[len(KEY_PREFIX):-len("_in")] for name in input_names
            if name.startswith(KEY_PREFIX) and name.endswith("_in")]


def is_kv(name: str) -> bool:
    return name.startswith((KEY_PREFIX, VALUE_PREFIX))


def past_slots(ar: int, context_length: int) -> int:
    """P: the slots of the window that hold the past, before the `ar` new entries."""
    return context_length - ar


def mask_shape(ar: int, context_length: int) -> tuple:
    return (1, 1, ar, context_length)


def rope_shape(ar: int, pos_id_dim: int) -> tuple:
    return (1, 1, ar, pos_id_dim)


def key_shape(num_kv_heads: int, head_dim: int, slots: int) -> tuple:
    return (num_kv_heads, 1, head_dim, slots)


def value_shape(num_kv_heads: int, head_dim: int, slots: int) -> tuple:
    return (num_kv_heads, 1, slots, head_dim)


# ============================================================================ the inputs


def rope_inv_freq(head_dim: int, theta: float, scaling=None) -> np.ndarray:
    """RoPE's frequencies, float64 (head_dim/2,): theta^(-2i/head_dim), and for a "llama3"
    `scaling` (config.model.RopeScaling) Llama 3's bands, as Hugging Face computes them
    (transformers' _compute_llama3_parameters; tests/data/rope holds its values): wavelengths
    longer than original_max_position_embeddings / low_freq_factor are divided by `factor`,
    those shorter than original / high_freq_factor are kept, and the ones between are blended
    linearly in original / wavelength."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.rope_type != "llama3":
        raise ValueError(f"rope scaling {scaling.rope_type!r}: only 'llama3' is known")
    original = float(scaling.original_max_position_embeddings)
    low, high, factor = scaling.low_freq_factor, scaling.high_freq_factor, scaling.factor
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return np.where(medium, blended, scaled)


def rope_inputs(positions: np.ndarray, head_dim: int, theta: float, scaling=None):
    """(cos, sin), each float32 (1, 1, S, head_dim/2), for the given absolute positions (S,).

    angle[s, i] = positions[s] * inv_freq[i] (`rope_inv_freq`: theta^(-2i/head_dim), scaled per
    band for Llama 3), computed in float64.
    """
    positions = np.asarray(positions, dtype=np.float64).reshape(-1)
    angles = positions[:, None] * rope_inv_freq(head_dim, theta, scaling)[None, :]
    shape = rope_shape(positions.size, head_dim // 2)
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
    past = past_slots(ar, context_length)
    if not 0 <= n_past <= past:
        raise ValueError(f"n_past={n_past} does not fit the {past} past slots of the window")
    allowed = np.zeros((ar, context_length), dtype=bool)
    allowed[:, past - n_past:past] = True
    allowed[:, past:] = np.tri(ar, dtype=bool)
    mask = np.where(allowed, np.float32(0.0), np.float32(MASK_VALUE)).astype(np.float32)
    return mask.reshape(mask_shape(ar, context_length))
