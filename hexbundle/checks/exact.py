"""The exact half of `doit verify` (issue 34): what the build wrote, compared with the export
element for element, with no threshold at all.

Three checks per graph of a part, each a row of verify's table:
  topology vs the export's    graph name, inputs and outputs (names, order, dtypes, shapes: the
                              KV layout is the past_key/value shapes), and the nodes (op type,
                              inputs, outputs, in order) against the export's ONNX
  encodings vs the export's   every activation encoding of the export present in the bin with its
                              bit width, type, symmetry, scale and offset, bit for bit; every
                              encoded weight stored with its bit width, symmetry, channel axis,
                              block size and block axis and its scales and offsets, bit for bit
  weights vs the export's     every stored weight against AIMET's quantization of the export's
                              float weight with the export's encoding, q = clip(floor(w / s - o
                              + 0.5), 0, 2^bw - 1): integer-exact, +-1 only where w / s - o is a
                              rounding tie (x.5 exactly, where half-to-even and half-up part ways);
                              ties are counted and printed. Float weights equal the export's at
                              the stored precision; weights the export leaves unencoded and the
                              build quantizes by its unencoded_weights policy are checked against
                              the same formula with the bin's own grid (the build's choice).
Numbers alone cannot see these faults: an 8-bit KV path stored at 16 bits, a dropped 16-bit
encoding or a 4-bit weight on an 8-bit grid each move the output by less than the comparison's
own noise. A failure names the graph, the tensor and the first differing element, with both
values.

Everything is streamed: a weight is read in row blocks from the export (onnxfile) and in element
blocks from the bin (ctxbin), so the 7B shape is never materialised whole, and a weight shared by
a part's graphs is compared once.

The channel axis a per-channel weight encoding must be stored along comes from the export's
graph (runtime.qdq.weight_axis: the consumer's output channels), not from the backend's weight
plan, so the check does not share the build's decisions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hexbundle.formats.encodings import load_encodings
from hexbundle.formats.onnxfile import initializer_values, load_structure
from hexbundle.runtime.qdq import weight_axis

ROW_BLOCK_ELEMENTS = 1 << 22     # ~16 MB of float32 per block: memory stays flat at any size
TOPOLOGY, ENCODINGS, WEIGHTS = ("topology vs the export's", "encodings vs the export's",
                                "weights vs the export's")
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
               7: "int64", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
               16: "bfloat16"}


@dataclass
class ExactCheck:
    """One exact check over a part's graphs: how many things compared, and what differs."""
    check: str
    compared: int = 0
    problems: list = field(default_factory=list)
    elements: int = 0            # weights: elements compared
    ties: int = 0                # weights: +-1 at a rounding tie (allowed, counted)

    def summary(self) -> str:
        if self.check == WEIGHTS:
            return (f"{self.compared} weight(s), {self.elements} element(s): integer-exact, "
                    f"{self.ties} at a rounding tie (+-1)")
        return f"{self.compared} compared"


@dataclass
class PartGraph:
    """A graph of the part: its name in the bin and the export's files it was built from."""
    name: str
    onnx: Path
    encodings: Path


def exact_checks(reader, graphs: list) -> list:
    """The three exact checks of one part (a bin and the export graphs it holds)."""
    topology, encodings, weights = ExactCheck(TOPOLOGY), ExactCheck(ENCODINGS), ExactCheck(WEIGHTS)
    compared_blobs = set()   # a weight shared by the part's graphs is compared once
    for g in graphs:
        model = load_structure(g.onnx)
        spec = load_encodings(g.encodings).for_graph({i.name for i in model.graph.initializer})
        check_topology(reader, g, model, topology)
        check_encodings(reader, g, model, spec, encodings)
        check_weights(reader, g, model, spec, weights, compared_blobs)
    return [topology, encodings, weights]


# ============================================================================ topology


def _io(values, skip=frozenset()) -> list:
    out = []
    for v in values:
        if v.name in skip:
            continue
        t = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in t.shape.dim) if t.HasField("shape") else None
        out.append((v.name, ONNX_DTYPES.get(t.elem_type, str(t.elem_type)), dims))
    return out


