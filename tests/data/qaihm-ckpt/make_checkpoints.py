"""Make tiny random-weight qai-hub-models quantize checkpoints with Qualcomm's own code.

Each checkpoint is what `python -m qai_hub_models.models.<model>.quantize --checkpoint HF_DIR
--output-dir OUT --precision RECIPE.yaml` writes, run in-process by this script after three
patches that a tiny CPU-only, offline run needs (nothing in Qualcomm's export or AIMET is
changed):
  1. the model module's shape constants (NUM_LAYERS, HIDDEN_SIZE, heads, KV heads, HEAD_DIM,
     NUM_LAYERS_PER_SPLIT) are set, in the module and on every class that copied them,
     because the classes' `_verify_ckpt` accepts only the stock shape; NUM_SPLITS is left as
     the module has it (it is the per-model constant the importer must reproduce);
  2. `WikiText.load_raw_dataset` returns local text (no hub at run time);
  3. the recipe is a file with the manifest's precision block and one `Calibration` step
     (the manifests start with AdaScale or SeqMSE, which raise without CUDA); 0.59.1's CLI
     has no recipes and gets `--precision w4a16 --num-samples 2` instead.
The source HF folder (config.json, random safetensors, a small byte-level BPE tokenizer with
the family's special tokens and chat template) is built here from a seed.

Environments (Python 3.10.13 from pyenv; every package from PyPI):
  0.65.0 (venv /work/venvs/qaihm065):
    /root/.pyenv/versions/3.10.13/bin/python -m venv /work/venvs/qaihm065
    /work/venvs/qaihm065/bin/pip install qai-hub-models==0.65.0 aimet-onnx==2.35.0 \
        torch==2.10.0 torchvision==0.25.0 transformers==4.51.0 accelerate==1.12.0 \
        onnx==1.18.0 onnxscript==0.7.0 onnx-ir==0.2.1 onnxruntime==1.22.0 \
        sentencepiece==0.2.1 psutil==6.1.1
  0.59.1 (venv /work/venvs/qaihm057):
    /root/.pyenv/versions/3.10.13/bin/python -m venv /work/venvs/qaihm057
    /work/venvs/qaihm057/bin/pip install qai-hub-models==0.59.1 aimet-onnx==2.26.0 \
        torch==2.10.0 torchvision==0.25.0 transformers==4.51.0 accelerate==1.12.0 \
        onnx==1.18.0 onnxscript==0.7.0 onnx-ir==0.2.1 onnxruntime==1.22.0 \
        sentencepiece==0.2.1 psutil==6.1.1
  0.64.0 (venv /work/venvs/qaihm064; issue 46's checkpoints): the 0.65.0 line with
    qai-hub-models==0.64.0 aimet-onnx==2.28.0 (0.64.0's own aimet-onnx pin); `pip freeze` in
    freeze-qaihm064.txt (identical to freeze-qaihm065.txt but for those two and the CLI).
    The 0.65.0 venv for split_expected.py was remade (issue 46) as a copy of that venv plus
    `python -m pip install qai-hub-models==0.65.0 qai_hub_models_cli==0.65.0 aimet-onnx==2.35.0`.
  torch 2.10.0 on PyPI for linux x86_64 is the CUDA build (a 915 MB wheel plus ~3 GB of
  nvidia-* wheels); PyPI has no CPU-only build in qai-hub-models' range (>=2.9, <=2.11), so
  that is what is installed; it runs on CPU here.

Run (rerunnable; each checkpoint in its own process because the model classes cache):
  /work/venvs/qaihm065/bin/python make_checkpoints.py qwen3 llama3_2 falcon3 smollm2
  /work/venvs/qaihm057/bin/python make_checkpoints.py qwen3_old
  /work/venvs/qaihm064/bin/python make_checkpoints.py qwen3_8b falcon3_pad llama3_2_6l smollm2_pad
then split_expected.py (0.65's split code) on each folder.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# One entry per checkpoint: the qai-hub-models module, the release that must run it, the HF
# config of the tiny source model and its tokenizer's special tokens / chat template.
# Shapes are chosen unlike each other (layers, hidden, head_dim, heads, KV heads, vocab).
SPECS: dict[str, dict] = {
    "qwen3": {
        "folder": "qwen3_4b-0.65.0",
        "module": "qwen3_4b",
        "release": "0.65.0",
        "seed": 3501,
        "context_length": 4096,
        "config": {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": 512,
            "hidden_size": 96,
            "intermediate_size": 160,
            "num_hidden_layers": 7,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            # explicit head_dim unlike hidden/heads (24), as Qwen3-4B (128 vs 80)
            "head_dim": 32,
            "max_position_embeddings": 40960,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "qwen",
    },
    "llama3_2": {
        "folder": "llama_v3_2_1b_instruct-0.65.0",
        "module": "llama_v3_2_1b_instruct",
        "release": "0.65.0",
        "seed": 3502,
        "context_length": 1024,
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 384,
            "hidden_size": 128,
            "intermediate_size": 320,
            "num_hidden_layers": 9,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 131072,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "llama3",
    },
    "falcon3": {
        "folder": "falcon_v3_7b_instruct-0.65.0",
        "module": "falcon_v3_7b_instruct",
        "release": "0.65.0",
        "seed": 3503,
        "context_length": 1024,
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 448,
            "hidden_size": 160,
            "intermediate_size": 384,
            "num_hidden_layers": 10,
            "num_attention_heads": 5,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "max_position_embeddings": 32768,
            "rope_theta": 1000042.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "falcon3",
    },
    "smollm2": {
        "folder": "smollm2_1_7b_it-0.65.0",
        "module": "smollm2_1_7b_it",
        "release": "0.65.0",
        "seed": 3504,
        "context_length": 1024,
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 320,
            "hidden_size": 64,
            "intermediate_size": 176,
            "num_hidden_layers": 11,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 16,
            "max_position_embeddings": 8192,
            "rope_theta": 130000.0,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "smollm2",
    },
    "qwen3_old": {
        "folder": "qwen3_4b-0.59.1",
        "module": "qwen3_4b",
        "release": "0.59.1",
        "seed": 3505,
        "context_length": 4096,
        "config": {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": 416,
            "hidden_size": 80,
            "intermediate_size": 224,
            "num_hidden_layers": 5,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 48,
            "max_position_embeddings": 40960,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "qwen",
    },
    # Issue 46: shapes unlike all of the above, made by a release not used above (0.64.0, its
    # own aimet-onnx pin 2.28.0).
    "qwen3_8b": {
        # Qwen3-8B class (module qwen3_8b, NUM_SPLITS 5): heads x head_dim (2 x 128 = 256) !=
        # hidden (160); MQA (1 KV head); the MLP width (256) equal to the query projection's
        # width; 12 layers; untied like the real Qwen3-8B; calibrated at context 2048.
        "folder": "qwen3_8b-0.64.0",
        "module": "qwen3_8b",
        "release": "0.64.0",
        "seed": 4601,
        "context_length": 2048,
        "config": {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": 544,
            "hidden_size": 160,
            "intermediate_size": 256,
            "num_hidden_layers": 12,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "qwen",
    },
    "falcon3_pad": {
        # Falcon 3 whose pad token's embedding row is all zeros (as the real Falcon 3 and
        # SmolLM2 ship it): <|pad|> is added to the tokenizer after BPE training, so its id
        # comes right after the ordinary merges (not among the low special ids); config.json
        # and the tokenizer name it as pad; build_source zeroes that row. Larger vocab.
        "folder": "falcon_v3_7b_instruct-0.64.0",
        "module": "falcon_v3_7b_instruct",
        "release": "0.64.0",
        "seed": 4602,
        "context_length": 1024,
        "zero_pad_row": True,
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 1152,
            "hidden_size": 72,
            "intermediate_size": 200,
            "num_hidden_layers": 4,
            "num_attention_heads": 3,
            "num_key_value_heads": 1,
            "head_dim": 24,
            "max_position_embeddings": 32768,
            "rope_theta": 1000042.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "falcon3_late_pad",
    },
    "llama3_2_6l": {
        # Llama 3.2 with 6 layers and llama3 rope scaling factor 32 (module
        # llama_v3_2_3b_instruct, NUM_SPLITS 3: two blocks of 3 layers).
        "folder": "llama_v3_2_3b_instruct-0.64.0",
        "module": "llama_v3_2_3b_instruct",
        "release": "0.64.0",
        "seed": 4603,
        "context_length": 1024,
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 640,
            "hidden_size": 96,
            "intermediate_size": 256,
            "num_hidden_layers": 6,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 131072,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "llama3",
    },
    "llama3_2_6l_065": {
        # Llama 3.2, 6 layers, rope scaling 32 again, by 0.65.0 (aimet-onnx 2.35.0) and wider
        # (hidden 128, 4 heads x 32, 1 KV head): a second try at issue 46's constant-gate case.
        # Made and tried, NOT committed (its faithful bundle passed at seeds 0-3: STATUS.md).
        "folder": "llama_v3_2_3b_instruct-0.65.0",
        "module": "llama_v3_2_3b_instruct",
        "release": "0.65.0",
        "seed": 4605,
        "context_length": 1024,
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 512,
            "hidden_size": 128,
            "intermediate_size": 384,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "max_position_embeddings": 131072,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "llama3",
    },
    "smollm2_pad": {
        # SmolLM2 as the real one ships: pad = <|im_end|> (id 2), its embedding row zeroed.
        "folder": "smollm2_1_7b_it-0.64.0",
        "module": "smollm2_1_7b_it",
        "release": "0.64.0",
        "seed": 4604,
        "context_length": 1024,
        "zero_pad_row": True,
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 704,
            "hidden_size": 48,
            "intermediate_size": 136,
            "num_hidden_layers": 3,
            "num_attention_heads": 3,
            "num_key_value_heads": 3,
            "head_dim": 16,
            "max_position_embeddings": 8192,
            "rope_theta": 130000.0,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "smollm2",
    },
}

# Special tokens and chat templates as the real families spell them (shortened templates).
TOKENIZERS = {
    "qwen": {
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        "bos": None,
        "config_bos": "<|endoftext|>",
        "eos": "<|im_end|>",
        "pad": "<|endoftext|>",
        "cls": "Qwen2TokenizerFast",
        "chat_template": (
            "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
            "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
        ),
    },
    "llama3": {
        "special": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                    "<|end_header_id|>", "<|eot_id|>"],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "pad": None,
        "cls": "PreTrainedTokenizerFast",
        "chat_template": (
            "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + "
            "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
            "{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
        ),
    },
    "falcon3": {
        "special": ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|pad|>"],
        "bos": None,
        "config_bos": "<|endoftext|>",
        "eos": "<|endoftext|>",
        "pad": "<|pad|>",
        "cls": "PreTrainedTokenizerFast",
        "chat_template": (
            "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + "
            "message['content'] + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
        ),
    },
    # Falcon 3 with <|pad|> added after training (late_special): its id follows the merges.
    "falcon3_late_pad": {
        "special": ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>"],
        "late_special": ["<|pad|>"],
        "bos": None,
        "config_bos": "<|endoftext|>",
        "eos": "<|endoftext|>",
        "pad": "<|pad|>",
        "cls": "PreTrainedTokenizerFast",
        "chat_template": (
            "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + "
            "message['content'] + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
        ),
    },
    "smollm2": {
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bos": "<|im_start|>",
        "eos": "<|im_end|>",
        "pad": "<|im_end|>",
        "cls": "GPT2TokenizerFast",
        "chat_template": (
            "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
            "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
        ),
    },
}

# The manifests' w4a16 precision block, with one Calibration step (CPU-capable).
RECIPE_YAML = """\
precision:
  activations: int16
  blocks:
    granularity: PCQ
    qtype: int4
  embedding: int16
  kv_cache: int8
  lm_head:
    granularity: PCQ
    qtype: int8
