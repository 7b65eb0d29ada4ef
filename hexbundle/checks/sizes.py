"""The size model and the size check.

The expected size of each context binary is derived from the architecture and the quantization
scheme alone: weight bytes at their bit widths (4-bit packed two per byte), per-channel scale and
offset, float tensors at float_bitwidth, laid out as the reference container lays them out
(page-aligned blobs). The same model reproduces the seeds' measured QAIRT figures for
Qwen2.5-7B within 1% (tests/test_sizes.py), so one check serves both backends.

A part that comes out near its *unpacked* expectation is reported as what it almost always is:
4-bit weights that were not packed (the QAIRT CLI ignores weights_packing in multi-graph mode).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hexbundle.config.layout import Layout
from hexbundle.config.model import Model, Part, Plan, WeightSpec, part_weights
from hexbundle.formats.container import (QUANT_DTYPE_FOR_BITWIDTH, container_size,
                                         tensor_blob_nbytes)
from hexbundle.support.console import say
from hexbundle.support.errors import SizeError

MIB = 1 << 20

# Graph topology (the ONNX graph without weights) and the JSON header are small and do not
# follow from the architecture exactly; these allowances were measured on the reference
# backend's output for qwen2-tiny (a decoder layer's topology is ~10 KB per graph, its header
# records ~680 bytes per tensor). For a 7B part they are < 0.1% of the size.
TOPOLOGY_BYTES_BASE = 512
TOPOLOGY_BYTES_PER_LAYER = 10000
HEADER_BYTES_PER_TENSOR = 680
HEADER_BYTES_PER_GRAPH = 1300


def tensor_bytes(w: WeightSpec, packed: bool, float_bitwidth: int) -> int:
    """Bytes of one tensor blob before page alignment, as the container lays it out."""
    if w.bitwidth is None:
        return tensor_blob_nbytes(w.shape, f"float{float_bitwidth}", False, 0)
    return tensor_blob_nbytes(w.shape, QUANT_DTYPE_FOR_BITWIDTH[w.bitwidth], packed, w.channels)


@dataclass(frozen=True)
class PartExpectation:
    part: Part
    packed: int      # bytes: the build we want
    unpacked: int    # bytes if 4-bit weights were stored one per byte
    unshared: int    # bytes if prompt and token graphs each kept their own weights
    has_4bit: bool

    @property
    def content(self) -> str:
        bits = []
        if self.part.has_embedding:
            bits.append("embedding")
        if self.part.layers:
            first, last = self.part.layers[0], self.part.layers[-1]
            bits.append(f"layer {first}" if first == last else f"layers {first}-{last}")
        if self.part.has_head:
            bits.append("norm + LM head")
        return ", ".join(bits)


def part_bytes(model: Model, part: Part, packed: bool = True, shared: bool = True,
               float_bitwidth: int = 16) -> int:
    weights = part_weights(model.architecture, model.quantization, part)
    copies = 1 if shared else 2
    blobs = [tensor_bytes(w, packed, float_bitwidth) for w in weights] * copies
    n_graphs = 2
    topology = TOPOLOGY_BYTES_BASE + TOPOLOGY_BYTES_PER_LAYER * len(part.layers)
    blobs += [topology] * n_graphs
    header = HEADER_BYTES_PER_TENSOR * len(weights) * copies + HEADER_BYTES_PER_GRAPH * n_graphs
    return container_size(blobs, header)


def expect(model: Model, plan: Plan, float_bitwidth: int = 16) -> list:
    out = []
    for part in plan.parts():
        weights = part_weights(model.architecture, model.quantization, part)
        out.append(PartExpectation(
            part,
            part_bytes(model, part, True, True, float_bitwidth),
            part_bytes(model, part, False, True, float_bitwidth),
            part_bytes(model, part, True, False, float_bitwidth),
            any(w.bitwidth == 4 for w in weights)))
    return out


@dataclass
class SizeRow:
    expectation: PartExpectation
    actual: Optional[int]
    measured_mib: Optional[float]   # the plan's recorded measurement of a known-good build
    verdict: str                     # "ok" | "NOT PACKED" | "NOT SHARED" | "OFF" | "MISSING"

    @property
    def deviation_pct(self) -> Optional[float]:
        if self.actual is None:
            return None
        return 100.0 * (self.actual - self.expectation.packed) / self.expectation.packed


def _closest(actual: int, e: PartExpectation) -> str:
    candidates = {"packed": e.packed, "unshared": e.unshared}
    if e.has_4bit:
        candidates["unpacked"] = e.unpacked
    return min(candidates, key=lambda k: abs(actual - candidates[k]))


def judge_sizes(model: Model, plan: Plan, actual: dict, float_bitwidth: int = 16) -> list:
    """actual: part index -> bytes (None when the file is missing)."""
    rows = []
    for i, e in enumerate(expect(model, plan, float_bitwidth)):
        size = actual.get(e.part.index)
        measured = plan.expected_part_mib[i] if plan.expected_part_mib else None
        if size is None:
            verdict = "MISSING"
        elif abs(size - e.packed) <= e.packed * plan.tolerance_pct / 100:
            verdict = "ok"
        else:
            verdict = {"unpacked": "NOT PACKED", "unshared": "NOT SHARED"}.get(
                _closest(size, e), "OFF")
        rows.append(SizeRow(e, size, measured, verdict))
    return rows


def _mib(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / MIB:10.2f}"


def format_table(model: Model, plan: Plan, rows: list) -> str:
    has_measured = any(r.measured_mib is not None for r in rows)
    head = f"{'part':>5}  {'content':<28}{'actual MiB':>11}{'expected MiB':>13}{'dev %':>8}"
    head += f"{'measured MiB':>14}" if has_measured else ""
    lines = [f"size check: {model.name}, plan {plan.name} ({len(rows)} parts), "
             f"tolerance {plan.tolerance_pct}%", head + "  verdict"]
    for r in rows:
        dev = "-" if r.deviation_pct is None else f"{r.deviation_pct:+.2f}"
        line = (f"{r.expectation.part.index:>5}  {r.expectation.content:<28}{_mib(r.actual):>11}"
                f"{_mib(r.expectation.packed):>13}{dev:>8}")
        if has_measured:
            line += f"{r.measured_mib:>14.1f}" if r.measured_mib is not None else f"{'-':>14}"
        lines.append(line + f"  {r.verdict}")
    total_actual = sum(r.actual or 0 for r in rows)
    total_expected = sum(r.expectation.packed for r in rows)
    line = f"{'total':>5}  {'':<28}{_mib(total_actual):>11}{_mib(total_expected):>13}" \
           f"{100.0 * (total_actual - total_expected) / total_expected:>+8.2f}"
    if plan.expected_total_mib:
        line += f"{plan.expected_total_mib:>14.1f}" if has_measured else \
            f"   (a known-good build measured {plan.expected_total_mib:.1f})"
    lines.append(line)
    return "\n".join(lines)


def raise_on_failure(model: Model, plan: Plan, rows: list, table: str) -> None:
    bad = [r for r in rows if r.verdict != "ok"]
    if not bad:
        return
    unpacked = [r for r in bad if r.verdict == "NOT PACKED"]
    if unpacked:
        parts = ", ".join(str(r.expectation.part.index) for r in unpacked)
        ratio = max(r.actual / r.expectation.packed for r in unpacked)
        raise SizeError(
            f"part(s) {parts}: 4-bit weights were not packed: up to {ratio:.2f}x the expected "
            "size, matching one byte per 4-bit weight. Set weights_packing = true; with QAIRT, "
            "compile through the Python API (HtpGraphConfig(weights_packing=True)): "
            "qnn-context-binary-generator ignores weights_packing in multi-graph mode and "
            "still exits 0.\n" + table)
    unshared = [r for r in bad if r.verdict == "NOT SHARED"]
    if unshared:
        parts = ", ".join(str(r.expectation.part.index) for r in unshared)
        raise SizeError(f"part(s) {parts}: weights are stored twice (prompt and token graph each "
                        "hold a copy): set weight_sharing = true, or the device maps every weight "
                        "twice and runs out of address space.\n" + table)
    missing = [r for r in bad if r.verdict == "MISSING"]
    if missing:
        raise SizeError("missing context binaries for part(s) "
                        + ", ".join(str(r.expectation.part.index) for r in missing)
                        + ": run `doit bundle`.\n" + table)
    raise SizeError("sizes outside tolerance (expected vs actual below); a changed "
                    "architecture or quantization scheme must be reflected in the model config."
                    "\n" + table)


def check_built_sizes(layout: Layout) -> None:
    """Size every part's context binary against the size model; a SizeError explains itself."""
    cfg = layout.cfg
    actual = {p.index: (layout.bin(p).stat().st_size if layout.bin(p).is_file() else None)
              for p in cfg.plan.parts()}
    rows = judge_sizes(cfg.model, cfg.plan, actual, cfg.compile["float_bitwidth"])
    table = format_table(cfg.model, cfg.plan, rows)
    raise_on_failure(cfg.model, cfg.plan, rows, table)
    say(table)
