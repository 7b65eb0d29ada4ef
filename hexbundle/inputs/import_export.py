"""`doit import_export`: a qai-hub-models export, as it comes, becomes a model config.

The export's files are read in place and never renamed, moved or edited. What the model is
(layers, hidden size, heads, KV heads, head_dim, intermediate size, vocab, context length, the AR
values, the quantization, the plan) is read from the graphs and encodings themselves; what the
files cannot say (RoPE theta, the RMSNorm epsilon) is a stated assumption, printed and written as
a comment. The result is configs/models/<name>.toml with `[inputs] source = "qai-hub-models"`
and the file of every graph, after which `doit bundle model=<name>` builds it.

Where the export has only unsplit graphs (Qualcomm's asset, a 0.53-0.55 tree whose export
stopped before splitting) or another plan is asked for, the config says `split = "local"`: the
`split` task cuts the unsplit graphs into the plan's parts under the build root
(hexbundle.inputs.split).
"""
from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from hexbundle.config.build import MODEL_SCHEMA, QUALCOMM_MAX_NUM_TOKENS, did_you_mean
from hexbundle.config.layout import GraphInputs, ProjectLayout, check_name
from hexbundle.config.model import (Architecture, Graph, Model, Part, Plan, Quantization,
                                    part_graphs)
from hexbundle.formats.encodings import load_encodings
from hexbundle.formats.hf_config import LLAMA3_KEYS, read_hf_config
from hexbundle.formats.onnxfile import initializer_values
from hexbundle.formats.qaihm import (CKPT_ARCHITECTURES, CKPT_ARGS, CKPT_CONFIG, CKPT_GRAPH,
                                     CKPT_PROMPT_AR, CKPT_REFUSED, CKPT_TOKEN_AR, CKPT_VLM,
                                     QAIHM_CHECKPOINT_MODELS, QWEN2_RMS_NORM_EPS,
                                     QWEN2_ROPE_THETA, QWEN2_SPECIALS, TOKENIZER,
                                     TOKENIZER_CONFIG, ExportTree, graph_io, is_checkpoint,
                                     load_structure, qaihm_split, qaihm_split_layers,
                                     recorded_context_length, scan_checkpoint, scan_export)
from hexbundle.formats.tokenizer import added_token_contents, special_token_ids
from hexbundle.inputs.structure import Linear, Structure, read_structure
from hexbundle.inputs.validate import whole_model_part
from hexbundle.support.atomic import atomic_output
from hexbundle.support.console import say
from hexbundle.support.errors import HexbundleError, InputError
from hexbundle.support.files import (TOKENIZER_MAX_BYTES, about_argument, require_named_dir,
                                     require_named_file)

# --name: a file name (NAME.toml) and a directory of build/, nested in paths: far below
# NAME_MAX (255 bytes), long enough for any model's name
PAST_KEY = re.compile(r"past_key_(\d+)_in")
LAYER_IN_NAME = re.compile(r"layers\.(\d+)[./]")


@dataclass
class Inferred:
    """What the graphs and encodings say about the model."""

    arch: dict = field(default_factory=dict)
    quant: dict = field(default_factory=dict)
    context_lengths: tuple = ()    # ascending: a prompt and a token graph of each per part
    prompt_ar: int = 0
    token_ar: int = 0
    layers_per_part: tuple = ()
    notes: list = field(default_factory=list)
    # decided by decide_family: from the files, config.json or the family's known values
    family: str = ""
    evidence: str = ""             # what in the graphs says the family
    stated: dict = field(default_factory=dict)   # key -> (value, where it comes from)
    rope_scaling: Optional[dict] = None
    specials: dict = field(default_factory=dict)
    specials_from: str = ""        # where the special tokens come from (default: the family)
    sources: dict = field(default_factory=dict)   # size -> the file and what in it shows it
    unknown: dict = field(default_factory=dict)   # size -> why the graphs do not show it
    head: Optional[Linear] = None  # the LM head (the linear logits are computed with)


# ============================================================================ the command

def import_export(root: Path, dir: str, name: str, plan: str = "", tokenizer: str = "",
                  rope_theta: float = 0.0, model_config: str = "", context_length: str = "",
                  model_id: str = "") -> None:
    """Scan the export at `dir`, infer the model, write configs/models/<name>.toml."""
    project = ProjectLayout(root)
    if not dir or not name:
        raise InputError("import_export needs --dir PATH (the export) and --name NAME (the "
                         "model config to write), e.g. `doit import_export --dir ~/export "
                         "--name qwen2.5-7b-mine`")
    check_name(name, "--name")
    # every path named on the command line, before the export is scanned (stats and one small
    # read: a wrong one is named at once)
    require_named_dir(Path(dir).expanduser(), "export directory", "--dir")
    hf = read_model_config(Path(model_config)) if model_config else None
    if tokenizer:
        require_named_file(Path(tokenizer).expanduser(), "tokenizer.json", TOKENIZER_MAX_BYTES,
                           "--tokenizer")
    if is_checkpoint(Path(dir).expanduser()):
        return import_checkpoint(project, Path(dir).expanduser().resolve(), name, plan,
                                 tokenizer, rope_theta, model_config, context_length, model_id)
    if context_length or model_id:
        raise InputError(f"{dir}: --context-length and --model-id are for a quantize checkpoint "
                         f"(a folder with {CKPT_GRAPH}); an export tree's graphs fix both")
    with about_argument("--dir", dir):
        tree = scan_export(Path(dir).expanduser())
    for line in tree.describe():
        if not (tokenizer and line.startswith("tokenizer: missing")):
            say(f"  {line}")
    if tree.problems:
        raise InputError(f"{tree.root}: the export is incomplete or inconsistent:\n"
                         + "\n".join(f"  - {p}" for p in tree.problems)
                         + "\nre-run the export (or restore the files named) and import again")
    wanted = parse_plan(plan) if plan else None
    split, prompt_ar, token_ar = choose_split(tree, wanted)
    inferred = infer(tree, split, prompt_ar, token_ar)
    decide_family(inferred, hf, rope_theta, tree)
    plan_layers = wanted or (inferred.layers_per_part if split == "export"
                             else qaihm_split(tree.slug, inferred.arch["num_layers"]))
    if plan_layers is None or sum(plan_layers) != inferred.arch["num_layers"]:
        known = (f"qai-hub-models splits {tree.slug!r} as {','.join(map(str, plan_layers))}, "
                 f"which does not fit this export's {inferred.arch['num_layers']} layers"
                 if plan_layers else f"qai-hub-models' split of {tree.slug!r} is not known here")
        raise InputError(f"{tree.root}: only unsplit graphs, and {known}: give the layers per "
                         f"part, e.g. --plan 0,{inferred.arch['num_layers'] - 1},1 (part 1 the "
                         "embedding)")
    check_plan(plan_layers, inferred.arch["num_layers"])
    write_model(project, name, tree, split, inferred, plan_layers, hf, tokenizer)


