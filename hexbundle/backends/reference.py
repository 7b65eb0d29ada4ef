"""The embedded reference backend: real conversion and compilation in numpy + onnx.

It writes the open hexbundle DLC / context-binary formats (docs/formats.md), not Qualcomm's, so
its outputs are not deployable; they let the whole pipeline, the size model and the failure
modes (unpacked 4-bit, unshared weights) be built and checked without the QAIRT SDK.

Memory stays bounded by a few blocks, whatever the tensor and model size: the ONNX is loaded
without its external data; each weight is read in blocks of rows through a short-lived np.memmap
window, quantized, written and dropped block by block (the 2.2 GB float32 embedding never sits
in memory whole, nor its 1.1 GB of 16-bit codes); compile streams the DLCs' tensors out of their
mmaps in blocks and releases each block's pages behind it.
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
from onnx import numpy_helper

from hexbundle.backends import CompileOptions, ConvertOptions, reference_toolchain_version
from hexbundle.backends.bincheck import check_bin_facts, facts_from_ctxbin
from hexbundle.backends.weightplan import (graph_encodings, graph_info, load_onnx_structure,
                                          outputs_without_encoding, plan_weights,
                                          topology_bytes)
from hexbundle.formats.container import UNKEYED, QuantParams, TensorStream
from hexbundle.formats.ctxbin import CtxGraph, is_ctxbin, read_ctxbin, write_ctxbin
from hexbundle.formats.dlc import DlcGraph, DlcReader, read_dlc, write_dlc
from hexbundle.formats.onnxfile import BLOCK_ELEMENTS, TensorValues, initializer_values
from hexbundle.inputs.validate import WeightValueCheck
from hexbundle.support import progress
from hexbundle.support.errors import BackendError, EncodingsError, HexbundleError

# Non-weight initializers kept inside the topology must stay small: the topology is one blob
# that is parsed whole.
MAX_TOPOLOGY_INITIALIZER_BYTES = 1 << 20
QUANTIZE_BLOCK_ELEMENTS = BLOCK_ELEMENTS   # rows per block ~ 16 MiB of float32 temporaries


class ReferenceBackend:
    name = "reference"
    deployable = False
    marks_outputs = True             # its DLC and bin record the step's key (made_for)
    checks_weight_values = True       # in the conversion pass itself (_stored_tensors)

    def toolchain_version(self) -> str:
        return reference_toolchain_version()

    def _producer(self) -> dict:
        return {"name": self.name, "version": self.toolchain_version()}

    def check_dlc(self, dlc_path: Path, graph_name: str, log: Callable[[str], None]) -> None:
        check_dlc(dlc_path, graph_name, log)

    def check_bin(self, bin_path: Path, options: CompileOptions,
                  log: Callable[[str], None]) -> None:
        check_bin(bin_path, options, log)

    def made_for(self, path: Path) -> "str | None":
        """The key the DLC or context binary records (None: it records none)."""
        reader = read_ctxbin(path) if is_ctxbin(path) else read_dlc(path)
        with reader:
            return reader.made_for

    # ---------------------------------------------------------------------------------- convert
    def convert(self, onnx_path: Path, encodings_path: Path, dlc_path: Path, graph_name: str,
                options: ConvertOptions, log: Callable[[str], None],
                made_for: str = UNKEYED, part_graphs: tuple = ()) -> None:
        onnx_path, encodings_path, dlc_path = Path(onnx_path), Path(encodings_path), Path(dlc_path)
        if options.float_bitwidth not in (16, 32):
            raise BackendError(f"float_bitwidth {options.float_bitwidth} is not supported; use 16 or 32")
        model = load_onnx_structure(onnx_path)
        encodings = graph_encodings(model, onnx_path, encodings_path)
        if encodings.derived:
            outputs = [o.name for o in model.graph.output if o.name in encodings.derived]
            log(f"{len(encodings.derived)} activation encoding(s) carried through data-movement "
                f"ops (as QNN does)" + (f", graph outputs among them: {', '.join(outputs)}"
                                        if outputs else ""))
        for name in outputs_without_encoding(model, encodings):
            log(f"graph output {name!r} has no activation encoding (none in {encodings_path.name}, "
                "none derivable): it leaves the graph in float")
        weights, constants = plan_weights(model.graph, encodings, onnx_path, encodings_path,
                                          options.unencoded_weights)
        weight_names = {w.name for w in weights}
        info = graph_info(model, graph_name, encodings)
        topology = topology_bytes(model.graph, weight_names,
                                  [_inline_constant(c, onnx_path) for c in constants],
                                  [_inline_attribute_tensors(n, onnx_path) for n in model.graph.node])
        tensors = _stored_tensors(weights, onnx_path, options.float_bitwidth, log)
        with progress.meter(f"{onnx_path.stem} weights", _bytes_read(weights, onnx_path)):
            size = write_dlc(dlc_path, DlcGraph(info, topology, tensors, self._producer(),
                                                options.float_bitwidth, onnx_path.name,
                                                encodings_path.name, deployable=self.deployable,
                                                made_for=made_for))
        quantized = sum(1 for w in weights if w.encoding is not None)
        log(f"{dlc_path.name}: graph {graph_name}: {quantized} quantized + {len(weights) - quantized} "
            f"float weights, {len(constants)} constants in topology, {size} bytes")

    # ---------------------------------------------------------------------------------- compile
    def compile(self, dlc_paths: list, bin_path: Path, options: CompileOptions,
                log: Callable[[str], None], made_for: str = UNKEYED) -> None:
        bin_path = Path(bin_path)
        names = tuple(options.graph_names)
        _check_compile_options(names, dlc_paths, options)
        readers = []
        try:
            for path in dlc_paths:
                readers.append(read_dlc(path))
            actual = tuple(r.graph_name for r in readers)
            if actual != names:
                raise BackendError(
                    f"{bin_path.name}: the DLCs hold graphs {list(actual)} (from "
                    f"{', '.join(Path(p).name for p in dlc_paths)}) but graph_names is {list(names)}; "
                    f"pass the DLCs in bin order (prompt, token; per context length)")
            graphs = (CtxGraph(r.graph, r.topology_bytes(), _dlc_tensors(r)) for r in readers)
            device = {"soc_model": options.device.soc_model, "dsp_arch": options.device.dsp_arch}
            total = sum(rec.data_nbytes for r in readers for rec in r.tensors.values())
            with progress.meter(f"{bin_path.name} DLC weights", total):
                size = write_ctxbin(bin_path, graphs, weights_packing=options.weights_packing,
                                    weight_sharing=options.weight_sharing,
                                    optimization_type=options.optimization_type,
                                    vtcm_mb=options.device.vtcm_mb, device=device,
                                    producer=self._producer(), deployable=self.deployable,
                                    made_for=made_for)
        finally:
            for reader in readers:
                reader.close()
        log(f"{bin_path.name}: {len(names)} graphs ({', '.join(names)}), "
            f"weights_packing={options.weights_packing}, weight_sharing={options.weight_sharing}, "
            f"{size} bytes ({size / 2**20:.1f} MiB)")
        check_compiled(bin_path, options, log)


def check_dlc(dlc_path: Path, graph_name: str, log: Callable[[str], None]) -> None:
    """A DLC as this backend writes it: every blob's digest, the graph it holds."""
    with read_dlc(dlc_path) as reader:
        reader.verify_digests()
        if reader.graph_name != graph_name:
            raise BackendError(f"{dlc_path}: holds graph '{reader.graph_name}', not "
                               f"'{graph_name}'")
    log(f"{dlc_path.name}: every blob's digest checked; graph {graph_name}")


