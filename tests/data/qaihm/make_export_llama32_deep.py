#!/usr/bin/env python3
"""Regenerate tests/data/qaihm/export-llama32-deep/ (and config-llama32-deep.json) with
qai-hub-models 0.55.0's own llama_v3_2_3b_instruct code: make_export_llama32.py's recipe
(``build``), run on another shape and other random weights.

Why a second Llama 3.2 (issue 34): verify must hold on exports the tests were not tuned on.  This
one differs from every other tree in tests/data/qaihm in each dimension the graphs carry:

* 11 decoder layers (the others: 2, 4, 6, 9), split by Qualcomm's own rule into
  [0, 6, 5]: llama_v3_2_3b_instruct's NUM_SPLITS 3 with the embedding on its own leaves 2 groups,
  ``split_onnx`` takes ceil(11 / 2) = 6 layers per group (it warns "num_layers_per_split (14) is
  not compatible with model. Overwriting with 6"), so the last group is one layer short, as
  real splits often are;
* hidden 48 (the others: 64), 2 query heads x head_dim 24 (the others: 16 and 32), so
  position_ids_cos/sin are [.., 12] wide;
* 1 KV head (the others: 2), i.e. grouped-query attention 2:1 with a single KV head
  (past_key_<l>_in [1, 1, 24, CL-S]);
* intermediate 128 (unequal to the query width 48, as in Llama-3.2-3B);
* random weights from seed 4321 (the others: 1234), the tokenizer trained on text from the same
  seed.

Everything else is Llama 3.2's, as in export-llama32: tied embeddings, no biases, rope_theta
500000 with the llama3 rope_scaling (factor 32), vocab 1024 with the 512-token tokenizer whose
Llama 3 special tokens sit at 507-511, context length 256, AR 128 and 1, w4a16.

Environment, patches, genie config and output layout: exactly make_export_llama32.py's (its
docstring; the same venv /work/venvs/qaihm, the same monkeypatches 1, A, D, B, 8; nothing new).

Run (CPU only, about 15 s on 2 cores, no network needed; re-running gives byte-identical files):
    /work/venvs/qaihm/bin/python tests/data/qaihm/make_export_llama32_deep.py
It wipes and rewrites tests/data/qaihm/export-llama32-deep/ and config-llama32-deep.json.
Scratch files go to $QAIHM_LLAMA32_DEEP_WORK (default /tmp/qaihm_llama32_deep_work).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_export_llama32 import TINY_CONFIG, build  # noqa: E402  (the Llama 3.2 recipe)

EXPORT_DIR = HERE / "export-llama32-deep"
MODEL_CONFIG = HERE / "config-llama32-deep.json"
WORK = Path(os.environ.get("QAIHM_LLAMA32_DEEP_WORK", "/tmp/qaihm_llama32_deep_work"))
SEED = 4321

DEEP_CONFIG = dict(
    TINY_CONFIG,
    num_hidden_layers=11,
    hidden_size=48,
    num_attention_heads=2,
    head_dim=24,             # = hidden / heads, as Llama-3.2-3B's 128 = 3072 / 24
    num_key_value_heads=1,
    intermediate_size=128,
)


if __name__ == "__main__":
    build(EXPORT_DIR, MODEL_CONFIG, WORK, DEEP_CONFIG, SEED)
