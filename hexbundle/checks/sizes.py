"""The size model and the size check.

A part's expected context-binary size comes from the tensors actually in its inputs: each
graph's ONNX structure (loaded without external data: names, shapes, types, never weight
values) and its encodings go through the reference backend's own storage decisions
(backends/weightplan.py: quantized at the encoding's bitwidth with per-channel scale/offset,
float at float_bitwidth, small constants inside the topology), a part's graphs (prompt and
token, per context length) share weights by name, and the container lays the blobs out
(page-aligned) under a header composed as the writer composes it. For the reference backend that is the file size to the byte.

The architecture formula (config/model.py part_weights: q/k/v/o, gate/up/down, norms, embedding,
LM head) stays as a cross-check and for estimates before any input exists (disk space, bench):
it reproduces the seeds' measured QAIRT figures for Qwen2.5-7B within 1% (tests/test_sizes.py).
As a cross-check its weights are laid over what the graphs themselves measure (each graph's
topology, the header, the weight blobs' alignment: `Overhead`), not over allowances measured on
one family; the exports of three families (qwen2, qwen3, llama) then agree within 0.2%.
Real exports hold other tensors (per-head 1x1 Conv q/k/v with biases, quantized norm weights,
anonymous MatMul initializers), so a part is judged by its tensors and a disagreeing
architecture figure is only noted in the table.

A part that comes out near its *unpacked* expectation is reported as what it almost always is:
4-bit weights that were not packed (the QAIRT CLI ignores weights_packing in multi-graph mode).

Real HTP bins (backend ortqnn: a backend with `compile_unpacked_probe`) carry program and
container bytes no model of ours knows, so they are judged against the same part compiled in
the same run with its 4-bit weights stored as bytes: the weights' buffer the bin's metadata
record must be smaller by exactly what the part's declared 4-bit weights stored as 4 bits save,
measured on a reference compile (section "real HTP bins" below; docs/backends.md).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hexbundle.backends import reference_toolchain_version
from hexbundle.backends.registry import get_backend
from hexbundle.backends.weightplan import (WeightPlan, constant_stand_in, graph_encodings, graph_info,
                                           load_onnx_structure, plan_weights, topology_bytes)
from hexbundle.config.layout import Layout
from hexbundle.config.model import Model, Part, Plan, WeightSpec, part_weights
from hexbundle.formats import ctxbin
from hexbundle.formats.container import (QUANT_DTYPE_FOR_BITWIDTH, GraphInfo, TensorStream,
                                         align_up, container_size, tensor_blob_nbytes)
from hexbundle.support import hashing
from hexbundle.support import table as tables
from hexbundle.support.console import say
from hexbundle.support.errors import SizeError

MIB = 1 << 20

# The architecture formula cannot know the graph topology (the ONNX graph without weights) and
# the JSON header exactly; these allowances were measured on the reference backend's output for
# qwen2-tiny (a decoder layer's topology is ~10 KB per graph, its header records ~680 bytes per
# tensor). For a 7B part they are < 0.1% of the size. The tensor-derived expectation needs none.
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
    unshared: int    # bytes if every graph (prompt, token; per length) kept its own weights
    has_4bit: bool
    # The architecture formula's packed figure, as a cross-check of a tensor-derived
    # expectation (None when the expectation IS the architecture formula).
    architecture: Optional[int] = None
    unencoded: tuple = ()   # (weight, how it is stored) for layer weights without an encoding

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


# ============================================================ the architecture formula (estimate)

@dataclass(frozen=True)
class Overhead:
    """What a part's bin holds besides its weights, measured from its graphs (each graph's
    topology blob; the header, which records every tensor and graph): the architecture formula
    cannot know a family's graph (Qwen3-4B's ~310 nodes per layer in 4 graphs per part, Llama's
    per-head convolutions), so where the graphs exist it takes these instead of its allowances."""

    topology: tuple        # bytes per graph
    header: int            # bytes
    padding: int           # bytes aligning the part's weight blobs (per-head splits add blobs)


def part_bytes(model: Model, part: Part, packed: bool = True, shared: bool = True,
               float_bitwidth: int = 16, overhead: Optional[Overhead] = None) -> int:
    weights = part_weights(model.architecture, model.quantization, part)
    n_graphs = len(model.graphs(part))   # a prompt and a token graph per context length
    copies = 1 if shared else n_graphs
    blobs = [tensor_bytes(w, packed, float_bitwidth) for w in weights] * copies
    if overhead is not None:   # the weights' bytes, laid out as the graphs split them
        return container_size(list(overhead.topology), overhead.header) + sum(blobs) \
            + overhead.padding
    topology = TOPOLOGY_BYTES_BASE + TOPOLOGY_BYTES_PER_LAYER * len(part.layers)
    blobs += [topology] * n_graphs
    header = HEADER_BYTES_PER_TENSOR * len(weights) * copies + HEADER_BYTES_PER_GRAPH * n_graphs
    return container_size(blobs, header)


def expect(model: Model, plan: Plan, float_bitwidth: int = 16) -> list:
    """Every part's expectation from the architecture alone (no inputs needed)."""
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


