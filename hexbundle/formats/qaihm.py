"""qai-hub-models export trees: what Qualcomm's export code writes, read as it comes.

One module owns this format: the directory layouts (constants below), the scan of a tree and the
external-data files an ONNX records. Nothing here renames, moves or edits a file of the export.

Layouts (<slug> the model's file-name stem, e.g. qwen2_5_7b_instruct; N parts):
  tree      qai-hub-models 0.52-0.55 `--onnx-export-dir DIR`:
              DIR/ar<S>_cl<C>/<slug>_<precision>_ar<S>_cl<C>_<i>_of_<N>.aimet/<same>.{onnx,data,encodings}
              DIR/ar<S>_cl<C>/<slug>.{onnx,data,encodings}          the unsplit graph of that AR
                (the 7B class, which copies its asset), or
              DIR/ar<S>_cl<C>/<ClassName>.aimet/model.{onnx,data,encodings}   (the generic
                LLM_AIMETOnnx path: models/_shared/llm/model.py writes it, e.g. qwen3_4b)
            one ar<S>_cl<C>/ per (AR, context length): a model exported at several context
            lengths has a prompt and a token directory for each
  tree-0.46 qai-hub-models 0.46 and older:
              DIR/prompt/<slug>_prompt_<i>_of_<N>.aimet/<same>.{onnx,data,encodings}, DIR/token/...
  asset     Qualcomm's pre-quantized asset: DIR/<slug>_ar<S>.onnx (one per AR), ONE shared
              DIR/<slug>.data and ONE DIR/<slug>.encodings
  checkpoint  qai-hub-models 0.57-0.65 quantize checkpoint (`python -m
              qai_hub_models.models.<id>.quantize --output-dir DIR`): DIR/model_dynamic.onnx
              (symbolic sequence and context dims) + DIR/model.encodings + DIR/config.json
              [+ DIR/model.data when the model is >= 2 GiB] [+ DIR/args.json] + tokenizer files;
              the one dynamic graph serves every (AR, context length), pinned per graph
  static checkpoint  qai-hub-models 0.55's quantize, and 0.56's for its non-PreSplit models
              (falcon_v3_7b, llama_v3_1_8b, llama_v3_8b and fine-tunes, qwen3_4b: the static
              `Model` class, use_dynamic_shapes off by default; its Llama 3.2 ones are dynamic):
              DIR/model_seqlen<S>_cl<C>.onnx per sequence length (128
              and 1, the export's, and the calibration's), all recording ONE DIR/model.data,
              + DIR/model.encodings + config.json; fixed shapes, one context length. No release
              0.57-0.59 writes it (each text LLM's quantize module passes a dynamic PreSplit
              class; 0.59's quantize() asserts it)
A tokenizer.json, when the user put one there, sits at DIR's top level.

The .data of a graph is what its ONNX records (every external initializer's `location`,
relative to the ONNX's directory), never a guess from the file name: renaming a .data breaks the
ONNX, and that is reported naming the ONNX and the location it records.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hexbundle.config.layout import GraphInputs
from hexbundle.support.errors import InputError
from hexbundle.support.files import JSON_CONFIG_MAX_BYTES, read_named_text, require_regular_file

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
AR_DIR = re.compile(r"ar(?P<ar>\d+)_cl(?P<cl>\d+)")
KIND_DIRS = ("prompt", "token")                     # tree-0.46
PART_DIR = re.compile(r"(?P<stem>.+)_(?P<index>\d+)_of_(?P<count>\d+)\.aimet")
ASSET_ONNX = re.compile(r"(?P<slug>.+)_ar(?P<ar>\d+)\.onnx")
# <slug>_<precision>[_<checkpoint>]_ar<S>_cl<C>: export_main adds the stem of a --checkpoint
# other than the default to the model name (qai-hub-models 0.55 utils/args.py)
PRECISION = re.compile(r"_(?P<precision>w\d+a\d+)(?:_.+?)?_ar\d+_cl\d+$")
UNSPLIT_AIMET = "model.onnx"    # <ClassName>.aimet/model.onnx: the generic path's unsplit graph
# Not in an export's files: the Qwen2 family's values (Qwen2.5's config.json), which an import
# (inputs/import_export.py) prints as assumptions.
# qai-hub-models' text LLMs with an --onnx-export-dir tree (0.52-0.56; from 0.57 no release
# writes one): each model's file-name stem (slug), the class whose name the generic path gives
# the unsplit graph's directory (<ClassName>.aimet/model.onnx), and its own split (its model.py's
# NUM_SPLITS, NUM_LAYERS_PER_SPLIT; part 1 the embedding alone). Llama3_2_1B_AIMETOnnx: 0.52 and
# 0.54 (a precompiled collection from 0.55).
QAIHM_LLMS = {
    "qwen2_5_7b_instruct": ("Qwen2_5_7B_Instruct", 6, 6),
    "qwen3_4b": ("Qwen3_4B_AIMETOnnx", 4, 12),
    "qwen3_4b_instruct_2507": ("Qwen3_4B_Instruct_2507_AIMETOnnx", 4, 12),
    "llama_v3_2_1b_instruct": ("Llama3_2_1B_AIMETOnnx", 3, 8),
    "llama_v3_2_3b_instruct": ("Llama3_2_3B_AIMETOnnx", 3, 14),
    "llama_v3_1_8b_instruct": ("Llama3_1_8B_AIMETOnnx", 5, 9),
    "llama_v3_8b_instruct": ("Llama3_8B_AIMETOnnx", 5, 9),
    "falcon_v3_7b_instruct": ("Falcon3_7B_AIMETOnnx", 5, 8),
}
SLUG_OF_CLASS = {cls: slug for slug, (cls, _, _) in QAIHM_LLMS.items()}

# A quantize checkpoint's files (templates/llm/quantize.py in 0.62+, _shared/llm before)
CKPT_GRAPH, CKPT_DATA, CKPT_ENCODINGS = "model_dynamic.onnx", "model.data", "model.encodings"
CKPT_CONFIG, CKPT_ARGS = "config.json", "args.json"
CKPT_PROMPT_AR, CKPT_TOKEN_AR = 128, 1   # the compile's input specs: AR 128 prompt, AR 1 token
CKPT_STATIC = re.compile(r"model_seqlen(?P<ar>\d+)_cl(?P<cl>\d+)\.onnx")   # 0.55's static graphs
DEFAULT_CONTEXT_LENGTH = 4096            # templates/llm/model.py DEFAULT_EXPORT_CONTEXT_LENGTHS


@dataclass(frozen=True)
class CheckpointModel:
    """A qai-hub-models 0.65 model whose quantize code writes a checkpoint: the config.json
    sizes that identify the stock model, and its module's split and export context lengths."""

    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_splits: int              # the module's NUM_SPLITS (embedding part included)
    layers_per_split: int        # its NUM_LAYERS_PER_SPLIT
    context_lengths: tuple = (DEFAULT_CONTEXT_LENGTH,)


