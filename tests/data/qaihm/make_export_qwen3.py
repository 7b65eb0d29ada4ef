#!/usr/bin/env python3
"""Regenerate tests/data/qaihm/export-qwen3/ with Qualcomm's own qai-hub-models code (Qwen3).

What this produces
------------------
A tiny *random* Qwen3 model (6 layers, hidden 64, 4 query heads x head_dim 32 = 128 query width,
unequal to hidden as in Qwen3-4B; 2 KV heads; q/k RMSNorm; no q/k/v biases; tied embeddings),
quantized with AIMET-ONNX by qai-hub-models 0.55.0's own ``qwen3_4b`` quantize entry point
(``python -m qai_hub_models.models.qwen3_4b.quantize --checkpoint <fp dir> ...``, i.e.
``_shared/llm/quantize.llm_quantize`` with ``Qwen3_4B`` / ``Qwen3_4B_AIMETOnnx``, precision
w4a16), then exported by the stock ``qwen3_4b`` export entry point
(``python -m qai_hub_models.models.qwen3_4b.export --checkpoint DEFAULT --context-length 256
--sequence-length 128,1 --onnx-export-dir export-qwen3/ ...``, i.e. ``_shared/llm/export.
export_main`` -> ``export_model`` with ``Qwen3_4B_AIMETOnnx``, NUM_SPLITS 4,
NUM_LAYERS_PER_SPLIT 12), all AI Hub network calls stubbed.  Both entry points run as
``__main__`` (runpy) with their own argument parsers.  Everything under export-qwen3/ar*_cl*/ is
written by qai-hub-models itself (the generic ``LLM_AIMETOnnx.convert_to_onnx_and_aimet_encodings``
copies the unsplit graph to ``Qwen3_4B_AIMETOnnx.aimet/``, Qualcomm's ``split_onnx_utils`` writes
the parts); only export-qwen3/tokenizer.json is ours.

Environment
-----------
The venv of make_export.py's docstring, except transformers: Qwen3 needs transformers >= 4.51
(``transformers.models.qwen3``; ``SHAQwen3Attention.forward_sha`` asserts >= 4.48), and
qai_hub_models/models/qwen3_4b/requirements.txt pins transformers==4.51.0 and
sentencepiece==0.2.1.  Exactly:

    /root/.pyenv/versions/3.10.13/bin/python3.10 -m venv /work/venvs/qaihm-b
    P=/work/venvs/qaihm-b/bin/pip
    ... every pip line of make_export.py's docstring, with /work/venvs/qaihm-b ...
    $P install transformers==4.51.0 sentencepiece==0.2.1     (-> tokenizers 0.21.4)
    $P install accelerate==1.6.0
  accelerate: transformers 4.51.0's from_pretrained calls accelerate's init_empty_weights
  unconditionally; without accelerate it fails with "NameError: name 'init_empty_weights' is
  not defined".

Run (CPU only, 25-40 s on 2 cores, no network needed; re-running gives byte-identical files):
    /work/venvs/qaihm-b/bin/python tests/data/qaihm/make_export_qwen3.py
It wipes and rewrites tests/data/qaihm/export-qwen3/.  Scratch files go to
$QAIHM_QWEN3_WORK (default /tmp/qaihm_qwen3_work).

What differs from make_export.py (Qwen2)
----------------------------------------
* Model: Qwen3 (``Qwen3ForCausalLM``) instead of Qwen2; 6 layers (not 9); head_dim 32 with 4
  query heads (query width 128 != hidden 64; the Qwen2 export has 4 x 16 = 64); no q/k/v biases;
  per-head q_norm/k_norm RMSNorm; ``tie_word_embeddings=True`` (Qwen3-4B's value); bos
  ``<|endoftext|>`` / eos ``<|im_end|>`` as Qwen3's config.
  6 layers, not 4: qwen3_4b's split is NUM_SPLITS 4 with split_embedding, i.e. 3 groups of
  decoder layers; with 4 layers Qualcomm's ``split_onnx`` computes ceil(4/3) = 2 layers per
  group, finds only 2 cut points and raises (tried) "ValueError: Expected 3 split points for
  4 splits, but got 2. Check num_splits, num_layers_per_split, split_embedding=True,
  split_lm_head=False."  With 6 it warns "Warning: specified num_layers_per_split (12) is not
  compatible with model. Overwriting with 2" and cuts [0, 2, 2, 2], Qwen3-4B's
  [0, 12, 12, 12] in small.
  intermediate_size 192, not 128: with 128 it equals the query width 4 x 32, and hexbundle's
  import (which sets aside weights as wide as the query projection when it looks for the MLP)
  stopped with "no MLP weight [hidden, intermediate] found in the graphs; cannot tell the
  intermediate size".  Qwen3-4B's are 9728 and 4096.
* No concrete tiny classes: the stock ``Qwen3_4B`` / ``Qwen3_4B_AIMETOnnx`` are used as they
  are.  qai-hub-models 0.55 ships a concrete quantizable Qwen3 (unlike Qwen2), and its
  from_pretrained with ``checkpoint="DEFAULT"`` is the generic LLM_AIMETOnnx path that
  export-2cl/ emulated for Qwen2 with its patch 9.  So patches 2-7 and 9 of make_export.py are
  not needed; instead (A), (B) and (C) below.
* The quantize and export steps run the model's own ``quantize`` and ``export`` modules as
  ``__main__`` with command-line arguments, not the library functions directly.
* The export name is ``qwen3_4b_w4a16`` (what the real Qwen3-4B export writes); the unsplit
  graph sits in ``ar<S>_cl256/Qwen3_4B_AIMETOnnx.aimet/model.{onnx,data,encodings}``.

Monkeypatches (all in this process; the installed package is not edited)
------------------------------------------------------------------------
1. Calibration text (make_export.py's patch 1): ``WikiText.load_raw_dataset`` returns text
   decoded from a few seeded random token sequences instead of downloading WikiText-2.
A. Shape constants of ``qai_hub_models.models.qwen3_4b.model``: NUM_LAYERS 36 -> 6,
   HIDDEN_SIZE 2560 -> 64, NUM_ATTN_HEADS 32 -> 4, NUM_KEY_VALUE_HEADS 8 -> 2.  The class reads
   them (module globals, at call time) in ``Qwen3_4B._verify_ckpt`` (which refuses any other
   checkpoint) and in ``get_output_names`` of both classes (36 layers of KV outputs otherwise).
   NUM_SPLITS and NUM_LAYERS_PER_SPLIT are left as shipped (4, 12).
B. The pre-quantized asset: ``CachedWebModelAsset`` in ``qwen3_4b.model`` is replaced by a stub
   whose ``fetch(extract=True)`` returns a local copy of the checkpoint that step 1's stock
   quantize wrote (``model_seqlen{128,1}_cl256.onnx``, ``model.data``, ``model.encodings``,
   config.json, tokenizer) instead of downloading ``qwen34_w4a16_adascale.zip``.  No file is
   renamed or edited: the generic path reads the checkpoint's own names.  And the default
   ``checkpoint`` of ``Qwen3_4B.from_pretrained`` (``Qwen/Qwen3-4B``; export_main builds the
   float model from it for a DEFAULT checkpoint) is the local tiny float checkpoint, set via
   ``__defaults__``, so the export name stays ``qwen3_4b_w4a16``.
C. Model info: ``export_model`` starts with ``QAIHMModelInfo.from_model("qwen3_4b")`` (for
   the display name), and in the 0.55.0 wheel that raises for qwen3_4b: pydantic
   "Value error, Model cannot be published: no release assets available".  Its info.yaml says
   ``status: published`` with ``llm_details.call_to_action: Download``, so
   ``can_promote_to_published`` requires ``models/qwen3_4b/release-assets.yaml``, which the
   wheel does not ship (its RECORD has no such file for any model; qwen2_5_7b_instruct passes
   because its call_to_action is "View Readme").  The check reads only local files, and
   ``QAIHMModelInfo.from_model("qwen3_4b")`` raises when called on its own in this venv, so the
   stock qwen3_4b export stops there as installed from PyPI.  We wrap ``QAIHMModelInfo.can_promote_to_published`` so that this one reason is not raised;
   every other check stays.
8. AI Hub stubs (make_export.py's ``patch_hub``, reused): ``hub.get_devices`` (one fake
   "Snapdragon 8 Elite QRD"), ``get_or_create_cached_model`` (no upload),
   ``hub.submit_compile_job`` and ``hub.submit_link_job`` (fake jobs).  The export runs with
   --skip-profiling --skip-downloading --skip-summary (inferencing is off by default).
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_export import (  # noqa: E402  (make_export.py's helpers; importing it runs nothing)
    CHAT_TEMPLATE, SPECIAL_TOKENS, TOKENIZER_VOCAB, patch_hub, random_text)
from llm_entry_points import (  # noqa: E402  (the steps the tiny 0.55 exports share)
    patch_asset_and_fp_default, patch_calibration_text, patch_class_constants, run_export,
    run_quantize, write_tokenizer)

MODULE = "qai_hub_models.models.qwen3_4b"
EXPORT_DIR = HERE / "export-qwen3"
WORK = Path(os.environ.get("QAIHM_QWEN3_WORK", "/tmp/qaihm_qwen3_work"))
# Under WORK: fp_checkpoint/ (random HF Qwen3 checkpoint + tokenizer), quantized_checkpoint/
# (output of qwen3_4b's own quantize), fake_asset/ (stands in for the qwen34_w4a16_adascale
# asset).

SEED = 1234
CONTEXT_LENGTH = 256
CALIB_SEQ_LEN = 128
EXPORT_SEQ_LENS = [128, 1]
NUM_CALIB_SAMPLES = 2
DEVICE = "Snapdragon 8 Elite QRD"

TINY_CONFIG = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attention_bias=False,
    use_sliding_window=False,
    bos_token_id=0,      # <|endoftext|>, as Qwen3's bos_token_id 151643
    eos_token_id=2,      # <|im_end|>, as Qwen3's eos_token_id 151645
)


# --------------------------------------------------------------------------
# Step 0: tiny random HF Qwen3 checkpoint + tiny tokenizer (ours, not Qualcomm's)
# --------------------------------------------------------------------------
def make_fp_checkpoint(ckpt_fp: Path, config: dict, seed: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    rng = random.Random(seed)
    ckpt_fp.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([random_text(rng, 50) for _ in range(400)], trainer)
    assert tok.get_vocab_size() <= config["vocab_size"]
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
    )
    hf_tok.save_pretrained(ckpt_fp)

    torch.manual_seed(seed)
    cfg = Qwen3Config(**config, torch_dtype="float32")
    cfg.architectures = ["Qwen3ForCausalLM"]
    model = Qwen3ForCausalLM(cfg).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight   # tied
    # HF init sets every RMSNorm weight (input/post-attention, q_norm, k_norm, final) to 1, and
    # torch.onnx.export would then de-duplicate identical initializers across layers.
    # Randomise them so each layer owns distinct tensors, as in a real checkpoint.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(ckpt_fp, safe_serialization=True)


# --------------------------------------------------------------------------
# Patches (1, A and B are llm_entry_points' patch_calibration_text, patch_class_constants and
# patch_asset_and_fp_default; 8 is make_export.py's patch_hub)
# --------------------------------------------------------------------------
def patch_model_info() -> None:
    """Patch C: the wheel ships no release-assets.yaml, which qwen3_4b's info.yaml validation
    requires; let that one reason pass."""
    from qai_hub_models.configs.info_yaml import QAIHMModelInfo

    orig = QAIHMModelInfo.can_promote_to_published

    def can_promote_to_published(self):
        ok, reason = orig(self)
        if not ok and reason == "no release assets available":
            return True, ""
        return ok, reason

    QAIHMModelInfo.can_promote_to_published = can_promote_to_published


def build(export_dir: Path, work: Path, config: dict, seed: int,
          model_config: Optional[Path] = None) -> None:
    """The whole recipe for one tiny Qwen3 of shape `config` and weights from `seed`
    (make_export_qwen3_kv16.py calls it with its own): float checkpoint, qwen3_4b's own quantize
    (step 1), its own export into `export_dir` (step 2), our tokenizer, and, when `model_config`
    is given, the float config.json copied there."""
    ckpt_fp, ckpt_q = work / "fp_checkpoint", work / "quantized_checkpoint"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    make_fp_checkpoint(ckpt_fp, config, seed)
    patch_class_constants(MODULE, config)
    patch_calibration_text(ckpt_fp, (), seed + 1, CONTEXT_LENGTH, NUM_CALIB_SAMPLES + 2)
    patch_hub()
    run_quantize(MODULE, ckpt_fp, ckpt_q, seed, CONTEXT_LENGTH, CALIB_SEQ_LEN, NUM_CALIB_SAMPLES)
    patch_asset_and_fp_default(MODULE, "Qwen3_4B", ckpt_fp, ckpt_q, work / "fake_asset")
    patch_model_info()
    run_export(MODULE, export_dir, work, CONTEXT_LENGTH, EXPORT_SEQ_LENS, DEVICE)
    write_tokenizer(ckpt_fp, export_dir)
    if model_config is not None:
        shutil.copyfile(ckpt_fp / "config.json", model_config)
    print("done:", export_dir)


def main() -> None:
    build(EXPORT_DIR, WORK, TINY_CONFIG, SEED)


if __name__ == "__main__":
    main()
