"""Row 5: the reference backend on the part with the most layers, GB/s and peak RSS, each step
in a process of its own (backend_step)."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from hexbundle.bench.common import GIB, part_weights_of, run_child_step
from hexbundle.config.build import load_build
from hexbundle.config.layout import Layout, dlc_name

IDS, NEEDS_BUILD = (5,), False


def measure(bench, full) -> dict:
    """Convert both graphs and compile the part, each in its own process (peak RSS from
    wait4), writing to a scratch directory so the build tree stays untouched."""
    bench.log(f"reference backend on {bench.part.tag} ({len(bench.part.layers)} layers) ...")
    scratch = bench.layout.bench_scratch
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    steps = []
    try:
        for graph in bench.cfg.model.graphs(bench.part):
            steps.append(_backend_step(bench, {"step": "convert", "graph": graph.slot}, scratch))
        steps.append(_backend_step(bench, {"step": "compile"}, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    weights = sum(s["read_bytes"] for s in steps if s["step"] == "convert")
    seconds = sum(s["seconds"] for s in steps)
    largest = max(w.numel * 4 for w in part_weights_of(bench.cfg, bench.part))
    return {"part": bench.part.index, "layers": len(bench.part.layers), "steps": steps,
            "fp32_weight_bytes": weights, "seconds": round(seconds, 2),
            "gb_per_s": round(weights / max(seconds, 1e-9) / 1e9, 3),
            "peak_rss_bytes": max(s["maxrss"] for s in steps),
            "largest_tensor_bytes": largest}


def _backend_step(bench, step: dict, scratch: Path) -> dict:
    spec = {**step, "root": str(bench.root), "model": bench.model_name,
            "part": bench.part.index, "scratch": str(scratch)}
    return run_child_step(bench, "hexbundle.bench.rows.backend:backend_step", spec,
                          f"backend step {step}")


def table(backend: dict, bench, full) -> list:
    return [row_backend(backend)]


def row_backend(backend) -> dict:
    return {"id": 5, "what": f"reference backend, part {backend['part']} ({backend['layers']} "
                             "layers): convert x2 + compile",
            "ours": f"{backend['gb_per_s']:.2f} GB/s fp32 weights",
            "baseline": f"peak RSS {backend['peak_rss_bytes'] / GIB:.2f} GiB",
            "ratio": f"RSS = {backend['peak_rss_bytes'] / backend['largest_tensor_bytes']:.2f}x "
                     "largest tensor",
            "target": "peak RSS < 3 GiB", "met": backend["peak_rss_bytes"] < 3 * GIB,
            "detail": backend}


def backend_step(spec: dict) -> dict:
    """Run in a fresh process by Bench.backend_row: one convert or compile of the part, outputs
    in the scratch directory. Returns its own timing (interpreter start-up excluded)."""
    from hexbundle.backends.registry import get_backend
    from hexbundle.steps.options import compile_options, convert_options
    cfg = load_build(Path(spec["root"]), {"model": spec["model"]})
    layout = Layout(cfg)
    part = cfg.plan.parts()[spec["part"] - 1]
    graphs = cfg.model.graphs(part)
    scratch = Path(spec["scratch"])
    backend = get_backend("reference")
    started = time.monotonic()
    if spec["step"] == "convert":
        graph = next(g for g in graphs if g.slot == spec["graph"])
        out = scratch / dlc_name(graph)
        backend.convert(layout.onnx(graph), layout.encodings(graph), out, graph.name,
                        convert_options(cfg), lambda m: None)
        read = layout.onnx_data(graph).stat().st_size
    else:
        dlcs = [scratch / dlc_name(g) for g in graphs]
        out = scratch / layout.bin_name(part)
        backend.compile(dlcs, out, compile_options(cfg, part), lambda m: None)
        read = sum(p.stat().st_size for p in dlcs)
    seconds = time.monotonic() - started
    return {"step": spec["step"], "graph": spec.get("graph"), "seconds": round(seconds, 6),
            "read_bytes": read, "written_bytes": out.stat().st_size}