def check_bin(bin_path: Path, options: CompileOptions, log: Callable[[str], None]) -> None:
    """A context binary as this backend writes it: every blob's digest, then the checks a
    compile ends with (graphs, weight sharing, device)."""
    with read_ctxbin(bin_path) as reader:
        reader.verify_digests()
        facts = facts_from_ctxbin(reader)
    check_bin_facts(bin_path, facts, tuple(options.graph_names), options.device.soc_model,
                    options.device.dsp_arch, options.weight_sharing, log)
    log(f"{bin_path.name}: every blob's digest checked; graphs, weight sharing and device as "
        "a compile here checks them")


def check_compiled(bin_path: Path, options: CompileOptions, log: Callable[[str], None]) -> None:
    """The binary as its own reader sees it, by the qairt backend's check (backends.bincheck);
    a refused binary is removed."""
    try:
        reader = read_ctxbin(bin_path)
        try:
            facts = facts_from_ctxbin(reader)
        finally:
            reader.close()
        check_bin_facts(bin_path, facts, tuple(options.graph_names), options.device.soc_model,
                        options.device.dsp_arch, options.weight_sharing, log)
    except HexbundleError:
        bin_path.unlink(missing_ok=True)
        raise


# ==================================================================================== compile

def _check_compile_options(names: tuple, dlc_paths: list, options: CompileOptions) -> None:
    if len(set(names)) != len(names):
        raise BackendError(f"graph_names {list(names)} contains a name twice; graph names must be distinct")
    if len(names) != len(dlc_paths):
        raise BackendError(f"{len(dlc_paths)} DLCs given for {len(names)} graph names {list(names)}")
    if options.optimization_type not in (1, 2, 3):
        raise BackendError(f"optimization_type {options.optimization_type} is not 1, 2 or 3")
    if options.device.vtcm_mb < 0:   # 0: the SoC's maximum, as QAIRT takes it
        raise BackendError(f"vtcm_mb {options.device.vtcm_mb} must be 0 (the SoC's maximum) or "
                           "positive")


