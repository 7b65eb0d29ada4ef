"""Rows 7 and 8: the local split of an unsplit graph vs `cp` of its weights; `import_export` of
a qai-hub-models tree of the parts vs `doit list` start-up."""
from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

from hexbundle.bench.common import GIB, BenchError, run_measured
from hexbundle.config.build import load_build
from hexbundle.config.model import Part

IDS, NEEDS_BUILD = (7, 8), False

# The unsplit graph the split row cuts: the model's shape with fewer layers (a 7B layer is ~0.9
# GB of float32; 4 layers + embedding + head is ~8 GB, x3 on disk with the parts and the cp copy,
# where the real 30 GB graph would need ~90 GB free). The split streams tensor by tensor, so its
# cost per byte does not depend on the layer count.
SPLIT_LAYERS = 4
SPLIT_PLAN = (0, 2, 2)



def measure(bench, full) -> dict:
    """hexbundle's local split of an unsplit graph vs `cp` of its weights, side by side on the
    same files (both read from the page cache the generator left them in)."""
    from hexbundle.inputs import generate
    model = split_model(bench.cfg.model, bench.small)
    whole = Part(1, 1, tuple(range(model.architecture.num_layers)), True, True)
    unsplit_dir = bench.build_root / "split-bench" / "unsplit"
    bench.log(f"split: writing an unsplit {model.architecture.num_layers}-layer "
              f"{bench.model_name}-shaped graph ...")
    generate.generate_part(model, whole, unsplit_dir, 0)
    data = next(unsplit_dir.glob("*.data"))
    copy = unsplit_dir.parent / "cp.data"
    cp_seconds, code, _, err, cp_rss = run_measured(["cp", str(data), str(copy)],
                                                    bench.root, bench.env())
    copy.unlink(missing_ok=True)
    if code:
        raise BenchError(f"cp {data} failed: {err.strip()}")
    out_dir = unsplit_dir.parent / "parts"
    spec = {"layers": model.architecture.num_layers, "small": bench.small, "root": str(bench.root),
            "model": bench.model_name, "unsplit": str(unsplit_dir), "out": str(out_dir)}
    bench.log(f"split: {data.stat().st_size / GIB:.2f} GiB of weights into "
              f"{len(SPLIT_PLAN)} parts vs cp ...")
    seconds, code, out, err, rss = run_measured(
        [sys.executable, "-c", "import json, sys; from hexbundle.bench.rows.split import "
         "split_step; split_step(json.loads(sys.argv[1]))", json.dumps(spec)],
        bench.root, bench.env())
    if code:
        raise BenchError(f"the split failed: {err.strip()[-2000:]}")
    written = sum(p.stat().st_size for p in out_dir.glob("*.data"))
    largest = max(w.numel * 4 for w in _all_weights(model))
    tree = import_row(bench, model, out_dir)
    weights = data.stat().st_size
    shutil.rmtree(unsplit_dir.parent, ignore_errors=True)
    return {"weights_bytes": weights, "written_bytes": written,
            "split_seconds": round(seconds, 3), "cp_seconds": round(cp_seconds, 4),
            "ratio": round(seconds / max(cp_seconds, 1e-6), 2), "peak_rss_bytes": rss,
            "cp_peak_rss_bytes": cp_rss, "largest_tensor_bytes": largest,
            "layers": model.architecture.num_layers, "plan": list(SPLIT_PLAN), **tree}


def import_row(bench, model, parts_dir: Path) -> dict:
    """`import_export` of a qai-hub-models 0.55-style tree of those parts (links to them:
    the import reads structure and encodings, never weights) vs `doit list` start-up."""
    tree = parts_dir.parent / "tree"
    link_as_tree(model, parts_dir, tree)
    project = parts_dir.parent / "project"
    (project / "configs" / "models").mkdir(parents=True, exist_ok=True)
    code = ("import sys; from pathlib import Path; from hexbundle.inputs.import_export "
            "import import_export; import_export(Path(sys.argv[1]), sys.argv[2], 'bench')")
    seconds, rc, out, err, rss = run_measured(
        [sys.executable, "-c", code, str(project), str(tree)], bench.root, bench.env())
    if rc:
        raise BenchError(f"import_export failed: {(out + err).strip()[-2000:]}")
    lists = [bench.doit("list").seconds for _ in range(3)]
    return {"import_seconds": round(seconds, 2), "import_peak_rss_bytes": rss,
            "list_seconds": round(statistics.median(lists), 3)}


