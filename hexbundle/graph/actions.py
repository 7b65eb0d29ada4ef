"""The one doit action wrapper: the library raises HexbundleError, doit shows TaskFailed.

Library functions know nothing of doit: they return on success and raise a HexbundleError whose
message names the file, the key and what to do. `action("module:function", *args)` makes a doit
python-action of such a function: the error becomes doit's TaskFailed (its message shown, no
traceback, exit non-zero); anything else is a bug and doit shows its traceback.

dodo.py names every action's function as "module:function", imported when the action runs, not
when dodo.py loads: `doit list`, `doit help` and a build with nothing to do import no onnx, numpy
or docker SDK (importing onnx alone costs ~1 s). tests/test_architecture.py checks each name
exists.
"""
from __future__ import annotations

import importlib

from doit.exceptions import TaskFailed

from hexbundle.support.errors import HexbundleError


def resolve(ref):
    """The function a "module:function" reference names (imported now); a callable as it is."""
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def action(fn, *args, **kwargs) -> tuple:
    """A doit python-action running fn(*args, **kwargs), fn a "module:function" reference (or a
    callable). Task params and pos_arg reach fn as keyword arguments (doit passes them to a
    callable that takes **kwargs)."""
    return (_run, [fn, *args], kwargs)


def _run(fn, *args, **kwargs):
    try:
        resolve(fn)(*args, **kwargs)
    except HexbundleError as exc:
        return TaskFailed(str(exc))
    return True


def step_action(run, layout, task_name: str, step: str, description=None, **extra) -> tuple:
    """The doit action of build step `step`: run(layout, task_name, step, **extra)
    (run: "hexbundle.steps.executor:run_step"), through the remote cache when one is configured
    (graph.remote_steps); a described step's `description` (graph.stepdesc.description) is what
    its function receives (or a function that makes it). doit hands the action its Task: the
    cache key is made of it."""
    return (_run_step, [run, layout, task_name, step, extra, description], {})


def _run_step(run, layout, task_name, step, extra, description, task):
    from hexbundle.graph.remote_steps import run_step_recorded
    if callable(description):   # graph.stepdesc makes it when the step runs
        description = description()
    try:
        run_step_recorded(resolve(run), layout, task_name, step, extra, task, description)
    except HexbundleError as exc:
        return TaskFailed(str(exc))
    return True
