#!/usr/bin/env python3
"""Regenerate tests/data/qaihm/export-qwen3-kv16/ (and config-qwen3-kv16.json) with
qai-hub-models 0.55.0's own qwen3_4b code: make_export_qwen3.py's recipe (``build``), on another
shape and other random weights, with the KV cache quantized to 16 bits instead of 8.

Why (issue 34): verify must hold on exports the tests were not tuned on, and one of them must
carry a 16-bit KV cache.  This one differs from every other tree in tests/data/qaihm:

* 10 decoder layers (the others: 2, 4, 6, 9, 11), split by Qualcomm's own rule into
  [0, 4, 4, 2]: qwen3_4b's NUM_SPLITS 4 with the embedding on its own leaves 3 groups,
  ``split_onnx`` takes ceil(10 / 3) = 4 layers per group (it warns "num_layers_per_split (12) is
  not compatible with model. Overwriting with 4"), so the last part holds 2 layers;
* hidden 40 (the others: 48, 64); 2 query heads x head_dim 48 (the others: 16, 24, 32), so the
  query width is 96, unequal to hidden as in Qwen3-4B (4096 vs 2560), and
  position_ids_cos/sin are [.., 24] wide;
* 1 KV head (past_key_<l>_in [1, 1, 48, CL-S]); intermediate 112 (unequal to hidden, the query
  width and the KV width);
* random weights from seed 2718 (the others: 1234, 4321), the tokenizer trained on text from the
  same seed;
* **a 16-bit KV cache** (patch K below): every other export holds its KV cache (past_*_in,
  past_*_out and what AIMET ties to them) in 8 bits.

Everything else is export-qwen3's: Qwen3ForCausalLM, per-head q/k RMSNorm, no biases, tied
embeddings, rope_theta 1e6, vocab 1024 with make_export.py's 512-token tokenizer, context length
256, AR 128 and 1, w4a16 weights (4-bit per-channel, LM head 8-bit), 16-bit activations.

Environment: make_export_qwen3.py's venv (/work/venvs/qaihm-b: make_export.py's pins with
transformers 4.51.0, sentencepiece 0.2.1, accelerate 1.6.0).  Patches: make_export_qwen3.py's
1, A, B, C and 8, plus K.

K. 16-bit KV cache.  qai-hub-models 0.55.0 has no setting for the KV cache's bit width: qwen3_4b
   supports one precision, w4a16 (``SUPPORTED_PRECISIONS``), and for w4a16
   ``LLM_AIMETOnnx._configure_quant_sim`` always calls ``_shared/llm/_utils.
   _apply_int8_kv_cache_tying_and_lm_head(sim, kv_io_map)``, which
   (a) ties the Concat quantizers, (b) sets every past_*_in / past_*_out quantizer to 8 bits
   symmetric (``_set_tensors_to_output_8b_sym``), (c) sets the LM head weights to 8 bits,
   (d) ties each past_*_in quantizer to its past_*_out's, and (e) with ``use_16x8_matmuls=True``
   (the default) sets the second input of every MatMul to 8 bits and propagates that up
   through Concat/Transpose/Reshape/Slice/Div, which reaches the KV cache again through the
   attention's Concat(past, new).  The patch wraps that one function as
   ``_shared.llm.model`` looks it up: (b) becomes a no-op for the duration of the call and the
   call passes ``use_16x8_matmuls=False`` (the value Qualcomm's own qwen2_vl passes), so (a),
   (c) and (d) run as shipped and the KV quantizers stay what QuantSim made them: AIMET's
   default 16-bit activation quantizer (asymmetric, as every other activation).  A side
   effect of (e) being off: the attention MatMuls' second inputs (K and V) stay 16-bit too.
   Nothing else changes; calibration then computes the 16-bit KV encodings as it computes
   every other one.

Run (CPU only, about 30 s on 2 cores, no network needed; re-running gives byte-identical files):
    /work/venvs/qaihm-b/bin/python tests/data/qaihm/make_export_qwen3_kv16.py
It wipes and rewrites tests/data/qaihm/export-qwen3-kv16/ and config-qwen3-kv16.json.  Scratch
files go to $QAIHM_QWEN3_KV16_WORK (default /tmp/qaihm_qwen3_kv16_work).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_export_qwen3 import TINY_CONFIG, build  # noqa: E402  (the Qwen3 recipe)

EXPORT_DIR = HERE / "export-qwen3-kv16"
MODEL_CONFIG = HERE / "config-qwen3-kv16.json"
WORK = Path(os.environ.get("QAIHM_QWEN3_KV16_WORK", "/tmp/qaihm_qwen3_kv16_work"))
SEED = 2718

KV16_CONFIG = dict(
    TINY_CONFIG,
    num_hidden_layers=10,
    hidden_size=40,
    num_attention_heads=2,
    head_dim=48,
    num_key_value_heads=1,
    intermediate_size=112,
)


def patch_kv16() -> None:
    """Patch K (see the docstring): the KV cache keeps AIMET's 16-bit activation quantizers."""
    import qai_hub_models.models._shared.llm._utils as llm_utils
    import qai_hub_models.models._shared.llm.model as llm_model

    stock = llm_model._apply_int8_kv_cache_tying_and_lm_head

    @functools.wraps(stock)
    def kv16(sim, kv_io_map, use_16x8_matmuls=True):  # noqa: ARG001  (always off: see K (e))
        to_8b = llm_utils._set_tensors_to_output_8b_sym
        llm_utils._set_tensors_to_output_8b_sym = lambda sim_, tensors: None
        try:
            return stock(sim, kv_io_map, use_16x8_matmuls=False)
        finally:
            llm_utils._set_tensors_to_output_8b_sym = to_8b

    llm_model._apply_int8_kv_cache_tying_and_lm_head = kv16


if __name__ == "__main__":
    patch_kv16()
    build(EXPORT_DIR, WORK, KV16_CONFIG, SEED, MODEL_CONFIG)
