"""What a backend's convert and compile are given: ConvertOptions and CompileOptions (with the
device's meaning, config.devices.DeviceOptions), frozen values computed once from the resolved
config (steps.options) and part of each step's key.

Here in config, not in backends/, so a step that only names these values (steps.options, which
the inputs step imports too) does not reach the backends package, whose code is in the key of
the steps that run it (graph.codekey) and of no other.
"""
from __future__ import annotations

from dataclasses import dataclass

from hexbundle.config.devices import DeviceOptions


@dataclass(frozen=True)
class ConvertOptions:
    float_bitwidth: int = 16          # params left in float: 16 -> float16, 32 -> float32
    unencoded_weights: str = "refuse" # a layer weight without an encoding: refuse | int8 | float
    # Qualcomm's LLM compile options (qai-hub-models), by [compile]'s names (config.build)
    truncate_64bit_io: bool = True    # int64 graph I/O (input_ids) as int32
    quantize_io: bool = False         # graph I/O quantized rather than float
    quantize_full_type: str = ""      # e.g. "w8a16": weights/activations without encodings


@dataclass(frozen=True)
class CompileOptions:
    graph_names: tuple                # the part's graphs in bin order (config.model.part_graphs)
    device: DeviceOptions
    weights_packing: bool = True      # off: every 4-bit value takes a byte (~2x)
    weight_sharing: bool = True       # off: every graph gets its own weight copy (~2x)
    optimization_type: int = 3


__all__ = ["CompileOptions", "ConvertOptions", "DeviceOptions"]