# Local quantize code exists for these only (every release 0.57-0.65); Phi, Granite, Mistral and
# Qwen2 have none. Regional Llama 3 fine-tunes share llama_v3_8b_instruct's constants.
QAIHM_CHECKPOINT_MODELS = {
    "qwen3_0_6b": CheckpointModel("qwen3", 28, 1024, 151936, 2, 28, (512, 1024, 4096)),
    "qwen3_1_7b": CheckpointModel("qwen3", 28, 2048, 151936, 4, 10),
    "qwen3_4b": CheckpointModel("qwen3", 36, 2560, 151936, 4, 12),
    "qwen3_4b_instruct_2507": CheckpointModel("qwen3", 36, 2560, 151936, 4, 12),
    "qwen3_8b": CheckpointModel("qwen3", 36, 4096, 151936, 5, 9),
    "llama_v3_2_1b_instruct": CheckpointModel("llama", 16, 2048, 128256, 3, 8),
    "llama_v3_2_3b_instruct": CheckpointModel("llama", 28, 3072, 128256, 3, 14),
    "llama_v3_1_8b_instruct": CheckpointModel("llama", 32, 4096, 128256, 5, 9),
    "llama_v3_8b_instruct": CheckpointModel("llama", 32, 4096, 128256, 5, 9),
    "falcon_v3_7b_instruct": CheckpointModel("llama", 28, 3072, 131072, 5, 8),
    "smollm2_1_7b_it": CheckpointModel("llama", 24, 2048, 49152, 3, 12),
}
# config.json's model_type / architectures a checkpoint may have (Falcon 3 and SmolLM2 are
# LlamaForCausalLM), and those refused by name: not conventional decoders
CKPT_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
CKPT_REFUSED = {
    "gemma4": "Gemma 4 is not a conventional decoder (inputs_embeds and per-layer inputs, "
              "sliding and full attention with two masks and RoPE tables, KV-shared layers)",
    "qwen3_5": "Qwen3.5 is a hybrid-attention model (linear and full attention layers)",
    "qwen3_next": "Qwen3-Next is a hybrid-attention model (linear and full attention layers)",
}
CKPT_VLM = "a vision-language model (its config.json nests the language model's settings under "\
           "text_config): its graph takes image embeddings, not a conventional decoder's inputs"