def _bytes_read(weights: list, onnx_path: Path) -> int:
    """What converting reads of the external data: each weight once, twice when its encoding is
    derived from its values (one pass for the scale, one to quantize)."""
    return sum(initializer_values(w.initializer, onnx_path).nbytes * (2 if w.derived_bitwidth else 1)
               for w in weights)


def _dlc_tensors(reader: DlcReader) -> Iterator[TensorStream]:
    """The DLC's weights, one at a time, each streamed in blocks out of the DLC's mmap."""
    for name in reader.tensors:
        yield reader.tensor_stream(name)


# ==================================================================================== convert

@dataclass
class _StreamNotes:
    """What streaming a weight found, logged once the writer has consumed it."""

    clipped: int = 0


def _stored_tensors(weights: list, onnx_path: Path, float_bitwidth: int,
                    log: Callable[[str], None]) -> Iterator[TensorStream]:
    """Generator: one weight at a time, as a stream the DLC writer pulls block by block (read,
    quantize or narrow to float, write); logged after it was written."""
    for plan in weights:
        init, enc, dtype = plan.initializer, plan.encoding, plan.stored_dtype(float_bitwidth)
        values = initializer_values(init, onnx_path)
        # NaN, infinity, float16 overflow: checked on the blocks this pass reads anyway
        check = WeightValueCheck(onnx_path, init.name, values.shape, dtype, values.data_path,
                                 values.offset)
        notes = _StreamNotes()
        policy = " (no encoding: unencoded_weights = " if plan.unencoded else ""
        if plan.derived_bitwidth:
            quant = _derived_quant(values, plan, check)
            yield TensorStream(init.name, dtype, values.shape,
                               _quantized_blocks(values, quant, notes), quant)
            granularity = "per-tensor" if plan.axis is None else f"per-channel axis {plan.axis}"
            log(f"{init.name}: int{plan.derived_bitwidth} symmetric {granularity} shape "
                f"{list(values.shape)}{policy}int8, as QNN's --quantize_full_type w8a16)")
        elif enc is None:
            yield TensorStream(init.name, dtype, values.shape,
                               _float_blocks(values, np.dtype(dtype), check))
            log(f"{init.name}: {dtype} shape {list(values.shape)}"
                + (f"{policy}float)" if policy else ""))
        else:
            quant = plan.quant_params()
            yield TensorStream(init.name, dtype, values.shape,
                               _quantized_blocks(values, quant, notes, check), quant)
            granularity = "per-tensor" if plan.axis is None else f"per-channel axis {plan.axis}"
            if quant.block_size:
                granularity = (f"{enc.enc_type.lower().replace('_', '-')} {quant.block_size} along "
                               f"axis {quant.block_axis}, channels axis {plan.axis}")
            note = f", {notes.clipped} values clipped to the encoding range" if notes.clipped else ""
            log(f"{init.name}: int{enc.bitwidth} {granularity} shape {list(values.shape)}{note}")