# ============================================================ from the inputs' tensors (judged)

@dataclass(frozen=True)
class NamedGraph:
    """One graph of a part as the backend receives it: its name in the bin and its files."""

    name: str
    onnx: Path
    encodings: Path
    unencoded: str = "refuse"   # the model's unencoded_weights policy


@dataclass(frozen=True)
class PlannedGraph:
    """What the reference backend stores of one graph, known without reading weight values."""

    info: GraphInfo            # weights not filled in
    topology_nbytes: int
    weights: tuple             # WeightPlan, in storage order


def plan_graph(graph: NamedGraph) -> PlannedGraph:
    """Read the graph's ONNX structure and encodings; decide per initializer as convert does.
    Once per process for the same bytes: the bundle task's size check and its step (in the
    same doit process under the local executor) both plan every part's graphs, and reading
    the encodings is most of that (docs/perf-notes.md). Keyed on the files' XXH3 (through
    support.hashing's cache), so an edited file is planned again."""
    try:
        digests = hashing.digest(graph.onnx), hashing.digest(graph.encodings)
    except OSError:   # missing or unreadable: the readers say which and what to do
        return _plan(graph)
    return _planned(graph, *digests)


@functools.lru_cache(maxsize=64)
def _planned(graph: NamedGraph, onnx_digest: str, encodings_digest: str) -> PlannedGraph:
    """_plan of these bytes (the ONNX is read without its external data: the .data files are
    no part of the plan)."""
    return _plan(graph)


def _plan(graph: NamedGraph) -> PlannedGraph:
    model = load_onnx_structure(graph.onnx)
    encodings = graph_encodings(model, graph.onnx, graph.encodings)
    weights, constants = plan_weights(model.graph, encodings, graph.onnx, graph.encodings,
                                      graph.unencoded)
    # Constants are inlined into the topology; stand-ins of their size keep their values unread.
    topology = topology_bytes(model.graph, {w.name for w in weights},
                              [constant_stand_in(c) for c in constants])
    return PlannedGraph(graph_info(model, graph.name, encodings), len(topology), tuple(weights))


def _stream(plan: WeightPlan, float_bitwidth: int) -> TensorStream:
    """The weight as the writer receives it, without its values (none are read)."""
    return TensorStream(plan.name, plan.stored_dtype(float_bitwidth), plan.shape,
                        lambda: iter(()), plan.quant_params())


def header_fields(weights_packing: bool = True, weight_sharing: bool = True,
                  optimization_type: int = 3, vtcm_mb: int = 8, device: Optional[dict] = None,
                  producer: Optional[dict] = None) -> dict:
    """The header fields besides graphs and tensors (a few hundred bytes; defaults as compiled
    by the reference backend for the default device)."""
    return ctxbin.header_fields(
        producer=producer or {"name": "reference", "version": reference_toolchain_version()},
        deployable=False, device=device or {"soc_model": 0, "dsp_arch": "v73"},
        weights_packing=weights_packing, weight_sharing=weight_sharing,
        optimization_type=optimization_type, vtcm_mb=vtcm_mb)


