"""DLC and context binary: round trips, packing, determinism, size model, corruption."""
from __future__ import annotations

import json
import struct

import numpy as np
import onnx
import pytest
from onnx import helper

from hexbundle.formats.container import (ALIGN, FORMAT_VERSION, PREAMBLE, GraphInfo, IoSpec, QuantParams, Tensor,
                                         container_size, pack_uint4, tensor_blob_nbytes,
                                         unpack_uint4)
from hexbundle.formats.ctxbin import CtxGraph, read_ctxbin, write_ctxbin
from hexbundle.formats.dlc import DlcGraph, read_dlc, write_dlc
from hexbundle.support.errors import BackendError, FormatError

PRODUCER = {"name": "test", "version": "0"}
DEVICE = {"soc_model": 77, "dsp_arch": "v73"}


def quantize(w: np.ndarray, bitwidth: int, axis):
    """Symmetric per-channel (or per-tensor) quantization of a float array."""
    reduce = tuple(i for i in range(w.ndim) if i != axis) if axis is not None else None
    scale = np.atleast_1d(np.abs(w).max(axis=reduce) / (2 ** (bitwidth - 1) - 1)).astype(np.float32)
    offset = np.full(scale.shape, -(2 ** (bitwidth - 1)), np.int32)
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)) - offset.reshape(shape), 0, 2 ** bitwidth - 1)
    dtype = {4: "uint4", 8: "uint8", 16: "uint16"}[bitwidth]
    values = q.astype(np.uint8 if bitwidth <= 8 else np.uint16)
    return values, QuantParams(bitwidth, axis, scale, offset, True), dtype


@pytest.fixture
def source():
    rng = np.random.default_rng(1)
    return {"w4": rng.normal(size=(33, 7)).astype(np.float32),       # odd element count: 231
            "w8": rng.normal(size=(5, 40)).astype(np.float32),
            "e16": rng.normal(size=(10, 6)).astype(np.float32),
            "norm": rng.normal(size=(100,)).astype(np.float32)}


def tensors(source, scale_bump=1.0):
    out = []
    for name, bw, axis in (("w4", 4, 1), ("w8", 8, 0), ("e16", 16, None)):
        values, quant, dtype = quantize(source[name], bw, axis)
        quant = QuantParams(quant.bitwidth, quant.axis, quant.scale * scale_bump, quant.offset, True)
        out.append(Tensor(name, dtype, values, quant))
    out.append(Tensor("norm", "float16", source["norm"].astype(np.float16)))
    return out


def topology_bytes() -> bytes:
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w4"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 33])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 7])])
    return graph.SerializeToString(deterministic=True)


def info(name: str) -> GraphInfo:
    return GraphInfo(name, (IoSpec("x", "float32", (1, "S")),), (IoSpec("y", "float32", None),),
                     (), (("", 17),), 8)


def write_test_dlc(path, source):
    return write_dlc(path, DlcGraph(info("g"), topology_bytes(), iter(tensors(source)), PRODUCER, 16,
                                    "/abs/dir/model.onnx", "/abs/dir/model.encodings"))


def write_test_bin(path, source, packing=True, sharing=True, token_scale_bump=1.0):
    graphs = [CtxGraph(info("prompt"), topology_bytes(), iter(tensors(source))),
              CtxGraph(info("token"), topology_bytes(), iter(tensors(source, token_scale_bump)))]
    return write_ctxbin(path, graphs, weights_packing=packing, weight_sharing=sharing,
                        optimization_type=3, vtcm_mb=8, device=DEVICE, producer=PRODUCER)


def header_length(path) -> int:
    return PREAMBLE.unpack(path.read_bytes()[:PREAMBLE.size])[4]


# --- packing -------------------------------------------------------------------------------------

def test_nibble_order_is_low_first():
    assert pack_uint4(np.array([0x1, 0x2, 0x3], np.uint8)).tolist() == [0x21, 0x03]
    assert unpack_uint4(np.array([0x21, 0x03], np.uint8), 3).tolist() == [1, 2, 3]