recipe:
- dataset:
    name: Wikitext
    split: train
  name: Calibration
  num_iterations: {iterations}
"""

CALIBRATION_ITERATIONS = 2
CALIBRATION_SEQ_LEN = 128
SHAPE_ATTRS = {
    # module constant -> class attribute that copies it
    "NUM_LAYERS": "num_layers",
    "HIDDEN_SIZE": "hidden_size",
    "NUM_ATTN_HEADS": "num_attention_heads",
    "NUM_KEY_VALUE_HEADS": "num_key_value_heads",
    "HEAD_DIM": "head_dim",
    "NUM_LAYERS_PER_SPLIT": "num_layers_per_split",
}


def local_text(seed: int, words: int = 60000) -> str:
    """Deterministic English-like text standing in for WikiText (no hub at run time)."""
    rng = random.Random(seed)
    vocab = ("the of and to in a is that for it as was with be by on not he this are or "
             "his from at which but have an they you were her she there been one all we "
             "their has would when if so no will more can out up other into time only "
             "river castle season album species church game film army city world water "
             "light music history station island company battle school family").split()
    out, line = [], []
    for i in range(words):
        line.append(rng.choice(vocab))
        if len(line) > rng.randint(8, 20):
            out.append(" ".join(line).capitalize() + " .")
            line = []
    return "\n".join(out)


def build_tokenizer(kind: str, vocab_size: int, seed: int, dest: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GPT2TokenizerFast, PreTrainedTokenizerFast, Qwen2TokenizerFast

    spec = TOKENIZERS[kind]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=spec["special"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(local_text(seed, 20000).split("\n"), trainer=trainer)
    if spec.get("late_special"):
        tok.add_special_tokens(spec["late_special"])
    if spec["bos"]:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{spec['bos']} $A", pair=f"{spec['bos']} $A $B",
            special_tokens=[(spec["bos"], tok.token_to_id(spec["bos"]))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    dest.mkdir(parents=True, exist_ok=True)
    kwargs = {"bos_token": spec["bos"], "eos_token": spec["eos"], "pad_token": spec["pad"],
              "unk_token": None, "model_max_length": 131072}
    cls = {"Qwen2TokenizerFast": Qwen2TokenizerFast, "GPT2TokenizerFast": GPT2TokenizerFast,
           "PreTrainedTokenizerFast": PreTrainedTokenizerFast}[spec["cls"]]
    if cls is Qwen2TokenizerFast:
        # Qwen ships vocab.json + merges.txt beside tokenizer.json: keep the slow files.
        with tempfile.TemporaryDirectory() as tmp:
            tok.model.save(tmp)
            tok.save(f"{tmp}/tokenizer.json")
            hf = cls(vocab_file=f"{tmp}/vocab.json", merges_file=f"{tmp}/merges.txt",
                     tokenizer_file=f"{tmp}/tokenizer.json", **kwargs)
    else:
        hf = cls(tokenizer_object=tok, **kwargs)
    hf.chat_template = spec["chat_template"]
    hf.save_pretrained(dest)


def build_source(name: str, spec: dict, dest: Path) -> None:
    """The tiny HF model the user would pass as --checkpoint: config, random weights, tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(spec["config"])
    build_tokenizer(spec["tokenizer"], cfg["vocab_size"] - 16, spec["seed"], dest)
    from transformers import AutoTokenizer
    tk = AutoTokenizer.from_pretrained(dest)
    # Token ids of the family's specials (the real ones are far above a tiny vocab).
    # Qwen3's config names <|endoftext|> as bos although its tokenizer has no bos token.
    bos = tk.bos_token or TOKENIZERS[spec["tokenizer"]].get("config_bos")
    cfg["bos_token_id"] = tk.convert_tokens_to_ids(bos)
    cfg["eos_token_id"] = tk.eos_token_id
    if spec.get("zero_pad_row"):
        cfg["pad_token_id"] = tk.pad_token_id
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(spec["seed"])
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    # Random-normal weights with a spread that keeps activations finite in 16-bit.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02 if "embed" in pname else 0.08)
            else:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        if spec.get("zero_pad_row"):
            # The pad token's input embedding row all zeros, as real SmolLM2 (row 2) and
            # Falcon 3 ship it (tied, as SmolLM2, the LM head's row is the same tensor; an
            # own LM head, as Falcon 3's, keeps its random row).
            model.get_input_embeddings().weight[cfg["pad_token_id"]] = 0.0
    model.save_pretrained(dest, safe_serialization=True)


