"""What each build step receives beside its files, computed in one place from the resolved
config: one frozen options value per step.

  inputs (generated parts)  generate_options     inputs (tokenizer)  tokenizer_options
  inputs (local split)      split_options        convert             convert_step_options,
                                                                     convert_inputs
  compile                   compile_step_options bundle              bundle_options
  verify                    verify_options

Every build step receives its description (steps/description.py): its options value
(config.step_options) holds everything it reads besides its files, the backend's own
ConvertOptions / CompileOptions (convert_options, compile_options) among it; its files by
role come from here too (part_outputs, split_inputs, bundle_inputs, bundle_outputs).

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
from hexbundle.config.layout import MANIFEST, Layout
from hexbundle.config.model import Architecture, Graph, Part, Quantization
from hexbundle.config.schema import FrozenMap
from hexbundle.config.step_options import (BundleOptions, CompileStepOptions, ConvertStepOptions,
                                           GenerateOptions, GenieOptions, ManifestRecord,
                                           SplitOptions, TokenizerOptions)


def frozen(table: dict) -> tuple:
    """A table of data (the tokenizer's specials: role -> token) as sorted (key, value) pairs:
    a value whose repr is canonical, whatever order the TOML gave them in."""
    return tuple(sorted(table.items()))


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
    return GenerateOptions(m.name, m.architecture, m.quantization, tuple(m.context_lengths),
                           m.prompt_ar, m.token_ar, tuple(cfg.plan.layers_per_part),
                           cfg.inputs.seed)


def tokenizer_options(cfg: BuildConfig) -> TokenizerOptions:
    return TokenizerOptions(cfg.model.architecture.vocab_size, frozen(cfg.tokenizer_specials))


def split_options(layout: Layout) -> SplitOptions:
    """The local split's options: where it cuts, and the pins of the unsplit files it reads."""
    cfg = layout.cfg
    m = cfg.model
    return SplitOptions(m.architecture, tuple(m.context_lengths), m.prompt_ar, m.token_ar,
                        tuple(cfg.plan.layers_per_part), layout.rel(layout.model_config_path),
                        pins_of(cfg, layout.source_inputs()), cfg.inputs.cut)


def pins_of(cfg: BuildConfig, paths) -> FrozenMap:
    """The model config's [inputs.pins] of these files (by name): what the step checks."""
    pins = cfg.inputs.pins
    return FrozenMap({p.name: pins[p.name] for p in paths if p.name in pins})


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
    return ConvertStepOptions(
        backend=cfg.backend, graph=graph, architecture=cfg.model.architecture,
        model_config=layout.rel(layout.model_config_path),
        pins=pins_of(cfg, layout.graph_inputs(graph)),
        convert=convert_options(cfg))


# backends whose convert derives what a part's graphs share from all of them (ortqnn: the
# activation encodings the export leaves out, backends/ortqnn.derived_activations)
READS_PART_GRAPHS = ("ortqnn",)


def convert_inputs(layout: Layout, graph: Graph, part: Part) -> list:
    """The convert step's files by role: the graph's ONNX, data and encodings; for a backend of
    READS_PART_GRAPHS also the part's other graphs' ("part-onnx", "part-data",
    "part-encodings"), in the model's graph order."""
    files = layout.graph_files(graph)
    out = [("onnx", files.onnx), *(("data", d) for d in files.data),
           ("encodings", files.encodings)]
    if layout.cfg.backend in READS_PART_GRAPHS:
        for other in layout.cfg.model.graphs(part):
            if other.name != graph.name:
                f = layout.graph_files(other)
                out += [("part-onnx", f.onnx), *(("part-data", d) for d in f.data
                                                 if d not in files.data),
                        ("part-encodings", f.encodings)]
    return out


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


def bundle_options(layout: Layout) -> BundleOptions:
    cfg = layout.cfg
    return BundleOptions(backend=cfg.backend, executor=cfg.executor, genie=genie_options(cfg),
                         specials=frozen(cfg.tokenizer_specials), convert=convert_options(cfg),
                         compile=tuple(compile_options(cfg, p) for p in cfg.plan.parts()),
                         model_config=layout.rel(layout.model_config_path),
                         pins=pins_of(cfg, [layout.tokenizer]),
                         manifest=manifest_record(layout),
                         runtime=cfg.runtime, target=cfg.device.os)


def manifest_record(layout: Layout) -> ManifestRecord:
    """What manifest.json records of the build (formats.manifest): names, the [compile]
    settings, and the project-relative names of the files the bundle step digests, in the
    order of its inputs (bundle_inputs)."""
    cfg = layout.cfg
    return ManifestRecord(cfg.model.name, cfg.device.name, cfg.plan.name, cfg.compile,
                          tuple(layout.logical(p) for p in layout.source_inputs()),
                          tuple(layout.logical(p) for p in cfg.config_files),
                          graph_sources(layout))


def graph_sources(layout: Layout) -> FrozenMap:
    """Which files each graph was built from: the export's own file names (a qai-hub-models tree
    is used in place), or the local split's parts and the unsplit graphs they were cut from."""
    cfg, out = layout.cfg, {}
    for part in cfg.plan.parts():
        for graph in cfg.model.graphs(part):
            files = layout.graph_files(graph)
            entry = {"onnx": layout.logical(files.onnx),
                     "data": tuple(layout.logical(d) for d in files.data),
                     "encodings": layout.logical(files.encodings)}
            if layout.splits_locally:
                entry["split_from"] = layout.logical(layout.unsplit_files(graph.slot).onnx)
            out[graph.name] = FrozenMap(entry)
    return FrozenMap(out)


def bundle_inputs(layout: Layout) -> list:
    """The bundle step's inputs by role, in the order ManifestRecord names them: the bins, the
    tokenizer, the graphs' ONNX and encodings in bin order (the size model reads them), the
    user's files it digests into the manifest ("source"), the config files ("config"), then the
    board runtime's files (runtime_inputs)."""
    cfg = layout.cfg
    graphs = [g for p in cfg.plan.parts() for g in cfg.model.graphs(p)]
    return ([("bin", layout.bin(p)) for p in cfg.plan.parts()]
            + [("tokenizer", layout.tokenizer)]
            + [(role, path) for g in graphs
               for role, path in (("onnx", layout.onnx(g)), ("encodings", layout.encodings(g)))]
            + [("source", p) for p in layout.source_inputs()]
            + [("config", p) for p in cfg.config_files]
            + runtime_inputs(cfg))


def runtime_inputs(cfg: BuildConfig) -> list:
    """The files the bundle step takes a board's runtime from, by role ("runtime", and the
    files saying which release they are: "runtime-pins", "runtime-release", "runtime-genie"):
    ortqnn's pinned onnxruntime-qnn wheel of the board's OS and the pin file
    (backends/ortqnn_runtime.runtime_inputs); a local qairt build's SDK files (its runtime
    files, sdk.yaml, the Genie header: backends/qairt_runtime.SdkRuntime). Declared, their
    digests are the step's key and a remote worker gets them; the step reads no other. With the
    docker executor the SDK is the image's: its ID in the key stands for it (graph.keys)."""
    if cfg.backend == "ortqnn":
        from hexbundle.backends.ortqnn_runtime import runtime_inputs as wheel_inputs
        return wheel_inputs(cfg.root, cfg.device.os)
    if cfg.backend == "qairt" and cfg.executor == "local":
        return sdk_inputs(cfg)
    return []


def sdk_inputs(cfg: BuildConfig) -> list:
    """The local SDK's runtime files for the device; none when no SDK is set (the step, through
    the backend, then says how to set one)."""
    from hexbundle.backends.qairt_runtime import SdkRuntime
    from hexbundle.config.toolchain import installed_sdk
    from hexbundle.support.errors import HexbundleError
    try:
        root = installed_sdk().root
    except HexbundleError:
        return []
    return SdkRuntime.at(root, cfg.device.os, cfg.device.dsp_arch).inputs()


def bundle_outputs(layout: Layout) -> list:
    """The bundle's files by role: its manifest (the bundle directory is its folder) and the
    rest."""
    return [("manifest" if p.name == MANIFEST and p.parent == layout.bundle_dir else "file", p)
            for p in layout.bundle_files()]


def verify_options(cfg: BuildConfig) -> VerifyOptions:
    simulated = tuple(compile_options(cfg, part) for part in cfg.plan.parts()) \
        if cfg.backend == "ortqnn" else ()
    return VerifyOptions(cfg.backend, cfg.verify, tuple(cfg.model.context_lengths),
                         cfg.compile.float_bitwidth, simulated)


def by_slot(slots: list, files: dict) -> list:
    """Graph files by role, as the inputs step reads and writes them: "onnx:<slot>" and
    "encodings:<slot>" per graph (Graph.slot), then each data file once ("data")."""
    pairs, data = [], []
    for slot in slots:
        pairs += [(f"onnx:{slot}", files[slot].onnx), (f"encodings:{slot}", files[slot].encodings)]
        data += [d for d in files[slot].data if d not in data]
    return pairs + [("data", d) for d in data]


def part_outputs(layout: Layout, part: Part) -> list:
    """The inputs step's outputs for `part` by role (by_slot): its graphs' files."""
    graphs = layout.cfg.model.graphs(part)
    return by_slot([g.slot for g in graphs], {g.slot: layout.graph_files(g) for g in graphs})


def split_inputs(layout: Layout) -> list:
    """The local split's inputs by role (by_slot): the export's unsplit graphs' files."""
    slots = layout.unsplit_slots()
    return by_slot(slots, {s: layout.unsplit_files(s) for s in slots})


def export_check(layout: Layout) -> dict:
    """What inputs.export.require_export checks of an export (`doit inputs:check`): its files,
    the tokenizer, the graphs whose data files the import recorded, and what its message
    names."""
    cfg = layout.cfg
    graphs = []
    if layout.is_tree:
        graphs = ([layout.unsplit_files(k) for k in layout.unsplit_slots()]
                  if layout.splits_locally else
                  [layout.graph_files(g) for p in cfg.plan.parts() for g in cfg.model.graphs(p)])
    return {"sources": layout.source_inputs(), "tokenizer": layout.tokenizer, "graphs": graphs,
            "specials": dict(cfg.tokenizer_specials),
            "vocab_size": cfg.model.architecture.vocab_size, "model": cfg.model.name,
            "how_to_export": cfg.inputs.how_to_export, "model_config": layout.model_config_path,
            "root": layout.root}
