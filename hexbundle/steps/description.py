"""A step's description as it runs: the one writer (`to_json`) and reader (`from_json`).

    {"step": "convert", "arguments": {"part": 1, "graph": "prompt"},
     "inputs":  [[role, path], ...],   in the order the step reads them (its output key's order)
     "outputs": [[role, path], ...],
     "options": the step's typed options value (config.step_options), as config.resolved
                writes it}

It is graph.stepdesc's Step (inputs, outputs, arguments, typed options), and nothing else: the
step function receives this value and its log, no Layout and no config, so what it reads is what
its key covers (the key is made of the same options, arguments and input files). Paths are
config.resolved's {"@path": ...}, so a remote Action relocates them into its input root
(remote.action.relocate) as it does any path. A role may name several files (a graph's data
files, a part's DLCs): `paths(role)` lists them in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hexbundle.config import resolved
from hexbundle.support.errors import HexbundleError


class DescriptionError(HexbundleError):
    """A description not written by `to_json` (a bug, or a spec from another hexbundle)."""


@dataclass(frozen=True)
class Description:
    step: str
    arguments: dict
    inputs: tuple                     # (role, Path) pairs, in reading order
    outputs: tuple                    # (role, Path) pairs
    options: object                   # the step's typed options (config.step_options)
    image: str = ""                   # the toolchain image it runs in (the docker executor's:
                                      # no input of the step, not in its JSON; the manifest
                                      # names it)

    def input(self, role: str) -> Path:
        return _one(self.inputs, role, self.step, "input")

    def output(self, role: str) -> Path:
        return _one(self.outputs, role, self.step, "output")

    def input_paths(self, role: str = "") -> list:
        """The input files of `role` (every input when ""), in order."""
        return [p for r, p in self.inputs if not role or r == role]


def _one(pairs: tuple, role: str, step: str, side: str) -> Path:
    found = [p for r, p in pairs if r == role]
    if len(found) != 1:
        raise DescriptionError(f"{step} step's description declares {len(found)} {side}(s) "
                               f"{role!r}, not one: a description from another hexbundle?")
    return found[0]


def to_json(description: Description) -> dict:
    def pairs(items):
        return [[role, resolved.dump(Path(path))] for role, path in items]
    return {"step": description.step, "arguments": dict(description.arguments),
            "inputs": pairs(description.inputs), "outputs": pairs(description.outputs),
            "options": resolved.dump(description.options)}


def from_json(data) -> Description:
    try:
        def pairs(items):
            return tuple((str(role), resolved.load(path)) for role, path in items)
        return Description(str(data["step"]), dict(data["arguments"]), pairs(data["inputs"]),
                           pairs(data["outputs"]), resolved.load(data["options"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DescriptionError(f"a step description not written by steps.description ({exc}); "
                               "is the step runner another hexbundle version?") from None
