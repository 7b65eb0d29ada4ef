"""Step `convert`: one graph's ONNX + AIMET encodings -> DLC, through the configured backend."""
from __future__ import annotations

from hexbundle.backends import ConvertOptions, get_backend
from hexbundle.config.layout import Layout
from hexbundle.inputs.export import check_pins


def convert_graph(layout: Layout, spec: dict, log) -> None:
    cfg = layout.cfg
    graph = cfg.graph(spec["part"], spec["graph"])
    backend = get_backend(cfg.backend)
    log(f"convert {graph.name}: backend {cfg.backend} ({backend.toolchain_version()})")
    check_pins(layout, layout.graph_inputs(graph))
    layout.dlc_dir.mkdir(parents=True, exist_ok=True)
    c = cfg.compile
    options = ConvertOptions(float_bitwidth=c["float_bitwidth"],
                             unencoded_weights=cfg.model.quantization.unencoded_weights,
                             truncate_64bit_io=c["truncate_64bit_io"],
                             quantize_io=c["quantize_io"],
                             quantize_full_type=c["quantize_full_type"])
    log(f"convert options: float_precision {options.float_bitwidth}, truncate_64bit_io "
        f"{options.truncate_64bit_io}, quantize_io {options.quantize_io}, quantize_full_type "
        f"{options.quantize_full_type or '(not passed)'}")
    backend.convert(layout.onnx(graph), layout.encodings(graph), layout.dlc(graph), graph.name,
                    options, log)