def write_model(project: ProjectLayout, name: str, tree: ExportTree, split: str,
                inferred: Inferred, plan_layers: tuple, hf, tokenizer: str) -> None:
    """The tokenizer found and checked, configs/models/<name>.toml written, notes printed."""
    tokenizer_path = find_tokenizer(tree, tokenizer)
    with about_argument("--tokenizer", tokenizer) if tokenizer else contextlib.nullcontext():
        if tokenizer_path and hf is not None:
            inferred.specials = specials_from_config(hf, tokenizer_path, inferred.specials)
            inferred.specials_from = f"{hf.path.name}'s bos/eos ids in {tokenizer_path.name}"
        if tokenizer_path:
            check_tokenizer(tokenizer_path, inferred.arch["vocab_size"], inferred.specials)
    path = project.model_config(name)
    check_overwrite(path)
    text = model_toml(name, tree, split, inferred, plan_layers, tokenizer_path, project)
    with atomic_output(path) as f:
        f.write(text.encode())
    say(f"wrote {project.rel(path)}")
    for note in inferred.notes:
        say(f"  note: {note}")
    say(f"next: python3 -m doit bundle model={name}   (then: doit verify model={name})")


def parse_plan(text: str) -> tuple:
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise InputError(f"--plan {text!r}: give decoder layers per part, comma-separated, part 1 "
                         "the embedding (0), e.g. 0,6,6,6,6,4") from None
    if len(layers) < 2 or layers[0] != 0 or any(n < 0 for n in layers):
        raise InputError(f"--plan {text!r}: at least two parts, the first with 0 layers (the "
                         "embedding), no negative counts")
    return layers


# ============================================================================ a quantize checkpoint

def import_checkpoint(project: ProjectLayout, root: Path, name: str, plan: str, tokenizer: str,
                      rope_theta: float, model_config: str, context_length: str,
                      model_id: str) -> None:
    """A qai-hub-models 0.57-0.65 quantize checkpoint: its config.json says the family and
    (with its sizes, or --model-id) which qai-hub-models model made it, hence the split; its
    one dynamic graph is pinned per (AR, context length) and cut as qai-hub-models 0.65 cuts it
    by the `inputs` step (inputs/split.py, cut = "qaihm")."""
    name = name or re.sub(r"[^a-z0-9._-]+", "-", root.name.lower()).strip("-._") or "checkpoint"
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
        raise InputError(f"--name {name!r}: use lower-case letters, digits, '.', '_' and '-'")
    config = Path(model_config).expanduser() if model_config else root / CKPT_CONFIG
    if not config.is_file():
        raise InputError(f"{config}: missing; the quantize command copies the model's "
                         "config.json into its output folder: copy it there from the model's "
                         "Hugging Face folder (or give --model-config PATH)")
    hf = read_model_config(config, "--model-config" if model_config else "")
    family = checkpoint_family(hf)
    model_id, spec = checkpoint_model(hf, model_id)
    lengths = parse_context_lengths(context_length)
    # a static checkpoint's graphs fix their length; a dynamic one's args.json records it
    recorded = None if lengths or not (root / CKPT_GRAPH).is_file() else \
        recorded_context_length(root)
    if recorded:   # the length the quantize calibrated at, the build's unless told otherwise
        lengths = (check_context_length(recorded, f"{root / CKPT_ARGS}: context_length",
                                        "give --context-length N"),)
    tree = scan_checkpoint(root, model_id, tuple(sorted(set(lengths))), spec.context_lengths)
    say(f"  format: {tree.layout}")
    for line in tree.describe()[1:]:
        if not (tokenizer and line.startswith("tokenizer: missing")):
            say(f"  {line}")
    check_pinnable(tree, config_model(hf, tree, family))
    inferred = infer(tree, "local", CKPT_PROMPT_AR, CKPT_TOKEN_AR)
    if inferred.family == "llama" and family != "llama":   # the graph's names may be anonymous
        inferred.family = family
        inferred.evidence = "the graph's tensor names say nothing of q/k norms or biases"
    decide_family(inferred, hf, rope_theta, tree)
    layers = inferred.arch["num_layers"]
    if plan:
        plan_layers = parse_plan(plan)
        split_note = "--plan"
    else:
        # NUM_LAYERS_PER_SPLIT is the stock depth's; the model class refuses another depth
        # (_verify_ckpt), so for one (a model made with the module's shape constants set) the
        # blocks are even, as split_onnx computes them: ceil(layers / blocks)
        per = spec.layers_per_split if layers == spec.num_layers else \
            -(-layers // max(1, spec.num_splits - 1))
        plan_layers = qaihm_split_layers(layers, spec.num_splits, per, str(root / CKPT_GRAPH))
        split_note = (f"qai-hub-models' {model_id}: NUM_SPLITS {spec.num_splits}, "
                      f"NUM_LAYERS_PER_SPLIT {per}"
                      + ("" if per == spec.layers_per_split else
                         f" for {layers} layers (the stock {spec.num_layers} layers: "
                         f"{spec.layers_per_split})"))
    check_plan(plan_layers, layers)
    check_checkpoint_encodings(tree)
    check_layer_boundaries(tree, plan_layers)
    say(f"  model: {model_id}; plan {','.join(map(str, plan_layers))} ({split_note})")
    say(f"  graphs: AR {CKPT_PROMPT_AR} (prompt) and AR {CKPT_TOKEN_AR} (token) at context "
        f"length{'s' if len(inferred.context_lengths) > 1 else ''} "
        f"{', '.join(map(str, inferred.context_lengths))}"
        + ("" if context_length else " (the static graphs' own)" if not tree.dynamic else
           f" ({CKPT_ARGS}: the context length the quantize calibrated at; --context-length "
           "N,... builds others)" if recorded else
           f" (qai-hub-models' default for {model_id}; --context-length N,... builds others)"))
    say_settings(inferred)
    write_model(project, name, tree, "local", inferred, plan_layers, hf, tokenizer)


def say_settings(inferred: Inferred) -> None:
    """Every setting of the model that changes the bundle, where it comes from."""
    a, q = inferred.arch, inferred.quant
    say("  settings: " + ", ".join(f"{k} {a[k]}" for k in (
        "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
        "intermediate_size", "vocab_size")) + f", tie_word_embeddings {str(a['tied']).lower()}")
    say("  settings: " + ", ".join(f"{k} {v:g} ({source})"
                                   for k, (v, source) in inferred.stated.items())
        + (", rope_scaling " + ", ".join(f"{k} {v}" for k, v in inferred.rope_scaling.items())
           if inferred.rope_scaling else ", no rope_scaling"))
    say("  settings: " + ", ".join(f"{k} {v}" for k, v in q.items())
        + " (the encodings)")


SUPPORTED_CHECKPOINTS = ("Qwen3 (model_type qwen3, Qwen3ForCausalLM), Llama 3.x, Falcon 3 and "
                         "SmolLM2 (model_type llama, LlamaForCausalLM)")


def checkpoint_family(hf) -> str:
    """The family of a checkpoint's config.json, or refused by name: what qai-hub-models'
    quantize writes for a conventional decoder is Qwen3 or a Llama-shaped model only."""
    outer = hf.wrapper or hf.model_type or ""
    if outer.startswith("gemma"):
        reason = CKPT_REFUSED.get(outer, f"{outer} is not a conventional decoder hexbundle knows")
        raise InputError(f"{hf.path}: model_type {outer!r}: {reason}; not imported. "
                         f"Supported checkpoints: {SUPPORTED_CHECKPOINTS}")
    if outer in CKPT_REFUSED:
        raise InputError(f"{hf.path}: model_type {outer!r}: {CKPT_REFUSED[outer]}; not "
                         f"imported. Supported checkpoints: {SUPPORTED_CHECKPOINTS}")
    if hf.wrapper or "_vl" in outer or any("VL" in a or "ConditionalGeneration" in a
                                            for a in hf.architectures):
        raise InputError(f"{hf.path}: model_type {outer!r} "
                         f"({', '.join(hf.architectures) or 'no architectures'}) is {CKPT_VLM}; "
                         f"not imported. Supported checkpoints: {SUPPORTED_CHECKPOINTS}")
    arch = CKPT_ARCHITECTURES.get(hf.model_type or "")
    if arch is None or (hf.architectures and arch not in hf.architectures):
        raise InputError(f"{hf.path}: model_type {hf.model_type!r}, architectures "
                         f"{list(hf.architectures)}: no qai-hub-models quantize checkpoint "
                         f"hexbundle knows; supported: {SUPPORTED_CHECKPOINTS}")
    return hf.family


def checkpoint_model(hf, model_id: str) -> tuple:
    """(model id, CheckpointModel): --model-id, else the stock model whose config.json sizes
    (model_type, layers, hidden size, vocabulary) these are."""
    known = ", ".join(QAIHM_CHECKPOINT_MODELS)
    if model_id:
        spec = QAIHM_CHECKPOINT_MODELS.get(model_id)
        if spec is None:
            raise InputError(f"--model-id {model_id!r}: not a qai-hub-models model with a "
                             f"quantize checkpoint{did_you_mean(model_id, QAIHM_CHECKPOINT_MODELS)}"
                             f"; give one of {known}")
        if spec.model_type != hf.model_type:
            raise InputError(f"--model-id {model_id} is a {spec.model_type} model, but "
                             f"{hf.path} says model_type {hf.model_type!r}: give the id of the "
                             "quantize you ran")
        return model_id, spec
    sizes = (hf.model_type, hf.get("num_hidden_layers"), hf.get("hidden_size"),
             hf.get("vocab_size"))
    for mid, spec in QAIHM_CHECKPOINT_MODELS.items():
        if (spec.model_type, spec.num_layers, spec.hidden_size, spec.vocab_size) == sizes:
            return mid, spec
    raise InputError(f"{hf.path}: model_type {sizes[0]!r} with {sizes[1]} layers, hidden size "
                     f"{sizes[2]} and vocabulary {sizes[3]} is none of qai-hub-models' stock "
                     "models, so its split (NUM_SPLITS) is not known: give --model-id ID, the "
                     "<ID> of the `python -m qai_hub_models.models.<ID>.quantize` that wrote "
                     f"the checkpoint ({known}), or --plan 0,N,...")


def parse_context_lengths(text: str) -> tuple:
    if not text:
        return ()
    try:
        lengths = tuple(int(x) for x in text.split(","))
    except ValueError:
        lengths = ()
    example = "give context lengths comma-separated, e.g. 512,1024,4096"
    if not lengths:
        raise InputError(f"--context-length {text!r}: {example}")
    return tuple(check_context_length(cl, f"--context-length {text!r}", example)
                 for cl in lengths)


def check_context_length(value: int, where: str, fix: str) -> int:
    """A context length a checkpoint's graphs can be pinned to: above the prompt AR, within the
    model config's range (config/build.py MODEL_SCHEMA)."""
    bound = MODEL_SCHEMA["graphs"].type["context_length"]
    if not CKPT_PROMPT_AR < value <= bound.max:
        raise InputError(f"{where}: context length {value} is outside ({CKPT_PROMPT_AR}, "
                         f"{int(bound.max)}] (above the prompt AR {CKPT_PROMPT_AR}, within "
                         f"hexbundle's range); {fix}")
    return value


# config.json's keys the importer reads -> the model config's [architecture] field bounding it
HF_RANGES = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size",
             "num_attention_heads": "num_attention_heads",
             "num_key_value_heads": "num_kv_heads", "head_dim": "head_dim",
             "intermediate_size": "intermediate_size", "vocab_size": "vocab_size",
             "rms_norm_eps": "rms_norm_eps"}


