#!/usr/bin/env python3
"""Regenerate tests/data/qaihm/export-falcon3/ with Qualcomm's own qai-hub-models code (Falcon3).

What this produces
------------------
A tiny *random* Falcon3-7B-like model (``LlamaForCausalLM``, as Falcon3 is: 4 layers, hidden 64,
4 query heads x head_dim 16, 2 KV heads, intermediate 192, vocab 1024, untied LM head, no
biases, rope_theta 1000042 with no rope_scaling, rms_norm_eps 1e-6), quantized with AIMET-ONNX by
qai-hub-models 0.55.0's own ``falcon_v3_7b_instruct`` quantize entry point
(``python -m qai_hub_models.models.falcon_v3_7b_instruct.quantize --checkpoint <fp dir> ...``,
i.e. ``_shared/llm/quantize.llm_quantize`` with ``Falcon3_7B`` / ``Falcon3_7B_AIMETOnnx``,
precision w4a16), then exported by the stock ``falcon_v3_7b_instruct`` export entry point
(``python -m qai_hub_models.models.falcon_v3_7b_instruct.export --checkpoint DEFAULT
--context-length 256 --sequence-length 128,1 --onnx-export-dir export-falcon3/ ...``, i.e.
``_shared/llm/export.export_main`` -> ``export_model`` with ``Falcon3_7B_AIMETOnnx``,
NUM_SPLITS 5, NUM_LAYERS_PER_SPLIT 8), all AI Hub network calls stubbed.  Both entry points run
as ``__main__`` (runpy) with their own argument parsers.  Everything under
export-falcon3/ar*_cl*/ is written by qai-hub-models itself (the generic
``LLM_AIMETOnnx.convert_to_onnx_and_aimet_encodings`` copies the unsplit graph to
``Falcon3_7B_AIMETOnnx.aimet/``, Qualcomm's ``split_onnx_utils`` writes the parts).  Ours:
export-falcon3/tokenizer.json, and export-falcon3/qaihm_genie_config.json, the output of
qai-hub-models' own ``create_genie_config`` for this model (as make_export_llama32.py does).
The float checkpoint's config.json is copied to tests/data/qaihm/config-falcon3.json.

Why Falcon3 and not Mistral
---------------------------
No qai-hub-models release on PyPI has a quantizable/exportable ``mistral_7b_instruct_v0_3``.
In every release checked (all 22 from 0.51.0 to 0.65.0, and 0.30.7, 0.31.0, 0.32.0, 0.33.1,
0.34.1, 0.35.0, 0.36.0, 0.37.0, 0.37.1, 0.38.0, 0.39.1, 0.40.0, 0.45.0, 0.48.0, 0.49.1, 0.50.2)
``models/mistral_7b_instruct_v0_3/`` holds only ``model.py`` (a
``PrecompiledCollectionModel`` / ``PrecompiledWorkbenchModelCollection`` of 8 prebuilt QNN
context binaries fetched from ``snapdragon_8_elite/models.zip``), ``export.py`` and metadata:
no ``quantize.py``, no ``*_AIMETOnnx`` class, no ONNX anywhere.  Its export has no
``--onnx-export-dir``: in 0.55.0, ``python -m qai_hub_models.models.mistral_7b_instruct_v0_3.export
--onnx-export-dir X`` stops with "export.py: error: unrecognized arguments: --onnx-export-dir X",
and ``python -m qai_hub_models.models.mistral_7b_instruct_v0_3.quantize`` with "No module named
qai_hub_models.models.mistral_7b_instruct_v0_3.quantize".  (In 0.65.0 its ``export.py`` only
prints "Please use `qai-hub-models export mistral_7b_instruct_v0_3`" and exits 1; the model is
still precompiled, info ``is_precompiled: true``, ``call_to_action: Contact Us``.)

``falcon_v3_7b_instruct`` has the quantizable class (``Falcon3_7B_AIMETOnnx``, with
``quantize.py``) from 0.37.0 on (0.36.0 has no falcon_v3_7b_instruct); 0.55.0 has it, so the
0.55.0 of the other exports (and its venv, unchanged) is used.

Environment
-----------
Exactly the venv of make_export.py's docstring (/work/venvs/qaihm: Python 3.10.13,
qai-hub-models 0.55.0 --no-deps, torch 2.4.1, aimet-onnx 2.26.0, transformers 4.45.0,
tokenizers 0.20.3, onnx 1.18.0, onnxruntime 1.22.0, numpy 1.26.4, qai_hub 0.49.0), with no
additions: falcon_v3_7b_instruct/requirements.txt pins exactly aimet-onnx==2.26.0,
transformers==4.45.0, onnx==1.18.0, torch==2.4.1, torchvision==0.19.1, onnxruntime==1.22 and
psutil==6.1.1 (it also lists sentencepiece==0.2.1 and onnxsim==0.5.0, which this path does not
import).

Run (CPU only, about 8 s on 2 cores, no network needed; re-running gives byte-identical files):
    /work/venvs/qaihm/bin/python tests/data/qaihm/make_export_falcon3.py
It wipes and rewrites tests/data/qaihm/export-falcon3/ and config-falcon3.json.  Scratch files go
to $QAIHM_FALCON3_WORK (default /tmp/qaihm_falcon3_work).

The model
---------
* Falcon3-7B-Instruct is a ``LlamaForCausalLM`` (model_type llama): 28 layers, hidden 3072,
  12 heads x head_dim 256, 4 KV heads, intermediate 23040, vocab 131072, rope_theta 1000042,
  rms_norm_eps 1e-6, untied, bos = eos = 11 (``<|endoftext|>``; Qualcomm's own
  falcon_v3_7b_instruct/test.py::test_create_genie_config expects n-vocab 131072, bos-token 11,
  eos-token 11, kv-dim 256, rope-theta 1000042 for it).  Here: head_dim 16 = hidden / heads, as
  Falcon3-7B's 256 = 3072 / 12; intermediate 192 (3 x hidden), unequal to the query width 64,
  as 23040 vs 3072.
* 4 layers: the smallest count the stock split can cut.  falcon_v3_7b_instruct splits into
  NUM_SPLITS 5 with the embedding on its own (export_model passes split_embedding=True;
  split_lm_head is False), i.e. 4 groups of decoder layers.  Qualcomm's ``split_onnx`` uses
  ceil(L / 4) layers per group; with 3 layers that is 1, and the embedding's cut plus 2 layer
  cuts make 3 (tried: "ValueError: Expected 4 split points for 5 splits, but got 3. Check
  num_splits, num_layers_per_split, split_embedding=True, split_lm_head=False.").  With 4 it
  warns "Warning: specified num_layers_per_split (8) is not compatible with model. Overwriting
  with 1" and cuts [0, 1, 1, 1, 1], Falcon3-7B's [0, 7, 7, 7, 7] in small.  (A layer count with
  no warning would need ceil(L/8) == 4, i.e. L >= 25.)
* Tokenizer (ours): a 512-token byte-level BPE (GPT-2 pre-tokenizer regex, as Falcon3's
  byte-level BPE), trained on make_export.py's ``random_text``.  Falcon3's first 12 special
  tokens keep their Falcon3 ids: >>TITLE<< 0, >>ABSTRACT<< 1, >>INTRODUCTION<< 2, >>SUMMARY<< 3,
  >>COMMENT<< 4, >>ANSWER<< 5, >>QUESTION<< 6, >>DOMAIN<< 7, >>EMAIL_ADDRESS<< 8,
  >>IP_ADDRESS<< 9, <|startoftext|> 10, <|endoftext|> 11; regular tokens are ids 12-511.
  Falcon3's further special tokens (>>IP_ADDRESS_0<< ... >>KEY<< at 14-25, the >>UNUSED_...<<
  block, <|pad|> 2023) are not carried: their ids would fall among the regular tokens or
  beyond the tokenizer.  No post-processor (Falcon3 adds no bos when encoding).
  tokenizer_config (not shipped): eos ``<|endoftext|>`` and Falcon3-Instruct's
  ``<|system|>`` / ``<|user|>`` / ``<|assistant|>`` chat framing (without its tools branch);
  the role markers are plain text here.  config.json: bos_token_id = eos_token_id = 11.
* Random weights, seed 1234; every RMSNorm weight randomised (1 + 0.1 N(0,1)) so that
  torch.onnx.export keeps one tensor per layer.

Monkeypatches (all in this process; the installed package is not edited)
------------------------------------------------------------------------
The labels follow make_export.py (1, 8), make_export_qwen3.py (A, B) and make_export_llama32.py
(D); they are the same patches as make_export_llama32.py's, on the falcon module.
1. Calibration text (make_export.py's patch 1): ``WikiText.load_raw_dataset`` returns text
   decoded from a few seeded random token sequences instead of downloading WikiText-2.
   Without it the quantize stops offline with "ConnectionError: Couldn't reach 'wikitext' on
   the Hub (LocalEntryNotFoundError)".
A. Shape constants of ``qai_hub_models.models.falcon_v3_7b_instruct.model``: NUM_LAYERS
   28 -> 4, HIDDEN_SIZE 3072 -> 64, NUM_ATTN_HEADS 12 -> 4, NUM_KEY_VALUE_HEADS 4 -> 2.  The
   classes read them (module globals, at call time) in ``Falcon3_7B._verify_ckpt``, which
   refuses any other checkpoint ("ValueError: Model config is not compatible with our
   implementation."), and in ``get_output_names`` of the classes (28 layers of KV outputs
   otherwise).  NUM_SPLITS and NUM_LAYERS_PER_SPLIT are left as shipped (5, 8).
D. CPU quantization: ``falcon_v3_7b_instruct/quantize.py`` calls ``llm_quantize`` without
   ``allow_cpu_to_quantize=True``, so on a machine without CUDA the stock quantize stops at once
   with "ValueError: This model requires a CUDA GPU (V100/A100) on it to do quantization.
   Please re-try with GPU machine."  We wrap ``_shared.llm.quantize.llm_quantize`` (looked up
   by quantize.py when runpy executes it) so that it passes ``allow_cpu_to_quantize=True``; the
   argument parser and everything else are stock.  SeqMSE / AdaScale stay off (they would still
   need CUDA; the real asset is ``..._w4a16_seqmse``).
B. The pre-quantized asset: ``CachedWebModelAsset`` in ``falcon_v3_7b_instruct.model`` is
   replaced by a stub whose ``fetch(extract=True)`` returns a local copy of the checkpoint that
   step 1's stock quantize wrote (``model_seqlen{128,1}_cl256.onnx``, ``model.data``,
   ``model.encodings``, config.json, tokenizer) instead of downloading
   ``falcon_v3_7b_instruct_ckpt_w4a16_seqmse.zip`` (asset version 5).  No file is renamed or
   edited.  And the default ``checkpoint`` of ``Falcon3_7B.from_pretrained``
   (``tiiuae/Falcon3-7B-Instruct``; export_main builds the float model from it for a DEFAULT
   checkpoint) is the local tiny float checkpoint, set via ``__defaults__``, so the export name
   stays ``falcon_v3_7b_instruct_w4a16``.  Without the default, the export stops offline at the
   float model: "OSError: We couldn't connect to 'https://huggingface.co' to load this file,
   couldn't find it in the cached files and it looks like tiiuae/Falcon3-7B-Instruct is not the
   path to a directory containing a file named config.json."; with it but without the asset
   stub, at the asset: "requests.exceptions.ConnectionError: HTTPSConnectionPool(host=
   'qaihub-public-assets.s3.us-west-2.amazonaws.com', port=443): Max retries exceeded with url:
   /qai-hub-models/models/falcon_v3_7b_instruct/v5/falcon_v3_7b_instruct_ckpt_w4a16_seqmse.zip".
8. AI Hub stubs (make_export.py's ``patch_hub``, reused): ``hub.get_devices`` (one fake
   "Snapdragon 8 Elite QRD"), ``get_or_create_cached_model`` (no upload),
   ``hub.submit_compile_job`` and ``hub.submit_link_job`` (fake jobs).  The export runs with
   --skip-profiling --skip-downloading --skip-summary (inferencing is off by default).
   Without them: "qai_hub.client.UserError: Failed to load client configuration file."
   (/root/.qai_hub/client.ini not found).
Not needed: make_export_qwen3.py's patch C (model info).  ``falcon_v3_7b_instruct``'s info.yaml
has ``call_to_action: View Readme``, so ``QAIHMModelInfo.from_model`` validates without a
release-assets.yaml.  Patches 2-7 and 9 of make_export.py do not apply.

Genie config
------------
As make_export_llama32.py: ``--skip-downloading`` skips ``prepare_genie_assets``, the step that
writes genie_config.json, so ``write_qaihm_genie_config`` makes its call offline:
``create_genie_config(256, llm_config, "rope", model_list)`` with the float checkpoint's config
and the binary names ``falcon_v3_7b_instruct_w4a16_part_{1..5}_of_5.bin``, dumped with
``indent=4`` to export-falcon3/qaihm_genie_config.json.  With no rope_scaling, ``pos-id-dim``
and ``rope-theta`` sit in the QnnHtp block, as in Qualcomm's test for the real model.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_export import (  # noqa: E402  (make_export.py's helpers; importing it runs nothing)
    TOKENIZER_VOCAB, patch_hub, random_text)
from llm_entry_points import (  # noqa: E402  (the steps both tiny exports share)
    patch_asset_and_fp_default, patch_calibration_text, patch_class_constants,
    patch_cpu_quantize, run_export, run_quantize, write_qaihm_genie_config, write_tokenizer)

MODULE = "qai_hub_models.models.falcon_v3_7b_instruct"
EXPORT_DIR = HERE / "export-falcon3"
# The float model's config.json, beside the tree (the export does not write one): what a user
# gives `doit import_export --model-config`, as they would the Hugging Face repo's.
MODEL_CONFIG = HERE / "config-falcon3.json"
WORK = Path(os.environ.get("QAIHM_FALCON3_WORK", "/tmp/qaihm_falcon3_work"))
CKPT_FP = WORK / "fp_checkpoint"          # random HF Llama (Falcon3) checkpoint + tokenizer
CKPT_Q = WORK / "quantized_checkpoint"    # output of falcon_v3_7b_instruct's own quantize
ASSET_DIR = WORK / "fake_asset"           # stands in for the falcon3 w4a16 asset

SEED = 1234
CONTEXT_LENGTH = 256
CALIB_SEQ_LEN = 128
EXPORT_SEQ_LENS = [128, 1]
NUM_CALIB_SAMPLES = 2
DEVICE = "Snapdragon 8 Elite QRD"

# Falcon3's first special tokens, at their Falcon3 ids 0-11.
FALCON3_SPECIAL_TOKENS = [
    ">>TITLE<<",
    ">>ABSTRACT<<",
    ">>INTRODUCTION<<",
    ">>SUMMARY<<",
    ">>COMMENT<<",
    ">>ANSWER<<",
    ">>QUESTION<<",
    ">>DOMAIN<<",
    ">>EMAIL_ADDRESS<<",
    ">>IP_ADDRESS<<",
    "<|startoftext|>",
    "<|endoftext|>",
]
SPECIAL_ID = {t: i for i, t in enumerate(FALCON3_SPECIAL_TOKENS)}
ENDOFTEXT = "<|endoftext|>"

# Falcon3-Instruct's chat framing (its template's branch without tools).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

TINY_CONFIG = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    hidden_act="silu",
    max_position_embeddings=32768,
    rope_theta=1000042.0,
    rope_scaling=None,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=SPECIAL_ID[ENDOFTEXT],   # Falcon3-7B-Instruct: 11
    eos_token_id=SPECIAL_ID[ENDOFTEXT],   # Falcon3-7B-Instruct: 11
)


# --------------------------------------------------------------------------
# Step 0: tiny random HF Llama (Falcon3) checkpoint + tiny tokenizer (ours, not Qualcomm's)
# --------------------------------------------------------------------------
def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(SEED)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=FALCON3_SPECIAL_TOKENS,     # ids 0-11, in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([random_text(rng, 50) for _ in range(400)], trainer)
    for t, i in SPECIAL_ID.items():
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    assert tok.get_vocab_size() == TOKENIZER_VOCAB <= TINY_CONFIG["vocab_size"]
    return tok


def make_fp_checkpoint() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    CKPT_FP.mkdir(parents=True, exist_ok=True)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=make_tokenizer(),
        eos_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=True,
    )
    hf_tok.save_pretrained(CKPT_FP)

    torch.manual_seed(SEED)
    cfg = LlamaConfig(**TINY_CONFIG, torch_dtype="float32")
    cfg.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(cfg).eval()
    assert model.lm_head.weight is not model.model.embed_tokens.weight   # untied
    # HF init sets every RMSNorm weight to 1, and torch.onnx.export would then de-duplicate
    # identical initializers across layers.  Randomise them so each layer owns distinct
    # tensors, as in a real checkpoint.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(CKPT_FP, safe_serialization=True)


def main() -> None:
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    make_fp_checkpoint()
    patch_class_constants(MODULE, TINY_CONFIG)
    patch_calibration_text(CKPT_FP, SPECIAL_ID.values(), SEED + 1, CONTEXT_LENGTH,
                           NUM_CALIB_SAMPLES + 2)
    patch_hub()
    patch_cpu_quantize()
    run_quantize(MODULE, CKPT_FP, CKPT_Q, SEED, CONTEXT_LENGTH, CALIB_SEQ_LEN, NUM_CALIB_SAMPLES)
    patch_asset_and_fp_default(MODULE, "Falcon3_7B", CKPT_FP, CKPT_Q, ASSET_DIR)
    run_export(MODULE, EXPORT_DIR, WORK, CONTEXT_LENGTH, EXPORT_SEQ_LENS, DEVICE)
    write_tokenizer(CKPT_FP, EXPORT_DIR)
    write_qaihm_genie_config(MODULE, CKPT_FP, EXPORT_DIR, CONTEXT_LENGTH, EXPORT_SEQ_LENS)
    shutil.copyfile(CKPT_FP / "config.json", MODEL_CONFIG)
    print("done:", EXPORT_DIR)


if __name__ == "__main__":
    main()
