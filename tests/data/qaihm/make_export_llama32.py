#!/usr/bin/env python3
"""Regenerate tests/data/qaihm/export-llama32/ with Qualcomm's own qai-hub-models code (Llama 3.2).

What this produces
------------------
A tiny *random* Llama 3.2-like model (``LlamaForCausalLM``: 2 layers, hidden 64, 4 query heads x
head_dim 16, 2 KV heads, intermediate 192, vocab 1024, tied embeddings, no biases, rope_theta
500000 with Llama 3.2's "llama3" rope_scaling, factor 32), quantized with AIMET-ONNX by
qai-hub-models 0.55.0's own ``llama_v3_2_3b_instruct`` quantize entry point
(``python -m qai_hub_models.models.llama_v3_2_3b_instruct.quantize --checkpoint <fp dir> ...``,
i.e. ``_shared/llm/quantize.llm_quantize`` with ``Llama3_2_3B`` / ``Llama3_2_3B_AIMETOnnx``,
precision w4a16), then exported by the stock ``llama_v3_2_3b_instruct`` export entry point
(``python -m qai_hub_models.models.llama_v3_2_3b_instruct.export --checkpoint DEFAULT
--context-length 256 --sequence-length 128,1 --onnx-export-dir export-llama32/ ...``, i.e.
``_shared/llm/export.export_main`` -> ``export_model`` with ``Llama3_2_3B_AIMETOnnx``,
NUM_SPLITS 3, NUM_LAYERS_PER_SPLIT 14), all AI Hub network calls stubbed.  Both entry points
run as ``__main__`` (runpy) with their own argument parsers.  Everything under
export-llama32/ar*_cl*/ is written by qai-hub-models itself (the generic
``LLM_AIMETOnnx.convert_to_onnx_and_aimet_encodings`` copies the unsplit graph to
``Llama3_2_3B_AIMETOnnx.aimet/``, Qualcomm's ``split_onnx_utils`` writes the parts).  Ours:
export-llama32/tokenizer.json, and export-llama32/qaihm_genie_config.json, which is the output of
qai-hub-models' own ``create_genie_config`` for this model (see "Genie config" below).

Environment
-----------
Exactly the venv of make_export.py's docstring (/work/venvs/qaihm: Python 3.10.13,
qai-hub-models 0.55.0 --no-deps, torch 2.4.1, aimet-onnx 2.26.0, transformers 4.45.0,
tokenizers 0.20.3, onnx 1.18.0, onnxruntime 1.22.0, numpy 1.26.4, qai_hub 0.49.0), with no
additions: llama_v3_2_3b_instruct/requirements.txt pins transformers==4.45.0 itself.  (It also
lists sentencepiece and onnxsim, which this path does not import.)

Run (CPU only, about 10 s on 2 cores, no network needed; re-running gives byte-identical files):
    /work/venvs/qaihm/bin/python tests/data/qaihm/make_export_llama32.py
It wipes and rewrites tests/data/qaihm/export-llama32/.  Scratch files go to
$QAIHM_LLAMA32_WORK (default /tmp/qaihm_llama32_work).

The model
---------
* 2 layers: the smallest count the stock split can cut.  llama_v3_2_3b_instruct splits into
  NUM_SPLITS 3 with the embedding on its own (export_model passes split_embedding=True;
  split_lm_head is False), i.e. 2 groups of decoder layers.  With 1 layer Qualcomm's
  ``split_onnx`` finds ceil(1/2) = 1 layer per group and no cut point after the embedding's
  ("Expected 2 split points for 3 splits, but got 1").  With 2 it warns "Warning: specified
  num_layers_per_split (14) is not compatible with model. Overwriting with 1" and cuts
  [0, 1, 1], Llama-3.2-3B's [0, 14, 14] in small.  (A layer count with no warning would need
  ceil(L/14) == 2, i.e. L >= 15.)
* intermediate 192 (3 x hidden), unequal to the query width 4 x 16 = 64, as in Llama-3.2-3B
  (8192 vs 3072).  head_dim 16 = hidden / heads, as Llama-3.2-3B's 128 = 3072 / 24.
* Tokenizer (ours): a byte-level BPE with Llama 3's pre-tokenizer regex, trained on
  make_export.py's ``random_text``: 507 regular tokens (ids 0-506), then Llama 3's special
  tokens appended after them as Llama 3 appends its own after 128000 regular ones:
  <|begin_of_text|> 507, <|end_of_text|> 508, <|start_header_id|> 509, <|end_header_id|> 510,
  <|eot_id|> 511 (512 = make_export.py's TOKENIZER_VOCAB; the model's vocab is 1024, as
  Llama's 128256 exceeds its tokenizer's regular tokens).  Its post-processor prepends
  <|begin_of_text|> (Llama 3's TemplateProcessing); tokenizer_config: bos <|begin_of_text|>,
  eos <|eot_id|>, Meta-Llama-3-Instruct's chat template.  config.json: bos_token_id 507,
  eos_token_id [508, 511] (Llama-3.2-3B-Instruct: [128001, 128008, 128009], i.e.
  <|end_of_text|>, <|eom_id|>, <|eot_id|>; <|eom_id|> is not carried here).
* Random weights, seed 1234; every RMSNorm weight randomised (1 + 0.1 N(0,1)) so that
  torch.onnx.export keeps one tensor per layer.

Monkeypatches (all in this process; the installed package is not edited)
------------------------------------------------------------------------
The labels follow make_export.py (1, 8) and make_export_qwen3.py (A, B); D is new here.
1. Calibration text (make_export.py's patch 1): ``WikiText.load_raw_dataset`` returns text
   decoded from a few seeded random token sequences instead of downloading WikiText-2.
A. Shape constants of ``qai_hub_models.models.llama_v3_2_3b_instruct.model``: NUM_LAYERS
   28 -> 2, HIDDEN_SIZE 3072 -> 64, NUM_ATTN_HEADS 24 -> 4, NUM_KEY_VALUE_HEADS 8 -> 2.  The
   classes read them (module globals, at call time) in ``Llama3_2_3B._verify_ckpt``, which
   refuses any other checkpoint ("ValueError: Model config is not compatible with our
   implementation."), and in ``get_output_names`` of both classes (28 layers of KV outputs
   otherwise).  NUM_SPLITS and NUM_LAYERS_PER_SPLIT are left as shipped (3, 14).
D. CPU quantization: ``llama_v3_2_3b_instruct/quantize.py`` calls ``llm_quantize`` without
   ``allow_cpu_to_quantize=True`` (qwen3_4b's quantize.py passes it), so on a machine without
   CUDA the stock quantize stops at once with "ValueError: This model requires a CUDA GPU
   (V100/A100) on it to do quantization. Please re-try with GPU machine."  We wrap
   ``_shared.llm.quantize.llm_quantize`` (looked up by quantize.py when runpy executes it) so
   that it passes ``allow_cpu_to_quantize=True``; the argument parser and everything else are
   stock.  SeqMSE / AdaScale stay off (they would still need CUDA).
B. The pre-quantized asset: ``CachedWebModelAsset`` in ``llama_v3_2_3b_instruct.model`` is
   replaced by a stub whose ``fetch(extract=True)`` returns a local copy of the checkpoint that
   step 1's stock quantize wrote (``model_seqlen{128,1}_cl256.onnx``, ``model.data``,
   ``model.encodings``, config.json, tokenizer) instead of downloading
   ``llama32_ckpt_w4a16.zip`` (asset version 5).  No file is renamed or edited.  And the
   default ``checkpoint`` of ``Llama3_2_3B.from_pretrained`` (``meta-llama/Llama-3.2-3B-Instruct``;
   export_main builds the float model from it for a DEFAULT checkpoint) is the local tiny float
   checkpoint, set via ``__defaults__``, so the export name stays ``llama_v3_2_3b_instruct_w4a16``.
8. AI Hub stubs (make_export.py's ``patch_hub``, reused): ``hub.get_devices`` (one fake
   "Snapdragon 8 Elite QRD"), ``get_or_create_cached_model`` (no upload),
   ``hub.submit_compile_job`` and ``hub.submit_link_job`` (fake jobs).  The export runs with
   --skip-profiling --skip-downloading --skip-summary (inferencing is off by default).
Not needed: make_export_qwen3.py's patch C (model info).  ``QAIHMModelInfo.from_model(
"llama_v3_2_3b_instruct")`` validates: its info.yaml has ``call_to_action: View Readme``, which
does not require the release-assets.yaml the wheel lacks.  Patches 2-7 and 9 of make_export.py
do not apply (0.55 ships the concrete quantizable Llama 3.2 classes).

Genie config
------------
``--skip-downloading`` skips ``prepare_genie_assets``, the step that writes genie_config.json.
``write_qaihm_genie_config`` calls what it calls, offline: the stock
``qai_hub_models.utils.llm_helpers.create_genie_config(256, llm_config, "rope", model_list)``
with the float checkpoint's config and export_model's binary names
``llama_v3_2_3b_instruct_w4a16_part_{1,2,3}_of_3.bin``, and dumps it with ``indent=4`` as
prepare_genie_assets does, to export-llama32/qaihm_genie_config.json.  Note what it writes:
``positional-encoding`` {type rope, rope-dim 8, rope-theta 500000, rope-scaling {rope-type
llama3, factor **8.0**, low-freq-factor 1.0, high-freq-factor 4.0,
original-max-position-embeddings 8192}}: create_genie_config hard-codes factor 8.0 (Llama 3.1's)
and ignores config.json's 32.0, while the cos/sin that qai-hub-models computes on the host for
calibration (``RopeEmbedding``, transformers' llama3 rope with this config) use 32.0.  Qualcomm's
own test for llama_v3_2_3b_instruct expects the 8.0.
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

MODULE = "qai_hub_models.models.llama_v3_2_3b_instruct"
EXPORT_DIR = HERE / "export-llama32"
# The float model's config.json, beside the tree (the export does not write one): what a user
# gives `doit import_export --model-config`, as they would the Hugging Face repo's.
MODEL_CONFIG = HERE / "config-llama32.json"
WORK = Path(os.environ.get("QAIHM_LLAMA32_WORK", "/tmp/qaihm_llama32_work"))
# Under WORK: fp_checkpoint/ (random HF Llama checkpoint + tokenizer), quantized_checkpoint/
# (output of llama_v3_2_3b_instruct's own quantize), fake_asset/ (stands in for the
# llama32_ckpt_w4a16 asset).

SEED = 1234
CONTEXT_LENGTH = 256
CALIB_SEQ_LEN = 128
EXPORT_SEQ_LENS = [128, 1]
NUM_CALIB_SAMPLES = 2
DEVICE = "Snapdragon 8 Elite QRD"

# Llama 3's special tokens, appended after the regular byte-level BPE tokens (as Llama 3 puts
# its 256 special tokens after the 128000 regular ones), in Llama 3's relative order.
LLAMA3_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
NUM_REGULAR_TOKENS = TOKENIZER_VOCAB - len(LLAMA3_SPECIAL_TOKENS)   # 507: ids 0..506
SPECIAL_ID = {t: NUM_REGULAR_TOKENS + i for i, t in enumerate(LLAMA3_SPECIAL_TOKENS)}

# Llama 3's pre-tokenizer regex (Meta-Llama-3 / Llama-3.2 tokenizer.json).
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Meta-Llama-3-8B-Instruct's chat template (Llama 3.2's adds date/tool preambles to the same
# header / eot framing).
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

TINY_CONFIG = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    hidden_act="silu",
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=SPECIAL_ID["<|begin_of_text|>"],
    # Llama-3.2-3B-Instruct: [<|end_of_text|>, <|eom_id|>, <|eot_id|>]; no <|eom_id|> here.
    eos_token_id=[SPECIAL_ID["<|end_of_text|>"], SPECIAL_ID["<|eot_id|>"]],
)


# --------------------------------------------------------------------------
# Step 0: tiny random HF Llama checkpoint + tiny tokenizer (ours, not Qualcomm's)
# --------------------------------------------------------------------------
def make_tokenizer(seed: int = SEED):
    from tokenizers import (Regex, Tokenizer, decoders, models, pre_tokenizers, processors,
                            trainers)

    rng = random.Random(seed)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=NUM_REGULAR_TOKENS,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([random_text(rng, 50) for _ in range(400)], trainer)
    assert tok.get_vocab_size() == NUM_REGULAR_TOKENS, tok.get_vocab_size()
    tok.add_special_tokens(LLAMA3_SPECIAL_TOKENS)
    for t, i in SPECIAL_ID.items():
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    assert tok.get_vocab_size() == TOKENIZER_VOCAB <= TINY_CONFIG["vocab_size"]
    # As Llama 3's tokenizer.json: byte-level offsets, then <|begin_of_text|> prepended.
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, SPECIAL_ID[bos])]),
    ])
    return tok


def make_fp_checkpoint(ckpt_fp: Path, config: dict, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    ckpt_fp.mkdir(parents=True, exist_ok=True)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=make_tokenizer(seed),
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",           # Llama-3.2-3B-Instruct's tokenizer_config
        chat_template=CHAT_TEMPLATE,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=True,
    )
    hf_tok.save_pretrained(ckpt_fp)

    torch.manual_seed(seed)
    cfg = LlamaConfig(**config, torch_dtype="float32")
    cfg.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(cfg).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight   # tied
    # HF init sets every RMSNorm weight to 1, and torch.onnx.export would then de-duplicate
    # identical initializers across layers.  Randomise them so each layer owns distinct
    # tensors, as in a real checkpoint.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(ckpt_fp, safe_serialization=True)


def build(export_dir: Path, model_config: Path, work: Path, config: dict, seed: int) -> None:
    """The whole recipe for one tiny Llama 3.2 of shape `config` and weights from `seed`
    (make_export_llama32_deep.py calls it with its own): float checkpoint, the model's own
    quantize, its own export into `export_dir`, our tokenizer, Qualcomm's genie config, and the
    float config.json copied to `model_config`."""
    ckpt_fp, ckpt_q = work / "fp_checkpoint", work / "quantized_checkpoint"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    make_fp_checkpoint(ckpt_fp, config, seed)
    patch_class_constants(MODULE, config)
    patch_calibration_text(ckpt_fp, SPECIAL_ID.values(), seed + 1, CONTEXT_LENGTH,
                           NUM_CALIB_SAMPLES + 2)
    patch_hub()
    patch_cpu_quantize()
    run_quantize(MODULE, ckpt_fp, ckpt_q, seed, CONTEXT_LENGTH, CALIB_SEQ_LEN, NUM_CALIB_SAMPLES)
    patch_asset_and_fp_default(MODULE, "Llama3_2_3B", ckpt_fp, ckpt_q, work / "fake_asset")
    run_export(MODULE, export_dir, work, CONTEXT_LENGTH, EXPORT_SEQ_LENS, DEVICE)
    write_tokenizer(ckpt_fp, export_dir)
    write_qaihm_genie_config(MODULE, ckpt_fp, export_dir, CONTEXT_LENGTH, EXPORT_SEQ_LENS)
    shutil.copyfile(ckpt_fp / "config.json", model_config)
    print("done:", export_dir)


def main() -> None:
    build(EXPORT_DIR, MODEL_CONFIG, WORK, TINY_CONFIG, SEED)


if __name__ == "__main__":
    main()