def read_model_config(path: Path, argument: str = "--model-config"):
    """The model's config.json (formats/hf_config.py checks each key's type), every value the
    importer takes from it within the range the model config allows: a `num_hidden_layers` of
    10**30 is refused here, not met as a loop or an allocation later."""
    hf = read_hf_config(path, argument)
    arch = MODEL_SCHEMA["architecture"].type
    values = [(key, hf.get(key), arch[name]) for key, name in HF_RANGES.items()]
    values.append(("rope_theta", hf.rope_theta, arch["rope_theta"]))
    values += [(f"rope_scaling.{key}", (hf.rope_scaling or {}).get(key),
                arch["rope_scaling"].type[key]) for key in LLAMA3_KEYS]
    bad = [f"{key} is {json.dumps(value)[:40]}, outside [{bound.min:g}, {bound.max:g}]"
           for key, value, bound in values
           if type(value) in (int, float) and not bound.min <= value <= bound.max]
    if bad:
        raise InputError(f"{hf.path}: {'; '.join(bad)} (the ranges hexbundle builds): fix "
                         "config.json (the model's own, from its Hugging Face repository), or "
                         "give the right one with --model-config PATH/config.json")
    return hf


def check_checkpoint_encodings(tree: ExportTree) -> None:
    """model.encodings names tensors of this graph only: the split keeps a part's own and drops
    the rest, so another model's encodings would leave the parts silently unquantized."""
    files = next(iter(tree.unsplit.values()))
    proto = load_structure(files.onnx)
    encodings = load_encodings(files.encodings)
    params = {i.name for i in proto.graph.initializer}
    tensors = {n for node in proto.graph.node for n in (*node.input, *node.output) if n}
    tensors |= {v.name for v in (*proto.graph.input, *proto.graph.output)}
    unknown = sorted(set(encodings.params) - params) + sorted(set(encodings.activations) - tensors)
    if unknown or not encodings.params:
        raise InputError(
            f"{files.encodings}: " + (f"names {len(unknown)} tensor(s) {files.onnx.name} does "
                                      f"not have (e.g. {unknown[0]!r})" if unknown else
                                      "holds no weight encodings")
            + ": the encodings of another model or run; copy the model.encodings the quantize "
            f"wrote together with this {files.onnx.name}, or re-run the quantize")


def check_layer_boundaries(tree: ExportTree, plan_layers: tuple) -> None:
    """qai-hub-models' splitter finds one residual output per layer in the graph (the split
    step cuts there): refused now, not after a build has started."""
    from hexbundle.inputs.split import qaihm_part_outputs
    files = next(iter(tree.unsplit.values()))
    outputs = qaihm_part_outputs(load_structure(files.onnx), plan_layers, files.onnx)
    say(f"  cut at: {', '.join(o[0] for o in outputs)} (as qai-hub-models' split_onnx)")


