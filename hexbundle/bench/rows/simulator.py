"""Row 13: Qualcomm's simulator on the part with the most layers (the 7B shape's 3-layer part):
what `doit verify backend=ortqnn` of that part costs, beside onnxruntime CPU on the same QDQ
graphs, in the same run.

  convert   the part's two graphs through the ortqnn convert (the real doit tasks, backend=ortqnn,
            in the bench tree): their QDQ models;
  compile   one process: what verify compiles for the part (backends/ortqnn_sim.py): its shared
            bin again (`recompiled`) and each graph's own unshared bin (`own_bins`, fresh);
  simulator one process: those own bins run on the simulator through verify's own code
            (checks/simulated.py `simulated_session` and `close_session`, checks/verify.py
            `run_sequence`): CHUNKS prompt chunks, a token run at the end of each (verify's
            prompt-vs-token fork) and STEPS decode steps;
  cpu       one process: the same QDQ models through onnxruntime's CPU (optimizations off, as
            verify's references run), the same seeded sequence.
Each process's peak RSS comes from wait4: the largest of the Python process and the Wine
driver processes it waited for (the compiler's, the simulator's). Per-run times leave out each
graph's first run, which starts its session (the simulator's start is reported apart). The
main outputs of the two are compared in LSB of the part's output encoding.

A whole verify of the part on the simulator runs three sequences (the bundle's, the reference
fed the bundle's input, the reference chained) of `[verify]` prompt_tokens + decode_steps, six
driver starts, the recompile and the own bins. Its time is EXTRAPOLATED from the per-run
figures here (labelled so), not run: at full scale that is tens of minutes (docs/perf-notes.md).
"""
from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import numpy as np

from hexbundle.bench.common import GIB, BenchError, run_child_step

IDS, NEEDS_BUILD = (13,), False
CHUNKS, STEPS = 2, 2     # prompt chunks (the second is timed) and decode steps a run measures
SEED = 0


class Timed:
    """A GraphExecutor that records how long each run of the one it wraps takes."""

    def __init__(self, graph):
        self.graph, self.seconds = graph, []

    def __getattr__(self, name):
        return getattr(self.graph, name)

    def run(self, feeds: dict) -> dict:
        started = time.monotonic()
        out = self.graph.run(feeds)
        self.seconds.append(time.monotonic() - started)
        return out

    def close(self) -> None:
        self.graph.close()