def _bin_io(specs) -> list:
    return [(s.name, s.dtype, None if s.shape is None else tuple(s.shape)) for s in specs]


def check_topology(reader, g: PartGraph, model, result: ExactCheck) -> None:
    if g.name not in reader.graph_names:
        result.problems.append(f"graph '{g.name}': not in the bin (it holds "
                               f"{', '.join(reader.graph_names)})")
        return
    info = reader.graph(g.name)
    initializers = {i.name for i in model.graph.initializer}
    for what, got, want in (("input", _bin_io(info.inputs), _io(model.graph.input, initializers)),
                            ("output", _bin_io(info.outputs), _io(model.graph.output))):
        result.compared += len(want)
        if got != want:
            result.problems.append(f"{g.name}: {what}s differ from {g.onnx.name}: "
                                   + _first_difference(got, want, what))
    stored = [(n.op_type, tuple(n.input), tuple(n.output)) for n in reader.topology(g.name).node]
    export = [(n.op_type, tuple(n.input), tuple(n.output)) for n in model.graph.node]
    result.compared += len(export)
    if stored != export:
        result.problems.append(f"{g.name}: nodes differ from {g.onnx.name}: "
                               + _first_difference(stored, export, "node"))


def _first_difference(got: list, want: list, what: str) -> str:
    for index, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return f"{what} {index} is {_show(a)} in the bin, {_show(b)} in the export"
    if len(got) != len(want):
        return f"{len(got)} {what}s in the bin, {len(want)} in the export"
    return "(same)"


def _show(entry) -> str:
    return str(entry if len(str(entry)) < 160 else str(entry)[:157] + "...")


# ============================================================================ encodings


def _same(a, b) -> bool:
    a, b = np.asarray(a, np.float32).reshape(-1), np.asarray(b, np.float32).reshape(-1)
    return a.shape == b.shape and bool(np.all(a.view(np.uint32) == b.view(np.uint32)) or
                                       np.array_equal(a, b))


def _first_value_difference(got, want) -> str:
    a, b = np.asarray(got, np.float32).reshape(-1), np.asarray(want, np.float32).reshape(-1)
    if a.shape != b.shape:
        return f"{a.size} value(s) in the bin, {b.size} in the export"
    i = int(np.flatnonzero(a != b)[0])
    return f"[{i}] {a[i]!r} in the bin, {b[i]!r} in the export"


def check_encodings(reader, g: PartGraph, model, spec, result: ExactCheck) -> None:
    if g.name not in reader.graph_names:
        return
    info = reader.graph(g.name)
    stored = info.activations or {}
    where = g.encodings.name
    for name, enc in sorted(spec.activations.items()):
        result.compared += 1
        got = stored.get(name)
        want = f"{enc.bitwidth}-bit {enc.dtype}"
        if got is None:
            result.problems.append(f"{g.name}: activation '{name}': no encoding in the bin (the "
                                   f"export's {want})")
        elif (got["bitwidth"], got.get("dtype", "int")) != (enc.bitwidth, enc.dtype):
            result.problems.append(f"{g.name}: activation '{name}': {got['bitwidth']}-bit "
                                   f"{got.get('dtype', 'int')} in the bin, {want} in {where}")
        elif enc.is_int and bool(got.get("symmetric", enc.symmetric)) != enc.symmetric:
            result.problems.append(f"{g.name}: activation '{name}': symmetric "
                                   f"{got.get('symmetric')} in the bin, {enc.symmetric} in {where}")
        elif enc.is_int:
            for key, want_values in (("scale", enc.scale), ("offset", enc.offset)):
                if not _same(got[key], want_values):
                    result.problems.append(f"{g.name}: activation '{name}': {key} "
                                           f"{_first_value_difference(got[key], want_values)}")
                    break
    weights = set(info.weights)
    for name, enc in sorted(spec.params.items()):
        result.compared += 1
        if name not in weights:
            if enc.is_int:
                result.problems.append(f"{g.name}: weight '{name}': not stored in the bin (the "
                                       f"export's {enc.bitwidth}-bit encoding)")
            continue
        q = reader.quant_params(g.name, name)
        if not enc.is_int:
            # a float16 encoding is float16; a float32 one is stored at the build's float
            # precision (float_precision), either float width
            stored_dtype = reader.record(g.name, name).dtype
            allowed = ("float16",) if enc.bitwidth == 16 else ("float16", "float32")
            if q is not None or stored_dtype not in allowed:
                result.problems.append(f"{g.name}: weight '{name}': stored as {stored_dtype}, "
                                       f"float{enc.bitwidth} in {where}")
            continue
        problem = _param_problem(q, enc, model.graph, name, reader.record(g.name, name).shape)
        if problem:
            result.problems.append(f"{g.name}: weight '{name}': {problem} ({where})")


