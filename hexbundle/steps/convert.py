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
    backend.convert(layout.onnx(graph), layout.encodings(graph), layout.dlc(graph), graph.name,
                    ConvertOptions(float_bitwidth=cfg.compile["float_bitwidth"],
                                   unencoded_weights=cfg.model.quantization.unencoded_weights), log)
