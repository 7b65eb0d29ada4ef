"""DLC: one converted graph (the output of `convert`). Weights quantized, 4-bit NOT packed.

Like qairt-converter's default, every 4-bit value takes a whole byte here; packing happens (or,
with weights_packing off, does not happen) when the context binary is built.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Union

import numpy as np
import onnx

from hexbundle.formats.container import (UNKEYED, ContainerLayout, ContainerReader,
                                         ContainerWriter, FormatReader, GraphInfo,
                                         Tensor, TensorRecord, TensorStream, dequantize,
                                         encode_tensor, parse_graph_record, parse_tensor_record,
                                         made_for_field, tensor_blocks, tensor_quant_params,
                                         tensor_values)
from hexbundle.formats.container import plan_layout as container_plan
from hexbundle.support.errors import FormatError

DLC_MAGIC = b"HXDLC\0\0\0"
TOPOLOGY_BLOB = "topology"


def weight_blob_name(tensor_name: str) -> str:
    return f"weight/{tensor_name}"


@dataclass
class DlcGraph:
    """Everything a DLC holds. `tensors` may be a generator: it is consumed once, in order,
    and each tensor is written before the next is requested (bounded memory)."""

    info: GraphInfo                  # weights/topology_blob are filled in by the writer
    topology: bytes                  # serialized onnx.GraphProto without the weights
    tensors: Iterable                # Tensor
    producer: dict                   # {"name": ..., "version": ...}
    float_bitwidth: int
    source_onnx: str                 # basename only: bytes must not depend on where inputs live
    source_encodings: str
    deployable: bool = False
    made_for: str = UNKEYED          # the step's output key (formats.container.made_for_field)


def write_dlc(path: Union[str, Path], graph: DlcGraph) -> int:
    """Write a DLC atomically; returns its size in bytes."""
    with ContainerWriter(path, DLC_MAGIC) as writer:
        writer.add_blob(TOPOLOGY_BLOB, [graph.topology])
        records = []
        for tensor in graph.tensors:
            record, data, tail = encode_tensor(tensor, weight_blob_name(tensor.name), pack=False)
            writer.add_blob(record.blob, itertools.chain(data, tail))
            records.append(record)
        return writer.finish(_header(graph, records))


def plan_layout(graph: DlcGraph) -> ContainerLayout:
    """The layout write_dlc gives this graph, whose `tensors` are TensorStreams whose blocks are
    never asked for: the topology blob, then each weight (4-bit one per byte), the header."""
    records = [encode_tensor(t, weight_blob_name(t.name), pack=False)[0] for t in graph.tensors]
    blobs = [(TOPOLOGY_BLOB, len(graph.topology))] + [(r.blob, r.blob_nbytes) for r in records]
    return container_plan(blobs, _header(graph, records))


def _header(graph: DlcGraph, records: list) -> dict:
    """The header fields (all but the blob table), composed for write_dlc and plan_layout."""
    info = replace(graph.info, weights=tuple(r.name for r in records), topology_blob=TOPOLOGY_BLOB)
    return {
        "kind": "dlc",
        "producer": graph.producer,
        "float_bitwidth": graph.float_bitwidth,
        "source": {"onnx": Path(graph.source_onnx).name, "encodings": Path(graph.source_encodings).name},
        "deployable": graph.deployable,
        "made_for": made_for_field(graph.made_for),
        "graph": info.to_json(),
        "tensors": [r.to_json() for r in records],
    }


class DlcReader(FormatReader):
    """mmap-backed DLC reader; tensor data comes back as read-only views into the file."""

    def __init__(self, path: Union[str, Path]):
        self._container = ContainerReader(path, DLC_MAGIC, "DLC", rebuild="doit convert")
        self.path = self._container.path
        header = self._container.header
        where = str(self.path)
        if header.get("kind") != "dlc":
            raise self._container.error("header 'kind' is not \"dlc\"")
        self.graph = parse_graph_record(header.get("graph"), where)
        self.tensors = {}
        raw_tensors = header.get("tensors")
        if not isinstance(raw_tensors, list):
            raise self._container.error("header has no 'tensors' list")
        for raw in raw_tensors:
            record = parse_tensor_record(raw, where)
            self._container.check_tensor_blob(record)
            self.tensors[record.name] = record
        if list(self.graph.weights) != list(self.tensors):
            raise self._container.error("graph 'weights' and the tensor records disagree")
        self._container.blob(self.graph.topology_blob)   # validates that the topology blob exists

    # --- metadata ---
    @property
    def graph_name(self) -> str:
        return self.graph.name

    @property
    def float_bitwidth(self) -> int:
        return self.header.get("float_bitwidth")

    # --- data ---
    def record(self, name: str) -> TensorRecord:
        try:
            return self.tensors[name]
        except KeyError:
            raise FormatError(f"{self.path}: DLC of graph '{self.graph_name}' has no tensor '{name}'") from None

    def tensor_data(self, name: str) -> np.ndarray:
        """Stored elements in the logical shape (uint8 per 4-bit value), a view into the file."""
        record = self.record(name)
        return tensor_values(record, self._container.blob(record.blob))

    def weight_blocks(self, name: str, block_elements: int):
        """The stored elements of a weight in flat order, a block at a time."""
        record = self.record(name)
        return tensor_blocks(record, self._container.blob(record.blob), block_elements)

    def quant_params(self, name: str):
        record = self.record(name)
        return tensor_quant_params(record, self._container.blob(record.blob))

    def tensor(self, name: str) -> Tensor:
        """The stored tensor as a writer input (views, no copies): DLC -> context binary."""
        record = self.record(name)
        return Tensor(name, record.dtype, self.tensor_data(name), self.quant_params(name))

    def tensor_stream(self, name: str) -> TensorStream:
        """The stored tensor as a writer input streamed in blocks, each block's pages released
        after use: a multi-GB DLC is read with about one block resident (DLC -> context binary)."""
        record = self.record(name)
        return TensorStream(name, record.dtype, record.shape,
                            self._container.blob_stream(record), self.quant_params(name))

    def dequantize(self, name: str) -> np.ndarray:
        return dequantize(self.tensor_data(name), self.quant_params(name))

    def topology_bytes(self) -> np.ndarray:
        """The topology blob, its XXH3-128 checked (it goes into a context binary as it is)."""
        return self._container.verified_blob(self.graph.topology_blob)

    def topology(self) -> onnx.GraphProto:
        return self.parse_topology(self.graph.topology_blob, "topology blob")


def read_dlc(path: Union[str, Path]) -> DlcReader:
    return DlcReader(path)