def expected_axes(enc, graph, name: str, shape: tuple) -> tuple:
    """(channel axis, block axis) the export's encoding means for this weight, from its graph."""
    if not enc.per_channel:
        return None, None
    if enc.is_blockwise:
        axis = weight_axis(graph, name, shape, -1, enc.axis)
        return axis, (enc.block_axis if enc.block_axis is not None else (1 if axis == 0 else 0))
    return weight_axis(graph, name, shape, enc.channels, enc.axis), None


def _param_problem(q, enc, graph, name: str, shape: tuple) -> str:
    if q is None:
        return f"stored float, {enc.bitwidth}-bit in the export"
    if q.bitwidth != enc.bitwidth:
        return f"stored at {q.bitwidth} bits, {enc.bitwidth} in the export"
    if bool(q.symmetric) != bool(enc.symmetric):
        return f"symmetric {q.symmetric} in the bin, {enc.symmetric} in the export"
    axis, block_axis = expected_axes(enc, graph, name, tuple(shape))
    layout = lambda a, b, size: ("per tensor" if a is None else
                                 f"per channel along axis {a}" if not size else
                                 f"per block of {size} along axis {b}, channels along {a}")
    got_layout = layout(q.axis, q.block_axis, q.block_size)
    want_layout = layout(axis, block_axis, enc.block_size)
    if got_layout != want_layout:
        return f"{got_layout} in the bin, {want_layout} in the export"
    for key, got, want in (("scale", q.scale, enc.scale), ("offset", q.offset, enc.offset)):
        if not _same(got, want):
            return f"{key} {_first_value_difference(got, want)}"
    return ""


# ============================================================================ weights


def aimet_quantize(w: np.ndarray, scale, offset, bitwidth: int) -> tuple:
    """(q, tie): AIMET's q = clip(floor(w / s - o + 0.5), 0, 2^bw - 1), in float32 as the
    quantizer computes w / s, and where w / s - o is a tie (fraction exactly .5: the one place
    a correct half-to-even quantizer differs from it, by one)."""
    t = np.divide(w, scale, dtype=np.float32)
    offset = np.asarray(offset, np.float32)
    # an integral offset: round before it, exactly (w/s + 32768 in float32 would lose bits)
    integral = bool(np.all(offset == np.floor(offset)))
    u = t if integral else np.subtract(t, offset, dtype=np.float32)
    whole = np.floor(u)
    fraction = u - whole              # exact in float32 for |u| < 2^24
    q = whole + (fraction >= np.float32(0.5))   # floor(u + 0.5) without a rounding add
    if integral:
        q = q - offset
    return np.clip(q, 0, 2 ** bitwidth - 1), fraction == np.float32(0.5)


def _flat_blocks(blocks):
    """Re-cut a stream of flat element blocks into exactly the sizes asked for (`take(n)`)."""
    pending, it = [], iter(blocks)

    def take(n: int) -> np.ndarray:
        have = sum(p.size for p in pending)
        while have < n:
            block = next(it)
            pending.append(block)
            have += block.size
        joined = np.concatenate(pending) if len(pending) > 1 else pending[0]
        pending.clear()
        if joined.size > n:
            pending.append(joined[n:])
        return joined[:n]
    return take