def config_model(hf, tree: ExportTree, family: str) -> Model:
    """The whole model as config.json describes it: the sizes a dynamic dim would be pinned
    to (before the graph's own sizes are read and compared with config.json)."""
    def size(key: str) -> int:
        value = hf.get(key)
        return value if type(value) is int and value > 0 else 1
    heads = size("num_attention_heads")
    arch = Architecture(num_layers=size("num_hidden_layers"), hidden_size=size("hidden_size"),
                        num_attention_heads=heads,
                        num_kv_heads=size("num_key_value_heads") if hf.get(
                            "num_key_value_heads") else heads,
                        head_dim=hf.head_dim if type(hf.head_dim) is int else 1,
                        intermediate_size=size("intermediate_size"),
                        vocab_size=size("vocab_size"), rope_theta=QWEN2_ROPE_THETA,
                        rms_norm_eps=QWEN2_RMS_NORM_EPS, family=family)
    return Model(tree.slug, tree.slug, arch, Quantization(), tuple(tree.context_lengths),
                 CKPT_PROMPT_AR, CKPT_TOKEN_AR)


def check_pinnable(tree: ExportTree, model: Model) -> None:
    """Each graph the build will make can be pinned from the dynamic graph: only its sequence
    and context dims are dynamic (inputs/split.py pin_shapes refuses any other)."""
    from hexbundle.inputs.split import pin_shapes
    graph_files = next(iter(tree.unsplit.values()))
    proto = load_structure(graph_files.onnx)
    for graph in model.graphs(whole_model_part(model)):
        io = type(proto)()   # the inputs and outputs alone: never a second copy of inline weights
        io.graph.input.extend(proto.graph.input)
        io.graph.output.extend(proto.graph.output)
        pin_shapes(io, model, graph, graph_files.onnx)


def check_plan(layers: tuple, num_layers: int) -> None:
    if sum(layers) != num_layers:
        raise InputError(f"plan {','.join(map(str, layers))} holds {sum(layers)} decoder layers "
                         f"but the model has {num_layers}: give --plan 0,... with layers "
                         f"summing to {num_layers}")
    if len(layers) >= 10:
        raise InputError(f"plan {','.join(map(str, layers))}: {len(layers)} parts; graph names "
                         "must sort in pipeline order, so give --plan with fewer than 10 parts")


def choose_split(tree: ExportTree, wanted: Optional[tuple]) -> tuple:
    """("export" | "local", prompt AR, token AR): the export's own parts when they are complete
    and no other plan is asked for, else a local split of the unsplit graphs."""
    ars = tree.ars
    if len(ars) < 2:
        raise InputError(f"{tree.root}: graphs for AR {ars} only; a bundle needs a prompt graph "
                         "(AR > 1) and a token graph (AR 1): export both")
    prompt_ar, token_ar = max(ars), min(ars)
    keys = [(ar, cl) for ar in (prompt_ar, token_ar) for cl in tree.context_lengths]
    has_parts = all(len(tree.parts.get(key, {})) == tree.part_count > 0 for key in keys)
    has_unsplit = all(key in tree.unsplit for key in keys)
    if has_parts and wanted is None:
        return "export", prompt_ar, token_ar
    if has_unsplit:
        return "local", prompt_ar, token_ar
    if has_parts and wanted is not None:
        raise InputError(f"{tree.root}: --plan asks for another split, but the export has no "
                         "unsplit graphs to split: import without --plan (the export's own parts)")
    raise InputError(f"{tree.root}: neither every part nor the unsplit graph of AR {prompt_ar} "
                     f"and AR {token_ar} is there; re-run the export")


def find_tokenizer(tree: ExportTree, given: str) -> Optional[Path]:
    if given:
        require_named_file(Path(given).expanduser(), "tokenizer.json", TOKENIZER_MAX_BYTES,
                           "--tokenizer")
        return Path(given).expanduser().resolve()
    if tree.tokenizer:
        return tree.tokenizer
    if (tree.root / TOKENIZER_CONFIG).is_file():
        say(f"  missing: {tree.root}/tokenizer.json -- {TOKENIZER_CONFIG} alone is not enough: "
            "Genie needs the model's tokenizer.json (from its Hugging Face repo); put it there "
            "or pass --tokenizer FILE")
    else:
        say(f"  missing: {tree.root}/tokenizer.json: put the model's tokenizer.json there or "
            "pass --tokenizer FILE (the bundle needs it)")
    return None


def check_overwrite(path: Path) -> None:
    """An import refreshes its own config; a hand-written one is never overwritten."""
    if path.is_file() and 'source = "qai-hub-models"' not in path.read_text(errors="replace"):
        raise InputError(f"{path} exists and was not written by an import; choose another --name "
                         "or remove it")


# ============================================================================ inference

def infer(tree: ExportTree, split: str, prompt_ar: int, token_ar: int) -> Inferred:
    """The model as the prompt graph(s) of the largest context length show it."""
    key = (prompt_ar, tree.context_length)
    if split == "export":
        graphs = [tree.parts[key][i] for i in range(1, tree.part_count + 1)]
    else:
        graphs = [tree.unsplit[key]]
    protos = [load_structure(g.onnx) for g in graphs]
    out = Inferred(prompt_ar=prompt_ar, token_ar=token_ar,
                   context_lengths=tuple(tree.context_lengths))
    ios = [graph_io(p) for p in protos]
    with_mask = next(i for i, io in enumerate(ios) if "attention_mask" in io.inputs) \
        if any("attention_mask" in io.inputs for io in ios) else 0
    _, context = ios[with_mask].sequence_and_context(graphs[with_mask].onnx)
    if context != key[1] and not tree.dynamic:   # a checkpoint's: pinned to each length
        raise InputError(f"{graphs[with_mask].onnx}: its attention_mask says context length "
                         f"{context}, but its directory says {key[1]}; re-run the export")
    per_graph_layers = [sorted(int(m[1]) for n in io.inputs if (m := PAST_KEY.fullmatch(n)))
                        for io in ios]
    layers = [layer for ls in per_graph_layers for layer in ls]
    if not layers or layers != list(range(len(layers))):
        raise InputError(f"{graphs[0].onnx}: past_key_<L>_in inputs {layers[:8]}... are not "
                         "layers 0..N-1 in order; this is not a qai-hub-models LLM export")
    out.layers_per_part = tuple(len(ls) for ls in per_graph_layers)
    out.arch = infer_architecture(protos, ios, graphs, len(layers), out)
    out.quant = infer_quantization(graphs, out.arch, out.head, out.notes)
    out.family, out.evidence = family_from_graphs(protos, graphs)
    out.arch["tied"] = tied_head(protos, graphs, out.arch, out.head)
    return out


# ============================================================================ the family

