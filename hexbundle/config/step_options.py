"""The typed options of the steps that receive their description (steps/description.py): what
the step's code reads besides its declared files, all of it, so the step key (which is made of
this value) covers everything the step reads.

Here in config, beside the backend's own options (config.backend_options), so the one reader
and writer of typed config values (config.resolved) carries them into the step runner: in this
process, the toolchain container or a remote worker.
"""
from __future__ import annotations

from dataclasses import dataclass

from hexbundle.config.backend_options import CompileOptions, ConvertOptions
from hexbundle.config.model import Architecture, Graph
from hexbundle.config.schema import FrozenMap


@dataclass(frozen=True)
class ConvertStepOptions:
    """The convert step: the backend that converts, the graph (its name, kind, AR, context
    length and part: what its ONNX's inputs and outputs must be, with the architecture), the
    pins of its inputs, the model config's name (its messages name it) and the backend's own
    options."""
    backend: str
    graph: Graph
    architecture: Architecture
    model_config: str                 # e.g. "configs/models/qwen2-tiny.toml": named, not read
    pins: FrozenMap                   # input file name -> "sha256:..." | "xxh3_128:..."
    convert: ConvertOptions


@dataclass(frozen=True)
class CompileStepOptions:
    """The compile step: the backend that compiles, the backend's own options, and what its
    refusal names (the files each graph's DLC was converted from, as the model config gives
    them: the user's files, not the DLCs)."""
    backend: str
    compile: CompileOptions
    graph_sources: tuple              # (graph name, (source file, ...)) in bin order, each
                                      # relative to the inputs directory (steps.options)


@dataclass(frozen=True)
class CheckStepOptions:
    """The check of a cache hit's outputs (steps/check.py): which step made them, that step's
    options (its output key is computed again from them and its inputs) and whether the exact
    checks run too (remote_cache_trust = "verify")."""
    of: str                           # "convert" | "compile"
    checked: object                   # its ConvertStepOptions | CompileStepOptions
    verify: bool
