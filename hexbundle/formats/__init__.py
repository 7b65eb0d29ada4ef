"""hexbundle's two open file formats: the DLC (one converted graph) and the context binary
(several graphs of one part). Both use the container layout in `container` (docs/formats.md)."""
from .container import (ALIGN, FORMAT_VERSION, GraphInfo, IoSpec, QuantParams, Tensor,
                        TensorRecord, container_size, pack_uint4, tensor_blob_nbytes, unpack_uint4)
from .ctxbin import CTXBIN_MAGIC, CtxBinReader, CtxGraph, read_ctxbin, write_ctxbin
from .dlc import DLC_MAGIC, DlcGraph, DlcReader, read_dlc, write_dlc

__all__ = ["ALIGN", "FORMAT_VERSION", "GraphInfo", "IoSpec", "QuantParams", "Tensor", "TensorRecord",
           "container_size", "pack_uint4", "tensor_blob_nbytes", "unpack_uint4",
           "CTXBIN_MAGIC", "CtxBinReader", "CtxGraph", "read_ctxbin", "write_ctxbin",
           "DLC_MAGIC", "DlcGraph", "DlcReader", "read_dlc", "write_dlc"]
