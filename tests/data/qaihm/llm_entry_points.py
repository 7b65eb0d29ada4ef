"""What make_export_llama32.py, make_export_falcon3.py and make_export_qwen3.py share: running a
qai-hub-models 0.55 LLM's own quantize and export entry points in this process (so the scripts'
monkeypatches apply), the patches they have in common (1, A, B; D for the classes whose quantize
refuses a CPU), and the files written beside the export (our tokenizer, Qualcomm's own
genie_config.json for it). Each script keeps what differs: its model, its tokenizer.
make_export_llama32_deep.py and make_export_qwen3_kv16.py reuse the Llama 3.2 and Qwen3 scripts'
``build`` with their own shape and seed."""
from __future__ import annotations

import functools
import json
import runpy
import shutil
import sys
from pathlib import Path


def patch_cpu_quantize() -> None:
    """Patch D: the model's quantize.py calls llm_quantize without allow_cpu_to_quantize=True
    (qwen3_4b/quantize.py passes it), so quantize() refuses a machine without CUDA.  Pass it."""
    import qai_hub_models.models._shared.llm.quantize as llm_q

    orig = llm_q.llm_quantize

    @functools.wraps(orig)
    def llm_quantize(*a, **k):
        k["allow_cpu_to_quantize"] = True
        return orig(*a, **k)

    llm_q.llm_quantize = llm_quantize


def run_main(module: str, argv: list) -> None:
    """Run a qai-hub-models entry point as `python -m module argv...` would (in this process,
    so the patches apply)."""
    print("+ python -m", module, " ".join(argv), flush=True)
    saved = sys.argv
    sys.argv = [module] + argv
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    finally:
        sys.argv = saved


def run_quantize(module: str, ckpt_fp: Path, ckpt_q: Path, seed: int, context_length: int,
                 calib_seq_len: int, num_samples: int) -> None:
    """Step 1: the model's own quantize (AIMET-ONNX, w4a16)."""
    import numpy as np
    import torch

    np.random.seed(seed)
    torch.manual_seed(seed)
    run_main(f"{module}.quantize", [
        "--checkpoint", str(ckpt_fp),
        "--context-length", str(context_length),
        "--calibration-sequence-length", str(calib_seq_len),
        "--num-samples", str(num_samples),
        "--precision", "w4a16",
        "-o", str(ckpt_q),
    ])


def run_export(module: str, export_dir: Path, work: Path, context_length: int,
               seq_lens: list, device: str) -> None:
    """Step 2: the model's own export, AI Hub stubbed by the caller."""
    if export_dir.exists():
        shutil.rmtree(export_dir)
    run_main(f"{module}.export", [
        "--checkpoint", "DEFAULT",
        "--context-length", str(context_length),
        "--sequence-length", ",".join(map(str, seq_lens)),
        "--device", device,
        "--skip-profiling",
        "--skip-downloading",
        "--skip-summary",
        "--output-dir", str(work / "build"),
        "--onnx-export-dir", str(export_dir),
    ])


def write_tokenizer(ckpt_fp: Path, export_dir: Path) -> None:
    # qai-hub-models writes no tokenizer into onnx_export_dir (only prepare_genie_assets does,
    # after downloading compiled binaries), so ship our own tiny one.
    shutil.copyfile(ckpt_fp / "tokenizer.json", export_dir / "tokenizer.json")


def write_qaihm_genie_config(module: str, ckpt_fp: Path, export_dir: Path, context_length: int,
                             seq_lens: list) -> None:
    """What qai-hub-models' prepare_genie_assets would write as genie_config.json for this export
    (it runs only after downloading compiled binaries, skipped here): the stock
    ``create_genie_config(max(context_lengths), llm_config, "rope", model_list)``, with the fp
    model's config (export_main's fp_model for a DEFAULT checkpoint) and export_model's binary
    names ``<model_name>_part_{i}_of_{n}.bin``, dumped as prepare_genie_assets dumps it.
    Nothing here touches the network."""
    import importlib

    from qai_hub_models.models._shared.llm.model import get_llm_config
    from qai_hub_models.utils.llm_helpers import create_genie_config

    model = importlib.import_module(f"{module}.model")
    model_name = f"{model.MODEL_ID}_w4a16"
    splits = model.NUM_SPLITS
    parts = sorted((export_dir / f"ar{seq_lens[0]}_cl{context_length}").glob(
        f"{model_name}_ar*_of_{splits}.aimet"))
    assert len(parts) == splits, parts
    model_list = [f"{model_name}_part_{i + 1}_of_{splits}.bin" for i in range(splits)]
    config = create_genie_config(context_length, get_llm_config(str(ckpt_fp)), "rope", model_list)
    with open(export_dir / "qaihm_genie_config.json", "w") as f:
        json.dump(config, f, indent=4)


def patch_class_constants(module: str, tiny_config: dict) -> None:
    """Patch A: the model module's shape constants -> the tiny model's (its _verify_ckpt refuses
    any other checkpoint; get_output_names lists NUM_LAYERS layers of KV outputs)."""
    import importlib

    model = importlib.import_module(f"{module}.model")
    model.NUM_LAYERS = tiny_config["num_hidden_layers"]
    model.HIDDEN_SIZE = tiny_config["hidden_size"]
    model.NUM_ATTN_HEADS = tiny_config["num_attention_heads"]
    model.NUM_KEY_VALUE_HEADS = tiny_config["num_key_value_heads"]


def patch_calibration_text(ckpt_fp: Path, special_ids, seed: int, length: int,
                           count: int) -> None:
    """Patch 1: WikiText -> `count` random token sequences of `length` tokens (offline)."""
    import random

    from qai_hub_models.datasets.wikitext import WikiText
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt_fp))
    special = set(tok.all_special_ids) | set(special_ids)
    ids = [i for i in range(len(tok)) if i not in special]
    rng = random.Random(seed)
    texts = [tok.decode([rng.choice(ids) for _ in range(length)]) for _ in range(count)]

    def load_raw_dataset(self):  # noqa: ARG001
        return {"text": texts}

    WikiText.load_raw_dataset = load_raw_dataset


def patch_asset_and_fp_default(module: str, fp_class: str, ckpt_fp: Path, ckpt_q: Path,
                               asset_dir: Path) -> None:
    """Patch B: the asset download -> a copy of our quantized checkpoint; the float model's
    (class `fp_class`) default checkpoint -> our tiny float checkpoint."""
    import importlib

    model = importlib.import_module(f"{module}.model")
    if asset_dir.exists():
        shutil.rmtree(asset_dir)
    shutil.copytree(ckpt_q, asset_dir)

    class _Asset:
        @classmethod
        def from_asset_store(cls_, *a, **k):
            return cls_()

        def fetch(self, extract=False):
            return asset_dir

    model.CachedWebModelAsset = _Asset
    fp = getattr(model, fp_class).from_pretrained.__func__
    fp.__defaults__ = tuple(str(ckpt_fp) if d == model.HF_REPO_NAME else d
                            for d in fp.__defaults__)
