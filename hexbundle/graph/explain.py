"""Why a step runs, in one line (ninja's `-d explain`): `doit bundle --explain`, and the reasons
`--dry-run` gives.

The reason is read from doit's own status of the task (its file_dep, targets and up-to-date
items) and from what the step's last successful run left in the dependency DB: its step key's
text (graph.keys.KEY_VALUE, formats.stepkey) and its code files' digests (CODE_VALUE), and each
input's recorded state (graph.checker: [..., XXH3]). So it names the setting, input or code file:

    explain: compile:part_2_of_4  runs because weights_packing changed: true -> false
    explain: convert:part_2_of_4_prompt  runs because build/qwen2-tiny/inputs/part_2_of_4.data
             changed (digest 1a2b3c4d5e6f -> 0f9e8d7c6b5a)
    explain: bundle  runs because code file hexbundle/formats/genie.py changed
    explain: convert:part_1_of_4_token  up to date
    explain: compile:part_1_of_4  fetched from the cache (runs because ...)
    explain: compile:part_2_of_4  executed remotely on worker w1 with /opt/venv/bin/python3,
             action 3f2a.../1234 (runs because ...)

Under --explain the line is printed when the step is done (graph.reporter): "fetched from the
cache" and where it was executed (the worker, the interpreter its Command named: remote_python,
and the Action) are known then (formats.origins). Nothing is written for it.
"""
from __future__ import annotations

import json
import os
import re
from typing import Optional

from hexbundle.formats import stepkey
from hexbundle.graph.keys import CODE_VALUE, KEY_VALUE, step_code_files, step_key
from hexbundle.graph.targets import KEY as TARGETS_VALUE
from hexbundle.graph.targets import bundle_drift, bundle_in_place, changed, targets_unchanged
from hexbundle.support import console, hashing
from hexbundle.support.errors import HexbundleError
from hexbundle.support.jsondoc import read_state_json

SHORT = 12   # digest characters shown
MAX_REASONS = 3


def _first(names) -> str:
    names = sorted(names)
    return names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")


def _short(digest) -> str:
    return str(digest)[:SHORT] if digest else "none"


def key_changes(old_text: str, new_text: str, old_code, new_code: dict) -> list:
    """What differs between a step's stored key and its current one, as phrases: the option
    (its path inside the options, "options." left out), pin, toolchain or code file."""
    old, new = stepkey.loads(old_text), stepkey.loads(new_text)
    if old is None or new is None:
        return ["its key was recorded by an older hexbundle"]
    out = []
    for path, a, b in _grouped(stepkey.differences(old, new)):
        if path == "code":
            out += code_changes(old_code, new_code)
            continue
        name = path[len("options."):] if path.startswith("options.") else path
        if name.startswith("pins."):
            name = f"the pin of {name[len('pins.'):]}"
        elif name.startswith("toolchain."):
            name = "the toolchain's " + name[len("toolchain."):]
        if a is None:
            out.append(f"{name} is new: {stepkey.shown(b)}")
        elif b is None:
            out.append(f"{name} is gone (was {stepkey.shown(a)})")
        else:
            out.append(f"{name} changed: {stepkey.shown(a)} -> {stepkey.shown(b)}")
    return out


def _grouped(diffs: list) -> list:
    """The same change at several indices of a list (the bundle's options hold each part's
    compile options) as one, its index written [*]: compile[*].weights_packing."""
    def general(path: str) -> str:
        return re.sub(r"\[\d+\]", "[*]", path)
    count = {}
    for path, a, b in diffs:
        key = (general(path), json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True))
        count[key] = count.get(key, 0) + 1
    out, done = [], set()
    for path, a, b in diffs:
        key = (general(path), json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True))
        if count[key] == 1:
            out.append((path, a, b))
        elif key not in done:
            done.add(key)
            out.append((key[0], a, b))
    return out


def code_changes(old_code, new_code: dict) -> list:
    """The code files whose digest differs from the last run's (CODE_VALUE), as phrases."""
    if not isinstance(old_code, dict):
        return ["its code changed"]
    files = sorted(f for f in set(old_code) | set(new_code) if old_code.get(f) != new_code.get(f))
    out = [f"code file {f} changed" for f in files if f in old_code and f in new_code]
    out += [f"code file {f} is new to it" for f in files if f not in old_code]
    out += [f"code file {f} is no longer run" for f in files if f not in new_code]
    return out or ["its code changed"]


def _recorded_digest(dep_manager, task, dep: str):
    state = dep_manager.backend.get(task.name, dep)
    return state[-1] if isinstance(state, list) and state else None


def _current_digest(path: str):
    try:
        return hashing.digest(path)
    except OSError:
        return None