def _derived_quant(values: TensorValues, plan, check: WeightValueCheck) -> QuantParams:
    """Symmetric per-channel (or per-tensor) int encoding of a weight that has none, from its
    values (one streamed pass, which also checks them): scale = max|w| / (2^(bw-1) - 1),
    offset -2^(bw-1)."""
    bits, axis = plan.derived_bitwidth, plan.axis
    shape = values.shape if values.shape else (1,)
    groups = 1 if axis is None else shape[axis]
    absmax = np.zeros(groups, np.float32)
    for rows, block in values.rows(QUANTIZE_BLOCK_ELEMENTS):
        check(block, rows.start)
        a = np.abs(block)
        if axis is None:
            absmax[0] = max(absmax[0], float(a.max(initial=0.0)))
        elif axis == 0:
            absmax[rows] = np.maximum(absmax[rows], a.reshape(len(a), -1).max(axis=1, initial=0.0))
        else:
            reduced = np.moveaxis(a, axis, 0).reshape(groups, -1).max(axis=1, initial=0.0)
            absmax = np.maximum(absmax, reduced)
    scale = np.maximum(absmax, np.finfo(np.float32).tiny) / np.float32(2 ** (bits - 1) - 1)
    return QuantParams(bits, axis, scale.astype(np.float32),
                       np.full(groups, -(2.0 ** (bits - 1)), np.float32), True)


def _float_blocks(values: TensorValues, dtype: np.dtype, check: WeightValueCheck):
    """blocks() factory: the values narrowed (or kept) to `dtype`, row block by row block,
    each checked first (a value float16 cannot hold is an error, not infinity in the DLC)."""
    def blocks():
        for rows, block in values.rows(QUANTIZE_BLOCK_ELEMENTS):
            check(block, rows.start)
            yield block.astype(dtype)
    return blocks


def _quantized_blocks(values: TensorValues, quant: QuantParams, notes: _StreamNotes,
                      check: WeightValueCheck = None):
    """blocks() factory: q = clip(round(w / scale - offset), 0, 2^bw - 1), so that
    real = (q + offset) * scale (a shifted, fractional offset is rounded with, as AIMET does);
    row block by row block."""
    qmax = 2 ** quant.bitwidth - 1
    out_dtype = np.dtype(np.uint8 if quant.bitwidth <= 8 else np.uint16)
    shape = values.shape if values.shape else (1,)

    def blocks():
        scratch = None   # one float32 work buffer for every block: no per-block allocation
        # an encoding given with the weight (check set; a derived one covers its values)
        channels = ChannelCoverage(shape, quant.axis) if check is not None else None
        for rows, block in values.rows(QUANTIZE_BLOCK_ELEMENTS):
            if check is not None and check.limit is not None:
                check(block, rows.start)   # a float16 bound needs the values themselves
            if scratch is None:
                scratch = np.empty(block.shape, np.float32)
            scale, offset = quant.expanded(shape, rows)
            q = np.divide(block, scale, out=scratch[:len(block)].reshape(block.shape))
            if np.any(offset != np.floor(offset)):
                q -= offset          # a shifted zero point: round after it, in float32, as AIMET
                np.rint(q, out=q)
            else:                    # integral: round first, exact even for a 16-bit offset
                np.rint(q, out=q)    # (w/s + 30000 in float32 would lose bits)
                q -= offset
            low, high = (float(q.min()), float(q.max())) if q.size else (0.0, 0.0)
            if check is not None and not (math.isfinite(low) and math.isfinite(high)):
                # A NaN or infinite weight makes its q so (finite scales and offsets): only
                # then are the values searched, to refuse and locate it (None: the
                # derived-encoding pass checked them already)
                check(block, rows.start)
            if channels is not None:
                channels.add(block, q, np.rint(-offset), qmax, rows)
            if low < 0 or high > qmax:   # rare: count only when it happens
                notes.clipped += int(np.count_nonzero((q < 0) | (q > qmax)))
                np.clip(q, 0, qmax, out=q)
            yield q.astype(out_dtype)
        if channels is not None:
            channels.refuse_lost(check.onnx_path, check.name, quant)
    return blocks