def test_pack_unpack_round_trip_odd_and_even():
    rng = np.random.default_rng(0)
    for count in (0, 1, 2, 7, 64, 1001):
        values = rng.integers(0, 16, count).astype(np.uint8)
        packed = pack_uint4(values)
        assert packed.size == (count + 1) // 2
        np.testing.assert_array_equal(unpack_uint4(packed, count), values)


# --- DLC -----------------------------------------------------------------------------------------

def test_dlc_round_trip(tmp_path, source):
    path = tmp_path / "g.dlc"
    size = write_test_dlc(path, source)
    assert size == path.stat().st_size
    with read_dlc(path) as dlc:
        dlc.verify_digests()
        assert dlc.graph_name == "g"
        assert list(dlc.tensors) == ["w4", "w8", "e16", "norm"]
        assert dlc.header["source"] == {"onnx": "model.onnx", "encodings": "model.encodings"}
        assert dlc.graph.inputs == (IoSpec("x", "float32", (1, "S")),)
        assert dlc.graph.outputs[0].shape is None
        for tensor in tensors(source):
            record = dlc.tensors[tensor.name]
            assert record.shape == tensor.values.shape and record.dtype == tensor.dtype
            assert record.packed is False                           # a DLC never packs
            np.testing.assert_array_equal(dlc.tensor_data(tensor.name), tensor.values)
        assert dlc.tensors["w4"].data_nbytes == 33 * 7               # one byte per 4-bit value
        for name in ("w4", "w8", "e16"):
            err = np.abs(dlc.dequantize(name) - source[name])
            assert err.max() <= dlc.quant_params(name).scale.max() / 2 * (1 + 1e-6)
        assert dlc.dequantize("norm").dtype == np.float32
        assert dlc.topology().node[0].op_type == "MatMul"
        blob_sizes = [b.nbytes for b in dlc.blobs.values()]
        assert all(b.offset % ALIGN == 0 for b in dlc.blobs.values())
    assert size == container_size(blob_sizes, header_length(path))


def test_dlc_tensor_data_is_a_view_not_a_copy(tmp_path, source):
    write_test_dlc(tmp_path / "g.dlc", source)
    with read_dlc(tmp_path / "g.dlc") as dlc:
        data = dlc.tensor_data("w8")
        assert not data.flags.owndata and not data.flags.writeable


def test_dlc_is_deterministic(tmp_path, source):
    write_test_dlc(tmp_path / "a.dlc", source)
    write_test_dlc(tmp_path / "b.dlc", source)
    assert (tmp_path / "a.dlc").read_bytes() == (tmp_path / "b.dlc").read_bytes()


def test_blob_layout_matches_record(tmp_path, source):
    """The documented layout: [data][pad to 4][scales f32][offsets i32], data at blob start."""
    write_test_dlc(tmp_path / "g.dlc", source)
    raw = (tmp_path / "g.dlc").read_bytes()
    with read_dlc(tmp_path / "g.dlc") as dlc:
        record, blob = dlc.tensors["w8"], dlc.blobs["weight/w8"]
        start = blob.offset
        assert record.scales_offset == 200 and record.offsets_offset == 200 + 4 * 5
        scales = np.frombuffer(raw, "<f4", 5, start + record.scales_offset)
        offsets = np.frombuffer(raw, "<f4", 5, start + record.offsets_offset)
        np.testing.assert_array_equal(scales, dlc.quant_params("w8").scale)
        assert offsets.tolist() == [-128] * 5
        w4 = dlc.tensors["w4"]
        assert w4.scales_offset == 232   # 231 data bytes padded to 4


# --- context binary ------------------------------------------------------------------------------

