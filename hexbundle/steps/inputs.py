"""Step `inputs`: write a generated model's inputs (one part's ONNX + .data + .encodings, or the
tokenizer), or split one part out of an export's unsplit graphs (inputs/split.py); streamed
tensor by tensor so full-size models fit in memory.

The step receives its description (steps/description.py) and nothing else: its outputs (and
the split's inputs) by role -- "onnx:<slot>", "encodings:<slot>" per graph, "data" --, its
arguments (the part, or what = "tokenizer") and its options (config.step_options:
GenerateOptions, TokenizerOptions or SplitOptions), from which it rebuilds the model's graphs;
nothing from a config.
"""
from __future__ import annotations

from pathlib import Path

from hexbundle.config.layout import GraphInputs
from hexbundle.config.model import Model, Part, Plan
from hexbundle.config.step_options import GenerateOptions, SplitOptions, TokenizerOptions
from hexbundle.formats.tokenizer import special_token_ids
from hexbundle.inputs import bpe, generate, split
from hexbundle.inputs.pins import require_pins
from hexbundle.steps.description import Description, DescriptionError


def generate_inputs(described: Description, log) -> None:
    if described.arguments.get("what") == "tokenizer":
        write_tokenizer(described, described.options, log)
    elif described.inputs:   # a split reads the export's graphs; a generated part reads nothing
        for path in split_part(described, log):
            log(f"wrote {path.name} ({path.stat().st_size} bytes)")
    else:
        for path in generate_part(described, log):
            log(f"wrote {path.name} ({path.stat().st_size} bytes)")


def write_tokenizer(described: Description, o: TokenizerOptions, log) -> None:
    path = described.output("tokenizer")
    bpe.generate_tokenizer(o.vocab_size, path, dict(o.specials))
    # The bundle step's own check, now: a tokenizer it would refuse fails here, in seconds,
    # not after every part is converted and compiled.
    ids = special_token_ids(path, dict(o.specials), o.vocab_size)
    log(f"wrote {path.name} (specials {ids}; checked as the bundle step reads it)")


def model_of(o, quantization=None, name: str = "") -> Model:
    """The model as far as its graphs' shapes go: what GenerateOptions / SplitOptions hold."""
    return Model(name=name, slug="", architecture=o.architecture, quantization=quantization,
                 context_lengths=tuple(o.context_lengths), prompt_ar=o.prompt_ar,
                 token_ar=o.token_ar)


def part_of(o, arguments: dict) -> Part:
    return Plan("", tuple(o.layers_per_part)).parts()[int(arguments["part"]) - 1]


def generate_part(described: Description, log) -> list:
    o: GenerateOptions = described.options
    model, part = model_of(o, o.quantization, o.model_name), part_of(o, described.arguments)
    declared = [p for _, p in described.outputs]
    out_dir = declared[0].parent
    # The disk check of the parts still to come ran before the step (check_pending_disk).
    written = generate.generate_part(model, part, out_dir, o.seed, log)
    if sorted(map(Path, written)) != sorted(declared):
        raise DescriptionError(f"inputs step of {part.tag}: its description declares "
                               f"{sorted(p.name for p in declared)}, it writes "
                               f"{sorted(Path(p).name for p in written)}: a description from "
                               "another hexbundle?")
    return written


def graph_files(described: Description, side: str, slot: str) -> GraphInputs:
    """A graph's files (Graph.slot `slot`) among the description's inputs or outputs."""
    pairs = described.inputs if side == "input" else described.outputs
    one = described.input if side == "input" else described.output
    return GraphInputs(one(f"onnx:{slot}"), tuple(p for r, p in pairs if r == "data"),
                       one(f"encodings:{slot}"))


def split_sources(described: Description):
    """(model, part, unsplit files by slot, qai-hub-models' plan or ()) of a split's
    description; its inputs' pins checked first."""
    o: SplitOptions = described.options
    require_pins(described.input_paths(), dict(o.pins), o.model_config)
    model, part = model_of(o), part_of(o, described.arguments)
    unsplit = {g.slot: graph_files(described, "input", g.slot) for g in model.graphs(part)}
    return model, part, unsplit, tuple(o.layers_per_part) if o.cut == "qaihm" else ()


def split_part(described: Description, log) -> list:
    o: SplitOptions = described.options
    model, part, unsplit, qaihm_plan = split_sources(described)
    out = {g.slot: graph_files(described, "output", g.slot) for g in model.graphs(part)}
    return split.split_graphs(model, part, unsplit, out, log, Path(o.model_config), qaihm_plan)


def validate_split_sources(described: Description) -> int:
    """What the split reads of the export, checked as convert will check the split
    (inputs/split.validate_part_sources): run before a remote cache is asked for it."""
    model, part, unsplit, qaihm_plan = split_sources(described)
    return split.validate_part_sources(model, part, unsplit,
                                       Path(described.options.model_config), qaihm_plan)
