#!/usr/bin/env python3
"""Regenerate tests/data/qaihm/export/ (and export-2cl/) with Qualcomm's own qai-hub-models code.

What this produces
------------------
A tiny *random* Qwen2 model (9 layers, hidden 64) quantized with AIMET-ONNX by
qai-hub-models' generic Qwen2 quantize path (``_shared/llm/quantize.quantize``
with ``Qwen2Base`` / ``Qwen2Base_AIMETOnnx``, precision w4a16), then exported by
the stock ``export_model`` of ``qai_hub_models.models.qwen2_5_7b_instruct``
(the ``Qwen2_5_7B_Instruct`` class) with ``onnx_export_dir=export/``, all AI Hub
network calls stubbed.  Everything under export/ar*_cl*/ is written by
qai-hub-models itself (the 7B class copies the unsplit graph, Qualcomm's
``split_onnx_utils`` writes the parts); only export/tokenizer.json is ours.

Environment (exact versions used)
---------------------------------
    /root/.pyenv/versions/3.10.13/bin/python3.10 -m venv /work/venvs/qaihm
    P=/work/venvs/qaihm/bin/pip
    $P install --upgrade pip
    $P install qai-hub-models==0.55.0 --no-deps
    $P install torch==2.4.1 torchvision==0.19.1 aimet-onnx==2.26.0 \
        transformers==4.45.0 onnx==1.18.0 onnxruntime==1.22.0 "numpy<2" \
        pyyaml tqdm psutil==6.1.1 "qai_hub>=0.47,<=0.49"
    $P install "pydantic>=2,<=2.13.3" pydantic_yaml==1.4.0 ruamel-yaml==0.18.10 \
        schema==0.7.5 tabulate==0.9.0 gitpython==3.1.42 prettytable==3.11.0 \
        "typing-extensions<=4.15.0" "tqdm<=4.67.3" qai_hub_models_cli==0.55.0 \
        "Pillow<=11.3.0,>10" numpydoc==1.9.0 "boto3>=1.34,<=1.35.99" \
        "botocore>=1.34,<=1.35.99" "boto3-stubs[s3]==1.36.9" \
        "platformdirs<=4.9.6" inputimeout gdown==4.7.1 datasets==4.1.1 \
        "huggingface_hub>=0.34.0,<=0.36.2" "pandas<=2.2.3,>2" pyarrow==21.0.0
  (aimet-onnx must be 2.26.0: 2.42 fuses RMSNorm into ONNX local functions
  that Qualcomm's splitter drops.)

Run (from anywhere; CPU only, ~1-2 min on 2 cores, no network needed):
    /work/venvs/qaihm/bin/python /work/main/tests/data/qaihm/make_export.py
It wipes and rewrites tests/data/qaihm/export/.  Scratch files go to
$QAIHM_WORK (default /tmp/qaihm_tiny_work).

    /work/venvs/qaihm/bin/python /work/main/tests/data/qaihm/make_export.py --two-context-lengths
wipes and rewrites tests/data/qaihm/export-2cl/ instead (see "Two context
lengths" below); export/ is not touched.

Monkeypatches (all in this process; the installed package is not edited)
------------------------------------------------------------------------
1. Calibration text: ``WikiText.load_raw_dataset`` returns text decoded from a
   few seeded random token sequences instead of downloading WikiText-2.
   Everything else (tokenising, ``LLM_Generator.prefill``, AIMET calibration)
   is Qualcomm's.
2. Concrete tiny classes ``TinyQwen2`` / ``TinyQwen2_AIMETOnnx``: subclasses of
   ``Qwen2Base`` / ``Qwen2Base_AIMETOnnx`` written exactly like the stock
   ``llama_v3_2_3b_instruct`` pair (0.55 ships no concrete quantizable Qwen2
   text model), with the same Llama3Base input spec (int32 input_ids; the 7B
   class declares int64 for its asset, but Qualcomm's calibration generator
   feeds int32, so the quantized graphs take int32).
3. The 7B class downloads a pre-quantized asset zip
   (``CachedWebModelAsset.from_asset_store(...).fetch()``).  We replace
   ``CachedWebModelAsset`` in the 7B module with a stub whose ``fetch`` returns a
   local directory holding the checkpoint written by step 2 under the asset's
   file names: ``qwen2_5_7b_instruct_ar{128,1}.onnx`` (=
   ``model_seqlen{128,1}_cl{CL}.onnx``), ``qwen2_5_7b_instruct.data`` (=
   ``model.data``) and ``qwen2_5_7b_instruct.encodings`` (= ``model.encodings``).
   The only edit is the external-data ``location`` string in the two graphs
   ("model.data" -> "qwen2_5_7b_instruct.data"), needed because the 7B code
   renames the data file when copying.
4. Context-length guard: ``convert_to_onnx_and_aimet_encodings`` raises unless
   ``context_length == 4096``.  We wrap it so that ``self.context_length`` reads
   4096 only for the duration of the call (the method uses it for nothing
   else); the real CL (256) is used everywhere else.
5. ``Qwen2_5_7B_Instruct._adapt_aimet_encodings`` := the generic
   ``Qwen2Base_AIMETOnnx._adapt_aimet_encodings`` (the 7B one hard-codes the
   asset's tensor names such as ``model_embed_tokens_Gather.weight``).
6. ``Qwen2_5_7B_Instruct.split_lm_head = False`` (the 7B class does not derive
   from LLM_AIMETOnnx, so stock export stops with AttributeError
   ``split_lm_head`` after copying the unsplit graphs).
7. ``from_pretrained``'s default ``huggingface_model_name`` points at the local
   tiny checkpoint (config + tokenizer) instead of Qwen/Qwen2.5-7B-Instruct.
   Done via ``__defaults__`` so the export name stays ``qwen2_5_7b_instruct_w8a16``.
8. AI Hub stubs: ``hub.get_devices`` (one fake "Snapdragon 8 Elite QRD"),
   ``get_or_create_cached_model`` (no upload), ``hub.submit_compile_job`` and
   ``hub.submit_link_job`` (fake jobs).  Export runs with skip_profiling,
   skip_inferencing, skip_downloading and skip_summary.

Two context lengths (``--two-context-lengths``, writes export-2cl/)
---------------------------------------------------------------------
The 7B class cannot export two context lengths: its asset holds one graph per
AR and no context length (``<slug>_ar{128,1}.onnx``), and its
``convert_to_onnx_and_aimet_encodings`` refuses any context length but 4096.
In 0.55 the models that export several context lengths (``qwen3_4b``,
``qwen3_4b_instruct_2507``: ``default_context_lengths=[512, 1024, 2048, 3072,
4096]``) go through the generic ``LLM_AIMETOnnx`` path, and that is what this
mode runs: the stock ``_shared/llm/export.export_model`` with
``context_length=[256, 512]`` and ``sequence_length=[128, 1]`` in ONE call
(its own loop over ``(AR, CL)``), ``model_cls=TinyQwen2_AIMETOnnx``,
``checkpoint="DEFAULT"`` and an ``fp_model``, as ``export_main`` passes them
for a DEFAULT checkpoint.  Steps 0 and 1 (checkpoint, tokenizer, AIMET
calibration at context length 256) are the same as for export/, so both trees
share one calibration: Qualcomm's ``quantize`` takes one context length and
writes one ``model.data`` and one ``model.encodings`` that every context length
of the export reuses.  Patches used in this mode: 1, 2 and 8 as above, plus
9. ``TinyQwen2_AIMETOnnx.from_pretrained(checkpoint="DEFAULT")`` follows
   ``Llama3_2_3B_AIMETOnnx`` / ``Qwen3_4B_AIMETOnnx`` line for line, except
   that the asset download (``CachedWebModelAsset...fetch()`` of Qualcomm's
   pre-quantized checkpoint zip) is replaced by the local checkpoint of step 1.
   Given an ``fp_model`` it then calls Qualcomm's ``create_onnx_models``, which
   writes ``model_seqlen{AR}_cl{CL}.onnx`` for a context length the checkpoint
   lacks (512: ``torch.onnx.export`` of the float model, recording offsets into
   the checkpoint's ``model.data``, which it keeps).
Patches 3-7 are not needed: the generic class has no asset, no 4096 guard, its
own ``_adapt_aimet_encodings``, ``split_lm_head = False`` and takes the tiny
checkpoint as it is.  The export name is ``qwen2_5_7b_instruct_w4a16``
(``model_id`` of the 7B module, precision w4a16: the generic class compiles
only w4a16 or w4).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPORT_DIR = HERE / "export"
EXPORT_2CL_DIR = HERE / "export-2cl"
WORK = Path(os.environ.get("QAIHM_WORK", "/tmp/qaihm_tiny_work"))
CKPT_FP = WORK / "fp_checkpoint"  # random HF Qwen2 checkpoint + tokenizer
CKPT_Q = WORK / "quantized_checkpoint"  # output of Qualcomm's quantize()
ASSET_DIR = WORK / "fake_asset"  # stands in for the 7B's S3 asset zip

SEED = 1234
CONTEXT_LENGTH = 256
CALIB_SEQ_LEN = 128
EXPORT_SEQ_LENS = [128, 1]
# export-2cl/: the calibration context length first, as export_main's "first"
# instantiation (it builds the fp_model at the first AR and CL).
EXPORT_CONTEXT_LENGTHS_2CL = [CONTEXT_LENGTH, 512]
NUM_CALIB_SAMPLES = 2

TINY_CONFIG = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=9,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    use_sliding_window=False,
    bos_token_id=1,
    eos_token_id=0,
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_VOCAB = 512

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

WORDS = (
    "the a of to and in is it that for on with as was by at be this from or an "
    "are not have has had were which one all their there been more can when "
    "model token layer graph split part weight tensor quant hexagon genie "
    "qualcomm phone chip memory cache context prompt answer question gravity "
    "apple river mountain city light water stone green blue red small large"
).split()


def random_text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) + rng.choice(["", "", "s", "ed", "ing"]) for _ in range(n_words))


# --------------------------------------------------------------------------
# Step 0: tiny random HF checkpoint + tiny tokenizer (ours, not Qualcomm's)
# --------------------------------------------------------------------------
def make_fp_checkpoint() -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    rng = random.Random(SEED)
    CKPT_FP.mkdir(parents=True, exist_ok=True)

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
    assert tok.get_vocab_size() <= TINY_CONFIG["vocab_size"]
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=CHAT_TEMPLATE,
    )
    hf_tok.save_pretrained(CKPT_FP)

    torch.manual_seed(SEED)
    cfg = Qwen2Config(**TINY_CONFIG, torch_dtype="float32")
    cfg.architectures = ["Qwen2ForCausalLM"]
    model = Qwen2ForCausalLM(cfg).eval()
    # HF init sets every RMSNorm weight to 1 and every q/k/v bias to 0, and
    # torch.onnx.export then de-duplicates those identical initializers into
    # one shared tensor.  Randomise them so each layer owns distinct tensors,
    # as in a real checkpoint.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.02 * torch.randn_like(p))
    model.save_pretrained(CKPT_FP, safe_serialization=True)


# --------------------------------------------------------------------------
# Step 1: Qualcomm's generic Qwen2 quantize path (AIMET-ONNX, w4a16)
# --------------------------------------------------------------------------
def build_tiny_classes():
    import torch
    from qai_hub_models import Precision
    from qai_hub_models.models._shared.llm.common import LLMIOType
    from qai_hub_models.models._shared.llm.model import DEFAULT_SEQUENCE_LENGTH
    from qai_hub_models.models._shared.qwen2.model import Qwen2Base, Qwen2Base_AIMETOnnx
    from qai_hub_models.models._shared.llama3.model import Llama3Base

    def _spec(self, llm_config, sequence_length=DEFAULT_SEQUENCE_LENGTH,
              context_length=CONTEXT_LENGTH, llm_io_type=LLMIOType.genie_input_ids):
        # Same as llama_v3_2_3b_instruct's spec (Llama3Base._get_input_spec,
        # int32 input_ids).  Qualcomm's calibration generator feeds int32
        # input_ids, so the 7B class's int64 variant cannot be used here.
        return Llama3Base._get_input_spec(
            num_hidden_layers=llm_config["num_hidden_layers"],
            sequence_length=sequence_length, context_length=context_length,
            hidden_size=llm_config["hidden_size"],
            num_key_value_heads=llm_config["num_key_value_heads"],
            num_attention_heads=llm_config["num_attention_heads"],
            llm_io_type=llm_io_type)

    class TinyQwen2(Qwen2Base):
        @classmethod
        def from_pretrained(cls, checkpoint=str(CKPT_FP), sequence_length=DEFAULT_SEQUENCE_LENGTH,
                            context_length=CONTEXT_LENGTH, host_device=None,
                            load_pretrained=True, _skip_optimizations=None):
            return cls(checkpoint=checkpoint, sequence_length=sequence_length,
                       context_length=context_length, host_device=host_device,
                       load_pretrained=load_pretrained, _skip_optimizations=_skip_optimizations)

        def get_output_names(self):
            return Qwen2Base._get_output_names(TINY_CONFIG["num_hidden_layers"])

        get_input_spec = _spec

    class TinyQwen2_AIMETOnnx(Qwen2Base_AIMETOnnx):
        FPModel = TinyQwen2

        @classmethod
        def from_pretrained(cls, checkpoint=None, host_device=None,
                            sequence_length=DEFAULT_SEQUENCE_LENGTH, context_length=CONTEXT_LENGTH,
                            precision=Precision.w4a16, fp_model=None,
                            _skip_quantsim_creation=False, use_dynamic_shapes=False):
            host_device = host_device or torch.device("cpu")
            if isinstance(checkpoint, str) and checkpoint.startswith("DEFAULT"):
                # Patch 9: as Llama3_2_3B_AIMETOnnx / Qwen3_4B_AIMETOnnx, with
                # the local checkpoint of step 1 in place of the asset download.
                checkpoint = str(CKPT_Q)
                if fp_model is not None:
                    cls.create_onnx_models(
                        checkpoint=checkpoint, fp_model=fp_model,
                        context_length=context_length,
                        export_sequence_lengths=[sequence_length],
                        host_device=host_device, llm_io_type=fp_model.llm_io_type)
                    cls.save_tokenizer_and_config(checkpoint=checkpoint, fp_model=fp_model)
            return super().from_pretrained(
                checkpoint=checkpoint, host_device=host_device,
                sequence_length=sequence_length, context_length=context_length,
                precision=precision, fp_model=fp_model,
                _skip_quantsim_creation=_skip_quantsim_creation,
                use_dynamic_shapes=use_dynamic_shapes)

        def get_output_names(self):
            return Qwen2Base._get_output_names(TINY_CONFIG["num_hidden_layers"])

        get_input_spec = _spec

    return TinyQwen2, TinyQwen2_AIMETOnnx


def patch_calibration_text() -> None:
    """Patch 1: WikiText -> a few random token sequences (offline)."""
    from qai_hub_models.datasets.wikitext import WikiText
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(CKPT_FP))
    special = set(tok.all_special_ids)
    ids = [i for i in range(len(tok)) if i not in special]
    rng = random.Random(SEED + 1)
    texts = [tok.decode([rng.choice(ids) for _ in range(CONTEXT_LENGTH)])
             for _ in range(NUM_CALIB_SAMPLES + 2)]

    def load_raw_dataset(self):  # noqa: ARG001
        return {"text": texts}

    WikiText.load_raw_dataset = load_raw_dataset


def run_quantize() -> None:
    import numpy as np
    import torch
    from qai_hub_models import Precision
    from qai_hub_models.models._shared.llm.quantize import quantize

    np.random.seed(SEED)
    torch.manual_seed(SEED)
    TinyQwen2, TinyQwen2_AIMETOnnx = build_tiny_classes()
    patch_calibration_text()
    quantize(
        quantized_model_cls=TinyQwen2_AIMETOnnx,
        fp_model_cls=TinyQwen2,
        context_length=CONTEXT_LENGTH,
        seq_len=CALIB_SEQ_LEN,
        precision=Precision.w4a16,
        output_dir=str(CKPT_Q),
        num_samples=NUM_CALIB_SAMPLES,
        allow_cpu_to_quantize=True,
    )


# --------------------------------------------------------------------------
# Step 2: stock qwen2_5_7b_instruct export_model, hub stubbed
# --------------------------------------------------------------------------
def make_fake_asset() -> None:
    """Patch 3 (data side): lay the quantized checkpoint out like the 7B asset."""
    import onnx

    mid = "qwen2_5_7b_instruct"
    if ASSET_DIR.exists():
        shutil.rmtree(ASSET_DIR)
    ASSET_DIR.mkdir(parents=True)
    for sl in EXPORT_SEQ_LENS:
        src = CKPT_Q / f"model_seqlen{sl}_cl{CONTEXT_LENGTH}.onnx"
        m = onnx.load(str(src), load_external_data=False)
        for init in m.graph.initializer:
            for kv in init.external_data:
                if kv.key == "location":
                    assert kv.value == "model.data", kv.value
                    kv.value = f"{mid}.data"
        onnx.save(m, str(ASSET_DIR / f"{mid}_ar{sl}.onnx"))
    shutil.copyfile(CKPT_Q / "model.data", ASSET_DIR / f"{mid}.data")
    shutil.copyfile(CKPT_Q / "model.encodings", ASSET_DIR / f"{mid}.encodings")


class _FakeJob:
    def __init__(self, name, input_specs=None):
        self.name = name
        self.job_id = "fake_" + name
        self.url = "about:blank"
        self.target_shapes = input_specs

    def wait(self, *a, **k):
        class _S:
            success = True
        return _S()

    def get_target_model(self):
        return None


def patch_export_side():
    import qai_hub_models.models.qwen2_5_7b_instruct.model as q7
    from qai_hub_models.models._shared.qwen2.model import Qwen2Base_AIMETOnnx

    cls = q7.Qwen2_5_7B_Instruct

    # Patch 3: asset fetch -> local fake asset dir.
    class _Asset:
        @classmethod
        def from_asset_store(cls_, *a, **k):
            return cls_()

        def fetch(self, extract=False):
            return ASSET_DIR

    q7.CachedWebModelAsset = _Asset

    # Patch 4: the literal `context_length == 4096` guard.
    orig_convert = cls.convert_to_onnx_and_aimet_encodings

    def convert(self, *a, **k):
        real = self.context_length
        self.context_length = 4096
        try:
            return orig_convert(self, *a, **k)
        finally:
            self.context_length = real

    cls.convert_to_onnx_and_aimet_encodings = convert

    # Patch 5: generic Qwen2 encodings adaptation.
    cls._adapt_aimet_encodings = Qwen2Base_AIMETOnnx._adapt_aimet_encodings
    # Patch 6: split_lm_head.
    cls.split_lm_head = False
    # Patch 7: local config/tokenizer as default huggingface_model_name.
    fp = cls.from_pretrained.__func__
    fp.__defaults__ = tuple(str(CKPT_FP) if d == q7.HF_REPO_NAME else d for d in fp.__defaults__)

    return cls, patch_hub()


def patch_hub():
    """Patch 8: AI Hub stubs; returns the fake export device."""
    import qai_hub as hub
    import qai_hub_models.models._shared.llm.export as llm_export

    dev = hub.Device(
        "Snapdragon 8 Elite QRD",
        "15",
        ["chipset:qualcomm-snapdragon-8-elite", "htp-supports-weight-sharing:true",
         "htp-supports-fp16:true", "framework:qnn"],
    )
    hub.get_devices = lambda *a, **k: [dev]
    llm_export.get_or_create_cached_model = lambda **k: k["model_path"]
    hub.submit_compile_job = lambda model, input_specs=None, device=None, name="", options="", **k: _FakeJob(name, input_specs)
    hub.submit_link_job = lambda models, name="", options="", device=None, **k: _FakeJob(name)
    return dev


def run_export() -> None:
    from qai_hub_models.models.qwen2_5_7b_instruct.model import DEFAULT_PRECISION

    cls, dev = patch_export_side()
    call_export(cls, DEFAULT_PRECISION, dev, EXPORT_DIR, [CONTEXT_LENGTH])


def call_export(model_cls, precision, dev, export_dir: Path, context_lengths: list,
                **extra) -> None:
    """qai-hub-models' export_model into a fresh `export_dir`, as the 7B class's export calls
    it, with every AI Hub step skipped."""
    from qai_hub_models.models._shared.llm.export import export_model
    from qai_hub_models.models.qwen2_5_7b_instruct.model import (
        MODEL_ASSET_VERSION, MODEL_ID, NUM_LAYERS_PER_SPLIT, NUM_SPLITS)

    if export_dir.exists():
        shutil.rmtree(export_dir)
    export_model(
        model_cls=model_cls,
        model_id=MODEL_ID,
        model_asset_version=MODEL_ASSET_VERSION,
        num_splits=NUM_SPLITS,
        num_layers_per_split=NUM_LAYERS_PER_SPLIT,
        precision=precision,
        device=dev,
        skip_profiling=True,
        skip_inferencing=True,
        skip_downloading=True,
        skip_summary=True,
        output_dir=str(WORK / "build"),
        onnx_export_dir=str(export_dir),
        context_length=context_lengths,
        sequence_length=EXPORT_SEQ_LENS,
        **extra,
    )


def run_export_2cl() -> None:
    """Stock generic export loop, two context lengths in one call (see docstring)."""
    from qai_hub_models import Precision

    TinyQwen2, TinyQwen2_AIMETOnnx = build_tiny_classes()
    dev = patch_hub()
    # export_main builds this for a DEFAULT checkpoint, at the first AR and CL.
    fp_model = TinyQwen2.from_pretrained(
        sequence_length=EXPORT_SEQ_LENS[0], context_length=EXPORT_CONTEXT_LENGTHS_2CL[0])
    call_export(TinyQwen2_AIMETOnnx, Precision.w4a16, dev, EXPORT_2CL_DIR,
                EXPORT_CONTEXT_LENGTHS_2CL, checkpoint="DEFAULT", fp_model=fp_model,
                _skip_quantsim_creation=True)


def write_tokenizer(export_dir: Path) -> None:
    # qai-hub-models writes no tokenizer into onnx_export_dir (only
    # prepare_genie_assets does, after downloading compiled binaries), so
    # ship our own tiny one.
    shutil.copyfile(CKPT_FP / "tokenizer.json", export_dir / "tokenizer.json")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--two-context-lengths", action="store_true",
                        help=f"write {EXPORT_2CL_DIR.name}/ (context lengths "
                             f"{EXPORT_CONTEXT_LENGTHS_2CL}) instead of {EXPORT_DIR.name}/")
    args = parser.parse_args()
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    make_fp_checkpoint()
    run_quantize()
    if args.two_context_lengths:
        run_export_2cl()
        export_dir = EXPORT_2CL_DIR
    else:
        make_fake_asset()
        run_export()
        export_dir = EXPORT_DIR
    write_tokenizer(export_dir)
    print("done:", export_dir)


if __name__ == "__main__":
    main()