def qaihm_split_layers(num_layers: int, num_splits: int, per: int, where: str) -> tuple:
    """Decoder layers per part as qai-hub-models 0.65's split_onnx cuts them (split_embedding,
    no split_lm_head): part 1 the embedding, then blocks of NUM_LAYERS_PER_SPLIT, or of
    ceil(layers / (NUM_SPLITS - 1)) when that does not make NUM_SPLITS - 1 blocks (its
    "Overwriting with" warning); the cut count must then be NUM_SPLITS - 1, as it asserts."""
    blocks = num_splits - 1
    if blocks < 1:
        raise InputError(f"{where}: NUM_SPLITS {num_splits} leaves no decoder block")
    if blocks != -(-num_layers // per):
        per = -(-num_layers // blocks)
    groups = tuple(min(per, num_layers - start) for start in range(0, num_layers, per))
    if len(groups) != blocks:
        raise InputError(f"{where}: qai-hub-models cannot split {num_layers} layers into "
                         f"{num_splits} parts (its split_onnx raises 'Expected {num_splits - 1} "
                         f"split points'); give --plan 0,... to split otherwise")
    return (0, *groups)


def qaihm_split(slug: str, num_layers: int) -> Optional[tuple]:
    """Decoder layers per part as qai-hub-models splits `slug` (None: not one of QAIHM_LLMS).
    Its rule (split_onnx_utils.utils, 0.55): the layers in groups of NUM_LAYERS_PER_SPLIT after
    the embedding's part, unless that does not give exactly NUM_SPLITS - 1 groups; then groups of
    ceil(layers / (NUM_SPLITS - 1)) (its "Overwriting with" warning)."""
    if slug not in QAIHM_LLMS:
        return None
    _, splits, per = QAIHM_LLMS[slug]
    blocks = splits - 1
    if blocks != -(-num_layers // per):
        per = -(-num_layers // blocks)
    groups = [min(per, num_layers - start) for start in range(0, num_layers, per)]
    return (0, *groups)


QWEN2_ROPE_THETA = 1000000.0
QWEN2_RMS_NORM_EPS = 1e-6
QWEN2_SPECIALS = {"bos": "<|im_start|>", "eos": "<|im_end|>", "eot": "<|endoftext|>"}


@dataclass(frozen=True)
class GraphIO:
    """A graph's inputs and outputs: name -> (numpy dtype name, shape); dims unknown are 0."""

    inputs: dict
    outputs: dict

    def sequence_and_context(self, where: Path) -> tuple:
        """(AR, context length) from input_ids / the hidden input and attention_mask."""
        mask = self.inputs.get("attention_mask")
        if mask is None or len(mask[1]) != 4:
            raise InputError(f"{where}: no 4-D input 'attention_mask' (1, 1, AR, context); "
                             "this is not a qai-hub-models LLM graph")
        return mask[1][2], mask[1][3]


@dataclass
class ExportTree:
    """What a scan found, keyed by (AR, context length): parts[(ar, cl)] = {index: GraphInputs};
    unsplit[(ar, cl)] = GraphInputs (each graph's ONNX, the data files it records, its
    encodings)."""

    root: Path
    layout: str
    slug: str
    precision: str = ""
    part_count: int = 0
    parts: dict = field(default_factory=dict)
    unsplit: dict = field(default_factory=dict)
    tokenizer: Optional[Path] = None
    problems: list = field(default_factory=list)    # what is missing or inconsistent
    dynamic: bool = False    # a checkpoint: one dynamic graph for every (AR, context length)
    checkpoint: bool = False  # a quantize checkpoint (dynamic, or 0.55's static graphs)
    release: str = ""        # a checkpoint: which qai-hub-models releases write what was read

    @property
    def keys(self) -> list:
        """(AR, context length) of every graph found, AR descending, then length ascending."""
        return sorted(set(self.parts) | set(self.unsplit), key=lambda k: (-k[0], k[1]))

    @property
    def ars(self) -> list:
        return sorted({ar for ar, _ in self.keys}, reverse=True)

    @property
    def context_lengths(self) -> list:
        return sorted({cl for _, cl in self.keys})

    @property
    def context_length(self) -> int:
        """The largest context length (Genie's context size), 0 before any graph is found."""
        return max(self.context_lengths, default=0)

    def describe(self) -> list:
        """Lines saying what was found, for the import's printout."""
        lengths = ", ".join(map(str, self.context_lengths))
        if self.checkpoint:
            graphs = list(dict.fromkeys(self.unsplit.values()))
            data = list(dict.fromkeys(d for g in graphs for d in g.data))
            return [f"format: {self.layout}", f"release: {self.release}",
                    "graph" + ("s" if len(graphs) > 1 else "") + ": "
                    + ", ".join(self.rel(g.onnx) for g in graphs)
                    + (" (dynamic)" if self.dynamic else f" (static: context length {lengths})")
                    + ", weights " + (", ".join(self.rel(d) for d in data) or "inline")
                    + f", encodings {self.rel(graphs[0].encodings)}",
                    f"tokenizer: {self.rel(self.tokenizer) if self.tokenizer else 'missing'}"]
        lines = [f"layout: {self.layout}; slug {self.slug!r}"
                 + (f", precision {self.precision}" if self.precision else "")
                 + (f", context length{'s' if len(self.context_lengths) > 1 else ''} {lengths}"
                    if lengths else "")]
        for ar, cl in self.keys:
            parts = self.parts.get((ar, cl), {})
            if parts:
                lines.append(f"AR {ar} CL {cl}: {len(parts)} of {self.part_count} parts")
            if (ar, cl) in self.unsplit:
                lines.append(f"AR {ar} CL {cl}: unsplit graph "
                             f"{self.rel(self.unsplit[(ar, cl)].onnx)}")
        lines.append(f"tokenizer: {self.rel(self.tokenizer) if self.tokenizer else 'missing'}")
        return lines

    def rel(self, path: Path) -> str:
        try:
            return str(Path(path).relative_to(self.root))
        except ValueError:
            return str(path)


# ============================================================================ the ONNX side

def load_structure(onnx_path: Path):
    """The model proto without its weights (a 7B part's .onnx alone is small)."""
    from hexbundle.formats.onnxfile import load_structure as load   # onnx: only when asked
    return load(onnx_path)


def recorded_data_files(onnx_path: Path, model=None) -> tuple:
    """The external-data files the ONNX records, resolved next to it, each checked to exist.

    A broken record (the .data renamed or moved, a location outside the ONNX's directory) names
    the ONNX and the location it records."""
    model = model if model is not None else load_structure(onnx_path)
    locations: list = []
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location" and entry.value not in locations:
                locations.append(entry.value)
    files = []
    for location in locations:
        path = Path(onnx_path).parent / location
        if not location or Path(location).is_absolute() or ".." in Path(location).parts:
            raise InputError(f"{onnx_path}: records external data location {location!r}, which is "
                             "not a file name next to it; re-export the model")
        if not path.exists():
            raise InputError(
                f"{onnx_path}: records its weights in {location!r} (external data location), but "
                f"{path} does not exist; the .data was renamed or moved: restore its original "
                "name next to the ONNX (an ONNX cannot follow a renamed .data)")
        require_regular_file(path, f"external data of {Path(onnx_path).name}")
        files.append(path)
    return tuple(files)


def graph_io(model) -> GraphIO:
    import onnx
    initializers = {i.name for i in model.graph.initializer}

    def info(values) -> dict:
        out = {}
        for v in values:
            if v.name in initializers:
                continue
            t = v.type.tensor_type
            try:
                dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
            except (KeyError, TypeError, ValueError):   # 0 (not a tensor) or no numpy type
                dtype = "?"
            out[v.name] = (dtype, tuple(int(d.dim_value) for d in t.shape.dim))
        return out

    return GraphIO(info(model.graph.input), info(model.graph.output))


def graph_files(onnx_path: Path, encodings: Path) -> GraphInputs:
    if Path(encodings).exists():
        require_regular_file(encodings, "AIMET encodings")
    else:
        raise InputError(f"{encodings}: the AIMET encodings of {Path(onnx_path).name} are missing; "
                         "the export is incomplete: re-run the export")
    return GraphInputs(Path(onnx_path), recorded_data_files(onnx_path), Path(encodings))


# ============================================================================ scanning

def scan_export(root: Path) -> ExportTree:
    """Find the graphs of an export directory of any known layout; InputError if none is."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise InputError(f"{root}: no such directory; give the directory your qai-hub-models "
                         "export wrote (its --onnx-export-dir) or that holds Qualcomm's asset")
    ar_dirs = sorted(p for p in root.iterdir() if p.is_dir() and AR_DIR.fullmatch(p.name))
    kind_dirs = [root / k for k in KIND_DIRS if (root / k).is_dir()]
    assets = sorted(p for p in root.glob("*.onnx") if ASSET_ONNX.fullmatch(p.name))
    if ar_dirs:
        tree = _scan_ar_dirs(root, ar_dirs)
    elif kind_dirs:
        tree = _scan_kind_dirs(root, kind_dirs)
    elif assets:
        tree = _scan_asset(root, assets)
    elif is_checkpoint(root):
        kind = (f"a qai-hub-models 0.57-0.65 quantize checkpoint ({CKPT_GRAPH})"
                if (root / CKPT_GRAPH).is_file() else "a qai-hub-models 0.55-0.56 static "
                "quantize checkpoint (model_seqlen<S>_cl<C>.onnx)")
        raise InputError(f"{root}: {kind}; "
                         f"`doit import_export --dir {root} --name NAME` reads it")
    else:
        raise InputError(
            f"{root}: no qai-hub-models export found: expected ar<S>_cl<C>/ directories "
            "(qai-hub-models 0.52-0.55), prompt/ and token/ (0.46 and older), or Qualcomm's "
            "asset <slug>_ar<S>.onnx with <slug>.data and <slug>.encodings")
    tree.tokenizer = root / TOKENIZER if (root / TOKENIZER).is_file() else None
    _check_parts_complete(tree)
    return tree


def _scan_ar_dirs(root: Path, ar_dirs: list) -> ExportTree:
    tree = ExportTree(root, "qai-hub-models 0.52-0.55 tree", slug="")
    for ar_dir in ar_dirs:
        m = AR_DIR.fullmatch(ar_dir.name)
        key = int(m["ar"]), int(m["cl"])
        unsplit = sorted(ar_dir.glob("*.onnx")) + sorted(
            d / UNSPLIT_AIMET for d in ar_dir.glob("*.aimet")
            if not PART_DIR.fullmatch(d.name) and (d / UNSPLIT_AIMET).is_file())
        if len(unsplit) > 1:
            tree.problems.append(f"{tree.rel(ar_dir)}: several unsplit graphs "
                                 f"({', '.join(tree.rel(u) for u in unsplit)}); keep one")
        for onnx_path in unsplit[:1]:   # the unsplit graph of this (AR, CL)
            tree.unsplit[key] = _files_or_problem(tree, onnx_path,
                                                  onnx_path.with_suffix(".encodings"))
        _scan_part_dirs(tree, ar_dir, key)
        if not tree.slug and unsplit:   # no parts: the 7B class's copy is named by the model;
            named = unsplit[0].stem if unsplit[0].parent == ar_dir else unsplit[0].parent.stem
            tree.slug = SLUG_OF_CLASS.get(named) or \
                re.sub(r"[^a-z0-9_]+", "_", named.lower())   # the generic one by class
    return tree


def _scan_kind_dirs(root: Path, kind_dirs: list) -> ExportTree:
    """0.46: prompt/ and token/; the AR and context length are read from the graphs."""
    tree = ExportTree(root, "qai-hub-models 0.46 tree", slug="")
    for kind_dir in kind_dirs:
        _scan_part_dirs(tree, kind_dir, kind_dir.name)
    by_kind, tree.parts = tree.parts, {}
    for kind, parts in by_kind.items():   # the directory says prompt/token; the graph, its AR
        any_part = parts.get(2) or next(iter(parts.values()))   # part 1 has no mask
        key = graph_io(load_structure(any_part.onnx)).sequence_and_context(any_part.onnx)
        tree.parts[key] = parts
    return tree


def _scan_asset(root: Path, assets: list) -> ExportTree:
    slugs = {ASSET_ONNX.fullmatch(p.name)["slug"] for p in assets}
    if len(slugs) > 1:
        raise InputError(f"{root}: asset graphs of several models ({', '.join(sorted(slugs))}); "
                         "keep one model per directory")
    slug = slugs.pop()
    tree = ExportTree(root, "Qualcomm asset (unsplit)", slug=slug)
    for onnx_path in assets:   # the file name says the AR; the graph, its context length
        key = graph_io(load_structure(onnx_path)).sequence_and_context(onnx_path)
        tree.unsplit[key] = _files_or_problem(tree, onnx_path, root / f"{slug}.encodings")
    return tree


def _scan_part_dirs(tree: ExportTree, parent: Path, key) -> None:
    for part_dir in sorted(p for p in parent.iterdir() if p.is_dir()):
        m = PART_DIR.fullmatch(part_dir.name)
        if not m:
            continue
        index, count = int(m["index"]), int(m["count"])
        stem = part_dir.name[:-len(".aimet")]
        if not tree.slug:
            tree.slug = _slug_of(m["stem"])
        precision = PRECISION.search(m["stem"])
        if precision and not tree.precision:
            tree.precision = precision["precision"]
        if tree.part_count and count != tree.part_count:
            tree.problems.append(f"{tree.rel(part_dir)}: part of {count}, others of "
                                 f"{tree.part_count}; the tree mixes two exports")
            continue
        tree.part_count = count
        onnx_path = part_dir / f"{stem}.onnx"
        if not onnx_path.is_file():
            tree.problems.append(f"{tree.rel(onnx_path)} is missing (part {index} of {count})")
            continue
        files = _files_or_problem(tree, onnx_path, part_dir / f"{stem}.encodings")
        if files is not None:
            tree.parts.setdefault(key, {})[index] = files


def _slug_of(stem: str) -> str:
    """<slug>_<precision>_ar<S>_cl<C> (0.52+) or <slug>_prompt / <slug>_token (0.46)."""
    m = PRECISION.search(stem)
    if m:
        return stem[:m.start()]
    for kind in KIND_DIRS:
        if stem.endswith("_" + kind):
            return stem[:-len(kind) - 1]
    return re.sub(r"_ar\d+_cl\d+$", "", stem)


def _files_or_problem(tree: ExportTree, onnx_path: Path, encodings: Path) -> Optional[GraphInputs]:
    try:
        return graph_files(onnx_path, encodings)
    except InputError as exc:
        tree.problems.append(str(exc))
        return None


def _check_parts_complete(tree: ExportTree) -> None:
    several = len(tree.context_lengths) > 1
    for (ar, cl), parts in tree.parts.items():
        missing = [i for i in range(1, tree.part_count + 1) if i not in parts]
        if missing:
            tree.problems.append(f"AR {ar}{f' CL {cl}' if several else ''}: part(s) "
                                 f"{', '.join(map(str, missing))} of {tree.part_count} missing")
    for key in list(tree.unsplit):
        if tree.unsplit[key] is None:
            del tree.unsplit[key]
    found = set(tree.parts) | set(tree.unsplit)
    for ar in tree.ars:   # every context length needs a graph of every AR
        for cl in tree.context_lengths:
            if (ar, cl) not in found:
                tree.problems.append(
                    f"context length {cl} has no AR {ar} graphs (ar{ar}_cl{cl}/ is missing) while "
                    f"other lengths have them: export every (AR, context length) pair")


# ============================================================================ a quantize checkpoint

def static_graphs(root: Path) -> dict:
    """(AR, context length) -> a 0.55 static checkpoint's model_seqlen<S>_cl<C>.onnx."""
    found = {}
    for path in sorted(Path(root).glob("model_seqlen*_cl*.onnx")):
        m = CKPT_STATIC.fullmatch(path.name)
        if m and path.is_file():
            found[(int(m["ar"]), int(m["cl"]))] = path
    return found


def is_checkpoint(root: Path) -> bool:
    return (Path(root) / CKPT_GRAPH).is_file() or bool(static_graphs(root))


def recorded_context_length(root: Path) -> Optional[int]:
    """The context length a checkpoint's args.json records (the quantize's --context-length, the
    length it calibrated at), or None where there is no args.json or it records none. args.json
    is what the quantize CLI wrote beside its output; one that cannot be read is named, with the
    flag that makes it unneeded."""
    path = Path(root) / CKPT_ARGS
    if not path.is_file():
        return None
    fix = ("give --context-length N (args.json is read only for the default), or restore the "
           "args.json the quantize wrote")
    text = read_named_text(path, "quantize arguments", JSON_CONFIG_MAX_BYTES)
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc}); {fix}") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a JSON {type(raw).__name__}, not the object of arguments the "
                         f"quantize writes; {fix}")
    value = raw.get("context_length")
    if value is None:
        return None
    if type(value) is not int or value <= 0:
        raise InputError(f"{path}: context_length is {json_text(value)[:60]}, not a positive "
                         f"integer (the quantize's --context-length); {fix}")
    return value


def scan_checkpoint(root: Path, slug: str, context_lengths: tuple,
                    default_lengths: tuple = (DEFAULT_CONTEXT_LENGTH,)) -> ExportTree:
    """A quantize checkpoint as an export tree of unsplit graphs: the one dynamic graph (its
    recorded model.data, its model.encodings) in every (AR, context length) slot, at the
    context lengths asked for (else default_lengths); or 0.55's static graphs, each in its own
    slot, at the one context length they were exported with. The external data is checked
    against the file (present, long enough) without reading it."""
    from hexbundle.formats.encodings import encodings_header
    root = Path(root).resolve()
    for name, what in ((CKPT_ENCODINGS, "its AIMET encodings (quant_sim.export writes it)"),
                       (CKPT_CONFIG, "the model's config.json (the quantize CLI copies it)")):
        if not (root / name).is_file():
            raise InputError(f"{root / name}: missing, {what}; copy the whole folder the "
                             "quantize command wrote (--output-dir), or re-run it")
    if not (root / CKPT_GRAPH).is_file():
        return _scan_static(root, slug, context_lengths)
    onnx_path = root / CKPT_GRAPH
    tree = ExportTree(root, "qai-hub-models 0.57-0.65 quantize checkpoint", slug=slug,
                      dynamic=True, checkpoint=True)
    model = load_structure(onnx_path)
    data = recorded_data_files(onnx_path, model)
    check_external_windows(onnx_path, model)
    files = GraphInputs(onnx_path, data, root / CKPT_ENCODINGS)
    for ar in (CKPT_PROMPT_AR, CKPT_TOKEN_AR):
        for cl in context_lengths or default_lengths:
            tree.unsplit[(ar, cl)] = files
    tree.release = checkpoint_release(encodings_header(root / CKPT_ENCODINGS), bool(data))
    tree.tokenizer = root / TOKENIZER if (root / TOKENIZER).is_file() else None
    return tree


def _scan_static(root: Path, slug: str, context_lengths: tuple) -> ExportTree:
    """0.55-0.56's static checkpoint: model_seqlen128_cl<C>.onnx (prompt) and
    model_seqlen1_cl<C>.onnx (token), the graphs 0.55's export reads, for each context length
    asked for; a length no pair was exported with is refused (a fixed graph cannot be pinned to
    another)."""
    from hexbundle.formats.encodings import encodings_header
    found = static_graphs(root)
    names = ", ".join(p.name for p in found.values())
    exported = sorted({cl for _, cl in found
                       if (CKPT_PROMPT_AR, cl) in found and (CKPT_TOKEN_AR, cl) in found})
    if not exported:
        raise InputError(
            f"{root}: static graphs {names}, but no context length has both "
            f"model_seqlen{CKPT_PROMPT_AR}_cl<C>.onnx (prompt) and "
            f"model_seqlen{CKPT_TOKEN_AR}_cl<C>.onnx (token), which qai-hub-models 0.55's "
            "quantize writes for its export: copy the whole folder the quantize wrote, or "
            "re-run it")
    other = [cl for cl in context_lengths if cl not in exported]
    if other:
        raise InputError(
            f"{root}: a qai-hub-models 0.55-0.56 static checkpoint ({names}): its graphs are "
            f"fixed to context length {', '.join(map(str, exported))}, and a static graph "
            "cannot be pinned to another, so --context-length "
            f"{', '.join(map(str, other))} has no graph. "
            f"Import with --context-length {','.join(map(str, exported))} (or without it), "
            f"re-run the 0.55-0.56 quantize with --context-length {other[0]} (it writes "
            f"model_seqlen{CKPT_PROMPT_AR}_cl{other[0]}.onnx and "
            f"model_seqlen{CKPT_TOKEN_AR}_cl{other[0]}.onnx), or quantize with qai-hub-models "
            "0.57 or later, whose model_dynamic.onnx serves every context length")
    tree = ExportTree(root, "qai-hub-models 0.55-0.56 static quantize checkpoint", slug=slug,
                      checkpoint=True)
    external = False
    for ar in (CKPT_PROMPT_AR, CKPT_TOKEN_AR):
        for cl in context_lengths or exported:
            onnx_path = found[(ar, cl)]
            model = load_structure(onnx_path)
            shown = graph_io(model).sequence_and_context(onnx_path)
            if shown != (ar, cl):
                raise InputError(
                    f"{onnx_path}: its inputs are of sequence length {shown[0]} and context "
                    f"length {shown[1]} (attention_mask), but its name says {ar} and {cl}: the "
                    "file was renamed or another graph put in its place; restore the files the "
                    "quantize wrote (model_seqlen<S>_cl<C>.onnx as the graph's own lengths), "
                    "or re-run it")
            data = recorded_data_files(onnx_path, model)
            check_external_windows(onnx_path, model)
            external = external or bool(data)
            tree.unsplit[(ar, cl)] = GraphInputs(onnx_path, data, root / CKPT_ENCODINGS)
    header = encodings_header(root / CKPT_ENCODINGS)
    tree.release = (f"0.55-0.56 (static model_seqlen<S>_cl<C>.onnx, encodings "
                    f"{header.get('version', '?')}); "
                    + ("weights in model.data, shared by the graphs" if external
                       else "weights inline"))
    tree.tokenizer = root / TOKENIZER if (root / TOKENIZER).is_file() else None
    return tree


def check_external_windows(onnx_path: Path, model) -> None:
    """Every external initializer's window lies inside its data file: a truncated model.data
    (a copy cut short) is named before anything is built."""
    from hexbundle.formats.onnxfile import initializer_values
    for init in model.graph.initializer:
        if init.external_data:
            try:
                initializer_values(init, onnx_path)
            except InputError as exc:
                raise InputError(f"{exc}\n{Path(onnx_path).parent / CKPT_DATA} is not the "
                                 "complete data file of this checkpoint: copy it again from "
                                 "the quantize output, or re-run the quantize") from None


def checkpoint_release(header: dict, external: bool) -> str:
    """Which releases write what the encodings' top-level keys show: aimet-onnx 2.26 (0.57-0.59)
    writes no `producer` key; the aimet-onnx of later releases names itself there."""
    version = header.get("version", "?")
    producer = header.get("producer")
    weights = ("weights in model.data (aimet-onnx writes it for a model >= 2 GiB)" if external
               else "weights inline (a model < 2 GiB)")
    if producer is None:
        return (f"0.57-0.59 (encodings {version} with no 'producer' key, as aimet-onnx 2.26 "
                f"writes them); {weights}")
    return f"0.60-0.65 (encodings {version}, producer {json_text(producer)}); {weights}"


def json_text(value) -> str:
    import json
    return json.dumps(value, sort_keys=True)[:120]
