"""The key a step's output records it was made for: the DLC's and the context binary's
"made_for" (formats/container.py, docs/formats.md).

    key = SHA-256 of the canonical text (formats/stepkey.py) of
          {"step": "convert" | "compile", "arguments": {"part": N[, "graph": G]},
           "options": the step's ConvertOptions | CompileOptions (steps/options.py),
           "inputs": [[file name, XXH3-128 of its bytes], ...]}

the inputs in the order the step reads them (a convert: its ONNX, external data, encodings;
a compile: its DLCs in bin order). The step computes it where it runs (here, in the toolchain
container, on a remote worker) and writes it into its output; the check of an output fetched
from a remote cache or executor (steps/check.py) computes it again from the local inputs and
refuses a file that records another one: another build's output with the same names, graphs
and sizes (other weights, other options) is not this step's.

Not in it: the code and the toolchain image (the step key has them, docs/step-key.md). A local
build, a cached one and a docker or remote one of the same inputs and options therefore write
the same bytes; a result made by an older hexbundle from the same inputs and options records
the same key.

Made of values and paths alone: the described steps (convert, compile) compute it from their
description; the check step (steps/check.py) from the local layout, the same values.
"""
from __future__ import annotations

from pathlib import Path

from hexbundle.formats.stepkey import canonical, key_of
from hexbundle.support import hashing
from hexbundle.support.files import require_regular_file


def output_key(step: str, arguments: dict, options, inputs: list) -> str:
    """The key of the outputs of `step` made of the files `inputs` (read now, through the
    digest cache: a file doit has hashed is not read again). Each is a regular file first: the
    key is made before the step's own readers look at its inputs, and a FIFO would hang it."""
    for path in inputs:
        require_regular_file(Path(path), f"{step} step's input")
    files = [[Path(p).name, hashing.digest(p)] for p in inputs]
    return key_of(canonical({"step": step, "arguments": arguments, "options": options,
                             "inputs": files}))
