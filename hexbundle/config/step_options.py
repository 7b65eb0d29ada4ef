"""The typed options of the steps that receive their description (steps/description.py): what
the step's code reads besides its declared files, all of it, so the step key (which is made of
this value) covers everything the step reads.

Here in config, beside the backend's own options (config.backend_options), so the one reader
and writer of typed config values (config.resolved) carries them into the step runner: in this
process, the toolchain container or a remote worker.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hexbundle.config.backend_options import CompileOptions, ConvertOptions
from hexbundle.config.build import CompileSettings, DialogSettings
from hexbundle.config.devices import DeviceOptions, RuntimeSettings
from hexbundle.config.model import Architecture, Graph, Quantization, RopeScaling
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


@dataclass(frozen=True)
class GenerateOptions:
    """The inputs step of a generated model's part: every tensor's shape and encoding follow
    from these (the step rebuilds the model's graphs from them, nothing from a config)."""
    model_name: str                   # named in its messages (the disk check's)
    architecture: Architecture
    quantization: Quantization
    context_lengths: tuple
    prompt_ar: int
    token_ar: int
    layers_per_part: tuple
    seed: int


@dataclass(frozen=True)
class TokenizerOptions:
    """The generated tokenizer: its vocabulary size and the special tokens it must map."""
    vocab_size: int
    specials: tuple                   # (role, token) pairs, sorted


@dataclass(frozen=True)
class SplitOptions:
    """Where the local split cuts an export's unsplit graphs, and what it names the parts; the
    pins of the unsplit files and the model config that pins them (named in its messages)."""
    architecture: Architecture
    context_lengths: tuple
    prompt_ar: int
    token_ar: int
    layers_per_part: tuple
    model_config: str                 # e.g. "configs/models/NAME.toml": named, not read
    pins: FrozenMap                   # input file name -> "sha256:..." | "xxh3_128:..."
    cut: str = "names"


@dataclass(frozen=True)
class GenieOptions:
    """What the two Genie configs say besides the token ids and the bins' names (formats.genie
    writes them; steps/options.py genie_options computes it from the resolved config)."""
    device: DeviceOptions        # the same soc_model / dsp_arch / HTP settings as the compile
    cores: tuple
    mem_type: str
    weight_sharing: bool
    runtime: RuntimeSettings     # the device's [runtime] settings
    settings: DialogSettings     # the model's [genie] settings
    context_size: int            # the largest context length
    n_vocab: int
    head_dim: int
    pos_id_dim: int
    rope_theta: float
    rope_scaling: Optional[RopeScaling] = None
    device_id: int = 0           # which NPU (htp_backend_ext_config devices[].device_id)


@dataclass(frozen=True)
class ManifestRecord:
    """What manifest.json records of the build besides the bundle's files (formats.manifest):
    the names of the model, device and plan, the [compile] settings, and the project-relative
    names of the files the bundle step digests (its "source" and "config" inputs, in their
    order) and of each graph's sources."""
    model: str
    device: str
    plan: str
    compile: CompileSettings
    sources: tuple                    # logical names of the "source" inputs, in order
    configs: tuple                    # logical names of the "config" inputs, in order
    graphs: FrozenMap                 # graph name -> FrozenMap(onnx, data, encodings[, split_from])


@dataclass(frozen=True)
class BundleOptions:
    """The bundle step: the Genie configs' settings, the tokenizer's specials and pin, what the
    size check judges by (every step's options that shape a bin), and what the manifest
    records."""
    backend: str
    executor: str
    genie: GenieOptions
    specials: tuple                   # (role, token) pairs, sorted
    convert: ConvertOptions           # the size model: float and unencoded weights' storage
    compile: tuple                    # CompileOptions per part: packing, sharing, device
    model_config: str                 # named when the tokenizer's pin refuses it
    pins: FrozenMap                   # the tokenizer's pin, if the model config has one
    manifest: ManifestRecord
    runtime: str = "bundled"          # qairt: the SDK's runtime in the bundle, or the board's
    target: str = ""                  # the board OS (config/runtime_files.TARGETS)