def _uptodate_reasons(item, task, values) -> list:
    if isinstance(item, step_key):
        if KEY_VALUE not in values:
            return ["never built here (no step key recorded)"]
        return key_changes(values[KEY_VALUE], item.text(), values.get(CODE_VALUE),
                           step_code_files(item.step))
    if isinstance(item, targets_unchanged):
        recorded = values.get(TARGETS_VALUE) or {}
        edited = [t for t in task.targets if os.path.exists(t) and t in recorded
                  and changed(t, recorded[t])]
        return [f"output {t} changed since it was built" for t in edited] \
            or ["its outputs were never recorded"]
    if isinstance(item, bundle_in_place):
        return bundle_drift(item.layout)[:1] or ["the bundle directory is not in place"]
    if item is False:
        return ["always runs"]
    return [f"{item!r} says it is out of date"]


def reasons(dep_manager, task, tasks) -> Optional[list]:
    """Why doit would run `task` now, as phrases (the most telling first), or None if it is
    up to date."""
    with console.silenced():   # the up-to-date items' own lines were printed by the run
        try:
            status = dep_manager.get_status(task, tasks, get_log=True)
        except (HexbundleError, OSError) as exc:
            return [f"cannot tell: {exc}"]
    if status.status == "up-to-date":
        return None
    why = status.reasons
    if status.status == "error" or why.get("missing_file_dep"):
        return ["input missing: " + _first(why.get("missing_file_dep") or ["?"])]
    if why.get("has_no_dependencies"):
        return ["always runs"]
    values = dep_manager.get_values(task.name)
    out = []
    if why.get("missing_target"):
        out.append("target missing: " + _first(why["missing_target"]))
    if any(isinstance(item, step_key) for item, _, _ in task.uptodate) \
            and KEY_VALUE not in values:   # its outputs, key and inputs were never recorded
        return out or ["never built here"]
    for item, _, _ in why.get("uptodate_false") or []:
        out += _uptodate_reasons(item, task, values)
    if why.get("checker_changed"):
        out.append("the file checker changed")
    for dep in sorted(why.get("changed_file_dep") or []):
        out.append(f"{dep} changed (digest {_short(_recorded_digest(dep_manager, task, dep))}"
                   f" -> {_short(_current_digest(dep))})")
    out += [f"{dep} is a new input" for dep in sorted(why.get("added_file_dep") or [])]
    out += [f"{dep} is no longer an input" for dep in sorted(why.get("removed_file_dep") or [])]
    return _dedup(out) or ["not up to date"]


def _dedup(items: list) -> list:
    return list(dict.fromkeys(items))


def phrase(found: list) -> str:
    """The reasons as one clause: at most MAX_REASONS named, then how many more."""
    shown = "; ".join(found[:MAX_REASONS])
    more = len(found) - MAX_REASONS
    return shown + (f"; and {more} more" if more > 0 else "")


def reason(dep_manager, task, tasks) -> Optional[str]:
    """reasons() as one clause, or None if up to date."""
    found = reasons(dep_manager, task, tasks)
    return None if found is None else phrase(found)


class Explainer:
    """--explain during a run: the reason of each step taken when doit decides to run it,
    printed with its outcome when it is done (graph.reporter)."""

    def __init__(self, dep_manager, tasks: dict, layout=None):
        self.dep_manager, self.tasks, self.layout = dep_manager, tasks, layout
        self.why = {}

    def running(self, task) -> None:
        self.why[task.name] = reason(self.dep_manager, task, self.tasks) or "not up to date"

    def line(self, task, outcome: str, failure: str = "") -> str:
        why = self.why.get(task.name)
        if outcome == "up to date":
            return f"explain: {task.name}  up to date"
        if why is None:   # failed before it could run (an input missing, a check's error)
            return f"explain: {task.name}  not run: {failure or outcome}"
        origin = self._origin(task) if outcome == "success" else {}
        if origin.get("origin") == "remote-cache":
            return f"explain: {task.name}  fetched from the cache (runs because {why})"
        if origin.get("origin") == "remote-execution":
            return (f"explain: {task.name}  executed remotely on worker {origin.get('worker')} "
                    f"with {origin.get('python')}, action {origin.get('action')} (runs because "
                    f"{why})")
        tail = "" if outcome == "success" else f"; it {outcome}"
        return f"explain: {task.name}  runs because {why}{tail}"

    def _fetched(self, task) -> bool:
        return self._origin(task).get("origin") == "remote-cache"

    def _origin(self, task) -> dict:
        """The step's origin record (formats.origins) as this run left it, or {}."""
        if self.layout is None:
            return {}
        try:
            origin = read_state_json(self.layout.step_origin(task.name))
        except (OSError, ValueError, AttributeError):
            return {}
        return origin if isinstance(origin, dict) else {}


_active: Optional[Explainer] = None


def start(explainer: Optional[Explainer]) -> None:
    global _active
    _active = explainer


def active() -> Optional[Explainer]:
    return _active
