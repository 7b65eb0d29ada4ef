#!/usr/bin/env python3
"""Follow one build step's value through the code (issue 51's evidence): run `doit TASK` here
and list every hexbundle module a call receives the step's description in (the JSON
graph.remote_steps.run_step_recorded gets, the Description steps.description makes of it, its
fields: options, paths), with the call edges between modules and those that go up a layer
(tests/test_architecture.py's LAYERS: a value that only goes down the layers stops there).

    python3 scripts/follow_step_value.py STEP TASK [key=value ...]
    e.g. python3 -m doit forget bundle && python3 scripts/follow_step_value.py bundle bundle

The task must run (forget it first); the step's other runs are not followed. Local executor
only: a step in a container or on a worker is another process.
"""
import dataclasses
import os
import runpy
import sys
import threading

LAYERS = ("support", "config", "formats", "runtime", "inputs", "backends", "checks", "toolchain",
          "remote", "steps", "release", "deploy", "graph", "bench")
# The calls whose result is the value again, in another form: the description's reader, the
# resolved values' reader, the runner's spec.
DERIVE = {"from_json", "described_spec", "load", "_dataclass"}


class Follower:
    def __init__(self, step: str):
        self.step, self.tracked, self.calls, self.pending = step, {}, [], {}

    def track(self, value) -> None:
        if value is None or isinstance(value, (bool, int, float, str)) or id(value) in self.tracked:
            return
        self.tracked[id(value)] = value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                self.track(getattr(value, f.name))
        elif isinstance(value, (tuple, list)):
            for item in value:
                self.track(item)
        elif isinstance(value, dict):
            for item in value.values():
                self.track(item)

    def holds(self, value) -> bool:
        return id(value) in self.tracked and self.tracked[id(value)] is value

    def __call__(self, frame, event, arg):
        module = frame.f_globals.get("__name__", "?")
        code = frame.f_code
        if event == "call":
            if (code.co_name == "run_step_recorded" and not self.tracked
                    and frame.f_locals.get("step") == self.step):
                made = frame.f_locals.get("description")
                self.track(made() if callable(made) else made)
            if not self.tracked or not module.startswith("hexbundle"):
                return
            count = (code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4)
                     + bool(code.co_flags & 8))
            args = [frame.f_locals.get(name) for name in code.co_varnames[:count]]
            inner = [x for a in args if isinstance(a, (tuple, list)) for x in a]
            inner += [x for a in args if isinstance(a, dict) for x in a.values()]
            if any(self.holds(a) for a in args + inner):
                caller = frame.f_back.f_globals.get("__name__", "?") if frame.f_back else "?"
                self.calls.append((caller, module))
                self.pending[id(frame)] = code.co_name in DERIVE
        elif event == "return" and self.pending.pop(id(frame), False):
            self.track(arg)


def layer(module: str):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def report(calls: list) -> None:
    modules = list(dict.fromkeys(m for _, m in calls))
    edges = sorted({(a, b) for a, b in calls if a != b and a.startswith("hexbundle")})
    up = [(a, b) for a, b in edges if layer(a) and layer(b)
          and LAYERS.index(layer(b)) > LAYERS.index(layer(a))]
    print(f"{len(calls)} calls receive it, in {len(modules)} modules; {len(edges)} call edges "
          f"between modules, {len(up)} of them up a layer")
    for module in modules:
        print(f"  {layer(module) or '-':9s} {module}")
    for a, b in edges:
        print(f"  {'UP ' if (a, b) in up else ''}{a} -> {b}")


def main(argv: list) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[4].strip(), file=sys.stderr)
        return 2
    follower = Follower(argv[1])
    sys.path.insert(0, os.getcwd())   # the project's hexbundle and dodo.py
    sys.argv = ["doit", *argv[2:]]
    sys.setprofile(follower)
    threading.setprofile(follower)
    try:
        runpy.run_module("doit", run_name="__main__")
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    if not follower.tracked:
        print(f"the {argv[1]} step did not run: `python3 -m doit forget ...` it first",
              file=sys.stderr)
        return 1
    report(follower.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
