"""Step `inputs`: write a generated model's inputs (one part's ONNX + .data + .encodings, or the
tokenizer), or split one part out of an export's unsplit graphs (inputs/split.py); streamed
tensor by tensor so full-size models fit in memory."""
from __future__ import annotations

from hexbundle.config.layout import Layout
from hexbundle.formats.tokenizer import special_token_ids
from hexbundle.inputs import bpe, generate, split
from hexbundle.steps.options import generate_options, tokenizer_options


def generate_inputs(layout: Layout, spec: dict, log) -> None:
    cfg = layout.cfg
    if spec.get("what") == "tokenizer":
        options = tokenizer_options(cfg)   # the same value the task's key is made of (dodo.py)
        bpe.generate_tokenizer(options.vocab_size, layout.tokenizer, dict(options.specials))
        # The bundle step's own check, now: a tokenizer it would refuse fails here, in seconds,
        # not after every part is converted and compiled.
        ids = special_token_ids(layout.tokenizer, dict(options.specials), options.vocab_size)
        log(f"wrote {layout.rel(layout.tokenizer)} (specials {ids}; checked as the bundle "
            "step reads it)")
        return
    part = cfg.part(spec["part"])
    if layout.splits_locally:
        for path in split.split_part(layout, part, log):
            log(f"wrote {layout.rel(path)} ({path.stat().st_size} bytes)")
        return
    # Refuse early: the disk must also hold the parts still to be generated after this one.
    others = [p for p in generate.missing_parts(cfg.model, cfg.plan.parts(), layout.inputs_dir)
              if p.index != part.index]
    pending = sum(generate.part_disk_bytes(cfg.model, p) for p in others)
    options = generate_options(cfg)   # the same value the task's key is made of (dodo.py)
    for path in generate.generate_part(cfg.model, part, layout.inputs_dir, options.seed,
                                       log, also_needed=pending):
        log(f"wrote {layout.rel(path)} ({path.stat().st_size} bytes)")
