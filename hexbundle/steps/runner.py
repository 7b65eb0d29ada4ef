"""The step runner: one build step from its JSON spec, in this Python, in the toolchain container
or on a remote worker.

A spec is {"step", "description", "digest_cache"?, "image"?}: the step's description
(steps.description: its input and output paths, arguments and typed options, the value its key
is made of) is all its function receives, with `log`; no Layout, no config. "digest_cache" is
where the build keeps its file digests (a file doit hashed is not read again), "image" the
toolchain image the docker executor runs it in (the bundle's manifest names it). Output goes to
`log` (stdout in the container), which the executor sends to the step's log file.
"""
from __future__ import annotations

import dataclasses
import sys
import time
import traceback

from hexbundle.config import resolved
from hexbundle.steps.bundle import assemble_bundle
from hexbundle.steps.check import check_fetched
from hexbundle.steps.compile import compile_part
from hexbundle.steps.convert import convert_graph
from hexbundle.steps.description import from_json
from hexbundle.steps.inputs import generate_inputs
from hexbundle.support import hashing, progress, testhooks
from hexbundle.support.errors import HexbundleError
from hexbundle.support.run import end_with_the_run
from hexbundle.support.jsondoc import parse_json

# The step names are the doit tasks' names: task `compile` runs steps/compile.py, and so on.
# Each step's function takes (description, log).
DESCRIBED = {"inputs": generate_inputs, "convert": convert_graph, "compile": compile_part,
             "bundle": assemble_bundle, "check": check_fetched}


def print_log(msg: str) -> None:
    print(msg, flush=True)


def run(spec: dict, log=print_log) -> int:
    """Run one step; 0 on success, 1 on a user-facing error, 2 on a bug (with traceback)."""
    started = time.monotonic()
    try:
        described = from_json(spec.get("description"))
        if spec.get("image"):
            described = dataclasses.replace(described, image=spec["image"])
        if spec.get("digest_cache"):
            hashing.use_cache(resolved.load(spec["digest_cache"]))
        testhooks.set_step(described.step)
        DESCRIBED[described.step](described, log)
    except HexbundleError as exc:
        log(f"error: {exc}")
        return 1
    except Exception:  # a bug, not bad input: show everything
        log(traceback.format_exc())
        return 2
    log(f"done in {time.monotonic() - started:.2f}s")
    return 0


def main(argv: list) -> int:
    if len(argv) != 1:
        print("usage: step.py SPEC_JSON", file=sys.stderr)
        return 2
    end_with_the_run()   # in a step container: its run killed, the step stops too
    progress.set_sink(progress.LineSink())   # relayed by the docker executor, not logged
    return run(parse_json(argv[0], "the step's spec (its argument)"))