def patch_shapes(module, cfg: dict) -> None:
    """Set the module's shape constants and every class attribute that copied them."""
    values = {
        "NUM_LAYERS": cfg["num_hidden_layers"],
        "HIDDEN_SIZE": cfg["hidden_size"],
        "NUM_ATTN_HEADS": cfg["num_attention_heads"],
        "NUM_KEY_VALUE_HEADS": cfg["num_key_value_heads"],
        "HEAD_DIM": cfg.get("head_dim"),
    }
    # Layers per block as the module's own formula would give with its NUM_SPLITS: the split
    # code recomputes ceil(layers / blocks) anyway and warns when this disagrees.
    import math
    blocks = module.NUM_SPLITS - 1  # every text LLM here splits the embedding
    values["NUM_LAYERS_PER_SPLIT"] = math.ceil(cfg["num_hidden_layers"] / blocks)
    for const, attr in SHAPE_ATTRS.items():
        if not hasattr(module, const) or values[const] is None:
            continue
        old = getattr(module, const)
        setattr(module, const, values[const])
        for obj in vars(module).values():
            if isinstance(obj, type) and attr in vars(obj) and vars(obj)[attr] == old:
                setattr(obj, attr, values[const])
    if hasattr(module, "ADA_SCALE_NUM_RMSNORM_PER_BLK"):
        module.ADA_SCALE_NUM_RMSNORM_PER_BLK = (
            cfg["num_attention_heads"] + cfg["num_key_value_heads"] + 1)
    for obj in vars(module).values():
        if isinstance(obj, type) and "ada_scale_num_rmsnorm_per_blk" in vars(obj):
            obj.ada_scale_num_rmsnorm_per_blk = (
                cfg["num_attention_heads"] + cfg["num_key_value_heads"] + 1)


