"""Step `compile`: a part's DLCs (prompt + token, per context length) -> one context binary
(weight sharing, packing).

The step receives its description (steps/description.py) and nothing else: its DLCs in bin
order, its output (the bin) and its options (config.step_options.CompileStepOptions: the backend,
the backend's CompileOptions, the files each graph was converted from, for its messages).
"""
from __future__ import annotations

from hexbundle.backends.registry import get_backend
from hexbundle.config.step_options import CompileStepOptions
from hexbundle.steps.description import Description
from hexbundle.steps.outputkey import output_key
from hexbundle.support.errors import HexbundleError, SharedWeightError


def compile_part(described: Description, log) -> None:
    o: CompileStepOptions = described.options
    options, binary = o.compile, described.output("bin")
    backend = get_backend(o.backend)
    log(f"compile {binary.name}: backend {o.backend} ({backend.toolchain_version()}),"
        f" soc_model {options.device.soc_model} {options.device.dsp_arch}, weights_packing "
        f"{options.weights_packing}, weight_sharing {options.weight_sharing}, O="
        f"{options.optimization_type}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    dlcs = described.input_paths("dlc")
    try:
        backend.compile(dlcs, binary, options, log,
                        made_for=output_key("compile", described.arguments, options, dlcs))
    except HexbundleError as exc:
        # A refusal here (e.g. a shared weight whose bytes differ between two graphs) is about
        # the user's files, not the DLCs: name the files the DLCs came from (of the graphs it
        # names, when it names some: a part holds a prompt and a token graph per length).
        named = exc.graphs if isinstance(exc, SharedWeightError) else ()
        graphs = [(g, files) for g, files in o.graph_sources if g in named] or o.graph_sources
        sources = "; ".join(f"{g}: " + ", ".join(files) for g, files in graphs)
        exc.args = (f"{exc}\n  the part's graphs were converted from {sources}",)
        raise exc from None   # its type and fields kept
    size = binary.stat().st_size
    log(f"wrote {binary} ({size / (1 << 20):.2f} MiB)")
