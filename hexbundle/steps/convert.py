"""Step `convert`: one graph's ONNX + AIMET encodings -> DLC, through the configured backend.

The inputs are validated first (inputs/validate.py): the ONNX's structure and its inputs and
outputs against the model config before any backend reads it; the weights' values in the pass
the backend makes over them (reference) or in a streamed pass of their own (qairt, whose SDK
reads the files itself).
"""
from __future__ import annotations

import time

from hexbundle.backends import ConvertOptions, get_backend
from hexbundle.backends.weightplan import graph_encodings, plan_weights
from hexbundle.config.layout import Layout
from hexbundle.formats.encodings import require_encodings_file
from hexbundle.inputs import validate
from hexbundle.formats.onnxfile import initializer_values
from hexbundle.inputs.export import check_pins
from hexbundle.steps.options import convert_options
from hexbundle.steps.outputkey import convert_key
from hexbundle.support import progress


def convert_graph(layout: Layout, spec: dict, log) -> None:
    cfg = layout.cfg
    graph = cfg.graph(spec["part"], spec["graph"])
    backend = get_backend(cfg.backend)
    log(f"convert {graph.name}: backend {cfg.backend} ({backend.toolchain_version()})")
    options = convert_options(cfg)   # the same value the task's key is made of (dodo.py)
    validate_graph_inputs(layout, graph, options, log,
                          scan_values=not backend.checks_weight_values)
    layout.dlc_dir.mkdir(parents=True, exist_ok=True)
    log(f"convert options: float_precision {options.float_bitwidth}, truncate_64bit_io "
        f"{options.truncate_64bit_io}, quantize_io {options.quantize_io}, quantize_full_type "
        f"{options.quantize_full_type or '(not passed)'}")
    backend.convert(layout.onnx(graph), layout.encodings(graph), layout.dlc(graph), graph.name,
                    options, log, made_for=convert_key(layout, spec["part"], spec["graph"]))


def validate_graph_inputs(layout: Layout, graph, options: ConvertOptions, log,
                          scan_values: bool = True) -> None:
    """Everything convert refuses of its inputs before a backend reads them: the pins, the
    ONNX's structure and I/O, and (scan_values) every weight's values, streamed. Run before a
    remote cache is asked too (graph/remote_steps.py): a cache that has the step must not let
    a broken input through."""
    check_pins(layout, layout.graph_inputs(graph))
    # before the step's key is made of its bytes (steps/outputkey), in the encodings' own words
    require_encodings_file(layout.encodings(graph))
    proto = validate.check_graph(layout, graph)
    log(f"{layout.onnx(graph).name}: ONNX checked (structure, onnx.checker full check, "
        f"inputs and outputs of {graph.name} as {layout.model_config_path.name} says)")
    if scan_values:
        scan_weight_values(layout, graph, proto, options, log)


def validate_before_cache(layout: Layout, spec: dict, log) -> None:
    """validate_graph_inputs of the step's graph, values included (graph/remote_steps.py)."""
    graph = layout.cfg.graph(spec["part"], spec["graph"])
    validate_graph_inputs(layout, graph, convert_options(layout.cfg), log)


def scan_weight_values(layout: Layout, graph, proto, options: ConvertOptions, log) -> None:
    """Every weight's values, streamed, before a backend that reads them itself: each stored as
    the reference backend's weight plan says (the size model's decisions too)."""
    onnx_path, encodings_path = layout.onnx(graph), layout.encodings(graph)
    started = time.monotonic()
    encodings = graph_encodings(proto, onnx_path, encodings_path)
    weights, _ = plan_weights(proto.graph, encodings, onnx_path, encodings_path,
                              options.unencoded_weights)
    stored = {w.name: w.stored_dtype(options.float_bitwidth) for w in weights}
    total = sum(initializer_values(i, onnx_path).nbytes for i in proto.graph.initializer
                if i.name in stored)
    with progress.meter(f"{onnx_path.stem} weight values", total):
        read = validate.check_weight_values(onnx_path, proto, stored)
    log(f"weight values checked: {len(stored)} weights, {read / 2**20:.1f} MiB read in "
        f"{time.monotonic() - started:.2f}s (no NaN, no infinity, float16 weights in range)")