def patch_wikitext(seed: int) -> None:
    from datasets import Dataset

    from qai_hub_models.datasets.wikitext import wikitext

    text = local_text(seed)
    wikitext.WikiText.load_raw_dataset = lambda self: Dataset.from_dict(
        {"text": text.split("\n")})


def run_one(name: str) -> None:
    """In this process: build the source model, patch, run Qualcomm's quantize CLI."""
    import importlib
    import importlib.metadata
    import runpy



    spec = SPECS[name]
    version = importlib.metadata.version("qai-hub-models")
    assert version == spec["release"], (
        f"{name} needs qai-hub-models {spec['release']}, this venv has "
        f"{version}")
    # Relative paths from this folder, so args.json records no machine-specific path.
    os.chdir(HERE)
    out = Path(spec["folder"])
    src = Path(f"_src_{name}")
    recipe = Path("recipe_calibration_only.yaml")
    if not spec["release"].startswith("0.59"):
        recipe.write_text(RECIPE_YAML.format(iterations=CALIBRATION_ITERATIONS))
    for stale in (out, src):
        if stale.exists():
            shutil.rmtree(stale)
    build_source(name, spec, src)
    module = importlib.import_module(f"qai_hub_models.models.{spec['module']}.model")
    patch_shapes(module, spec["config"])
    patch_wikitext(spec["seed"])
    sys.argv = [
        f"qai_hub_models.models.{spec['module']}.quantize",
        "--checkpoint", str(src), "--output-dir", str(out),
        "--context-length", str(spec["context_length"]),
        "--calibration-sequence-length", str(CALIBRATION_SEQ_LEN),
        "--precision", str(recipe),
    ]
    if spec["release"].startswith("0.59"):
        # 0.57-0.59's CLI has no recipe files: calibration is its default (no SeqMSE /
        # AdaScale unless asked), --num-samples the number of calibration samples.
        sys.argv[-2:] = ["--precision", "w4a16", "--num-samples", str(CALIBRATION_ITERATIONS)]
    runpy.run_module(f"qai_hub_models.models.{spec['module']}.quantize", run_name="__main__")
    shutil.rmtree(src)