# By name, as qai-hub-models' exports keep them (q_proj_sha.0.bias, q_norm_sha.0.weight, and
# the asset's flattened names such as ..._q_proj_sha_0_Conv.bias), and by structure (a q/k/v
# projection Conv with a bias input)
QK_NORM = re.compile(r"(^|[^a-z])[qk]_(norm|layernorm)", re.I)   # not "seq_norm"
QKV_BIAS = re.compile(r"(^|[^a-z])[qkv]_proj.*bias$", re.I)
QKV_PROJ = re.compile(r"(^|[^a-z])[qkv]_proj", re.I)
TIED_SAMPLES = 16
TIED_HIDDEN_SAMPLES = 64
# The chat special tokens of each family, as its tokenizer names them (Genie's bos/eos/eot)
FAMILY_SPECIALS = {"qwen2": QWEN2_SPECIALS, "qwen3": QWEN2_SPECIALS,
                   "llama": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>",
                             "eot": "<|end_of_text|>"}}
# What the files cannot say, for the families whose every model agrees on it (Qwen2, Qwen2.5 and
# Qwen3 config.json files: rope_theta 1e6, rms_norm_eps 1e-6, no rope_scaling). A Llama's differ
# between models (Llama 3.x 500000 and scaled, Mistral 1e6, Falcon 3 1000042): asked for.
FAMILY_DEFAULTS = {"qwen2": {"rope_theta": QWEN2_ROPE_THETA, "rms_norm_eps": QWEN2_RMS_NORM_EPS},
                   "qwen3": {"rope_theta": QWEN2_ROPE_THETA, "rms_norm_eps": QWEN2_RMS_NORM_EPS}}
# config.json's names of the dimensions the graphs show
HF_DIMENSIONS = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
                 "num_attention_heads": "num_attention_heads",
                 "num_kv_heads": "num_key_value_heads", "intermediate_size": "intermediate_size",
                 "vocab_size": "vocab_size"}


def family_from_graphs(protos: list, graphs: list) -> tuple:
    """(family, evidence) from the decoder's tensors: q/k norms make a Qwen3, q/k/v biases a
    Qwen2, neither a Llama-style decoder (Llama 3.x, Mistral, Falcon 3)."""
    names = [i.name for p in protos for i in p.graph.initializer]
    norms = sorted({n for n in names if QK_NORM.search(n)})
    biases = sorted({n for n in names if QKV_BIAS.search(n)} | {
        node.input[2] for p in protos for node in p.graph.node
        if node.op_type in ("Conv", "Gemm") and len(node.input) == 3 and node.input[2]
        and QKV_PROJ.search(node.name or node.output[0])})
    if norms and biases:
        raise InputError(f"{graphs[0].onnx}: q/k norms ({norms[0]}) and q/k/v biases "
                         f"({biases[0]}): no family hexbundle knows has both (qwen2: biases, "
                         "qwen3: norms, llama: neither); this model cannot be built as any of "
                         "them")
    if norms:
        return "qwen3", f"q/k norms ({norms[0]}, ...), no q/k/v biases"
    if biases:
        return "qwen2", f"q/k/v biases ({biases[0]}, ...), no q/k norms"
    return "llama", "no q/k/v biases and no q/k norms"


def tied_head(protos: list, graphs: list, arch: dict, head: Optional[Linear]) -> Optional[bool]:
    """Whether the LM head (the linear logits are computed with) holds the embedding's values (a
    tied model: the export keeps a copy), compared on TIED_SAMPLES vocabulary entries spread
    over the vocabulary, each at TIED_HIDDEN_SAMPLES positions of the hidden size: single
    elements of the mapped tables, so a head stored [hidden, vocab] (a MatMul's, as Qwen3
    checkpoints hold it) is not read whole to gather its columns (a 7B model's 2.5 GB table
    was, at the import's peak RSS); None where no head of the vocabulary's width is found."""
    vocab, hidden = arch["vocab_size"], arch["hidden_size"]
    if head is None or (head.in_width, head.out_width) != (hidden, vocab):
        return None
    if head.weight == arch["embedding"]:
        return True
    found = {}
    for proto, graph in zip(protos, graphs):
        for init in proto.graph.initializer:
            if init.name in (arch["embedding"], head.weight):
                found.setdefault(init.name, (init, graph.onnx))
    ids = np.unique(np.linspace(0, vocab - 1, TIED_SAMPLES).astype(np.int64))[:, None]
    at = np.unique(np.linspace(0, hidden - 1, TIED_HIDDEN_SAMPLES).astype(np.int64))[None, :]
    embedding = initializer_values(*found[arch["embedding"]]).mapped()
    weight = initializer_values(*found[head.weight]).mapped()
    if head.out_in:   # [vocab, hidden(, 1, 1)]: Conv, Gemm transB
        rows = weight[(ids, at) + (0,) * (weight.ndim - 2)]
    else:             # MatMul [hidden, vocab]
        rows = weight[at, ids]
    return bool(np.array_equal(np.asarray(embedding[ids, at], np.float32),
                               np.asarray(rows, np.float32)))


def expected_specials(family: str, hf, tokenizer: Path) -> dict:
    """The special tokens a tokenizer is judged by before an import: config.json's ids where
    given; else the family's, for the Qwen families, whose every model shares them; none for a
    Llama-style decoder (Llama 3.x, Mistral and Falcon 3 each have their own)."""
    if hf is not None:
        return specials_from_config(hf, tokenizer, FAMILY_SPECIALS[family])
    return dict(FAMILY_SPECIALS[family]) if family in FAMILY_DEFAULTS else {}


def specials_from_config(hf, tokenizer: Path, family_specials: dict) -> dict:
    """bos / eos / eot as config.json names them by id (bos_token_id; eos_token_id, one id or a
    list: eos the last, the chat turn's end in Llama 3's [end_of_text, eom, eot_id]; eot the
    first), read in the tokenizer's added tokens; the family's where config.json says nothing."""
    contents = added_token_contents(tokenizer)
    eos = hf.get("eos_token_id")
    eos = eos if isinstance(eos, list) else [eos]
    ids = {"bos": hf.get("bos_token_id"), "eos": eos[-1], "eot": eos[0]}
    out = dict(family_specials)
    for role, tid in ids.items():
        if type(tid) is int and tid in contents:
            out[role] = contents[tid]
        elif tid is not None:
            say(f"  problem: {hf.path.name} {role} id {tid} is not among {tokenizer.name}'s "
                f"added tokens; the family's {out[role]!r} is written")
    return out


def fill_from_config(out: Inferred, hf, tree: ExportTree) -> None:
    """A size the graphs' structure does not show is config.json's, said so; without a
    config.json that states it, refused naming the graph, what was looked for and the flag."""
    for key, reason in list(out.unknown.items()):
        hf_key = HF_DIMENSIONS[key]
        value = hf.get(hf_key) if hf is not None else None
        graph = _graph_files(tree)
        if type(value) is not int:
            fix = (f"{hf.path} has no {hf_key} either: add the model's value there, or give the "
                   "model's own config.json with --model-config PATH/config.json"
                   if hf is not None else
                   "give the model's config.json: --model-config PATH/config.json")
            raise InputError(f"{graph}: {reason}, so the graph does not show the {key}; {fix}")
        out.arch[key] = value
        out.sources[key] = f"{hf.path}: {hf_key} (the graph does not show it: {reason})"
        out.notes.append(f"{key} = {value}: {hf.path.name}'s {hf_key}; {graph} does not show it "
                         f"({reason})")
        del out.unknown[key]