class ChannelCoverage:
    """Per channel of a weight's encoding (one for a per-tensor encoding), streamed block by
    block: whether any value is nonzero, any quantizes off the zero point, any lands inside
    [0, 2^bw - 1]. A channel with a nonzero value whose values all quantize to its zero point
    (a scale of 1e38) is zeroed by its encoding; one whose values all fall outside the range
    (a scale of 1e-30) is saturated: either is a broken encoding, refused naming the tensor."""

    def __init__(self, shape: tuple, axis):
        self.axis = axis
        groups = 1 if axis is None else shape[axis]
        self.nonzero, self.off_zero, self.inside = (np.zeros(groups, bool) for _ in range(3))

    def _any(self, mask: np.ndarray) -> np.ndarray:
        if self.axis is None:
            return np.array([bool(mask.any())])
        return np.moveaxis(mask, self.axis, 0).reshape(mask.shape[self.axis], -1).any(axis=1)

    def add(self, block, q, zero_point, qmax: int, rows: slice) -> None:
        masks = ((self.nonzero, lambda: block != 0), (self.off_zero, lambda: q != zero_point),
                 (self.inside, lambda: (q >= 0) & (q <= qmax)))
        for seen, mask in masks:
            if self.axis == 0:    # each block holds channels of its own rows
                seen[rows] |= self._any(mask())
            elif not seen.all():  # every block spans every channel: once all are seen, done
                seen |= self._any(mask())

    def refuse_lost(self, onnx_path, name: str, quant: QuantParams) -> None:
        for lost, what in ((self.nonzero & ~self.off_zero, "zero: every value quantizes to "
                            "its zero point"),
                           (self.nonzero & ~self.inside, "saturated: every value is clipped")):
            if lost.any():
                channel = int(np.flatnonzero(lost)[0])
                scale = float(np.ravel(quant.scale[channel] if quant.axis is not None
                                       else quant.scale)[0])
                where = "the tensor" if quant.axis is None else \
                    f"channel {channel} (axis {quant.axis})"
                raise EncodingsError(
                    f"{onnx_path}: weight '{name}': its encoding makes {where} all {what} "
                    f"(scale {scale:g}, {int(lost.sum())} channel(s) so); the encodings file is "
                    "broken for this tensor: re-export the encodings")


def _inline_attribute_tensors(node: onnx.NodeProto, onnx_path: Path) -> onnx.NodeProto:
    """The node, with tensor attributes kept in external data (a Constant's value, when the
    export was saved with convert_attribute) read into it: the topology blob must be
    self-contained, the data file is not shipped."""
    if not any(_is_external_tensor(a) for a in node.attribute):
        return node
    inlined = onnx.NodeProto()
    inlined.CopyFrom(node)
    for attribute in filter(_is_external_tensor, inlined.attribute):
        if not attribute.t.name:   # external data is found by file and offset; errors need a name
            attribute.t.name = f"{node.name or node.op_type}.{attribute.name}"
        attribute.t.CopyFrom(_inline_constant(attribute.t, onnx_path))
    return inlined


def _is_external_tensor(attribute: onnx.AttributeProto) -> bool:
    return (attribute.type == onnx.AttributeProto.TENSOR
            and attribute.t.data_location == onnx.TensorProto.EXTERNAL)


def _inline_constant(init: onnx.TensorProto, onnx_path: Path) -> onnx.TensorProto:
    values = initializer_values(init, onnx_path)
    if values.nbytes > MAX_TOPOLOGY_INITIALIZER_BYTES:
        raise BackendError(
            f"{onnx_path}: initializer '{init.name}' ({values.nbytes} bytes, {values.dtype}) is neither "
            f"a float weight nor a small constant; the reference backend keeps such tensors in the "
            f"topology only up to {MAX_TOPOLOGY_INITIALIZER_BYTES} bytes")
    # np.asarray, not np.ascontiguousarray: that one makes a 0-d constant 1-d, and the topology
    # must keep the ONNX's shapes (the size model counts the constant as the ONNX has it)
    return numpy_helper.from_array(np.asarray(values.whole(), order="C"), name=init.name)
