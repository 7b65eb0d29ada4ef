"""The doit side of the remote cache: a build step's Action from its doit task.

The Action covers exactly what decides whether doit reruns the task here: its file_dep (the
input root), its step key's document (graph.stepdesc: step, arguments, typed options, code,
pins, toolchain: the Command's options, as the same canonical JSON) and its targets (the
Command's output paths); plus the code that runs it (hexbundle.remote.action). So a changed
input or option misses exactly the steps whose local up-to-date check it fails.

Which steps: inputs (generate or split), convert and compile. Not bundle: its outputs are hard
links to bin/ plus three small JSON files written in milliseconds, and fetching its bins again
from the cache would copy gigabytes that bin/ already holds.

Every run of those steps leaves a record of where its outputs came from (formats.origins),
with or without a cache: build-info.json and a release's provenance gather them.
"""
from __future__ import annotations

from hexbundle.config.layout import Layout
from hexbundle.formats.origins import (fetched_records, forget_origin, record_origin,
                                       refuse_action)
from hexbundle.graph.keys import image_id, step_key
from hexbundle.support.console import warn
from hexbundle.support.errors import HexbundleError, StepFailed

CACHED_STEPS = ("inputs", "convert", "compile")
# Steps whose fetched outputs get the checks their own outputs get (steps/check.py) before they
# are renamed into place; the inputs step's are judged by the convert that reads them.
FETCH_CHECKED = ("convert", "compile")


def run_step_recorded(run, layout: Layout, task_name: str, step: str,
                      extra: dict, task, description=None) -> None:
    """Run the step (through the remote cache when one is configured); for the cacheable steps,
    record where its outputs came from (formats.origins), cache or not. A step that fails
    evicts the inputs it read that came from a remote cache or executor (evict_fetched).
    The step (graph.stepdesc.description) is run with its description alone."""
    run = described_run(run, description)
    try:
        _run_step_recorded(run, layout, task_name, step, extra, task)
    except HexbundleError as exc:
        if not getattr(exc, "remote_failure", False):   # not the server's failure: the inputs'
            evict_fetched(layout, task_name, task.file_dep)
        raise


def described_run(run, description: dict):
    """`run` that hands the step its description (steps.executor.run_step); the `check` step
    a cache hit gets (fetch_check) is given its own (check_description)."""
    def run_described(layout, task_name, step, **extra):
        if step != description["step"]:
            return run(layout, task_name, step, **extra)
        return run(layout, task_name, step, description=description, **extra)
    run_described.description = description
    return run_described


def evict_fetched(layout: Layout, task_name: str, inputs) -> None:
    """A step failed on inputs fetched from a remote cache or executor: their bytes were right
    for their digests but may not be right (a result trusted by its shape). They are removed,
    with their origin records, and their Action's remote result is never used again here
    (formats.origins.refuse_action): the next run builds them here instead of keeping them
    up to date."""
    fetched = fetched_records(layout.records, [layout.root / f for f in inputs])
    for source, (record, outputs) in sorted(fetched.items()):
        for path in outputs:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                warn(f"hexbundle: warning: cannot remove {layout.rel(path)} ({exc})")
        forget_origin(layout.records, source)
        if record.get("action"):
            refuse_action(layout.records, str(record["action"]))
        warn(f"hexbundle: warning: {task_name} failed on the outputs of {source}, which came "
             f"from the {record['origin'].replace('-', ' ')} {record.get('server', '')} "
             f"(action {record.get('action', '?')}): removed "
             f"({', '.join(layout.rel(p) for p in outputs)}), and that result will not be used "
             f"again here; the next run builds {source} here")


def _run_step_recorded(run, layout: Layout, task_name: str, step: str,
                       extra: dict, task) -> None:
    if step not in CACHED_STEPS:
        run(layout, task_name, step, **extra)
    elif layout.cfg.remote.cache_trust == "verify" and not exact_checkable(layout, step):
        # The inputs step's files (ONNX, AIMET encodings, external data) are not ours to mark
        # and are what the exact checks compare against; a real SDK's DLCs and bins are not
        # read by them: a cache not trusted never gives them.
        run(layout, task_name, step, **extra)
        record_origin(layout.records, task_name, {"origin": "local"},
                      [layout.root / t for t in task.targets])
    elif layout.cfg.remote.executor:
        run_through_executor(run, layout, task_name, step, extra, task)
    elif layout.cfg.remote.cache:
        run_through_cache(run, layout, task_name, step, extra, task)
    else:   # (hexbundle.remote, and gRPC with it, is not even imported)
        run(layout, task_name, step, **extra)
        record_origin(layout.records, task_name, {"origin": "local"},
                      [layout.root / t for t in task.targets])


def exact_checkable(layout: Layout, step: str) -> bool:
    """Whether a fetched output of `step` can get the exact checks (steps/check.py)."""
    from hexbundle.backends import marks_outputs
    return step in FETCH_CHECKED and marks_outputs(layout.cfg.backend)