def ctxbin_bytes(graphs: list, packed: bool, shared: bool, float_bitwidth: int,
                 fields: Optional[dict] = None) -> int:
    """The size of the context binary write_ctxbin makes of these planned graphs."""
    return ctxbin_layout(graphs, packed, shared, float_bitwidth, fields).size


def ctxbin_layout(graphs: list, packed: bool, shared: bool, float_bitwidth: int,
                  fields: Optional[dict] = None):
    """The layout (formats/container.ContainerLayout) write_ctxbin gives these planned graphs:
    formats/ctxbin.plan_layout, fed the weights as the reference backend stores them."""
    fields = fields or header_fields()
    fields = {**fields, "options": {**fields["options"], "weights_packing": packed,
                                    "weight_sharing": shared}}
    return ctxbin.plan_layout([ctxbin.PlannedGraph(g.info, g.topology_nbytes,
                                                   tuple(_stream(p, float_bitwidth)
                                                         for p in g.weights))
                               for g in graphs], fields)


def measured_overhead(graphs: list, float_bitwidth: int, fields: dict) -> Overhead:
    """A part's topology blobs and header, as its bin (packed, shared) lays them out."""
    layout = ctxbin_layout(graphs, True, True, float_bitwidth, fields)
    topologies = {ctxbin.topology_blob_name(g.info.name) for g in graphs}
    blobs = [(b.name, b.nbytes) for b in layout.blobs]
    padding = sum(align_up(n) - n for name, n in blobs if name not in topologies)
    return Overhead(tuple(n for name, n in blobs if name in topologies), layout.header_length,
                    padding)


def part_expectation(part: Part, graphs: list, float_bitwidth: int = 16,
                     fields: Optional[dict] = None, model: Optional[Model] = None):
    """A part's expectation from its graphs' inputs (NamedGraph, in bin order). The packed,
    unpacked and unshared figures come from the same tensor list; with `model`, the
    architecture formula's weights over the graphs' measured topology and header beside it."""
    planned = [plan_graph(g) for g in graphs]
    fields = fields or header_fields()
    architecture = None if model is None else part_bytes(
        model, part, float_bitwidth=float_bitwidth,
        overhead=measured_overhead(planned, float_bitwidth, fields))

    def size(packed: bool, shared: bool) -> int:
        return ctxbin_bytes(planned, packed, shared, float_bitwidth, fields)

    has_4bit = any(p.encoding is not None and p.encoding.bitwidth == 4
                   for g in planned for p in g.weights)
    unencoded = tuple(sorted({(p.name, p.stored_dtype(float_bitwidth)) for g in planned
                              for p in g.weights if p.unencoded}))
    return PartExpectation(part, size(True, True), size(False, True), size(True, False), has_4bit,
                           architecture, unencoded)


def expect_from_inputs(layout: Layout, convert, compiles: tuple) -> list:
    """Every part's expectation from its inputs (layout.onnx / layout.encodings per graph), with
    the architecture formula's figure alongside as a cross-check. `convert` and `compiles` (one
    per part) are the options the steps built the bins with (steps/options.py)."""
    cfg = layout.cfg
    out = []
    for part, c in zip(cfg.plan.parts(), compiles):
        graphs = [NamedGraph(g.name, layout.onnx(g), layout.encodings(g), convert.unencoded_weights)
                  for g in cfg.model.graphs(part)]
        out.append(expect_part_files(graphs, convert, c, part, cfg.model))
    return out


def expect_part_files(graphs: list, convert, c, part: Optional[Part] = None,
                      model: Optional[Model] = None):
    """A part's expectation from its graphs' files (NamedGraph, in bin order) under the options
    the steps built its bin with (`convert`, its CompileOptions `c`); with `part` and `model`
    the architecture formula's figure alongside."""
    fields = header_fields(c.weights_packing, c.weight_sharing, c.optimization_type,
                           c.device.vtcm_mb,
                           {"soc_model": c.device.soc_model, "dsp_arch": c.device.dsp_arch})
    return part_expectation(part, graphs, convert.float_bitwidth, fields, model)


# ============================================================ judging

