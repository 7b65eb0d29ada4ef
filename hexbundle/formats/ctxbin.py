"""Context binary: several graphs of one part (prompt, token; per context length) in one file.

weight_sharing on: each weight is stored once and every graph refers to it by name (one mapping
on the device). Off: each graph gets its own copy, so the file (and the device mapping) doubles.
weights_packing on: 4-bit weights two per byte; off: one per byte, again ~2x. Both "off" cases
are kept reproducible on purpose: they are the failure modes the size checks must catch.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Union

import numpy as np
import onnx
import xxhash

from hexbundle.formats.container import (UNKEYED, ContainerLayout, ContainerReader,
                                         ContainerWriter, FormatReader, GraphInfo,
                                         QuantParams, TensorRecord, dequantize, encode_tensor,
                                         made_for_field, parse_graph_record, parse_tensor_record,
                                         tensor_blocks, tensor_quant_params, tensor_values)
from hexbundle.formats.container import plan_layout as container_plan
from hexbundle.support.errors import BackendError, FormatError, SharedWeightError

CTXBIN_MAGIC = b"HXCTXBIN"


def topology_blob_name(graph_name: str) -> str:
    return f"graph/{graph_name}/topology"


def weight_blob_name(graph_name: str, tensor_name: str, weight_sharing: bool) -> str:
    return f"weight/{tensor_name}" if weight_sharing else f"graph/{graph_name}/weight/{tensor_name}"


@dataclass
class CtxGraph:
    """One graph to store. `tensors` may be a generator (consumed once, in order)."""

    info: GraphInfo                  # weights/topology_blob are filled in by the writer
    topology: object                 # bytes-like: serialized onnx.GraphProto without weights
    tensors: Iterable                # Tensor


@dataclass
class PlannedGraph:
    """One graph as the size model knows it before any weight value is read: `tensors` are
    TensorStreams whose blocks are never asked for (their records are all plan_layout needs)."""

    info: GraphInfo                  # weights/topology_blob are filled in as by the writer
    topology_nbytes: int
    tensors: tuple                   # TensorStream


class _BlobOrder:
    """The ctx-bin's layout decisions, made once for the writer and for plan_layout: each
    graph's topology blob, then its weights in order; with weight_sharing a weight is stored
    once, under the name every graph refers to, the first time a graph brings it; the header
    records each graph and each stored tensor with the graphs that use it."""

    def __init__(self, path, weight_sharing: bool):
        self.path, self.weight_sharing = path, weight_sharing
        self.records: dict = {}      # blob name -> TensorRecord (the first graph's)
        self.users: dict = {}        # blob name -> [graph names]
        self.graphs: list = []       # GraphInfo, complete
        self._graph, self._weights = None, []

    def topology(self, info: GraphInfo) -> str:
        """Start a graph: the name of its topology blob, which comes first."""
        if any(g.name == info.name for g in self.graphs):
            raise BackendError(f"{self.path}: graph name '{info.name}' given twice; graph names "
                               "must be distinct")
        self._graph, self._weights = info, []
        return topology_blob_name(info.name)

    def weight_blob(self, tensor_name: str) -> str:
        if tensor_name in self._weights:
            raise ValueError(f"graph {self._graph.name}: tensor {tensor_name!r} given twice")
        return weight_blob_name(self._graph.name, tensor_name, self.weight_sharing)

    def add_weight(self, record: TensorRecord) -> bool:
        """Whether the weight's blob is stored now (False: a shared weight stored before)."""
        new = record.blob not in self.records
        if new:
            self.records[record.blob] = record
        self.users.setdefault(record.blob, []).append(self._graph.name)
        self._weights.append(record.name)
        return new

    def end_graph(self) -> None:
        self.graphs.append(replace(self._graph, weights=tuple(self._weights),
                                   topology_blob=topology_blob_name(self._graph.name)))

    def header(self, fields: dict) -> dict:
        tensors = [{**r.to_json(), "graphs": self.users[blob]} for blob, r in self.records.items()]
        return ctxbin_header(graphs=self.graphs, tensors=tensors, **fields)


def header_fields(*, producer: dict, deployable: bool, device: dict, weights_packing: bool,
                  weight_sharing: bool, optimization_type: int, vtcm_mb: int,
                  made_for: str = UNKEYED) -> dict:
    """The header fields besides the graphs and tensors (`made_for`: the compile step's output
    key, formats.container.made_for_field)."""
    return {"producer": producer, "deployable": deployable, "device": device,
            "made_for": made_for_field(made_for),
            "options": {"weights_packing": weights_packing, "weight_sharing": weight_sharing,
                        "optimization_type": optimization_type, "vtcm_mb": vtcm_mb}}