def task_options(task) -> dict:
    """The task's step key document (callables called): the Action's options."""
    for item, _, _ in task.uptodate:
        if isinstance(item, step_key):
            return item.resolved()
    raise HexbundleError(f"{task.name}: no step key (a step not declared through "
                         "graph.stepdesc): it cannot be an Action")


def run_through_cache(run, layout: Layout, task_name: str, step: str,
                      extra: dict, task) -> None:
    from hexbundle.remote.action import step_action
    from hexbundle.remote.cache import run_cached

    def make_action():
        image = image_id(layout.root) if layout.cfg.executor == "docker" else ""
        return step_action(layout, step, extra, task_options(task), sorted(task.file_dep),
                           list(task.targets), image)

    validate_inputs(layout, step, extra, run)   # whether or not the cache has the step
    run_cached(layout, task_name, [layout.root / t for t in task.targets], make_action,
               lambda: run(layout, task_name, step, **extra),
               fetch_check(run, layout, task_name, step, extra))


def run_through_executor(run, layout: Layout, task_name: str, step: str,
                         extra: dict, task) -> None:
    """The step on the Execution server (remote_executor): its Action is the step runner's
    spec in an input root of its file_dep and the code (remote.action.exec_action)."""
    from hexbundle.remote.action import exec_action
    from hexbundle.remote.executed import run_executed
    from hexbundle.steps.executor import described_spec

    def make_action():   # no config: the description is all the step reads
        image = image_id(layout.root) if layout.cfg.executor == "docker" else ""
        spec = described_spec(layout, run.description)
        return exec_action(layout, spec, sorted(task.file_dep), list(task.targets), image)

    validate_inputs(layout, step, extra, run)
    run_executed(layout, task_name, [layout.root / t for t in task.targets], make_action,
                 lambda: run(layout, task_name, step, **extra),
                 fetch_check(run, layout, task_name, step, extra))


def validate_inputs(layout: Layout, step: str, extra: dict, run) -> None:
    """A step's inputs are validated here whatever the server answers (cache or executor)."""
    if step == "convert":
        from hexbundle.steps.convert import validate_graph_inputs
        from hexbundle.steps.description import from_json
        validate_graph_inputs(from_json(run.description), lambda line: None)
    elif step == "inputs" and layout.splits_locally and "part" in extra:
        from hexbundle.steps.description import from_json
        from hexbundle.steps.inputs import validate_split_sources
        validate_split_sources(from_json(run.description))


def fetch_check(run, layout: Layout, task_name: str, step: str, extra: dict):
    """The check a hit's downloads get before they are renamed into place: the `check` step
    (steps/check.py) through the configured executor; None for steps whose outputs another
    step judges."""
    if step not in FETCH_CHECKED:
        return None

    def check(files: dict) -> None:
        try:
            run(layout, f"{task_name}:cache-check", "check",
                description=check_description(layout, run.description, files))
        except StepFailed as exc:   # the step's own error line, not the log's tail
            raise HexbundleError(exc.error or str(exc).splitlines()[0]) from None
        except HexbundleError as exc:
            raise HexbundleError(str(exc).splitlines()[0]) from None
    return check


def check_description(layout: Layout, checked: dict, files: dict) -> dict:
    """The `check` step's description (steps/check.py) of a hit's downloads `files` (target ->
    temp file) of the described step `checked`: the downloads (role "fetched", in the step's
    output order), the step's own inputs (its output key is made of them again), and under
    remote_cache_trust = "verify" a compile's graphs' ONNX, encodings and data files (the exact
    checks read them: roles "source_onnx" / "source_encodings" in bin order, "source_data")."""
    from pathlib import Path

    from hexbundle.config.step_options import CheckStepOptions
    from hexbundle.steps.description import Description, from_json, to_json
    step = from_json(checked)
    verify = layout.cfg.remote.cache_trust == "verify"
    targets = [path for _, path in step.outputs]
    fetched = {Path(t).name: Path(p) for t, p in files.items()}   # a step's outputs: one name each
    inputs = [("fetched", fetched[t.name]) for t in targets] + list(step.inputs)
    if verify and step.step == "compile":
        part = layout.cfg.part(step.arguments["part"])
        for graph in layout.cfg.model.graphs(part):
            inputs += [("source_onnx", layout.onnx(graph)),
                       ("source_encodings", layout.encodings(graph))]
        data = {d for g in layout.cfg.model.graphs(part) for d in layout.graph_files(g).data}
        inputs += [("source_data", d) for d in layout.part_inputs(part) if d in data]
    return to_json(Description("check", {**step.arguments, "targets": [t.name for t in targets]},
                               tuple(inputs), (), CheckStepOptions(step.step, step.options,
                                                                   verify)))