@dataclass
class SizeRow:
    expectation: PartExpectation
    actual: Optional[int]
    measured_mib: Optional[float]   # the plan's recorded measurement of a known-good build
    verdict: str                     # "ok" | "NOT PACKED" | "NOT SHARED" | "OFF" | "MISSING"
    note: str = ""                   # the architecture cross-check, when it disagrees

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


def _cross_check(e: PartExpectation, tolerance_pct: float) -> str:
    """A note when the architecture formula disagrees with the tensors beyond the tolerance:
    the export holds other tensors than the config describes (or the config is stale)."""
    if e.architecture is None:
        return ""
    dev = 100.0 * (e.architecture - e.packed) / e.packed
    if abs(dev) <= tolerance_pct:
        return ""
    return (f"part {e.part.index}: the architecture formula gives {e.architecture / MIB:.2f} MiB "
            f"({dev:+.1f}% vs the inputs' tensors); judged by the tensors")


def judge(expectations: list, plan: Plan, actual: dict) -> list:
    """actual: part index -> bytes (None when the file is missing)."""
    rows = []
    for i, e in enumerate(expectations):
        size = actual.get(e.part.index)
        measured = plan.expected_part_mib[i] if plan.expected_part_mib else None
        if size is None:
            verdict = "MISSING"
        elif abs(size - e.packed) <= e.packed * plan.tolerance_pct / 100:
            verdict = "ok"
        else:
            verdict = {"unpacked": "NOT PACKED", "unshared": "NOT SHARED"}.get(
                _closest(size, e), "OFF")
        rows.append(SizeRow(e, size, measured, verdict, _cross_check(e, plan.tolerance_pct)))
    return rows


def judge_sizes(model: Model, plan: Plan, actual: dict, float_bitwidth: int = 16) -> list:
    """Judge against the architecture formula (no inputs at hand)."""
    return judge(expect(model, plan, float_bitwidth), plan, actual)


def _mib(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / MIB:.2f}"


def format_table(model: Model, plan: Plan, rows: list) -> str:
    has_measured = any(r.measured_mib is not None for r in rows)
    head = ["part", "content", "actual MiB", "expected MiB", "dev %"]
    head += ["measured MiB"] if has_measured else []
    body = []
    for r in rows:
        dev = "-" if r.deviation_pct is None else f"{r.deviation_pct:+.2f}"
        cells = [r.expectation.part.index, r.expectation.content, _mib(r.actual),
                 _mib(r.expectation.packed), dev]
        if has_measured:
            cells.append("-" if r.measured_mib is None else f"{r.measured_mib:.1f}")
        body.append(cells + [r.verdict])
    total_actual = sum(r.actual or 0 for r in rows)
    total_expected = sum(r.expectation.packed for r in rows)
    total = ["total", "", _mib(total_actual), _mib(total_expected),
             f"{100.0 * (total_actual - total_expected) / total_expected:+.2f}"]
    if has_measured:
        total += [f"{plan.expected_total_mib:.1f}" if plan.expected_total_mib else "", ""]
    elif plan.expected_total_mib:
        total.append(f"(a known-good build measured {plan.expected_total_mib:.1f})")
    body.append(total)
    lines = [f"size check: {model.name}, plan {plan.name} ({len(rows)} parts), "
             f"tolerance {plan.tolerance_pct}%"]
    lines += tables.table(head + ["verdict"], body, right={0, 2, 3, 4, 5} if has_measured else {0, 2, 3, 4})
    lines += [f"note: {r.note}" for r in rows if r.note]
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
        graphs = len(model.graphs(unshared[0].expectation.part))
        each = "prompt and token graph" + (" of every context length" if graphs > 2 else "")
        raise SizeError(f"part(s) {parts}: weights are stored {graphs} times (the {each} each "
                        "hold a copy): set weight_sharing = true, or the device maps every weight "
                        f"{graphs} times and runs out of address space.\n" + table)
    missing = [r for r in bad if r.verdict == "MISSING"]
    if missing:
        raise SizeError("missing context binaries for part(s) "
                        + ", ".join(str(r.expectation.part.index) for r in missing)
                        + ": run `doit bundle`.\n" + table)
    raise SizeError("sizes outside tolerance (expected vs actual below); a changed "
                    "architecture or quantization scheme must be reflected in the model config."
                    "\n" + table)


