"""Each build step described once; its doit task, its key and its remote Action derive from it.

A `Step` says what a step is: the task it makes, the step module it runs (steps.runner's name,
graph.keys.STEP_CODE's entry), its own arguments, its typed options (steps/options.py), its
input and output files, and whether it runs through the backend (the toolchain). From it:

  doit task     file_dep = inputs, targets = outputs, uptodate = [its step key, the recorded
                outputs unchanged (check_outputs), its own extra checks];
  step key      {"step", "arguments", "options", "code", "pins"? (not for a described step:
                its options hold them), "toolchain"? | "image"?}: canonical
                typed JSON (formats.stepkey, docs/step-key.md); the pins are those of its
                inputs (config [inputs.pins]); "toolchain" is {"backend", "version"} for a
                step that runs through the backend; "image" (executor=docker) the toolchain
                image's ID for one that runs in the container otherwise (the input steps);
  REAPI Action  the same document as the Command's options, inputs as the input root, outputs
                as its output paths (graph.remote_steps, remote.action);
  --explain     the stored key and code files against the current ones (graph.explain).

No step lists its key fields by hand: whatever a step reads is in its options value, its
inputs' pins, its code and, when it runs through the backend, the backend and its version.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Optional

from hexbundle.config.layout import Layout
from hexbundle.graph.actions import step_action

# graph.keys and graph.targets (the config's pins, the toolchain, the code digests) are imported
# when a task is made, not with dodo.py: `doit list` makes none (graph.loader).

RUN_STEP = "hexbundle.steps.executor:run_step"
# Steps run in threads under `doit -n 2`: don't let doit swap sys.stdout per action (racy).
NO_CAPTURE = {"capture": False}


@dataclass
class Step:
    """One build step of the graph, declared once (dodo.py)."""
    task: str                     # "convert:part_1_of_4_prompt", or "bundle"
    step: str                     # the step module: inputs, convert, compile, bundle, verify
    doc: str                      # "" for a task of its own: its function's docstring
    options: object               # the typed options value the step's code receives
    inputs: list = field(default_factory=list)    # Paths, or (role, Path): doit's file_dep
    outputs: list = field(default_factory=list)   # Paths, or (role, Path): doit's targets
    arguments: dict = field(default_factory=dict)  # the step's own: part, graph, what
    toolchain: bool = False       # runs through the backend: its version keys the step
    check_outputs: bool = True    # rerun when an output was changed after the step wrote it
    action: Optional[tuple] = None   # another action than the step runner (verify's)
    before: tuple = ()            # actions run first (bundle: dead outputs, the size check)
    after: tuple = ()             # actions run after the step, here (bundle: build-info.json)
    checks: tuple = ()            # more uptodate items (bundle: bundle_in_place)
    doit: dict = field(default_factory=dict)    # other doit fields: clean, io, verbosity
    described: bool = False       # the step function receives description(step) alone

    @property
    def subtask(self) -> Optional[str]:
        return self.task.split(":", 1)[1] if ":" in self.task else None

    @property
    def input_paths(self) -> list:
        return _paths(self.inputs)

    @property
    def output_paths(self) -> list:
        return _paths(self.outputs)


def _paths(items: list) -> list:
    return [item[1] if isinstance(item, tuple) else item for item in items]


def _roles(items: list) -> tuple:
    return tuple(item if isinstance(item, tuple) else ("", item) for item in items)


def description(step: Step) -> dict:
    """What a described step's function receives (steps.description's JSON): its inputs and
    outputs by role, its arguments and its typed options: the same values its key is made of."""
    from hexbundle.steps.description import Description, to_json
    return to_json(Description(step.step, dict(step.arguments), _roles(step.inputs),
                               _roles(step.outputs), step.options))


def key(step: Step, layout: Layout):
    """The step's key item (graph.keys.step_key), its document derived from the description:
    nothing listed by hand."""
    from hexbundle.graph.keys import image_id, pinned, step_code, step_key, toolchain_key
    cfg = layout.cfg
    document = {"step": step.step, "arguments": dict(step.arguments), "options": step.options,
                "code": step_code(step.step)}
    if not step.described:   # a described step's options hold the pins it checks (convert's)
        document["pins"] = pinned(cfg, step.input_paths)
    if step.toolchain:
        document["toolchain"] = lambda: {"backend": cfg.backend, "version": toolchain_key(cfg)}
    elif step.action is None and cfg.executor == "docker":   # runs in the image all the same
        document["image"] = lambda: image_id(cfg.root) or "(unavailable)"
    return step_key(step.step, document)


def doit_task(step: Step, layout: Layout) -> dict:
    """The doit task dict of a described step."""
    rel = layout.rel
    # made when the step runs, not for every task of every run (a no-op runs none)
    described = functools.partial(description, step) if step.described else None
    run = step.action or step_action(RUN_STEP, layout, step.task, step.step, described,
                                     **step.arguments)
    uptodate = [key(step, layout)]
    if step.check_outputs and step.outputs:
        from hexbundle.graph.targets import targets_unchanged
        uptodate.append(targets_unchanged())
    task = {"actions": [*step.before, run, *step.after],
            "file_dep": [rel(p) for p in step.input_paths],
            "targets": [rel(p) for p in step.output_paths],
            "uptodate": uptodate + list(step.checks), **step.doit}
    if step.doc:   # else doit takes the task function's docstring
        task["doc"] = step.doc
    if step.subtask is not None:
        task["name"] = step.subtask
    return task


def declared(layout: Layout) -> Callable[[Step], dict]:
    """`task = declared(LAYOUT)`, then `yield task(Step(...))` in dodo.py."""
    return lambda step: doit_task(step, layout)
