"""Step `compile`: a part's DLCs (prompt + token, per context length) -> one context binary
(weight sharing, packing).

`compile_options` is the one place the device's soc_model / dsp_arch and the compile settings
become backend options; the bundle's runtime config reads the same device (formats.genie).
"""
from __future__ import annotations

from hexbundle.backends import CompileOptions, DeviceOptions, get_backend
from hexbundle.config.build import BuildConfig
from hexbundle.config.layout import Layout
from hexbundle.config.model import Part
from hexbundle.support.errors import HexbundleError


def compile_options(cfg: BuildConfig, part: Part) -> CompileOptions:
    d, htp = cfg.device, cfg.device.htp
    device = DeviceOptions(soc_model=d.soc_model, dsp_arch=d.dsp_arch,
                           perf_profile=htp["perf_profile"],
                           rpc_control_latency=htp["rpc_control_latency"], vtcm_mb=htp["vtcm_mb"])
    return CompileOptions(graph_names=tuple(g.name for g in cfg.model.graphs(part)), device=device,
                          weights_packing=cfg.compile["weights_packing"],
                          weight_sharing=cfg.compile["weight_sharing"],
                          optimization_type=cfg.compile["optimization_type"])


def compile_part(layout: Layout, spec: dict, log) -> None:
    cfg = layout.cfg
    part = cfg.part(spec["part"])
    backend = get_backend(cfg.backend)
    options = compile_options(cfg, part)
    log(f"compile {layout.bin_name(part)}: backend {cfg.backend} ({backend.toolchain_version()}),"
        f" soc_model {options.device.soc_model} {options.device.dsp_arch}, weights_packing "
        f"{options.weights_packing}, weight_sharing {options.weight_sharing}, O="
        f"{options.optimization_type}")
    layout.bin_dir.mkdir(parents=True, exist_ok=True)
    dlcs = [layout.dlc(g) for g in cfg.model.graphs(part)]
    try:
        backend.compile(dlcs, layout.bin(part), options, log)
    except HexbundleError as exc:
        # A refusal here (e.g. a shared weight whose bytes differ between two graphs) is about
        # the user's files, not the DLCs: name the files the DLCs came from (of the graphs it
        # names, when it names some: a part holds a prompt and a token graph per length).
        graphs = cfg.model.graphs(part)
        graphs = [g for g in graphs if f"'{g.name}'" in str(exc)] or graphs
        sources = "; ".join(f"{g.name}: " + ", ".join(str(p) for p in layout.graph_inputs(g))
                            for g in graphs)
        raise type(exc)(f"{exc}\n  the part's graphs were converted from {sources}") from None
    size = layout.bin(part).stat().st_size
    log(f"wrote {layout.rel(layout.bin(part))} ({size / (1 << 20):.2f} MiB)")
