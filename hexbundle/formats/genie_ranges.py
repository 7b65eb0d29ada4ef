"""The range of every number of Qualcomm's Genie dialog schema (formats/genie_schema.py), as the
value's destination takes it. Hand-written beside the generated schema: the schema says a key is
an int or a float, not which ones make sense. Read by checks/genie_bundle.py; tests/
test_check_bundle.py checks that every number of the schema has its range here, and nothing else.

Genie's config parser (closed source) reads counts, sizes, dimensions and versions into 32-bit
C++ integers (byte budgets into 64-bit ones): a negative value or one past 2**32 wraps into
another number, which the device then uses. Versions count from 1 (every Genie config
Qualcomm ships says 1). A token id is a row of the logits (an int32 in the graphs); -1 is
Qualcomm's "none" for bos-token (their Qwen2.5 configs write it). The floats must be finite
(Python's json reads NaN and Infinity; Genie's reader does not) and within their meaning: a
temperature >= 0, top-p a probability, RoPE's theta and scaling factors > 0.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

# the same constants the configs' schema bounds its numbers with (one source: a [genie] setting
# and the key it is written to hold one range; tests/test_number_ranges.py checks each pair)
from hexbundle.config.schema import U32, U64

I32 = 2 ** 31 - 1


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    low_open: bool = False     # low itself excluded (a factor or theta of 0 is meaningless)

    def holds(self, value) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def describe(self) -> str:
        high = {U32: "2**32 - 1", I32: "2**31 - 1", U64: "2**64 - 1",
                math.inf: "any finite value"}.get(self.high, f"{self.high:g}")
        low = f"> {self.low:g}" if self.low_open else f">= {self.low:g}"
        return f"{low} and <= {high}" if self.high != math.inf else f"finite and {low}"


VERSION = Range(1, U32)
COUNT = Range(1, U32)          # a dimension, a size, a number of layers or tokens
COUNT0 = Range(0, U32)         # where 0 means "the default" or "none"
BYTES = Range(0, U64)
TOKEN = Range(0, I32)
POSITIVE = Range(0, math.inf, low_open=True)

# dotted key (a list's items as key[]) -> Range; every "version" key is VERSION
RANGES = {
    "dialog.max-num-tokens": COUNT,
    "dialog.sampler.seed": COUNT0,
    "dialog.sampler.temp": Range(0, math.inf),
    "dialog.sampler.top-k": COUNT0,
    "dialog.sampler.top-p": Range(0, 1),
    "dialog.embedding.size": COUNT,
    "dialog.embedding.quant-param.scale": POSITIVE,
    "dialog.embedding.quant-param.offset": Range(-I32 - 1, I32),
    "dialog.context.bos-token": Range(-1, I32),
    "dialog.context.eos-token": TOKEN,
    "dialog.context.eot-token": TOKEN,
    "dialog.context.pad-token": TOKEN,
    "dialog.context.n-vocab": COUNT,
    "dialog.context.size": COUNT,
    "dialog.engine.n-threads": COUNT0,
    "dialog.engine.backend.QnnGenAiTransformer.n-logits": COUNT,
    "dialog.engine.backend.QnnGenAiTransformer.n-layer": COUNT,
    "dialog.engine.backend.QnnGenAiTransformer.n-embd": COUNT,
    "dialog.engine.backend.QnnGenAiTransformer.n-heads": COUNT,
    "dialog.engine.backend.QnnHtp.spill-fill-bufsize": BYTES,
    "dialog.engine.backend.QnnHtp.mmap-budget": BYTES,
    "dialog.engine.backend.QnnHtp.pos-id-dim": COUNT,
    "dialog.engine.backend.QnnHtp.kv-dim": COUNT,
    "dialog.engine.backend.QnnHtp.rope-theta": COUNT,
    "dialog.engine.model.positional-encoding.rope-dim": COUNT,
    "dialog.engine.model.positional-encoding.rope-theta": POSITIVE,
    "dialog.engine.model.positional-encoding.rope-scaling.factor": POSITIVE,
    "dialog.engine.model.positional-encoding.rope-scaling.low-freq-factor": POSITIVE,
    "dialog.engine.model.positional-encoding.rope-scaling.high-freq-factor": POSITIVE,
    "dialog.engine.model.positional-encoding.rope-scaling.original-max-position-embeddings":
        COUNT,
    "dialog.engine.model.positional-encoding.rope-scaling.short-factor[]": POSITIVE,
    "dialog.engine.model.positional-encoding.rope-scaling.long-factor[]": POSITIVE,
}


def range_problems(value, node: dict = None, where: str = "dialog") -> list:
    """'KEY is VALUE, outside its range (...)' for each number of a dialog (genie_config.json's
    "dialog" object) outside its destination's range; values of another type are the schema
    check's (checks/genie_bundle.py) and skipped here. The runtime's reader refuses these too."""
    from hexbundle.formats.genie_schema import DIALOG
    node = DIALOG if node is None else node
    kind = node["type"]
    if kind == "object" and isinstance(value, dict):
        return [p for key, child in node["keys"].items() if key in value
                for p in range_problems(value[key], child, f"{where}.{key}")]
    if kind == "list" and isinstance(value, list):
        return [p for i, item in enumerate(value)
                for p in range_problems(item, node["item"], f"{where}[{i}]")]
    if kind not in ("int", "float", "ids"):
        return []
    bounds = range_of(where)
    return [f"'{where}' is {_short(n)}, outside its range ({bounds.describe()}): the device "
            "would read another number"
            for n in (value if isinstance(value, list) else [value])
            if type(n) in (int, float) and not bounds.holds(n)]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def range_of(where: str) -> Range:
    """The Range of a schema number at dotted path `where` (list indices as [])."""
    key = re.sub(r"\[\d+\]", "[]", where)
    if key.endswith("-token[]"):   # an ids list's items: the key's range
        key = key[:-2]
    if key.rsplit(".", 1)[-1] == "version":
        return VERSION
    return RANGES[key]