def table(split: dict, bench, full) -> list:
    return split_rows(split)


def split_model(model, small: bool):
    """The bench model's shape with SPLIT_LAYERS layers (qwen2-tiny has 4 already)."""
    from dataclasses import replace
    arch = replace(model.architecture, num_layers=SPLIT_LAYERS)
    return replace(model, architecture=arch)


def _all_weights(model) -> list:
    from hexbundle.config.model import part_weights
    whole = Part(1, 1, tuple(range(model.architecture.num_layers)), True, True)
    return part_weights(model.architecture, model.quantization, whole)


def split_step(spec: dict) -> None:
    """Run in a fresh process by Bench.split_row: cut every part of SPLIT_PLAN out of the
    unsplit graphs (peak RSS is this process's)."""
    from hexbundle.config.layout import GraphInputs
    from hexbundle.config.model import Plan
    from hexbundle.inputs.split import split_graphs
    cfg = load_build(Path(spec["root"]), {"model": spec["model"]})
    model = split_model(cfg.model, spec["small"])
    whole = Part(1, 1, tuple(range(spec["layers"])), True, True)
    unsplit = {g.slot: GraphInputs(*_files(Path(spec["unsplit"]), g)) for g in model.graphs(whole)}
    for part in Plan("bench", SPLIT_PLAN).parts():
        out = {g.slot: GraphInputs(*_files(Path(spec["out"]), g)) for g in model.graphs(part)}
        split_graphs(model, part, unsplit, out, lambda m: None)


def _files(directory: Path, graph) -> tuple:
    from hexbundle.config.layout import graph_files
    onnx_path, data, encodings = graph_files(directory, graph)
    return onnx_path, (data,), encodings


def link_as_tree(model, parts_dir: Path, tree: Path) -> None:
    """A qai-hub-models 0.55 tree (ar<S>_cl<C>/<slug>_w8a16_..._<i>_of_<N>.aimet/) whose files
    are symbolic links to the split parts (each ONNX records its part's .data by name)."""
    from hexbundle.config.layout import graph_files
    from hexbundle.config.model import Plan
    parts = Plan("bench", SPLIT_PLAN).parts()
    for part in parts:
        for graph in model.graphs(part):
            stem = (f"{model.slug}_w8a16_ar{graph.ar}_cl{graph.context_length}_{part.index}_of_"
                    f"{part.count}")
            d = tree / f"ar{graph.ar}_cl{graph.context_length}" / f"{stem}.aimet"
            d.mkdir(parents=True, exist_ok=True)
            onnx_path, data, encodings = graph_files(parts_dir, graph)
            for src, name in ((onnx_path, f"{stem}.onnx"), (data, data.name),
                              (encodings, f"{stem}.encodings")):
                link = d / name
                if not link.exists():
                    link.symlink_to(src)


def split_rows(split: dict) -> list:
    return [
        {"id": 7, "what": f"local split of an unsplit {split['layers']}-layer graph into "
                          f"{len(split['plan'])} parts vs `cp` of its "
                          f"{split['weights_bytes'] / GIB:.2f} GiB of weights",
         "ours": f"{split['split_seconds']:.2f} s, peak RSS {split['peak_rss_bytes'] / GIB:.2f} GiB",
         "baseline": f"{split['cp_seconds']:.2f} s",
         "ratio": f"{split['ratio']:.2f}x cp; RSS = "
                  f"{split['peak_rss_bytes'] / split['largest_tensor_bytes']:.2f}x largest tensor",
         "target": "(reported)", "met": None, "detail": split},
        {"id": 8, "what": "`import_export` of a qai-hub-models tree of those parts vs "
                          "`doit list` start-up",
         "ours": f"{split['import_seconds']:.2f} s", "baseline": f"{split['list_seconds']:.2f} s",
         "ratio": f"{split['import_seconds'] / split['list_seconds']:.2f}x",
         "target": "(reported)", "met": None, "detail": split},
    ]
