"""The doit side of the remote cache: a build step's Action from its doit task.

The Action covers exactly what decides whether doit reruns the task here: its file_dep (the
input root), the values of its options_key up-to-date items (backend, toolchain, compile
options, pins, ...: the Command's options) and its targets (the Command's output paths); plus
the step's own arguments and the code that runs it (hexbundle.remote.action). So a changed
input or option misses exactly the steps whose local up-to-date check it fails.

Which steps: inputs (generate or split), convert and compile. Not bundle: its outputs are hard
links to bin/ plus three small JSON files written in milliseconds, and fetching its bins again
from the cache would copy gigabytes that bin/ already holds.
"""
from __future__ import annotations

from hexbundle.config.layout import Layout
from hexbundle.graph.keys import image_id, options_key

CACHED_STEPS = ("inputs", "convert", "compile")


def uses_remote_cache(layout: Layout, step: str) -> bool:
    return step in CACHED_STEPS and bool((layout.cfg.remote or {}).get("cache"))


def task_options(task) -> dict:
    """The values of the task's options_key items (callables called), merged."""
    out = {}
    for item, _, _ in task.uptodate:
        if isinstance(item, options_key):
            out.update(item.resolved())
    return out


def run_through_cache(run, layout: Layout, overrides: dict, task_name: str, step: str,
                      extra: dict, task) -> None:
    from hexbundle.remote.action import step_action
    from hexbundle.remote.cache import run_cached

    def make_action():
        image = image_id(layout.root) if layout.cfg.executor == "docker" else ""
        return step_action(layout, step, extra, task_options(task), sorted(task.file_dep),
                           list(task.targets), image)

    run_cached(layout, task_name, make_action,
               lambda: run(layout, overrides, task_name, step, **extra))