def write_ctxbin(path: Union[str, Path], graphs: Iterable, *, weights_packing: bool,
                 weight_sharing: bool, optimization_type: int, vtcm_mb: int, device: dict,
                 producer: dict, deployable: bool = False, made_for: str = UNKEYED) -> int:
    """Write a context binary atomically; returns its size. Graphs keep the given order.

    With weight_sharing, a tensor name claimed by two graphs must have identical bytes
    (data, scales, offsets) and metadata, else SharedWeightError naming both graphs.
    """
    order = _BlobOrder(path, weight_sharing)
    first: dict = {}                 # blob name -> (first graph, digests) of a stored weight
    with ContainerWriter(path, CTXBIN_MAGIC) as writer:
        for graph in graphs:
            writer.add_blob(order.topology(graph.info), [graph.topology])
            for tensor in graph.tensors:
                blob = order.weight_blob(tensor.name)
                record, data, tail = encode_tensor(tensor, blob, pack=weights_packing)
                data_digest = xxhash.xxh3_128()
                data = _hashed(data, data_digest)
                stored = order.records.get(blob)
                if order.add_weight(record):
                    writer.add_blob(blob, itertools.chain(data, tail))
                else:   # a shared weight seen before: hash it to compare, don't store
                    for _ in data:
                        pass
                digests = (data_digest.hexdigest(),) + _tail_digests(tail)
                if stored is None:
                    first[blob] = (graph.info.name, digests)
                else:
                    _check_same_weight(path, stored, first[blob], record, digests,
                                       graph.info.name)
            order.end_graph()
        return writer.finish(order.header(header_fields(
            producer=producer, deployable=deployable, device=device,
            weights_packing=weights_packing, weight_sharing=weight_sharing,
            optimization_type=optimization_type, vtcm_mb=vtcm_mb, made_for=made_for)))


def plan_layout(graphs: Iterable, fields: dict) -> ContainerLayout:
    """The layout write_ctxbin gives these graphs (PlannedGraph, in bin order) under these
    header fields (header_fields: the options say whether weights are packed and shared):
    the size model, to the byte, without a weight value read."""
    options = fields["options"]
    order, blobs = _BlobOrder(None, options["weight_sharing"]), []
    for graph in graphs:
        blobs.append((order.topology(graph.info), graph.topology_nbytes))
        for tensor in graph.tensors:
            record = encode_tensor(tensor, order.weight_blob(tensor.name),
                                   pack=options["weights_packing"])[0]
            if order.add_weight(record):
                blobs.append((record.blob, record.blob_nbytes))
        order.end_graph()
    return container_plan(blobs, order.header(fields))


def ctxbin_header(*, producer: dict, deployable: bool, options: dict, device: dict, graphs: list,
                  tensors: list, made_for: str = UNKEYED) -> dict:
    """The header fields (all but the blob table), composed for the writer and plan_layout."""
    return {"kind": "ctxbin", "producer": producer, "deployable": deployable, "options": options,
            "device": device, "made_for": made_for_field(made_for),
            "graphs": [g.to_json() for g in graphs], "tensors": tensors}


def _hashed(chunks: Iterable, digest) -> Iterable:
    """Pass the data chunks through, hashing them on the way (one pass over a streamed tensor)."""
    for chunk in chunks:
        digest.update(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))
        yield chunk


def _tail_digests(tail: list) -> tuple:
    """Digests of scales / offsets (tail is [] or [pad, scales, offsets])."""
    if not tail:
        return (None, None)
    return tuple(xxhash.xxh3_128(np.ascontiguousarray(c).view(np.uint8)).hexdigest() for c in tail[1:])


def _check_same_weight(path, stored: TensorRecord, first: tuple, record: TensorRecord,
                       digests: tuple, graph: str) -> None:
    """`stored`: the record of the copy stored; `first`: (its graph, its digests)."""
    first_graph, first_digests = first
    if stored != record:
        what = "shape/dtype/quantization parameters"
    else:
        differing = [part for part, a, b in zip(("data", "scales", "offsets"), first_digests, digests) if a != b]
        if not differing:
            return
        what = " and ".join(differing)
    raise SharedWeightError(
        f"{path}: weight sharing is on, but tensor '{record.name}' differs between graphs "
        f"'{first_graph}' and '{graph}' ({what} differ). Both graphs must be exported "
        f"with the same weights and encodings, or compile with weight_sharing off (a copy of "
        f"every weight per graph).", tensor=record.name, graphs=(first_graph, graph))


