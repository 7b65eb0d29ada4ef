"""Step `compile`: a part's DLCs (prompt + token, per context length) -> one context binary
(weight sharing, packing).

Its options come from steps/options.py (compile_options), which dodo.py keys the task on.
"""
from __future__ import annotations

from hexbundle.backends import get_backend
from hexbundle.config.layout import Layout
from hexbundle.steps.options import compile_options
from hexbundle.steps.outputkey import compile_key
from hexbundle.support.errors import HexbundleError, SharedWeightError


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
        backend.compile(dlcs, layout.bin(part), options, log,
                        made_for=compile_key(layout, spec["part"]))
    except HexbundleError as exc:
        # A refusal here (e.g. a shared weight whose bytes differ between two graphs) is about
        # the user's files, not the DLCs: name the files the DLCs came from (of the graphs it
        # names, when it names some: a part holds a prompt and a token graph per length).
        named = exc.graphs if isinstance(exc, SharedWeightError) else ()
        graphs = cfg.model.graphs(part)
        graphs = [g for g in graphs if g.name in named] or graphs
        sources = "; ".join(f"{g.name}: " + ", ".join(str(p) for p in layout.graph_inputs(g))
                            for g in graphs)
        exc.args = (f"{exc}\n  the part's graphs were converted from {sources}",)
        raise exc from None   # its type and fields kept
    size = layout.bin(part).stat().st_size
    log(f"wrote {layout.rel(layout.bin(part))} ({size / (1 << 20):.2f} MiB)")
