"""The build steps, as run by an executor (in this Python, or in the toolchain container).

Each step is described by a JSON spec: {"stage": ..., "root": ..., "overrides": {...}, ...}.
The step reloads and re-validates the configs itself from the spec, so the container sees exactly
what the host saw. Output goes to stdout, which the executor sends to the step's log file.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

from hexbundle.support import hashing, testhooks
from hexbundle.checks import sizes
from hexbundle.config.build import BuildConfig, load_build
from hexbundle.support.errors import HexbundleError
from hexbundle.inputs.export import check_pins
from hexbundle.config.layout import Layout


def print_log(msg: str) -> None:
    print(msg, flush=True)


def _part(cfg: BuildConfig, index: int):
    return cfg.plan.parts()[index - 1]


def _graph(cfg: BuildConfig, index: int, kind: str):
    return {g.kind: g for g in cfg.model.graphs(_part(cfg, index))}[kind]


def backend_for(cfg: BuildConfig):
    from hexbundle.backends import get_backend
    return get_backend(cfg.backend)


def run_generate(cfg: BuildConfig, layout: Layout, spec: dict, log) -> None:
    from hexbundle.inputs import synthetic as tinygen
    if spec.get("what") == "tokenizer":
        tinygen.generate_tokenizer(cfg.model, layout.tokenizer, cfg.tokenizer_specials)
        log(f"wrote {layout.rel(layout.tokenizer)}")
        return
    from hexbundle.inputs import generate as biggen   # tinygen's files, streamed: full-size models fit in memory too
    part = _part(cfg, spec["part"])
    # Refuse early: the disk must also hold the parts still to be generated after this one.
    others = [p for p in biggen.missing_parts(cfg.model, cfg.plan.parts(), layout.inputs_dir)
              if p.index != part.index]
    pending = sum(biggen.part_disk_bytes(cfg.model, p) for p in others)
    for path in biggen.generate_part(cfg.model, part, layout.inputs_dir, cfg.inputs["seed"],
                                     log, also_needed=pending):
        log(f"wrote {layout.rel(path)} ({path.stat().st_size} bytes)")


def run_convert(cfg: BuildConfig, layout: Layout, spec: dict, log) -> None:
    from hexbundle.backends import ConvertOptions
    graph = _graph(cfg, spec["part"], spec["graph"])
    backend = backend_for(cfg)
    log(f"convert {graph.name}: backend {cfg.backend} ({backend.toolchain_version()})")
    check_pins(layout, layout.graph_inputs(graph))
    layout.dlc_dir.mkdir(parents=True, exist_ok=True)
    backend.convert(layout.onnx(graph), layout.encodings(graph), layout.dlc(graph), graph.name,
                    ConvertOptions(float_bitwidth=cfg.compile["float_bitwidth"]), log)


def compile_options(cfg: BuildConfig, part):
    from hexbundle.backends import CompileOptions, DeviceOptions
    d, htp = cfg.device, cfg.device.htp
    device = DeviceOptions(soc_model=d.soc_model, dsp_arch=d.dsp_arch,
                           perf_profile=htp["perf_profile"],
                           rpc_control_latency=htp["rpc_control_latency"], vtcm_mb=htp["vtcm_mb"])
    return CompileOptions(graph_names=tuple(g.name for g in cfg.model.graphs(part)), device=device,
                          weights_packing=cfg.compile["weights_packing"],
                          weight_sharing=cfg.compile["weight_sharing"],
                          optimization_type=cfg.compile["optimization_type"])


def run_compile(cfg: BuildConfig, layout: Layout, spec: dict, log) -> None:
    part = _part(cfg, spec["part"])
    backend = backend_for(cfg)
    options = compile_options(cfg, part)
    log(f"compile {layout.bin_name(part)}: backend {cfg.backend} ({backend.toolchain_version()}),"
         f" soc_model {options.device.soc_model} {options.device.dsp_arch}, weights_packing "
         f"{options.weights_packing}, weight_sharing {options.weight_sharing}, O="
         f"{options.optimization_type}")
    layout.bin_dir.mkdir(parents=True, exist_ok=True)
    dlcs = [layout.dlc(g) for g in cfg.model.graphs(part)]
    backend.compile(dlcs, layout.bin(part), options, log)
    log(f"wrote {layout.rel(layout.bin(part))} "
         f"({layout.bin(part).stat().st_size / sizes.MIB:.2f} MiB)")


def run_bundle(cfg: BuildConfig, layout: Layout, spec: dict, log) -> None:
    from hexbundle.steps.bundle import assemble, write_build_info
    check_pins(layout, [layout.tokenizer])
    expected = {layout.bin_name(e.part): e.packed
                for e in sizes.expect(cfg.model, cfg.plan, cfg.compile["float_bitwidth"])}
    final = assemble(cfg, layout, backend_for(cfg).toolchain_version(), layout.all_inputs(),
                     expected, log)
    write_build_info(layout, cfg.executor, spec.get("image", ""))   # set by the docker executor
    log(f"bundle ready: {layout.rel(final)}")


STAGES = {"generate": run_generate, "convert": run_convert, "compile": run_compile,
          "bundle": run_bundle}


def run(spec: dict, log=print_log) -> int:
    """Run one step; 0 on success, 1 on a user-facing error, 2 on a bug (with traceback)."""
    root = Path(spec["root"])
    started = time.monotonic()
    try:
        cfg = load_build(root, spec.get("overrides") or {})
        layout = Layout(cfg)
        hashing.use_cache(layout.digest_cache)
        testhooks.set_stage(spec["stage"])
        STAGES[spec["stage"]](cfg, layout, spec, log)
    except HexbundleError as exc:
        log(f"error: {exc}")
        return 1
    except Exception:  # a bug, not bad input: show everything
        log(traceback.format_exc())
        return 2
    log(f"done in {time.monotonic() - started:.2f}s")
    return 0


def main(argv: list) -> int:
    if len(argv) != 1:
        print("usage: stage.py SPEC_JSON", file=sys.stderr)
        return 2
    return run(json.loads(argv[0]))