def check_size_ranges(out: Inferred) -> None:
    """Each size the graphs show within the range the model config allows, else refused naming
    the file and what in it shows the size."""
    fields = MODEL_SCHEMA["architecture"].type
    for key in (*HF_DIMENSIONS, "head_dim"):
        bound, value = fields[key], out.arch[key]
        if not bound.min <= value <= bound.max:
            raise InputError(f"{out.sources.get(key, key)}: {key} {value} is outside "
                             f"[{bound.min:g}, {bound.max:g}], the range hexbundle builds: not "
                             "a model it can build; check that this is the export of an LLM")


def check_sizes_against_config(out: Inferred, hf, tree: ExportTree) -> None:
    """Every size the graphs show, against config.json's: a disagreement names both files,
    both values, what in the graph shows it, and the flag that gives the right config.json."""
    a, wrong, evidence = out.arch, [], []
    given = [(key, source, hf.get(source)) for key, source in HF_DIMENSIONS.items()]
    given.append(("head_dim", "head_dim", hf.head_dim))
    for key, source, value in given:
        if type(value) is int and value != a[key] and not out.sources.get(key, "").startswith(
                str(hf.path)):
            wrong.append(f"{source} {value} (the graphs: {a[key]})")
            evidence.append(f"  {key} {a[key]}: {out.sources.get(key, 'the graphs')}")
    if wrong:
        raise InputError(f"{hf.path}: {'; '.join(wrong)}; the graphs of {_graph_files(tree)} "
                         "say otherwise:\n" + "\n".join(evidence) + "\nIs it the config.json "
                         "of another model? Give the one the "
                         f"{'checkpoint' if tree.checkpoint else 'export'} was made from: "
                         "--model-config PATH/config.json")


def _graph_files(tree: ExportTree) -> str:
    files = sorted({str(f.onnx) for f in tree.unsplit.values()})
    return files[0] if len(files) == 1 else str(tree.root)


def decide_family(out: Inferred, hf, rope_theta: float, tree: ExportTree) -> None:
    """The family and what the files cannot say, each from the best source: config.json
    (`--model-config`) where given and consistent with the graphs, else the family's known
    values (Qwen), else refused asking for config.json. --rope-theta overrides the theta."""
    a, where = out.arch, (hf.path.name if hf else "")
    fill_from_config(out, hf, tree)
    check_size_ranges(out)
    if hf is not None:
        if hf.family is None:
            raise InputError(f"{hf.path}: model_type {hf.model_type!r} is no family hexbundle "
                             "knows (qwen2, qwen3, llama, mistral); the graphs show "
                             f"{out.evidence}. Not built as another family")
        if hf.family != out.family:
            raise InputError(f"{hf.path}: model_type {hf.model_type!r} is the {hf.family} "
                             f"family, but the graphs show {out.evidence} ({out.family}) in "
                             f"{_graph_files(tree)}; is this the config.json of another model? "
                             "Give the model's own: --model-config PATH/config.json")
        check_sizes_against_config(out, hf, tree)
    family = out.family
    defaults = FAMILY_DEFAULTS.get(family, {})
    stated = {}
    for key in ("rope_theta", "rms_norm_eps"):
        value = (hf.rope_theta if key == "rope_theta" else hf.get(key)) if hf else None
        if isinstance(value, (int, float)):
            stated[key] = (float(value), f"{where} {key}")
        elif key in defaults:
            stated[key] = (defaults[key], f"not in the files: the {family} family's value")
        else:
            raise InputError(
                f"{tree.root}: the graphs show a {family}-family decoder ({out.evidence}): "
                f"Llama 3.x, Mistral and Falcon 3 differ in {key} (and RoPE scaling), which the "
                f"files do not hold; give the model's config.json: --model-config "
                f"PATH/config.json")
    if rope_theta:
        stated["rope_theta"] = (float(rope_theta), "--rope-theta")
    out.stated = stated
    out.rope_scaling = hf.rope_scaling if hf else None
    if out.rope_scaling and out.rope_scaling["rope_type"] != "llama3":
        raise InputError(f"{hf.path}: rope_scaling of type {out.rope_scaling['rope_type']!r}; "
                         "hexbundle's runtime and Genie config compute 'llama3' scaling only")
    if out.rope_scaling:
        missing = [k for k in LLAMA3_KEYS if not isinstance(out.rope_scaling.get(k), (int, float))]
        if missing:
            raise InputError(f"{hf.path}: rope_scaling 'llama3' lacks {', '.join(missing)}: "
                             "give the model's own config.json (its Hugging Face repository's) "
                             "with --model-config PATH/config.json")
    tied = hf.get("tie_word_embeddings") if hf else None
    if isinstance(tied, bool):
        if a["tied"] is not None and a["tied"] != tied:
            out.notes.append(f"{where} says tie_word_embeddings = {str(tied).lower()}, but the "
                             f"export's LM head {'equals' if a['tied'] else 'differs from'} the "
                             "embedding; config.json's value is written")
        a["tied"] = tied
    if a["tied"] is None:
        out.notes.append("tie_word_embeddings: no LM head weight of the vocabulary's shape to "
                         "compare with the embedding and no config.json says; false written")
        a["tied"] = False
    out.specials = dict(FAMILY_SPECIALS[family])
    say(f"  family {family}: {out.evidence}"
        + (f"; {where} model_type {hf.model_type!r}" if hf else ""))
    for key, (value, source) in stated.items():
        if source.startswith("not in the files"):
            out.notes.append(f"{key} = {value:g}: {source}; give --model-config config.json if "
                             "the model's says otherwise")


def infer_architecture(protos: list, ios: list, graphs: list, num_layers: int,
                       out: Inferred) -> dict:
    """The sizes the graphs show, each from the role of what shows it (inputs/structure.py):
    the KV cache inputs, the embedding table, the logits, the attention's query projections, the
    MLP's projections. Where each came from goes to out.sources; a size the structure does not
    show goes to out.unknown with the reason (settled by fill_from_config)."""
    dims = {i.name: tuple(i.dims) for p in protos for i in p.graph.initializer}
    key_at, key_name, key = next((n, name, shape) for n, io in enumerate(ios)
                                 for name, (_, shape) in io.inputs.items()
                                 if PAST_KEY.fullmatch(name))
    kv_heads, head_dim = key[0], key[2]
    logits_at = next((n for n, io in enumerate(ios) if "logits" in io.outputs), None)
    if logits_at is None:
        raise InputError(f"{graphs[-1].onnx}: no output 'logits'; the last part must end with "
                         "the LM head: re-run the export (or import the folder it wrote whole)")
    logits = ios[logits_at].outputs["logits"][1]
    vocab = logits[-1]
    table, table_at = embedding_table(protos, graphs)
    hidden = dims[table][1]
    cache = f"{graphs[key_at].onnx}: {key_name} {list(key)} (KV heads, 1, head_dim, positions)"
    out.sources.update({
        "num_layers": f"{graphs[0].onnx}: past_key_0_in..past_key_{num_layers - 1}_in",
        "hidden_size": f"{graphs[table_at].onnx}: the embedding table {table} {list(dims[table])}",
        "num_kv_heads": cache, "head_dim": cache,
        "vocab_size": f"{graphs[logits_at].onnx}: logits {list(logits)}"})
    structure = read_structure(protos, graphs)
    arch = {"num_layers": num_layers, "hidden_size": hidden,
            "num_attention_heads": attention_heads(structure, kv_heads, head_dim, out),
            "num_kv_heads": kv_heads, "head_dim": head_dim,
            "intermediate_size": mlp_width(structure, out),
            "vocab_size": vocab, "embedding": table}
    out.head = structure.head
    return arch


