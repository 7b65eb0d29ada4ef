"""Run qai-hub-models 0.65.0's own split on a quantize checkpoint; write expected_split.json.

This is the path `qai-hub-models export` takes for a checkpoint folder, minus the upload:
the model's Part classes (`DynamicSplitPartBase`) ask their Quantizable PreSplit for
`convert_to_onnx_and_split(part_id)`, which copies model_dynamic.onnx + model.encodings into a
bundle, runs the family's `_postprocess_full_onnx_bundle` (`_adapt_aimet_encodings`) and then
`split_onnx_utils.utils.split_onnx(num_splits=NUM_SPLITS, num_layers_per_split=...,
split_embedding=True, split_lm_head=False)` -> `fill_input_encodings_of_split` ->
`split_onnx_by_names`. The cut tensors are recorded by wrapping `split_onnx_by_names` (the
arguments are passed through unchanged).

Fixed shapes: Qualcomm never rewrites the ONNX to fixed shapes; the cloud compile pins each
graph with the Part's `get_graph_input_spec(graph_name)`. That spec is recorded per graph
(`{prompt|token}_ar{AR}_cl{CL}_{i}_of_{n}`, AR 128 and 1, CL = the checkpoint's default 4096,
qai-hub-models' DEFAULT_CONTEXT_LENGTH). Output shapes/dtypes per graph are what
onnxruntime 1.22 returns when the part (IR clamped to 10, as Qualcomm's own
`_get_fp_session` does) is run on zero inputs of exactly those specs.

The Part is built as `DynamicSplitPartBase.from_pretrained` builds it, except that the
precision is given (w4a16) rather than parsed from args.json: with a recipe file, args.json's
`precision` is the recipe's path, which `CheckpointType.precision` cannot parse.

Run in the release's venv that has qai-hub-models 0.65.0 (see make_checkpoints.py):
  /work/venvs/qaihm065/bin/python split_expected.py FOLDER [FOLDER ...]
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_checkpoints import SPECS, patch_shapes  # noqa: E402

SEQUENCE_LENGTHS = [128, 1]
CONTEXT_LENGTH = 4096


def _dims(value_info) -> list:
    return [d.dim_param if d.dim_param else d.dim_value
            for d in value_info.type.tensor_type.shape.dim]


def _dtype(value_info) -> str:
    import onnx
    return onnx.helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type).name


def _run_zero_inputs(onnx_path: Path, spec: dict) -> dict:
    """Output name -> (shape, dtype) from onnxruntime on zero inputs of the pinned spec."""
    import numpy as np
    import onnx
    import onnxruntime

    model = onnx.load(str(onnx_path), load_external_data=True)
    model.ir_version = min(model.ir_version, 10)
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    feeds = {name: np.zeros(shape, dtype=np.dtype(dtype)) for name, (shape, dtype) in spec.items()}
    names = [o.name for o in sess.get_outputs()]
    outs = sess.run(names, feeds)
    return {n: {"shape": list(o.shape), "dtype": o.dtype.name} for n, o in zip(names, outs)}


def _dump_compact(obj, path: Path) -> None:
    """Qualcomm writes indent=4; the content is what counts, kept compact here."""
    path.write_text(json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n")


def split_one(folder: Path) -> None:
    import onnx
    import torch


    from qai_hub_models import Precision
    from qai_hub_models.models.templates.llm import model as llm_model
    from qai_hub_models.models.templates.llm.model import DynamicSplitPartBase
    from qai_hub_models.models.templates.llm.split_onnx_utils import utils as split_utils

    import importlib.metadata
    assert importlib.metadata.version("qai-hub-models") == "0.65.0"
    folder = folder.resolve()
    cfg = json.loads((folder / "config.json").read_text())
    args = json.loads((folder / "args.json").read_text())
    spec = next(s for s in SPECS.values() if s["folder"] == folder.name)
    module = importlib.import_module(f"qai_hub_models.models.{spec['module']}.model")
    patch_shapes(module, cfg)

    cuts: list[list[str]] = []
    original = split_utils.split_onnx_by_names

    def recording(onnxfile, modelname, *names, **kw):
        cuts.extend(n.split(",") for n in names)
        return original(onnxfile, modelname, *names, **kw)

    split_utils.split_onnx_by_names = recording
    # split_onnx is imported by name into the template; it calls the utils-module global.
    assert llm_model.split_onnx is split_utils.split_onnx

    parts = sorted(
        (c for c in vars(module).values()
         if isinstance(c, type) and issubclass(c, DynamicSplitPartBase) and c.part_id > 0),
        key=lambda c: c.part_id)
    quant_cls = parts[0].quant_presplit_cls
    presplit = quant_cls.from_pretrained(
        precision=Precision.w4a16, checkpoint=str(folder),
        host_device=torch.device("cpu"), _skip_quantsim_creation=True)

    out_dir = folder / "expected_split"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir()
    result = {
        "made_by": "qai-hub-models 0.65.0 split (split_expected.py)",
        "checkpoint_release": args.get("raw_args") and spec["release"],
        "module": spec["module"],
        "num_splits": module.NUM_SPLITS,
        "num_layers_per_split_constant": module.NUM_LAYERS_PER_SPLIT,
        "split_embedding": quant_cls.split_embedding,
        "split_lm_head": quant_cls.split_lm_head,
        "context_length": CONTEXT_LENGTH,
        "sequence_lengths": SEQUENCE_LENGTHS,
        "cuts": cuts,
        "parts": [],
    }
    for part_cls in parts:
        part = part_cls(presplit, precision=Precision.w4a16,
                        context_lengths=[CONTEXT_LENGTH], sequence_lengths=SEQUENCE_LENGTHS)
        bundle = part._get_onnx_bundle()
        graph = onnx.load(str(bundle.onnx_graph_path), load_external_data=False).graph
        base = Path(bundle.onnx_graph_path).stem
        enc_name = f"{base}.encodings"
        enc = json.loads(Path(bundle.aimet_encodings_path).read_text())
        _dump_compact(enc, out_dir / enc_name)
        entry = {
            "part": part_cls.part_id,
            "name": base,
            "inputs": [{"name": i.name, "shape": _dims(i), "dtype": _dtype(i)}
                       for i in graph.input],
            "outputs": [{"name": o.name, "shape": _dims(o), "dtype": _dtype(o)}
                        for o in graph.output],
            "initializers": sorted(t.name for t in graph.initializer),
            "num_nodes": len(graph.node),
            "encodings_file": f"expected_split/{enc_name}",
            "activation_encoding_names": sorted(e["name"] for e in enc["activation_encodings"]),
            "param_encoding_names": sorted(e["name"] for e in enc["param_encodings"]),
            "graphs": {},
        }
        for gname in part.graph_names:
            in_spec = part.get_graph_input_spec(gname)
            pinned = {n: (list(s.shape), s.dtype) for n, s in in_spec.items()}
            outs = _run_zero_inputs(Path(bundle.onnx_graph_path), pinned)
            entry["graphs"][gname] = {
                "inputs": [{"name": n, "shape": sh, "dtype": dt} for n, (sh, dt) in pinned.items()],
                "outputs": [{"name": n, **v} for n, v in outs.items()],
                "output_names_sanitized": list(part.get_graph_output_spec(gname)),
            }
        result["parts"].append(entry)
    # The encodings split_onnx_by_names started from: model.encodings after the family's
    # _adapt_aimet_encodings and fill_input_encodings_of_split (both edit the bundle's copy).
    full = Path(presplit._temp_dir.name) / "bundle_dynamic" / "model.encodings"
    _dump_compact(json.loads(full.read_text()), out_dir / "model.adapted.encodings")
    result["adapted_full_encodings_file"] = "expected_split/model.adapted.encodings"
    (folder / "expected_split.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{folder.name}: {len(result['parts'])} parts, cuts {[c[0] for c in cuts]}")


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if len(argv) == 1:
        split_one(Path(argv[0]))
        return 0
    import subprocess
    for folder in argv:
        subprocess.run([sys.executable, __file__, folder], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
