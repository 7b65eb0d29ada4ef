"""What each build step receives beside its files, computed in one place from the resolved
config: one frozen options value per step.

  inputs (generated parts)  generate_options     inputs (tokenizer)  tokenizer_options
  inputs (local split)      split_options        convert             convert_step_options
  compile                   compile_step_options bundle              bundle_options
  verify                    verify_options

convert and compile receive their description (steps/description.py): their options value
(config.step_options) holds everything they read besides their files, the backend's own
ConvertOptions / CompileOptions (convert_options, compile_options) among it.

The step's code uses exactly this value, and dodo.py keys the step's task on the same value
(`step_key`: its canonical text; the remote cache's Action options are that key's values,
graph/remote_steps.py). dodo.py lists no settings: a setting a step reads cannot be missing from
its key, since there is no second list of them. The device's meaning (soc_model, dsp_arch, HTP
settings) is computed once, by config.devices.Device.options.
Kept free of heavy imports: dodo.py imports it to declare the tasks.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hexbundle.config.backend_options import CompileOptions, ConvertOptions
from hexbundle.config.build import BuildConfig, VerifySettings
from hexbundle.config.layout import Layout
from hexbundle.config.model import Architecture, Graph, Part, Quantization
from hexbundle.config.schema import FrozenMap
from hexbundle.config.step_options import CompileStepOptions, ConvertStepOptions
from hexbundle.formats.genie import GenieOptions


def frozen(table: dict) -> tuple:
    """A table of data (the tokenizer's specials: role -> token) as sorted (key, value) pairs:
    a value whose repr is canonical, whatever order the TOML gave them in."""
    return tuple(sorted(table.items()))


@dataclass(frozen=True)
class GenerateOptions:
    """A generated model's parts: every tensor's shape and encoding follow from these."""
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
    """Where the local split cuts an export's unsplit graphs, and what it names the parts."""
    architecture: Architecture
    context_lengths: tuple
    prompt_ar: int
    token_ar: int
    layers_per_part: tuple
    cut: str = "names"


@dataclass(frozen=True)
class BundleOptions:
    """The bundle step: the Genie configs' settings, the tokenizer's specials, what the size
    check judges by (every step's options that shape a bin), and what the manifest records."""
    backend: str
    executor: str
    genie: GenieOptions
    specials: tuple                   # (role, token) pairs, sorted
    convert: ConvertOptions           # the size model: float and unencoded weights' storage
    compile: tuple                    # CompileOptions per part: packing, sharing, device
    runtime: str = "bundled"          # qairt: the SDK's runtime in the bundle, or the board's
    target: str = ""                  # the board OS (config/runtime_files.TARGETS)


@dataclass(frozen=True)
class VerifyOptions:
    """`doit verify`: the backend whose bins it runs, its thresholds and token counts."""
    backend: str
    settings: VerifySettings          # the model's [verify] table
    context_lengths: tuple
    float_bitwidth: int = 32          # how the build stores float weights (the reference too)
    # backend ortqnn: each part's CompileOptions, in part order (verify recompiles each bin and
    # compiles each graph's own bin for the simulator: checks/simulated.py); () otherwise
    compile: tuple = ()


def generate_options(cfg: BuildConfig) -> GenerateOptions:
    m = cfg.model
    return GenerateOptions(m.architecture, m.quantization, tuple(m.context_lengths), m.prompt_ar,
                           m.token_ar, tuple(cfg.plan.layers_per_part), cfg.inputs.seed)


def tokenizer_options(cfg: BuildConfig) -> TokenizerOptions:
    return TokenizerOptions(cfg.model.architecture.vocab_size, frozen(cfg.tokenizer_specials))


def split_options(cfg: BuildConfig) -> SplitOptions:
    m = cfg.model
    return SplitOptions(m.architecture, tuple(m.context_lengths), m.prompt_ar, m.token_ar,
                        tuple(cfg.plan.layers_per_part), cfg.inputs.cut)


def convert_options(cfg: BuildConfig) -> ConvertOptions:
    """The convert step's options: the [compile] settings convert reads and the model's
    treatment of weights that have no encoding."""
    c = cfg.compile
    return ConvertOptions(float_bitwidth=c.float_bitwidth,
                          unencoded_weights=cfg.model.quantization.unencoded_weights,
                          truncate_64bit_io=c.truncate_64bit_io, quantize_io=c.quantize_io,
                          quantize_full_type=c.quantize_full_type)


def compile_options(cfg: BuildConfig, part: Part) -> CompileOptions:
    """The compile step's options for a part: its graphs in bin order, the device (the bundle's
    runtime config reads the same Device.options) and the [compile] settings."""
    return CompileOptions(graph_names=tuple(g.name for g in cfg.model.graphs(part)),
                          device=cfg.device.options,
                          weights_packing=cfg.compile.weights_packing,
                          weight_sharing=cfg.compile.weight_sharing,
                          optimization_type=cfg.compile.optimization_type)


def convert_step_options(layout: Layout, graph: Graph) -> ConvertStepOptions:
    """All the convert step of `graph` reads besides its files: the backend, the graph and the
    architecture (what its ONNX's I/O must be), the pins of its inputs, the model config's
    project-relative name (its messages name it) and the backend's ConvertOptions."""
    cfg = layout.cfg
    pins = cfg.inputs.pins
    return ConvertStepOptions(
        backend=cfg.backend, graph=graph, architecture=cfg.model.architecture,
        model_config=layout.rel(layout.model_config_path),
        pins=FrozenMap({p.name: pins[p.name] for p in layout.graph_inputs(graph)
                        if p.name in pins}),
        convert=convert_options(cfg))


def compile_step_options(layout: Layout, part: Part) -> CompileStepOptions:
    """All the compile step of `part` reads besides its DLCs: the backend, its CompileOptions
    and the files each graph was converted from (named when the compile refuses them)."""
    cfg = layout.cfg
    sources = tuple((g.name, tuple(source_name(layout, p) for p in layout.graph_inputs(g)))
                    for g in cfg.model.graphs(part))
    return CompileStepOptions(backend=cfg.backend, compile=compile_options(cfg, part),
                              graph_sources=sources)


def source_name(layout: Layout, path) -> str:
    """A graph's input file as a message names it and a key may hold it: relative to the
    model's inputs directory (the export's), the build root or the project; the same on every
    machine, so the step's key and remote Action are too (no absolute path)."""
    for base in (layout.inputs_dir, layout.build_root, layout.root):
        try:
            return str(Path(path).relative_to(base))
        except ValueError:
            continue
    return Path(path).name


def genie_options(cfg: BuildConfig) -> GenieOptions:
    """What genie_config.json and htp_backend_ext_config.json say besides the token ids and
    the bins' names (formats.genie)."""
    a, htp = cfg.model.architecture, cfg.device.htp
    return GenieOptions(device=cfg.device.options, cores=htp.cores, mem_type=htp.mem_type,
                        weight_sharing=cfg.compile.weight_sharing, runtime=cfg.device.runtime,
                        settings=cfg.genie,
                        context_size=cfg.model.context_length, n_vocab=a.vocab_size,
                        head_dim=a.head_dim, pos_id_dim=a.pos_id_dim, rope_theta=a.rope_theta,
                        rope_scaling=a.rope_scaling, device_id=htp.device_id)


def bundle_options(cfg: BuildConfig) -> BundleOptions:
    return BundleOptions(backend=cfg.backend, executor=cfg.executor, genie=genie_options(cfg),
                         specials=frozen(cfg.tokenizer_specials), convert=convert_options(cfg),
                         compile=tuple(compile_options(cfg, p) for p in cfg.plan.parts()),
                         runtime=cfg.runtime, target=cfg.device.os)


def verify_options(cfg: BuildConfig) -> VerifyOptions:
    simulated = tuple(compile_options(cfg, part) for part in cfg.plan.parts()) \
        if cfg.backend == "ortqnn" else ()
    return VerifyOptions(cfg.backend, cfg.verify, tuple(cfg.model.context_lengths),
                         cfg.compile.float_bitwidth, simulated)