def embedding_table(protos: list, graphs: list) -> tuple:
    """(the initializer a Gather reads with input_ids (through a Cast, if any), the index of the
    graph holding it)."""
    for at, proto in enumerate(protos):
        inits = {i.name for i in proto.graph.initializer}
        ids = {"input_ids"}
        for node in proto.graph.node:
            if node.op_type == "Cast" and node.input and node.input[0] in ids:
                ids.add(node.output[0])
        for node in proto.graph.node:
            if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in ids \
                    and node.input[0] in inits:
                return node.input[0], at
    raise InputError(f"{graphs[0].onnx}: no Gather of an embedding table by input_ids; the "
                     "first part must hold the embedding: re-run the export")


def attention_heads(structure: Structure, kv_heads: int, head_dim: int,
                    out: Inferred) -> Optional[int]:
    """Query heads: the summed width of the projections a layer's attention reads as its
    queries, over head_dim; every layer alike, and its keys as wide as the KV cache."""
    if not structure.query_widths:
        out.unknown["num_attention_heads"] = structure.reasons["attention"]
        return None
    widths = sorted(set(structure.query_widths.values()))
    layer = min(structure.query_widths)
    where = structure.attention_graph[layer]
    if len(widths) > 1:
        other = next(n for n, w in sorted(structure.query_widths.items()) if w != widths[0])
        raise InputError(f"{where}: the query projections of layer {layer} are "
                         f"{structure.query_widths[layer]} wide, those of layer {other} "
                         f"{structure.query_widths[other]}: hexbundle builds decoders whose "
                         "layers are alike; this graph is not one qai-hub-models writes")
    for key_layer, width in sorted(structure.key_widths.items()):
        if width != kv_heads * head_dim:
            raise InputError(f"{structure.attention_graph[key_layer]}: layer {key_layer}'s key "
                             f"projections are {width} wide, but past_key_{key_layer}_in holds "
                             f"{kv_heads} KV heads x head_dim {head_dim}: the graph is "
                             "inconsistent; re-run the export")
    if widths[0] % head_dim:
        raise InputError(f"{where}: layer {layer}'s query projections are {widths[0]} wide, not "
                         f"a multiple of head_dim {head_dim} (past_key_{layer}_in): the graph is "
                         "inconsistent; re-run the export")
    heads = widths[0] // head_dim
    out.sources["num_attention_heads"] = (f"{where}: layer {layer}'s query projections, "
                                          f"{widths[0]} wide = {heads} x head_dim {head_dim}")
    return heads


def mlp_width(structure: Structure, out: Inferred) -> Optional[int]:
    """The intermediate size: the width of every MLP's gate and up projections and of its down
    projection's input, alike in every layer."""
    if not structure.mlp_widths:
        out.unknown["intermediate_size"] = structure.reasons["mlp"]
        return None
    for where, gate, up, down in structure.mlp_widths:
        if not gate == up == down:
            raise InputError(f"{where}: an MLP whose gate, up and down projections are {gate}, "
                             f"{up} and {down} wide: the graph is inconsistent; re-run the "
                             "export")
    widths = Counter(gate for _, gate, _, _ in structure.mlp_widths)
    where = structure.mlp_widths[0][0]
    if len(widths) > 1:
        raise InputError(f"{where}: MLPs of widths {', '.join(map(str, sorted(widths)))}: "
                         "hexbundle builds decoders whose layers are alike; this graph is not "
                         "one qai-hub-models writes")
    width = next(iter(widths))
    out.sources["intermediate_size"] = (f"{where}: the MLP's gate, up and down projections "
                                        f"({len(structure.mlp_widths)} found), {width} wide")
    return width


def infer_quantization(graphs: list, arch: dict, head_linear: Optional[Linear],
                       notes: list) -> dict:
    params, activations, embedding = {}, Counter(), None
    for g in graphs:
        encodings = load_encodings(g.encodings)
        params.update(encodings.params)
        activations.update(e.bitwidth for e in encodings.activations.values() if e.is_int)
        # a checkpoint's embedding table has an activation entry only, which qai-hub-models
        # makes its param encoding before splitting (split.qaihm_part_encodings)
        embedding = embedding or encodings.activations.get(arch["embedding"])
    embedding = params.get(arch["embedding"]) or embedding
    # the LM head by its role (the linear logits come from), never by a width a projection
    # may share with the vocabulary
    head = [head_linear.weight] if head_linear is not None and head_linear.weight in params \
        and head_linear.weight != arch["embedding"] else []
    decoder = Counter(e.bitwidth for n, e in params.items() if e.is_int and e.per_channel
                      and n != arch["embedding"] and n not in head)
    quant = {"decoder_linear_bitwidth": decoder.most_common(1)[0][0] if decoder else 4,
             "lm_head_bitwidth": params[head[0]].bitwidth if head else 8,
             "embedding_bitwidth": embedding.bitwidth if embedding and embedding.is_int else 16,
             "activation_bitwidth": activations.most_common(1)[0][0] if activations else 16}
    for key, seen in (("decoder_linear_bitwidth", decoder), ("lm_head_bitwidth", head),
                      ("embedding_bitwidth", embedding), ("activation_bitwidth", activations)):
        if not seen:
            notes.append(f"{key}: no encoding says; {quant[key]} assumed")
    return quant


def expected_graphs(tree: ExportTree) -> tuple:
    """(the model this import would write, {ONNX path: the Graph the build takes it for}): what
    `doit inspect` checks each graph's inputs and outputs against, as the convert step will."""
    split, prompt_ar, token_ar = choose_split(tree, None)
    inferred = infer(tree, split, prompt_ar, token_ar)
    fill_from_config(inferred, None, tree)
    model, graphs = model_of(tree, inferred)
    parts = Plan("export", inferred.layers_per_part).parts() if split == "export" else []
    several = len(inferred.context_lengths) > 1
    for kind, ar in (("prompt", prompt_ar), ("token", token_ar)):
        for cl in inferred.context_lengths:
            for part in parts:
                files = tree.parts.get((ar, cl), {}).get(part.index)
                if files is not None:
                    graphs[files.onnx] = Graph(kind, ar, cl, part, several)
    return model, graphs