# ============================================================ real HTP bins (backend ortqnn)
# A real QNN context binary holds the HTP program and QNN's own container besides the weights;
# no model of ours knows those bytes. So the yardsticks are measured in the same run: the
# backend compiles the part again from its own QDQ models with every 4-bit weight stored one per
# byte (backends/ortqnn.py compile_unpacked_probe). Same graphs, so the same program and layout;
# the weights' buffer, which the bin's metadata record (formats/qnn_context.py weights_shrink),
# must be smaller in the bin than in the probe by what HTP's packing saves. That is not half a
# byte per declared 4-bit weight: HTP pads some 4-bit tensors' rows (measured on one-weight
# graphs: a [64, 96] Conv weight saves 2048 B, not 3072; a [32, 96] one all 1536) and the
# buffer's size word counts whole 4096-byte pages (docs/backends.md). So the saving is measured
# on a second compile, the reference: the part's QDQ models with every weight its encodings
# declare 4-bit stored as INT4/UINT4 (compile_packed_reference). A faithful convert already
# wrote them so; the reference is then the bin's own inputs, and the deterministic compile
# makes it the bin itself (no second compile). A bin whose 4-bit weights went in as bytes IS
# the probe: its buffer is not smaller at all, while the reference's is. The declared half
# byte per weight is shown beside, not judged. File sizes are shown, not judged: QNN pads each
# section to pages, and the program of an int4 graph is not the int8 one's.


@dataclass(frozen=True)
class ProbedRow:
    part: Part
    actual: int          # bytes of the built bin
    probe: int           # bytes of the same part compiled with its 4-bit weights as bytes
    declared_saving: int  # half a byte per 4-bit weight the part's encodings declare
    expected_saving: int  # bytes the reference's weights' buffer is smaller than the probe's
    measured_saving: int  # bytes the bin's weights' buffer is smaller than the probe's

    @property
    def verdict(self) -> str:
        if self.declared_saving and not self.expected_saving:
            return "NOT PACKED"   # the compiler stored even the reference's 4-bit weights wide
        if self.measured_saving == self.expected_saving:
            return "ok"
        return "NOT PACKED" if self.measured_saving == 0 else "OFF"


def declared_4bit(graphs: list) -> dict:
    """The part's weights its encodings declare 4-bit: name -> element count, each weight once
    (prompt and token share them)."""
    counts = {}
    for g in graphs:
        for w in plan_graph(g).weights:
            if w.encoding is not None and w.encoding.bitwidth == 4:
                n = 1
                for d in w.shape:
                    n *= d
                counts[w.name] = n
    return counts