@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("sharing", [True, False])
def test_ctxbin_round_trip(tmp_path, source, packing, sharing):
    path = tmp_path / "m.bin"
    size = write_test_bin(path, source, packing, sharing)
    with read_ctxbin(path) as ctx:
        ctx.verify_digests()
        assert ctx.graph_names == ["prompt", "token"]
        assert ctx.options["weights_packing"] is packing and ctx.options["weight_sharing"] is sharing
        assert ctx.device == DEVICE
        for graph in ("prompt", "token"):
            assert ctx.graph(graph).weights == ("w4", "w8", "e16", "norm")
            for tensor in tensors(source):
                np.testing.assert_array_equal(ctx.weight(graph, tensor.name), tensor.values)
            assert ctx.topology(graph).node[0].op_type == "MatMul"
            assert ctx.record(graph, "w4").packed is packing
            assert ctx.record(graph, "w8").packed is False
        expected_blobs = [len(topology_bytes())] * 2
        for copy in range(1 if sharing else 2):
            expected_blobs += [tensor_blob_nbytes(t.values.shape, t.dtype, packing and t.dtype == "uint4",
                                                  t.quant.channels if t.quant else 0)
                               for t in tensors(source)]
        assert sorted(b.nbytes for b in ctx.blobs.values()) == sorted(expected_blobs)
    assert size == path.stat().st_size == container_size(expected_blobs, header_length(path))


def test_packed_data_is_half_the_unpacked(tmp_path, source):
    write_test_bin(tmp_path / "p.bin", source, packing=True)
    write_test_bin(tmp_path / "u.bin", source, packing=False)
    with read_ctxbin(tmp_path / "p.bin") as p, read_ctxbin(tmp_path / "u.bin") as u:
        assert p.record("prompt", "w4").data_nbytes == (33 * 7 + 1) // 2
        assert u.record("prompt", "w4").data_nbytes == 33 * 7
        # Hand-check the first byte: element 0 in the low nibble, element 1 in the high one.
        first_two = u.weight("prompt", "w4").reshape(-1)[:2]
        blob = p.blobs["weight/w4"]
        raw = (tmp_path / "p.bin").read_bytes()[blob.offset]
        assert raw == int(first_two[0]) | (int(first_two[1]) << 4)


def test_ctxbin_is_deterministic(tmp_path, source):
    write_test_bin(tmp_path / "a.bin", source)
    write_test_bin(tmp_path / "b.bin", source)
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()


def test_shared_weight_with_different_bytes_is_refused(tmp_path, source):
    with pytest.raises(BackendError) as info:
        write_test_bin(tmp_path / "m.bin", source, sharing=True, token_scale_bump=2.0)
    message = str(info.value)
    assert "'prompt'" in message and "'token'" in message and "'w4'" in message
    assert not (tmp_path / "m.bin").exists()
    assert not list(tmp_path.iterdir())          # the temp file is gone too
    write_test_bin(tmp_path / "m.bin", source, sharing=False, token_scale_bump=2.0)


def test_unknown_graph_and_weight_are_format_errors(tmp_path, source):
    write_test_bin(tmp_path / "m.bin", source)
    with read_ctxbin(tmp_path / "m.bin") as ctx:
        with pytest.raises(FormatError, match="no graph 'decode'"):
            ctx.graph("decode")
        with pytest.raises(FormatError, match="no weight 'lm_head'"):
            ctx.weight("prompt", "lm_head")


# --- corruption ----------------------------------------------------------------------------------

def rewrite(path, mutate):
    data = bytearray(path.read_bytes())
    data = mutate(data)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("reader,writer,suffix", [(read_dlc, write_test_dlc, "dlc"),
                                                  (read_ctxbin, write_test_bin, "bin")])
