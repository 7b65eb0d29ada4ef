"""Context binary: several graphs of one part (prompt, token; per context length) in one file.

weight_sharing on: each weight is stored once and every graph refers to it by name (one mapping
on the device). Off: each graph gets its own copy, so the file (and the device mapping) doubles.
weights_packing on: 4-bit weights two per byte; off: one per byte, again ~2x. Both "off" cases
are kept reproducible on purpose: they are the failure modes the size checks must catch.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Union

import numpy as np
import onnx
import xxhash

from hexbundle.formats.container import (ContainerReader, ContainerWriter, FormatReader, GraphInfo,
                                         QuantParams, TensorRecord, dequantize, encode_tensor,
                                         parse_graph_record, parse_tensor_record, tensor_blocks,
                                         tensor_quant_params, tensor_values)
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


@dataclass(frozen=True)
class _StoredWeight:
    record: TensorRecord
    first_graph: str
    digests: tuple                   # (data, scales, offsets) XXH3-128 hex, to compare claims


def write_ctxbin(path: Union[str, Path], graphs: Iterable, *, weights_packing: bool,
                 weight_sharing: bool, optimization_type: int, vtcm_mb: int, device: dict,
                 producer: dict, deployable: bool = False) -> int:
    """Write a context binary atomically; returns its size. Graphs keep the given order.

    With weight_sharing, a tensor name claimed by two graphs must have identical bytes
    (data, scales, offsets) and metadata, else BackendError naming both graphs.
    """
    with ContainerWriter(path, CTXBIN_MAGIC) as writer:
        stored: dict = {}            # blob name -> _StoredWeight
        users: dict = {}             # blob name -> [graph names]
        graph_infos = []
        for graph in graphs:
            name = graph.info.name
            if any(g.name == name for g in graph_infos):
                raise BackendError(f"{path}: graph name '{name}' given twice; graph names must be distinct")
            writer.add_blob(topology_blob_name(name), [graph.topology])
            weights = []
            for tensor in graph.tensors:
                if tensor.name in weights:
                    raise ValueError(f"graph {name}: tensor {tensor.name!r} given twice")
                blob = weight_blob_name(name, tensor.name, weight_sharing)
                record, data, tail = encode_tensor(tensor, blob, pack=weights_packing)
                data_digest = xxhash.xxh3_128()
                data = _hashed(data, data_digest)
                if blob in stored:   # a shared weight seen before: hash it to compare, don't store
                    for _ in data:
                        pass
                else:
                    writer.add_blob(blob, itertools.chain(data, tail))
                digests = (data_digest.hexdigest(),) + _tail_digests(tail)
                if blob in stored:
                    _check_same_weight(path, stored[blob], record, digests, name)
                else:
                    stored[blob] = _StoredWeight(record, name, digests)
                users.setdefault(blob, []).append(name)
                weights.append(tensor.name)
            graph_infos.append(GraphInfo(name, graph.info.inputs, graph.info.outputs, tuple(weights),
                                         graph.info.opset_import, graph.info.ir_version,
                                         topology_blob_name(name), graph.info.activations))
        return writer.finish(ctxbin_header(
            producer=producer, deployable=deployable, device=device, graphs=graph_infos,
            tensors=[{**s.record.to_json(), "graphs": users[blob]} for blob, s in stored.items()],
            options={"weights_packing": weights_packing, "weight_sharing": weight_sharing,
                     "optimization_type": optimization_type, "vtcm_mb": vtcm_mb}))


def ctxbin_header(*, producer: dict, deployable: bool, options: dict, device: dict, graphs: list,
                  tensors: list) -> dict:
    """The header fields (all but the blob table): one composition for the writer and for the
    size check, which predicts the header's length from it."""
    return {"kind": "ctxbin", "producer": producer, "deployable": deployable, "options": options,
            "device": device, "graphs": [g.to_json() for g in graphs], "tensors": tensors}


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


def _check_same_weight(path, first: _StoredWeight, record: TensorRecord, digests: tuple, graph: str) -> None:
    if first.record != record:
        what = "shape/dtype/quantization parameters"
    else:
        differing = [part for part, a, b in zip(("data", "scales", "offsets"), first.digests, digests) if a != b]
        if not differing:
            return
        what = " and ".join(differing)
    raise SharedWeightError(
        f"{path}: weight sharing is on, but tensor '{record.name}' differs between graphs "
        f"'{first.first_graph}' and '{graph}' ({what} differ). Both graphs must be exported "
        f"with the same weights and encodings, or compile with weight_sharing off (a copy of "
        f"every weight per graph).", tensor=record.name, graphs=(first.first_graph, graph))


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


def read_ctxbin(path: Union[str, Path]) -> CtxBinReader:
    return CtxBinReader(path)