def declared_4bit_saving(graphs: list) -> int:
    """Bytes packing would save on the part's 4-bit weights with no padding: half a byte each
    (an odd count ends in a half-used byte), every weight counted once by name."""
    return sum(n // 2 for n in declared_4bit(graphs).values())


def probe_part(layout: Layout, backend, part: Part, convert, compiled_with) -> ProbedRow:
    from hexbundle.formats.qnn_context import weights_shrink
    from hexbundle.support.atomic import temp_dir
    graphs = layout.cfg.model.graphs(part)
    declared = declared_4bit([NamedGraph(g.name, layout.onnx(g), layout.encodings(g),
                                         convert.unencoded_weights) for g in graphs])
    built = layout.bin(part)
    actual = built.stat().st_size
    if not declared:   # nothing 4-bit: nothing to pack; the bin is its own yardstick
        return ProbedRow(part, actual, actual, 0, 0, weights_shrink(built, built))
    dlcs = [layout.dlc(g) for g in graphs]
    with temp_dir(built.parent, built.name + ".probe") as scratch:
        probe = backend.compile_unpacked_probe(dlcs, compiled_with, scratch, lambda line: None)
        reference = backend.compile_packed_reference(dlcs, frozenset(declared), compiled_with,
                                                     scratch, lambda line: None) or built
        return ProbedRow(part, actual, probe.stat().st_size,
                         sum(n // 2 for n in declared.values()),
                         weights_shrink(probe, reference), weights_shrink(probe, built))


def format_probed_table(model: Model, plan: Plan, rows: list) -> str:
    head = ["part", "bin B", "4-bit as bytes B", "half byte each B", "4-bit as 4 bits saves B",
            "bin saves B", "verdict"]
    body = [[r.part.index, r.actual, r.probe, r.declared_saving, r.expected_saving,
             r.measured_saving, r.verdict] for r in rows]
    lines = [f"size check: {model.name}, plan {plan.name} ({len(rows)} parts), real HTP bins "
             "against the same part compiled with its 4-bit weights as bytes: the weights' "
             "buffer must shrink exactly as the part's declared 4-bit weights stored as 4 bits "
             "make it shrink (HTP pads some tensors and counts the buffer in pages, so that can "
             "be less than half a byte each)"]
    lines += tables.table(head, body, right={0, 1, 2, 3, 4, 5})
    return "\n".join(lines)


def check_probed_sizes(layout: Layout, backend, convert, compiles: tuple) -> None:
    """The size check for a backend that makes real HTP bins (see above)."""
    cfg = layout.cfg
    missing = [p.index for p in cfg.plan.parts() if not layout.bin(p).is_file()]
    if missing:
        raise SizeError("missing context binaries for part(s) "
                        + ", ".join(str(i) for i in missing) + ": run `doit bundle`.")
    rows = [probe_part(layout, backend, p, convert, c) for p, c in zip(cfg.plan.parts(), compiles)]
    table = format_probed_table(cfg.model, cfg.plan, rows)
    bad = [r for r in rows if r.verdict != "ok"]
    if not bad:
        say(table)
        return
    said = "; ".join(
        f"part {r.part.index} ({layout.bin(r.part).name}, {r.actual} B): its weights' buffer "
        f"is expected {r.expected_saving} B smaller than with 4-bit weights stored as bytes "
        f"({r.probe} B), measured {r.measured_saving} B smaller" for r in bad)
    if all(r.verdict == "NOT PACKED" for r in bad):
        if any(not r.expected_saving for r in bad):
            raise SizeError(f"the compiler stored declared 4-bit weights as 8 bits even from "
                            f"INT4/UINT4 models: {said}. Check the compile options (weights "
                            "packing) and rebuild with `doit bundle`.\n" + table)
        raise SizeError(f"4-bit weights stored as 8 bits: {said}. The convert step must write "
                        "them as INT4/UINT4; rebuild with `doit bundle`.\n" + table)
    raise SizeError(f"weights' bytes off the part's encodings: {said}.\n" + table)


def check_built_sizes(layout: Layout, convert, compiles: tuple) -> None:
    """Size every part's context binary against what its inputs' tensors make, by the options
    the steps built them with; a SizeError explains itself. A backend that makes real HTP bins
    (one with `compile_unpacked_probe`) is judged against probes compiled in the same run."""
    backend = get_backend(layout.cfg.backend)
    if hasattr(backend, "compile_unpacked_probe"):
        return check_probed_sizes(layout, backend, convert, compiles)
    cfg = layout.cfg
    actual = {p.index: (layout.bin(p).stat().st_size if layout.bin(p).is_file() else None)
              for p in cfg.plan.parts()}
    expectations = expect_from_inputs(layout, convert, compiles)
    rows = judge(expectations, cfg.plan, actual)
    table = format_table(cfg.model, cfg.plan, rows)
    raise_on_failure(cfg.model, cfg.plan, rows, table)
    say(table)
    unencoded = sorted({u for e in expectations for u in e.unencoded})
    if unencoded:   # no silent fallback: which weights the policy stored, and how
        say(f"note: {len(unencoded)} layer weight(s) without an encoding, stored by the policy "
            f"unencoded_weights = {convert.unencoded_weights!r}: "
            + ", ".join(f"{n} ({d})" for n, d in unencoded[:8]) + (" ..." if len(unencoded) > 8 else ""))