def measure(bench, full) -> dict:
    missing = _kit_missing(bench)
    if missing:
        bench.log(f"simulator row: {missing}: skipped")
        return {"skipped": missing}
    part = bench.part
    bench.log(f"Qualcomm's simulator on {part.tag} ({len(part.layers)} layers) ...")
    convert = bench.doit(*(f"convert:{part.tag}_{g.slot}" for g in bench.cfg.model.graphs(part)),
                         "backend=ortqnn")
    scratch = bench.layout.bench_scratch
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        compiled = _step(bench, "compile", scratch)
        sim = _step(bench, "simulator", scratch)
        cpu = _step(bench, "cpu", scratch)
        lsb = _difference_lsb(scratch, sim["output_scale"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    detail = {"part": part.index, "layers": len(part.layers), "chunks": CHUNKS, "steps": STEPS,
              "convert_seconds": round(sum(convert.step_seconds.values()), 2),
              "converted": bool(convert.executed), "convert_peak_rss_bytes": convert.maxrss,
              "qdq_bytes": compiled["qdq_bytes"], "compile": compiled, "simulator": sim,
              "cpu": cpu,
              "max_difference_lsb": lsb,
              "chunk_ratio": round(sim["chunk_seconds"] / cpu["chunk_seconds"], 2),
              "step_ratio": round(sim["step_seconds"] / cpu["step_seconds"], 2),
              "rss_ratio": round(sim["maxrss"] / cpu["maxrss"], 2)}
    detail["verify_estimate"] = verify_estimate(bench.cfg.verify, compiled, sim, cpu)
    return detail


def _kit_missing(bench) -> str:
    """Why the ortqnn kit cannot run here ('' when it can); under CI=true a BenchError (.ci/run
    provides wine64, mingw-w64 and the wheels)."""
    import os
    from hexbundle.backends.ortqnn_kit import ensure_kit
    from hexbundle.support.errors import BackendError
    try:
        ensure_kit(bench.root)
    except BackendError as exc:
        if os.environ.get("CI") == "true":
            raise BenchError(f"row 13 needs the ortqnn kit: {exc}") from None
        return f"no ortqnn kit ({str(exc).splitlines()[0]})"
    return ""


def _step(bench, step: str, scratch: Path) -> dict:
    spec = {"step": step, "root": str(bench.root), "model": bench.model_name,
            "part": bench.part.index, "scratch": str(scratch), "chunks": CHUNKS, "steps": STEPS}
    return run_child_step(bench, "hexbundle.bench.rows.simulator:run_step", spec,
                          f"simulator row, {step} step")


def _difference_lsb(scratch: Path, scale: float) -> float:
    """The largest difference of the main output, simulator vs CPU, in the output's LSB."""
    a, b = (np.load(scratch / f"{s}.npy") for s in ("simulator", "cpu"))
    return round(float(np.max(np.abs(a.astype(np.float64) - b))) / scale, 1)


def verify_estimate(settings, compiled: dict, sim: dict, cpu: dict) -> dict:
    """What a whole `doit verify backend=ortqnn` of the part would take on the simulator, from
    this run's per-run figures (EXTRAPOLATED, not run): three sequences (the bundle's, the
    reference fed it, the reference chained) of ceil(prompt/AR) chunks, as many forks and
    decode_steps token steps; a start per graph per sequence; the recompile and own bins. The
    CPU's share of verify (two references and the float, same sequence) is left out."""
    chunks = math.ceil(settings.prompt_tokens / sim["ar"])
    steps = chunks + settings.decode_steps
    sequences = 3
    runs = sequences * (chunks * sim["chunk_seconds"] + steps * sim["step_seconds"])
    starts = sequences * (sim["start_seconds"]["prompt"] + sim["start_seconds"]["token"])
    total = compiled["recompile_seconds"] + compiled["own_bins_seconds"] + starts + runs
    return {"extrapolated": True, "prompt_tokens": settings.prompt_tokens,
            "decode_steps": settings.decode_steps, "sequences": sequences,
            "chunks": sequences * chunks, "token_steps": sequences * steps,
            "runs_seconds": round(runs, 1), "starts_seconds": round(starts, 1),
            "seconds": round(total, 1),
            "cpu_same_runs_seconds": round(sequences * (chunks * cpu["chunk_seconds"]
                                                        + steps * cpu["step_seconds"]), 1)}


def table(sim: dict, bench, full) -> list:
    if "skipped" in sim:
        return [{"id": 13, "what": "Qualcomm's simulator on the part with the most layers",
                 "ours": "-", "baseline": "-", "ratio": f"skipped: {sim['skipped']}",
                 "target": "(reported)", "met": None, "detail": sim}]
    k, s, c, e = sim["compile"], sim["simulator"], sim["cpu"], sim["verify_estimate"]
    return [{"id": 13,
             "what": f"Qualcomm's simulator, part {sim['part']} ({sim['layers']} layers): own "
                     "bins, a prompt chunk, a token step (verify's code) vs onnxruntime CPU on "
                     "the same QDQ graphs",
             "ours": f"own bins {k['own_bins_seconds']:.1f} s (recompile "
                     f"{k['recompile_seconds']:.1f} s; peak RSS {k['maxrss'] / GIB:.2f} GiB); "
                     f"chunk {s['chunk_seconds']:.2f} s, step {s['step_seconds']:.2f} s; peak "
                     f"RSS {s['maxrss'] / GIB:.2f} GiB; verify of the part ~{e['seconds']:.0f} s "
                     "(extrapolated)",
             "baseline": f"chunk {c['chunk_seconds']:.2f} s, step {c['step_seconds']:.2f} s; "
                         f"peak RSS {c['maxrss'] / GIB:.2f} GiB",
             "ratio": f"chunk {sim['chunk_ratio']:.2f}x, step {sim['step_ratio']:.2f}x, RSS "
                      f"{sim['rss_ratio']:.2f}x; max {sim['max_difference_lsb']:g} LSB apart",
             "target": "(reported)", "met": None, "detail": sim}]


# ------------------------------------------------------------------ in a process of its own

def run_step(spec: dict) -> dict:
    """Run in a fresh process by _step: the part's graphs on the simulator ("simulator") or on
    onnxruntime's CPU ("cpu"), the same seeded sequence; its main output saved to
    scratch/<step>.npy."""
    from hexbundle.checks.verify import run_sequence
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.runtime.sessions import RopeSettings
    cfg = load_build(Path(spec["root"]), {"model": spec["model"], "backend": "ortqnn"})
    layout = Layout(cfg)
    part = cfg.plan.parts()[spec["part"] - 1]
    scratch = Path(spec["scratch"])
    a = cfg.model.architecture
    rope = RopeSettings(a.rope_theta, a.pos_id_dim, a.rope_scaling)
    graphs = cfg.model.graphs(part)
    result = {"qdq_bytes": sum(layout.dlc(g).stat().st_size for g in graphs)}
    if spec["step"] == "compile":
        return {**result, **_compiled(layout, part, scratch)}
    if spec["step"] == "simulator":
        session, finish = _simulated(layout, part, rope, scratch, result)
    else:
        session, finish = _on_cpu(layout, part, rope), lambda session: None
    session.graphs = {kind: Timed(g) for kind, g in session.graphs.items()}
    ar = session.ar("prompt")
    # the last chunk is cut short where the context would not hold the decode steps after it
    # (qwen2-tiny's 256): a graph run costs the same for any number of valid rows
    n_prompt = min(spec["chunks"] * ar, cfg.model.context_length - spec["steps"])
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((n_prompt + spec["steps"], a.hidden_size)).astype(np.float32)
    try:
        out = run_sequence(session, x, n_prompt)
    finally:
        timed = session.graphs
        session.graphs = {kind: t.graph for kind, t in timed.items()}
        finish_seconds = finish(session)
    np.save(scratch / f"{spec['step']}.npy", np.asarray(out.outputs, np.float32))
    prompt, token = timed["prompt"].seconds, timed["token"].seconds
    return {**result, **(finish_seconds or {}), "ar": ar,
            "prompt_runs": [round(s, 3) for s in prompt],
            "token_runs": [round(s, 3) for s in token],
            # each graph's first run starts its session: the rest are what a run costs
            "chunk_seconds": round(float(np.mean(prompt[1:])), 3),
            "step_seconds": round(float(np.mean(token[1:])), 3)}


def _compiled(layout, part, scratch: Path) -> dict:
    """What verify compiles for the part (checks/simulated.py), in its own process (the
    compiler's peak RSS apart from the simulator's): the shared bin again (`recompiled`), and
    each graph's own bin (`own_bins`, into an empty directory: compiled, not reused)."""
    from hexbundle.backends.ortqnn_sim import own_bins, recompiled
    from hexbundle.steps.options import compile_options
    cfg, log = layout.cfg, lambda line: None
    options = compile_options(cfg, part)
    graphs = cfg.model.graphs(part)
    started = time.monotonic()
    recompiled([layout.dlc(g) for g in graphs], options, scratch / "recompile", log)
    recompile = time.monotonic() - started
    started = time.monotonic()
    own_bins({g.name: layout.dlc(g) for g in graphs}, options, scratch / "simulator", log)
    return {"recompile_seconds": round(recompile, 2),
            "own_bins_seconds": round(time.monotonic() - started, 2),
            "own_bins_bytes": sum(p.stat().st_size
                                  for p in (scratch / "simulator").rglob("*.bin"))}


def _simulated(layout, part, rope, scratch: Path, result: dict) -> tuple:
    """verify's own path (checks/simulated.py): each graph's own bin (the compile step's, found
    in place) served on the simulator."""
    from hexbundle.backends.ortqnn_sim import output_encodings
    from hexbundle.checks.simulated import SimulatedPart, close_session, simulated_session
    from hexbundle.steps.options import compile_options
    cfg, log = layout.cfg, lambda line: None
    sp = SimulatedPart(part, layout.bin(part), compile_options(cfg, part), scratch / "simulator")
    session = simulated_session(sp, layout, rope, cfg.model.context_length, scratch / "sim", log)
    main = session.main_output
    result["output_scale"] = output_encodings(layout.dlc(cfg.model.graphs(part)[0]))[main][
        "scale"][0]

    def finish(session) -> dict:
        starts = {kind: round(g.start_seconds, 2) for kind, g in session.graphs.items()}
        close_session(session, sp)
        return {"start_seconds": starts}
    return session, finish


def _on_cpu(layout, part, rope):
    from hexbundle.runtime.onnx_graph import OnnxGraph
    from hexbundle.runtime.sessions import PartSession
    graphs = {g.kind: OnnxGraph(layout.dlc(g), optimize=False)
              for g in layout.cfg.model.graphs(part)}
    return PartSession("cpu", graphs, rope)