def model_of(tree: ExportTree, inferred: Inferred) -> tuple:
    """(the whole model as inferred, {unsplit ONNX path: its Graph})."""
    prompt_ar, token_ar = inferred.prompt_ar, inferred.token_ar
    a = inferred.arch
    arch = Architecture(num_layers=a["num_layers"], hidden_size=a["hidden_size"],
                        num_attention_heads=a["num_attention_heads"],
                        num_kv_heads=a["num_kv_heads"], head_dim=a["head_dim"],
                        intermediate_size=a["intermediate_size"], vocab_size=a["vocab_size"],
                        rope_theta=QWEN2_ROPE_THETA, rms_norm_eps=QWEN2_RMS_NORM_EPS,
                        family=inferred.family)
    model = Model(tree.slug, tree.slug, arch, Quantization(), inferred.context_lengths,
                  prompt_ar, token_ar)
    several = len(inferred.context_lengths) > 1
    graphs = {}
    for kind, ar in (("prompt", prompt_ar), ("token", token_ar)):
        for cl in inferred.context_lengths:
            if (ar, cl) in tree.unsplit:
                graphs[tree.unsplit[(ar, cl)].onnx] = Graph(kind, ar, cl, whole_model_part(model),
                                                            several)
    return model, graphs


# ============================================================================ the config

def model_toml(name: str, tree: ExportTree, split: str, inferred: Inferred, plan: tuple,
               tokenizer: Optional[Path], project: ProjectLayout) -> str:
    a, q = inferred.arch, inferred.quant
    lengths = inferred.context_lengths
    cl = max(lengths)
    decode = 32
    prompt_tokens = max(1, min(160, min(lengths) - decode - 1))   # verify runs at every length
    specials_from = inferred.specials_from or f"the {inferred.family} family's chat special tokens"
    graphs = (f"context_length = {cl}" if len(lengths) == 1 else
              f"context_lengths = [{', '.join(map(str, lengths))}]   # Genie's context: {cl}")
    lines = [
        f"# Imported by `doit import_export` from a {tree.layout}; re-run the import after a",
        "# new export. The export's files are used in place, read-only.",
        "[model]", f"name = {_s(name)}", f"slug = {_s(tree.slug)}",
        f"description = {_s(f'{tree.slug} from a qai-hub-models export ({tree.layout})')}",
        'default_plan = "export"', "",
        "[architecture]", f"family = {_s(inferred.family)}   # the graphs: {inferred.evidence}",
        f"tie_word_embeddings = {str(a['tied']).lower()}"] + [
        f"{k} = {a[k]}" for k in ("num_layers", "hidden_size", "num_attention_heads",
                                  "num_kv_heads", "head_dim", "intermediate_size", "vocab_size")
    ] + [f"{k} = {v!r}   # {source}" for k, (v, source) in inferred.stated.items()] + \
        scaling_table(inferred.rope_scaling) + ["",
        "[graphs]", graphs, f"prompt_ar = {inferred.prompt_ar}",
        f"token_ar = {inferred.token_ar}", "",
        "[quantization]   # read from the encodings"] + [f"{k} = {v}" for k, v in q.items()] + [
        'unencoded_weights = "int8"   # as Qualcomm compiles it (--quantize_full_type w8a16)',
        "",
        f"[tokenizer]   # {specials_from}"] + [
        f"{k} = {_s(v)}" for k, v in inferred.specials.items()] + [
        "",
        "[inputs]", 'source = "qai-hub-models"', f"dir = {_s(_dir_value(tree.root, project))}",
        f"layout = {_s(tree.layout)}", f"split = {_s(split)}"] + (
        ['cut = "qaihm"   # qai-hub-models 0.65\'s split_onnx rule, each graph pinned from the '
         'dynamic one'] if tree.dynamic else
        ['cut = "qaihm"   # qai-hub-models\' split_onnx rule (0.55\'s and 0.65\'s) on the '
         'static graphs'] if tree.checkpoint else []) + [
        f"tokenizer = {_s(tree.rel(tokenizer) if tokenizer else TOKENIZER)}",
        "how_to_export = " + _s(("re-run the qai-hub-models quantize" if tree.checkpoint else
                                 "re-run the qai-hub-models export") + " (docs/exports.md), "
                                "then `doit import_export` again"),
        "",
    ]
    lines += graph_tables(tree, split, inferred, plan)
    lines += [
        "[genie]",
        "# genie_config.json's dialog settings: what Qualcomm's Genie bundle generator writes",
        f"# (qai-hub-models 0.65.0 create_genie_config: max-num-tokens {QUALCOMM_MAX_NUM_TOKENS}, "
        "capped by",
        "# the (largest) context length; sampler seed 42, temp 0.8, top-k 40, top-p 0.95).",
        f"max_num_tokens = {min(QUALCOMM_MAX_NUM_TOKENS, cl)}", "sampler_seed = 42", "temp = 0.8",
        "top_k = 40", "top_p = 0.95", "",
        "# `doit verify`: the bundle against this export's own quantized model (its encodings",
        "# applied, in onnxruntime); its gates' defaults hold for any export (hexbundle/config/",
        "# build.py VERIFY_SCHEMA), so none is written here.",
        "[verify]", f"prompt_tokens = {prompt_tokens}", f"decode_steps = {decode}", "seed = 0",
        "",
        "[plans.export]", f"layers_per_part = [{', '.join(map(str, plan))}]",
        "tolerance_pct = 5.0", ""]
    return "\n".join(lines)


def scaling_table(scaling: Optional[dict]) -> list:
    if not scaling:
        return []
    return ["", "[architecture.rope_scaling]   # config.json's",
            f"rope_type = {_s(scaling['rope_type'])}"] + [
        f"{k} = {int(scaling[k]) if k == 'original_max_position_embeddings' else float(scaling[k])!r}"
        for k in LLAMA3_KEYS]


def graph_tables(tree: ExportTree, split: str, inferred: Inferred, plan: tuple) -> list:
    """[inputs.graphs.<graph name>] (the export's parts) or [inputs.unsplit.<slot>] (Graph.slot:
    prompt, token; prompt_cl<C>, token_cl<C> with several context lengths)."""
    lines = []
    lengths, ars = inferred.context_lengths, (inferred.prompt_ar, inferred.token_ar)
    if split == "local":
        for graph in part_graphs(Part(1, 1, (), True, True), lengths, *ars):
            lines += _files_table(f"inputs.unsplit.{graph.slot}", tree,
                                  tree.unsplit[(graph.ar, graph.context_length)])
        return lines
    count = len(plan)
    for index in range(1, count + 1):
        for graph in part_graphs(Part(index, count, (), index == 1, index == count), lengths, *ars):
            files = tree.parts[(graph.ar, graph.context_length)][index]
            lines += _files_table(f'inputs.graphs."{graph.name}"', tree, files)
            say(f"  {graph.name} <- {tree.rel(files.onnx)}")
    return lines


def _files_table(header: str, tree: ExportTree, files: GraphInputs) -> list:
    data = ", ".join(_s(tree.rel(d)) for d in files.data)
    return [f"[{header}]", f"onnx = {_s(tree.rel(files.onnx))}", f"data = [{data}]",
            f"encodings = {_s(tree.rel(files.encodings))}", ""]


def _dir_value(path: Path, project: ProjectLayout) -> str:
    try:
        return str(path.relative_to(project.root))
    except ValueError:
        return str(path)


def _s(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text, ensure_ascii=False)


def check_tokenizer(path: Path, vocab: int, specials: dict) -> None:
    try:
        special_token_ids(path, specials, vocab)
    except HexbundleError as exc:
        say(f"  problem: {exc}")
