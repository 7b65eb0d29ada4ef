"""Step `convert`: one graph's ONNX + AIMET encodings -> DLC, through the configured backend.

The step receives its description (steps/description.py) and nothing else: its input files (the
ONNX, its data files, the encodings), its output (the DLC) and its options
(config.step_options.ConvertStepOptions: the backend, the graph, the architecture its I/O is
checked against, the pins, the backend's ConvertOptions), the value its key is made of.

The inputs are validated first (inputs/validate.py): the ONNX's structure and its inputs and
outputs against the model config before any backend reads it; the weights' values in the pass
the backend makes over them (reference) or in a streamed pass of their own (qairt, whose SDK
reads the files itself).
"""
from __future__ import annotations

import time
from pathlib import Path

from hexbundle.backends import ConvertOptions
from hexbundle.backends.registry import get_backend
from hexbundle.backends.weightplan import graph_encodings, plan_weights
from hexbundle.config.step_options import ConvertStepOptions
from hexbundle.formats.encodings import require_encodings_file
from hexbundle.formats.onnxfile import initializer_values
from hexbundle.inputs import validate
from hexbundle.inputs.pins import require_pins
from hexbundle.steps.description import Description
from hexbundle.steps.outputkey import output_key
from hexbundle.support import progress


def convert_graph(described: Description, log) -> None:
    o: ConvertStepOptions = described.options
    backend = get_backend(o.backend)
    log(f"convert {o.graph.name}: backend {o.backend} ({backend.toolchain_version()})")
    validate_graph_inputs(described, log, scan_values=not backend.checks_weight_values)
    dlc = described.output("dlc")
    dlc.parent.mkdir(parents=True, exist_ok=True)
    c = o.convert
    log(f"convert options: float_precision {c.float_bitwidth}, truncate_64bit_io "
        f"{c.truncate_64bit_io}, quantize_io {c.quantize_io}, quantize_full_type "
        f"{c.quantize_full_type or '(not passed)'}")
    part_graphs = tuple(zip(described.input_paths("part-onnx"),
                            described.input_paths("part-encodings")))
    backend.convert(described.input("onnx"), described.input("encodings"), dlc, o.graph.name,
                    c, log, made_for=output_key("convert", described.arguments, c,
                                                described.input_paths()),
                    part_graphs=part_graphs)


def validate_graph_inputs(described: Description, log, scan_values: bool = True) -> None:
    """Everything convert refuses of its inputs before a backend reads them: the pins, the
    ONNX's structure and I/O, and (scan_values) every weight's values, streamed. Run before a
    remote cache is asked too (graph/remote_steps.py): a cache that has the step must not let
    a broken input through."""
    o: ConvertStepOptions = described.options
    onnx_path, encodings_path = described.input("onnx"), described.input("encodings")
    require_pins(described.input_paths(), dict(o.pins), o.model_config)
    # before the step's key is made of its bytes (steps/outputkey), in the encodings' own words
    require_encodings_file(encodings_path)
    proto = validate.check_graph(onnx_path, o.architecture, o.graph, Path(o.model_config))
    log(f"{onnx_path.name}: ONNX checked (structure, onnx.checker full check, inputs and "
        f"outputs of {o.graph.name} as {o.model_config} says)")
    if scan_values:
        scan_weight_values(onnx_path, encodings_path, proto, o.convert, log)


def scan_weight_values(onnx_path, encodings_path, proto, options: ConvertOptions, log) -> None:
    """Every weight's values, streamed, before a backend that reads them itself: each stored as
    the reference backend's weight plan says (the size model's decisions too)."""
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
