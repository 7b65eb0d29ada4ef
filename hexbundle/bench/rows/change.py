"""Row 4: one part's weights changed, its rebuild vs the full build."""
from __future__ import annotations

import statistics

from hexbundle.bench.common import CHANGED_BYTES, BenchError, part_weights_of

IDS, NEEDS_BUILD = (4,), True


def measure(bench, full) -> dict:
    """Negate the first MiB of one weight of the part (its .data is shared by both graphs,
    per-channel |max| unchanged so the encodings still fit), rebuild; undo, rebuild."""
    from hexbundle.formats.weightdata import negate_in_place
    name, offset, nbytes = _first_matmul_weight(bench)
    paths = [p for p in bench.layout.part_inputs(bench.part) if p.suffix == ".data"]
    bench.log(f"changing {name} of {bench.part.tag}, rebuilding (and back) ...")
    runs = []
    for _ in range(2):
        for path in paths:
            negate_in_place(path, offset, min(nbytes, CHANGED_BYTES))
        run = bench.doit("bundle")
        runs.append(run)
    expected = {f"convert:{bench.part.tag}_{g.slot}" for g in bench.cfg.model.graphs(bench.part)}
    expected |= {f"compile:{bench.part.tag}", "bundle"}
    for run in runs:
        if set(run.executed) != expected:
            raise BenchError(f"after changing {name}, doit ran {sorted(run.executed)}; "
                             f"expected {sorted(expected)}")
    seconds = statistics.mean(r.seconds for r in runs)
    bundle_step = statistics.mean(r.step_seconds.get("bundle", 0.0) for r in runs)
    budget = full.seconds / len(bench.parts) + bundle_step
    return {"weight": name, "part": bench.part.index, "runs_seconds": [round(r.seconds, 2) for r in runs],
            "seconds": round(seconds, 2), "full_seconds": round(full.seconds, 2),
            "ratio": round(seconds / full.seconds, 3), "parts": len(bench.parts),
            "bundle_step_seconds": round(bundle_step, 2), "budget_seconds": round(budget, 2)}


def _first_matmul_weight(bench) -> tuple:
    from hexbundle.formats.weightdata import plan_layout
    weights = part_weights_of(bench.cfg, bench.part)
    layout = plan_layout({w.name: w.shape for w in weights})
    name = next(w.name for w in weights if w.bitwidth == bench.cfg.model.quantization.decoder_linear_bitwidth
                and w.channels > 1)
    return (name, *layout[name])


def table(change: dict, bench, full) -> list:
    return [row_change(change)]


def row_change(change) -> dict:
    return {"id": 4,
            "what": f"one part's weights changed: rebuild vs full build ({change['parts']} parts)",
            "ours": f"{change['seconds']:.1f} s", "baseline": f"{change['full_seconds']:.1f} s",
            "ratio": f"{change['ratio']:.2f}x",
            "target": f"<= 1/{change['parts']} + bundle step ({change['budget_seconds']:.1f} s)",
            "met": change["seconds"] <= change["budget_seconds"], "detail": change}