class CtxBinReader(FormatReader):
    """mmap-backed context binary reader."""

    def __init__(self, path: Union[str, Path]):
        self._container = ContainerReader(path, CTXBIN_MAGIC, "context binary",
                                          rebuild="doit compile")
        self.path = self._container.path
        header = self._container.header
        if header.get("kind") != "ctxbin":
            raise self._container.error("header 'kind' is not \"ctxbin\"")
        for key in ("graphs", "tensors"):
            if not isinstance(header.get(key), list):
                raise self._container.error(f"header has no '{key}' list")
        for key in ("options", "device"):
            if not isinstance(header.get(key), dict):
                raise self._container.error(f"header has no '{key}' object")
        self.graphs = [parse_graph_record(raw, str(self.path)) for raw in header["graphs"]]
        self._graphs_by_name = {g.name: g for g in self.graphs}
        if len(self._graphs_by_name) != len(self.graphs):
            raise self._container.error("two graphs share one name")
        self._records = self._index_records(header["tensors"])

    def _index_records(self, raw_tensors: list) -> dict:
        records = {}
        for raw in raw_tensors:
            record = parse_tensor_record(raw, str(self.path))
            self._container.check_tensor_blob(record)
            graphs = raw.get("graphs")
            if not isinstance(graphs, list) or not graphs:
                raise self._container.error(f"tensor '{record.name}' lists no graphs")
            for graph in graphs:
                if graph not in self._graphs_by_name or (graph, record.name) in records:
                    raise self._container.error(f"tensor '{record.name}' claims graph '{graph}' wrongly")
                records[(graph, record.name)] = record
        for graph in self.graphs:
            self._container.blob(graph.topology_blob)
            missing = [w for w in graph.weights if (graph.name, w) not in records]
            if missing or len(graph.weights) != sum(1 for g, _ in records if g == graph.name):
                raise self._container.error(f"graph '{graph.name}' weights and tensor records disagree")
        return records

    # --- metadata ---
    @property
    def options(self) -> dict:
        return self.header["options"]

    @property
    def device(self) -> dict:
        return self.header["device"]

    @property
    def graph_names(self) -> list:
        return [g.name for g in self.graphs]

    def graph(self, name: str) -> GraphInfo:
        try:
            return self._graphs_by_name[name]
        except KeyError:
            raise FormatError(f"{self.path}: no graph '{name}'; it holds "
                              f"{', '.join(self.graph_names) or 'no graphs'}") from None

    def record(self, graph_name: str, tensor_name: str) -> TensorRecord:
        self.graph(graph_name)
        try:
            return self._records[(graph_name, tensor_name)]
        except KeyError:
            raise FormatError(f"{self.path}: graph '{graph_name}' has no weight '{tensor_name}'") from None

    # --- data ---
    def weight(self, graph_name: str, tensor_name: str) -> np.ndarray:
        """Quantized (or float) elements in the logical shape; packed 4-bit comes back unpacked uint8."""
        record = self.record(graph_name, tensor_name)
        return tensor_values(record, self._container.blob(record.blob))

    def weight_blocks(self, graph_name: str, tensor_name: str, block_elements: int):
        """The stored elements of a weight in flat order, a block at a time (unpacked)."""
        record = self.record(graph_name, tensor_name)
        return tensor_blocks(record, self._container.blob(record.blob), block_elements)

    def quant_params(self, graph_name: str, tensor_name: str) -> "QuantParams | None":
        record = self.record(graph_name, tensor_name)
        return tensor_quant_params(record, self._container.blob(record.blob))

    def dequantize(self, graph_name: str, tensor_name: str) -> np.ndarray:
        return dequantize(self.weight(graph_name, tensor_name), self.quant_params(graph_name, tensor_name))

    def topology(self, graph_name: str) -> onnx.GraphProto:
        return self.parse_topology(self.graph(graph_name).topology_blob,
                                   f"topology of graph '{graph_name}'")


def is_ctxbin(path: Union[str, Path]) -> bool:
    """Whether the file starts as a context binary of this format does (by its magic; a QAIRT
    context binary does not)."""
    with open(path, "rb") as fh:
        return fh.read(len(CTXBIN_MAGIC)) == CTXBIN_MAGIC


def read_ctxbin(path: Union[str, Path]) -> CtxBinReader:
    return CtxBinReader(path)
