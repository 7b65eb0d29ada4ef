"""What the reference backend stores of an ONNX graph, decided from its structure alone.

For each initializer: a quantized weight (its int encoding's bitwidth, per-channel along the
output axis), a float weight (at float_bitwidth), or a small constant that stays inside the
topology. `backends/reference.py` converts by these decisions and `checks/sizes.py` predicts
the context binary's size by the very same ones, so the prediction cannot drift from the build.
Nothing here reads weight values: the ONNX is loaded without its external data.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
import onnx
from onnx import helper

from hexbundle.formats.container import (QUANT_DTYPE_FOR_BITWIDTH, SMALL_CONSTANT_ELEMENTS,
                                         GraphInfo, IoSpec, QuantParams,
                                         activation_encodings_json)
from hexbundle.formats.encodings import Encodings, ParamEncoding, load_encodings
from hexbundle.formats.onnxfile import load_structure
from hexbundle.support.errors import EncodingsError, InputError

# Inputs through which an initializer acts as a layer weight (op type -> input indices).
LINEAR_WEIGHT_INPUTS = {"MatMul": (0, 1), "Gemm": (0, 1), "Gather": (0,), "Conv": (1,)}
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
               onnx.TensorProto.BFLOAT16}


@dataclass(frozen=True)
class WeightPlan:
    """A weight to store: quantized with `encoding` along `axis`, or float if encoding is None."""

    initializer: onnx.TensorProto     # metadata only; data is read lazily
    encoding: Optional[ParamEncoding]
    axis: Optional[int]
    block_axis: Optional[int] = None  # per-block encodings: the input axis the blocks run along
    derived_bitwidth: int = 0         # no encoding, policy int8: quantized per channel at convert
    feeds_linear: bool = False        # a layer weight (MatMul/Gemm/Conv/Gather input)

    @property
    def name(self) -> str:
        return self.initializer.name

    @property
    def shape(self) -> tuple:
        return tuple(int(d) for d in self.initializer.dims)

    def stored_dtype(self, float_bitwidth: int) -> str:
        """The container dtype the weight is stored as."""
        if self.derived_bitwidth:
            return QUANT_DTYPE_FOR_BITWIDTH[self.derived_bitwidth]
        if self.encoding is None:
            return "float16" if float_bitwidth == 16 else "float32"
        return QUANT_DTYPE_FOR_BITWIDTH[self.encoding.bitwidth]

    @property
    def unencoded(self) -> bool:
        """A layer weight the encodings say nothing about (kept float or quantized by policy)."""
        return self.derived_bitwidth > 0 or (self.encoding is None and self.feeds_linear)

    def quant_params(self) -> Optional[QuantParams]:
        enc = self.encoding
        if self.derived_bitwidth:   # the layout; convert computes the scales from the values
            groups = 1 if self.axis is None else self.shape[self.axis]
            return QuantParams(self.derived_bitwidth, self.axis, np.ones(groups, np.float32),
                               np.full(groups, -(2.0 ** (self.derived_bitwidth - 1)), np.float32),
                               True)
        if enc is None:
            return None
        return QuantParams(enc.bitwidth, self.axis, enc.scale, enc.offset, enc.symmetric,
                           self.block_axis, enc.block_size)


def load_onnx_structure(onnx_path: Path) -> onnx.ModelProto:
    """The model proto WITHOUT external data: weights are read later, one by one, via memmap."""
    return load_structure(onnx_path)


# Ops that move data without computing: their output takes the input's encoding, as QNN carries
# the producer's encoding through them (AIMET 0.6.1/1.0.0 write none for those outputs; 2.0.0
# writes them as derived encodings). Input 0 is the data (Concat: every input, if they agree).
DATA_MOVEMENT_OPS = ("Transpose", "Reshape", "Slice", "Concat", "Squeeze", "Unsqueeze", "Cast",
                     "Identity", "Flatten", "Expand", "Gather")


def derive_through_data_movement(graph: onnx.GraphProto, activations: dict) -> tuple:
    """(activations with the derived ones added, names of the derived ones), in node order."""
    out, derived = dict(activations), []
    for node in graph.node:
        if node.op_type not in DATA_MOVEMENT_OPS or not node.output or node.output[0] in out:
            continue
        sources = [i for i in (node.input if node.op_type == "Concat" else node.input[:1]) if i]
        encodings = [out.get(i) for i in sources]
        if not encodings or any(e is None for e in encodings):
            continue
        first = encodings[0]
        if all(e is first or (np.array_equal(e.scale, first.scale) and np.array_equal(
                e.offset, first.offset) and e.bitwidth == first.bitwidth) for e in encodings):
            out[node.output[0]] = first
            derived.append(node.output[0])
    return out, tuple(derived)


def graph_encodings(model: onnx.ModelProto, onnx_path: Path, encodings_path: Path) -> Encodings:
    """The graph's encodings file, as this graph sees it (`Encodings.for_graph`), with the
    encodings carried through data-movement ops. An activation encoding for a tensor the graph
    does not have is refused: it belongs to another graph (and would be copied into the bin,
    describing nothing)."""
    graph = model.graph
    encodings = load_encodings(encodings_path).for_graph({i.name for i in graph.initializer})
    tensors = {n for node in graph.node for n in (*node.input, *node.output) if n}
    tensors |= {v.name for v in (*graph.input, *graph.output)}
    unknown = sorted(set(encodings.activations) - tensors)
    if unknown:
        raise EncodingsError(
            f"{encodings_path}: activation encoding for '{unknown[0]}', a tensor {onnx_path} does "
            f"not have ({len(unknown)} such in total); the encodings belong to another graph or "
            "export: use the encodings exported with this ONNX")
    activations, derived = derive_through_data_movement(graph, encodings.activations)
    return replace(encodings, activations=activations, derived=derived)


def outputs_without_encoding(model: onnx.ModelProto, encodings: Encodings) -> list:
    """Graph outputs that leave the graph in float (no encoding, none derivable)."""
    return [o.name for o in model.graph.output if o.name not in encodings.activations]


def consumers_of(graph: onnx.GraphProto) -> dict:
    """tensor name -> [(op_type, input index, node)] over the top-level graph."""
    result: dict = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name:
                result.setdefault(name, []).append((node.op_type, index, node))
    return result


UNENCODED_POLICIES = ("refuse", "int8", "float")


def plan_weights(graph: onnx.GraphProto, encodings: Encodings, onnx_path: Path,
                 encodings_path: Path, unencoded: str = "refuse"):
    """Split initializers into weights (own blobs) and small constants (stay in the topology)."""
    if len(graph.sparse_initializer):
        raise InputError(f"{onnx_path}: sparse initializers are not supported; export dense weights")
    initializers = {init.name: init for init in graph.initializer}
    unknown = sorted(set(encodings.params) - set(initializers))
    if unknown:
        raise EncodingsError(
            f"{encodings_path}: param encoding for '{unknown[0]}' but {onnx_path} has no such "
            f"initializer ({len(unknown)} unknown in total); the encodings belong to another export")
    consumers = consumers_of(graph)
    weights, constants = [], []
    for init in graph.initializer:
        plan = plan_one(init, encodings.params.get(init.name), consumers.get(init.name, []),
                        onnx_path, encodings_path, unencoded)
        (weights if plan is not None else constants).append(plan if plan is not None else init)
    return weights, constants


def plan_one(init: onnx.TensorProto, encoding: Optional[ParamEncoding], consumers: list,
             onnx_path: Path, encodings_path: Path, unencoded: str = "refuse") -> Optional[WeightPlan]:
    is_float = init.data_type in FLOAT_TYPES
    count = int(np.prod(init.dims, dtype=np.int64))
    if encoding is not None and encoding.is_int:
        if not is_float:
            raise EncodingsError(f"{encodings_path}: int encoding for '{init.name}', but in {onnx_path} "
                                 f"it is not a float tensor; remove the encoding")
        if not encoding.per_channel:
            return WeightPlan(init, encoding, None)
        axis = channel_axis(init, encoding, consumers, onnx_path, encodings_path)
        if encoding.is_blockwise:
            return WeightPlan(init, encoding, axis,
                              block_axis(init, encoding, consumers, axis, onnx_path, encodings_path))
        return WeightPlan(init, encoding, axis)
    feeds_linear = any(index in LINEAR_WEIGHT_INPUTS.get(op, ()) for op, index, _ in consumers)
    if is_float and count > SMALL_CONSTANT_ELEMENTS and feeds_linear and encoding is None:
        return _unencoded(init, consumers, count, onnx_path, encodings_path, unencoded)
    if is_float and (encoding is not None or count > SMALL_CONSTANT_ELEMENTS):
        return WeightPlan(init, None, None)
    return None


def _unencoded(init: onnx.TensorProto, consumers: list, count: int, onnx_path: Path,
               encodings_path: Path, unencoded: str) -> WeightPlan:
    """A layer weight with no encoding, by the model's policy: a real converter would silently
    keep it in float (big and slow); hexbundle refuses unless the config says what to do."""
    if unencoded == "float":
        return WeightPlan(init, None, None, feeds_linear=True)
    if unencoded == "int8":
        axes = {output_axis(op, index, node, len(init.dims)) for op, index, node in consumers}
        axis = axes.pop() if len(axes) == 1 and None not in axes else None
        return WeightPlan(init, None, axis, derived_bitwidth=8, feeds_linear=True)
    raise EncodingsError(
        f"{encodings_path}: no int encoding for weight '{init.name}' of {onnx_path} ({count} "
        f"elements feeding {consumers[0][0]}); re-export the encodings with this layer quantized, "
        "or set [quantization] unencoded_weights = \"int8\" (as QNN's --quantize_full_type w8a16) "
        "or \"float\" in the model config")


def channel_axis(init: onnx.TensorProto, encoding: ParamEncoding, consumers: list,
                 onnx_path: Path, encodings_path: Path) -> int:
    """The OUTPUT channel axis, which depends on how the consumer op reads the weight."""
    ndim = len(init.dims)
    axes = {output_axis(op, index, node, ndim) for op, index, node in consumers}
    if len(axes) != 1 or None in axes or ndim == 0:
        ops = ", ".join(f"{op} input {index}" for op, index, _ in consumers) or "no consumer"
        raise EncodingsError(
            f"{encodings_path}: per-channel encoding for '{init.name}' but its channel axis cannot "
            f"be determined from {onnx_path} ({ops}); use a per-tensor encoding or MatMul/Gemm/Gather/Conv")
    axis = axes.pop()
    if encoding.axis is not None and encoding.axis != axis:
        raise EncodingsError(
            f"{encodings_path}: '{init.name}' is quantized along axis {encoding.axis} (key 'axis'), "
            f"but {onnx_path} reads its output channels along axis {axis} (shape "
            f"{list(init.dims)}); the encodings belong to another export")
    if encoding.is_blockwise:
        return axis
    if encoding.channels % init.dims[axis] == 0 and encoding.channels > init.dims[axis]:
        raise EncodingsError(
            f"{encodings_path}: '{init.name}' has {encoding.channels} encodings, "
            f"{encoding.channels // init.dims[axis]} per output channel: block-wise "
            f"quantization, which the legacy 0.6.1 format cannot describe (it flattens the "
            f"blocks into one list); export the encodings as 1.0.0 or 2.0.0")
    if encoding.channels != init.dims[axis]:
        raise EncodingsError(
            f"{encodings_path}: '{init.name}' has {encoding.channels} per-channel encodings but its "
            f"output-channel axis {axis} has length {init.dims[axis]} (shape {list(init.dims)}) in "
            f"{onnx_path}; the encodings belong to another export")
    return axis


def block_axis(init: onnx.TensorProto, encoding: ParamEncoding, consumers: list, axis: int,
               onnx_path: Path, encodings_path: Path) -> int:
    """The INPUT axis blocks run along: the other axis of a 2-D MatMul/Gemm weight, axis 1 of a
    Conv weight [out, in, kh, kw]."""
    ops = {op for op, _, _ in consumers}
    ndim = len(init.dims)
    found = 1 if ops == {"Conv"} else (1 - axis if ndim == 2 else None)
    where = f"{encodings_path}: '{init.name}' ({encoding.enc_type}, block_size {encoding.block_size})"
    if found is None:
        raise EncodingsError(f"{where}: the block axis of a {ndim}-D weight read by "
                             f"{', '.join(sorted(ops))} in {onnx_path} is not known; use "
                             "per-channel encodings for it")
    if encoding.block_axis is not None and encoding.block_axis != found:
        raise EncodingsError(f"{where}: blocks along axis {encoding.block_axis} (key 'axis'), but "
                             f"{onnx_path} reads the weight's input along axis {found}")
    length = init.dims[found]
    if length % encoding.block_size:
        raise EncodingsError(f"{where}: block_size {encoding.block_size} does not divide the input "
                             f"axis {found} of length {length} (shape {list(init.dims)})")
    groups = init.dims[axis] * (length // encoding.block_size)
    if encoding.channels != groups:
        raise EncodingsError(
            f"{where}: {encoding.channels} block scales, but shape {list(init.dims)} in "
            f"{onnx_path} needs {init.dims[axis]} channels x {length // encoding.block_size} "
            "blocks; the encodings belong to another export")
    return found


def output_axis(op: str, index: int, node: onnx.NodeProto, ndim: int) -> Optional[int]:
    if op == "MatMul" and index == 1:
        return ndim - 1
    if op == "Gemm" and index == 1:
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else ndim - 1
    if (op == "Gather" and index == 0) or (op == "Conv" and index == 1):
        return 0
    return None


def graph_info(model: onnx.ModelProto, graph_name: str, encodings: Encodings) -> GraphInfo:
    """The graph record a DLC (and then the context binary) holds, weights not yet filled in."""
    all_initializers = {i.name for i in model.graph.initializer}
    return GraphInfo(
        name=graph_name,
        inputs=io_specs(model.graph.input, exclude=all_initializers),
        outputs=io_specs(model.graph.output, exclude=set()),
        weights=(), opset_import=tuple((o.domain, o.version) for o in model.opset_import),
        ir_version=model.ir_version,
        activations=activation_encodings_json(encodings.activations))


def io_specs(value_infos, exclude: set) -> tuple:
    specs = []
    for vi in value_infos:
        if vi.name in exclude:
            continue
        tensor_type = vi.type.tensor_type
        dtype = (np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
                 if tensor_type.elem_type else "unknown")
        shape = None
        if tensor_type.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                          for d in tensor_type.shape.dim)
        specs.append(IoSpec(vi.name, dtype, shape))
    return tuple(specs)


def topology_bytes(graph: onnx.GraphProto, weight_names: set, inlined: list,
                   nodes: list = None) -> bytes:
    """The graph without its weights, with the `inlined` constant protos (and `nodes` for the
    graph's nodes, when some were rewritten), deterministically serialized.

    Built field by field rather than copied, so inline weights are never duplicated in memory.
    """
    topology = onnx.GraphProto(name=graph.name, doc_string=graph.doc_string)
    topology.node.extend(graph.node if nodes is None else nodes)
    # Old exports list initializers as graph inputs too; weights are not inputs of the topology.
    topology.input.extend(i for i in graph.input if i.name not in weight_names)
    topology.output.extend(graph.output)
    topology.value_info.extend(graph.value_info)
    topology.quantization_annotation.extend(graph.quantization_annotation)
    if hasattr(graph, "metadata_props"):   # onnx >= 1.16 (IR 10)
        topology.metadata_props.extend(graph.metadata_props)
    topology.initializer.extend(inlined)
    return topology.SerializeToString(deterministic=True)


def constant_stand_in(init: onnx.TensorProto) -> onnx.TensorProto:
    """A proto that serializes to as many bytes as the constant the backend inlines
    (numpy_helper.from_array: name, dims, data_type, raw_data) -- zeros, so the size is known
    without reading the constant's values from its external data."""
    if init.data_type == onnx.TensorProto.STRING:
        return init    # from_array stores strings as string_data: the proto itself is the best guess
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
    count = int(np.prod(init.dims, dtype=np.int64))
    return onnx.TensorProto(name=init.name, dims=list(init.dims), data_type=init.data_type,
                            raw_data=bytes(count * itemsize))
