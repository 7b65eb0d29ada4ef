"""What every row of the bench shares: its constants, its error, one measured doit run (Run)
and a measured child process (run_measured)."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hexbundle.support import hashing
from hexbundle.support.errors import HexbundleError

FULL_MODEL = "qwen2.5-7b-shape"
SMALL_MODEL = "qwen2-tiny"
# The seeds' measured context binary of a 3-layer Qwen2.5-7B part (11-split part 2, QAIRT 2.42
# Python API, weights_packing=True).
SEED_3_LAYER_PART_MIB = 337.3
RESULTS_FORMAT = 1
NOOP_REPEATS = 5
CHANGED_BYTES = 1 << 20     # bytes of one weight negated to "change a part's weights"
MIN_DIGEST_BYTES = 256 << 20   # the digest row times at least this much hashing
TRACE_ENV = hashing.TRACE_ENV
BUILD_TASKS = ("inputs", "convert", "compile", "bundle")   # what `doit bundle` runs
MIB, GIB = 1 << 20, 1 << 30


class BenchError(HexbundleError):
    """A benchmark step failed (a doit run exited non-zero, or did work it should not have)."""


@dataclass
class Run:
    """One doit invocation: wall time, peak RSS, what it ran, what it hashed."""

    args: tuple
    seconds: float
    code: int
    out: str
    err: str
    maxrss: int                      # bytes, of the doit process (steps run in it)
    hashed: list = field(default_factory=list)

    @property
    def executed(self) -> list:
        """Tasks doit ran: graph.reporter's line each, off a terminal ("[5/18] <task> ...",
        "[5/18] FAILED <task> ..."); an up-to-date task prints none."""
        return re.findall(r"^\[\d+/\d+\] (?:FAILED )?(\S+)", self.out, re.M)

    @property
    def step_seconds(self) -> dict:
        """task -> seconds of the steps built here, from graph.reporter's lines ("[5/18] <task>
        [reference/local] 1.2s"; a fetched or remotely run step says so instead)."""
        return {t: float(sec) for t, sec in
                re.findall(r"^\[\d+/\d+\] (\S+) \[[^\]]*\] ([\d.]+)s$", self.out, re.M)}

    def hashed_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.hashed if os.path.exists(p))


def run_measured(cmd: list, cwd: Path, env: dict) -> tuple:
    """(seconds, exit code, stdout, stderr, peak RSS bytes) of a child process (wait4 rusage)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return seconds, proc.returncode, out.read(), err.read(), usage.ru_maxrss * 1024


def run_child_step(bench, function: str, spec: dict, what: str) -> dict:
    """`function(spec)` ("module:name", its result plain JSON data) run in a child process of
    its own, so its time and peak RSS (wait4) are its alone: the result, with "wall_seconds"
    and "maxrss". The child prints the result as its last stdout line; a failed child is a
    BenchError showing its output."""
    import json
    import sys
    from hexbundle.support.jsondoc import parse_json
    module, name = function.split(":")
    code = (f"import json, sys; from {module} import {name}; "
            f"print(json.dumps({name}(json.loads(sys.argv[1]))))")
    wall, status, out, err, maxrss = run_measured([sys.executable, "-c", code, json.dumps(spec)],
                                                  bench.root, bench.env())
    if status != 0:
        raise BenchError(f"{what} failed (exit {status}):\n{out}{err}"[-4000:])
    result = parse_json(out.strip().splitlines()[-1], f"{what}'s result")
    return {**result, "wall_seconds": round(wall, 2), "maxrss": maxrss}


def part_weights_of(cfg, part) -> list:
    from hexbundle.config.model import part_weights
    return part_weights(cfg.model.architecture, cfg.model.quantization, part)