# qai-hub-models 0.55's static checkpoint: its quantize (non-PreSplit classes, use_dynamic_shapes
# off, the default) writes model_seqlen{S}_cl{C}.onnx per sequence length, sharing one
# model.data. tests/data/qaihm/make_export_llama32.py runs that quantize (step 1) and then 0.55's
# own export of the checkpoint (step 2: its split, committed as tests/data/qaihm/export-llama32/,
# the expected split); this keeps step 1's output. Run with the 0.55.0 venv (/work/venvs/qaihm,
# make_export.py's docstring).
STATIC_055 = {"llama3_2_static": ("llama_v3_2_3b_instruct-0.55.0", "export-llama32")}


def run_static_055(name: str) -> None:
    """make_export_llama32's recipe into a scratch export dir; the quantize output (the static
    checkpoint) copied here untouched; the export compared byte for byte with the committed
    tree, which is that checkpoint's expected split."""
    import filecmp
    import importlib.metadata

    version = importlib.metadata.version("qai-hub-models")
    assert version == "0.55.0", f"{name} needs qai-hub-models 0.55.0, this venv has {version}"
    folder, tree = STATIC_055[name]
    qaihm = HERE.parent / "qaihm"
    sys.path.insert(0, str(qaihm))
    import make_export_llama32 as recipe

    scratch = Path(tempfile.mkdtemp(prefix="static055_"))
    work = recipe.WORK
    recipe.build(scratch / tree, scratch / "config.json", work, recipe.TINY_CONFIG, recipe.SEED)
    out = HERE / folder
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(work / "quantized_checkpoint", out)
    differ = []

    def walk(cmp, prefix=""):
        differ.extend(prefix + n for n in cmp.diff_files + cmp.left_only + cmp.right_only)
        for sub, c in cmp.subdirs.items():
            walk(c, f"{prefix}{sub}/")
    walk(filecmp.dircmp(scratch / tree, qaihm / tree))
    print(f"{folder}: {sorted(p.name for p in out.iterdir())}")
    print(f"0.55 export of it vs tests/data/qaihm/{tree}: "
          + (f"DIFFERS in {differ}" if differ else "identical"))
    shutil.rmtree(scratch)


def main(argv: list[str]) -> int:
    names = argv or list(SPECS)
    if len(names) == 1 and names[0] in STATIC_055:
        run_static_055(names[0])
        return 0
    if len(names) == 1 and os.environ.get("QAIHM_CKPT_CHILD") == "1":
        run_one(names[0])
        return 0
    for name in names:
        env = dict(os.environ, QAIHM_CKPT_CHILD="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0")
        print(f"== {name}", flush=True)
        subprocess.run([sys.executable, __file__, name], env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