def check_weights(reader, g: PartGraph, model, spec, result: ExactCheck, seen: set) -> None:
    if g.name not in reader.graph_names:
        return
    initializers = {i.name: i for i in model.graph.initializer}
    for name in reader.graph(g.name).weights:
        record = reader.record(g.name, name)
        if record.blob in seen:
            continue
        seen.add(record.blob)
        init = initializers.get(name)
        if init is None:
            result.problems.append(f"{g.name}: weight '{name}': the bin stores it, "
                                   f"{g.onnx.name} has no such initializer")
            continue
        values = initializer_values(init, g.onnx)
        if tuple(values.shape) != tuple(record.shape):
            result.problems.append(f"{g.name}: weight '{name}': shape {list(record.shape)} in "
                                   f"the bin, {list(values.shape)} in {g.onnx.name}")
            continue
        enc = spec.params.get(name)
        q = reader.quant_params(g.name, name)
        problem = _compare_weight(reader, g, name, values, enc, q, model.graph, result)
        result.compared += 1
        if problem:
            result.problems.append(f"{g.name}: weight '{name}': {problem}")


def _compare_weight(reader, g, name, values, enc, q, graph, result: ExactCheck) -> str:
    """'' if the stored elements are the export's weight as specified, else the first
    difference (its index in the weight's shape, both values and the float weight)."""
    shape = tuple(values.shape) or (1,)
    if enc is not None and enc.is_int:
        if q is None or q.bitwidth != enc.bitwidth:
            return "not stored on the export's grid (see the encodings row)"
        from hexbundle.runtime.qdq import weight_grid
        try:
            grid = weight_grid(enc, graph, name, shape)
        except Exception as exc:   # an encoding the graph cannot place: the encodings row says
            return f"its encoding cannot be laid over the weight ({exc})"
        bits, what = enc.bitwidth, "AIMET's quantization with the export's encoding"
    elif q is not None:            # unencoded in the export: the build's own grid, same formula
        grid, bits, what = q.expanded(shape), q.bitwidth, "its own grid (unencoded_weights policy)"
    else:
        grid, bits, what = None, 0, "the export's float weight"
    take = _flat_blocks(reader.weight_blocks(g.name, name, ROW_BLOCK_ELEMENTS))
    row_elements = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    for rows, block in values.rows(ROW_BLOCK_ELEMENTS):
        block = block.reshape((-1, *shape[1:]))
        stored = take(block.size).reshape(block.shape)
        result.elements += block.size
        if grid is None:
            want = block.astype(stored.dtype)
            bad = np.flatnonzero((stored != want).reshape(-1) & ~(np.isnan(want.astype(
                np.float32)) & np.isnan(stored.astype(np.float32))).reshape(-1))
            if bad.size:
                i = int(bad[0])
                return (f"element {_index(i, rows, row_elements, shape)} is {stored.flat[i]!r} "
                        f"in the bin, {want.flat[i]!r} ({what})")
            continue
        scale, offset = (x[rows] if np.ndim(x) and x.shape[0] > 1 else x for x in grid)
        expected, tie = aimet_quantize(block, scale, offset, bits)
        diff = stored.astype(np.int64) - expected.astype(np.int64)
        off = diff != 0
        allowed = off & (np.abs(diff) == 1) & tie
        result.ties += int(np.count_nonzero(allowed))
        bad = np.flatnonzero((off & ~allowed).reshape(-1))
        if bad.size:
            i = int(bad[0])
            return (f"element {_index(i, rows, row_elements, shape)} is {int(stored.flat[i])} in "
                    f"the bin, {int(expected.flat[i])} by {what} (float {block.flat[i]!r}); "
                    f"{bad.size} element(s) of this block differ")
    return ""


def _index(flat_in_block: int, rows: slice, row_elements: int, shape: tuple) -> list:
    flat = (rows.start or 0) * row_elements + flat_in_block
    return [int(i) for i in np.unravel_index(flat, shape)]