class TestCorruption:
    def test_truncated(self, tmp_path, source, reader, writer, suffix):
        path = tmp_path / f"m.{suffix}"
        writer(path, source)
        for cut in (0, 10, 100, ALIGN + 5, path.stat().st_size - 1):
            truncated = tmp_path / f"t.{suffix}"
            truncated.write_bytes(path.read_bytes()[:cut])
            with pytest.raises(FormatError, match=str(truncated)):
                reader(truncated)

    def test_bad_magic(self, tmp_path, source, reader, writer, suffix):
        path = tmp_path / f"m.{suffix}"
        writer(path, source)
        rewrite(path, lambda d: b"GARBAGE!" + d[8:])
        with pytest.raises(FormatError, match="bad magic"):
            reader(path)

    def test_wrong_version(self, tmp_path, source, reader, writer, suffix):
        path = tmp_path / f"m.{suffix}"
        writer(path, source)
        rewrite(path, lambda d: d[:8] + struct.pack("<I", FORMAT_VERSION + 1) + d[12:])
        with pytest.raises(FormatError, match=f"version {FORMAT_VERSION + 1} is not supported"):
            reader(path)

    def test_corrupt_header(self, tmp_path, source, reader, writer, suffix):
        path = tmp_path / f"m.{suffix}"
        writer(path, source)
        offset = PREAMBLE.unpack(path.read_bytes()[:64])[3]
        rewrite(path, lambda d: d[:offset] + b"{" + d[offset + 1:].replace(b"{", b"["))
        with pytest.raises(FormatError):
            reader(path)

    def test_record_disagreeing_with_shape(self, tmp_path, source, reader, writer, suffix):
        path = tmp_path / f"m.{suffix}"
        writer(path, source)
        data = path.read_bytes()
        _, _, _, offset, length, count = PREAMBLE.unpack(data[:64])
        header = json.loads(data[offset:])
        header["tensors"][0]["shape"] = [34, 7]
        new_header = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        preamble = PREAMBLE.pack(data[:8], FORMAT_VERSION, 0, offset, len(new_header), count)
        path.write_bytes(preamble + data[64:offset] + new_header)
        with pytest.raises(FormatError, match="disagree"):
            reader(path)

    def test_flipped_byte_caught_by_digest(self, tmp_path, source, reader, writer, suffix):
        path = tmp_path / f"m.{suffix}"
        writer(path, source)
        with reader(path) as r:
            blob = next(b for name, b in r.blobs.items() if name.endswith("w8"))
        rewrite(path, lambda d: d[:blob.offset + 3] + bytes([d[blob.offset + 3] ^ 0x40]) + d[blob.offset + 4:])
        with reader(path) as r:                   # structure is intact: opens fine
            with pytest.raises(FormatError, match=f"blob '{blob.name}' digest mismatch"):
                r.verify_digests()

    def test_missing_file(self, tmp_path, source, reader, writer, suffix):
        with pytest.raises(FormatError, match="not found"):
            reader(tmp_path / f"missing.{suffix}")


# --- digests verified while reading (issue 14, item 3) -----------------------------------------

def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _bin_from_dlc(dlc_path, bin_path):
    with read_dlc(dlc_path) as dlc:
        graphs = [CtxGraph(dlc.graph, dlc.topology_bytes(),
                           (dlc.tensor_stream(n) for n in dlc.tensors))]
        return write_ctxbin(bin_path, graphs, weights_packing=True, weight_sharing=True,
                            optimization_type=3, vtcm_mb=8, device=DEVICE, producer=PRODUCER)


@pytest.mark.parametrize("blob, where, named", [
    ("weight/w8", "data", "tensor 'w8'"),
    ("weight/w8", "scales", "tensor 'w8'"),
    ("weight/norm", "data", "tensor 'norm'"),
    ("topology", "data", "blob 'topology'"),
])
def test_a_flipped_dlc_byte_is_refused_while_compiling_and_nothing_is_written(
        tmp_path, source, blob, where, named):
    dlc_path, bin_path = tmp_path / "g.dlc", tmp_path / "out" / "g.bin"
    bin_path.parent.mkdir()
    write_test_dlc(dlc_path, source)
    _bin_from_dlc(dlc_path, bin_path)   # the intact DLC compiles
    good = bin_path.read_bytes()
    with read_dlc(dlc_path) as dlc:
        entry = dlc.blobs[blob]
        record = dlc.tensors.get(blob.split("/", 1)[-1])
        offset = entry.offset + (record.scales_offset if where == "scales" else 1)
    _flip(dlc_path, offset)
    with pytest.raises(FormatError) as err:
        _bin_from_dlc(dlc_path, bin_path)
    message = str(err.value)
    assert str(dlc_path) in message and f"'{blob}'" in message and named in message
    assert "rebuild it (doit convert)" in message
    assert bin_path.read_bytes() == good                     # the previous bin untouched
    assert [p.name for p in bin_path.parent.iterdir()] == ["g.bin"]   # no temp file left
