"""The reference backend streams: block size changes nothing in the bytes, and converting or
compiling a tensor takes less memory than the tensor itself (measured in a real subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hexbundle.backends import CompileOptions, ConvertOptions, DeviceOptions, reference
from hexbundle.backends.registry import get_backend
from hexbundle.config.model import Architecture, Model, Plan, Quantization
from hexbundle.formats import container
from hexbundle.formats.container import GraphInfo, QuantParams, Tensor, TensorStream
from hexbundle.formats.ctxbin import CtxGraph, read_ctxbin, write_ctxbin
from hexbundle.inputs import generate

ROOT = Path(__file__).resolve().parent.parent
DEVICE = DeviceOptions(soc_model=77, dsp_arch="v73")


def model_of(vocab: int, hidden: int, layers=(0, 1)) -> Model:
    arch = Architecture(num_layers=sum(layers), hidden_size=hidden, num_attention_heads=4,
                        num_kv_heads=2, head_dim=hidden // 4, intermediate_size=3 * hidden,
                        vocab_size=vocab, rope_theta=1e6, rms_norm_eps=1e-6)
    return Model("stream-test", "stream_test", arch, Quantization(), (160,), 128, 1,
                 {"p": Plan("p", tuple(layers))}, "p")


def build(model: Model, inputs: Path, out: Path, packing: bool = True) -> list:
    """Convert every graph and compile every part; return the written files."""
    backend, written = get_backend("reference"), []
    out.mkdir(parents=True, exist_ok=True)
    for part in model.plans["p"].parts():
        dlcs = []
        for g in model.graphs(part):
            dlcs.append(out / f"{g.name}.dlc")
            backend.convert(inputs / f"{g.name}.onnx", inputs / f"{g.name}.encodings", dlcs[-1],
                            g.name, ConvertOptions(), lambda m: None)
        written += dlcs + [out / f"{part.tag}.bin"]
        backend.compile(dlcs, written[-1], CompileOptions(tuple(g.name for g in model.graphs(part)),
                                                          DEVICE, weights_packing=packing), lambda m: None)
    return written


def test_block_sizes_change_no_byte(tmp_path, monkeypatch):
    """Blocks of one row and odd-sized stream blocks (a 4-bit pair split across two blocks)
    give the same DLCs and context binaries as the default blocks."""
    model = model_of(vocab=300, hidden=64, layers=(0, 1, 1))
    inputs = tmp_path / "in"
    for part in model.plans["p"].parts():
        generate.generate_part(model, part, inputs, seed=5)
    default = build(model, inputs, tmp_path / "default")
    monkeypatch.setattr(reference, "QUANTIZE_BLOCK_ELEMENTS", 7)
    monkeypatch.setattr(container, "STREAM_BLOCK_ELEMENTS", 333)
    small = build(model, inputs, tmp_path / "small")
    for a, b in zip(default, small):
        assert a.read_bytes() == b.read_bytes(), b.name


def test_a_stream_of_odd_blocks_packs_like_the_whole_tensor(tmp_path):
    values = np.random.default_rng(0).integers(0, 16, size=(7, 9), dtype=np.uint8)
    quant = QuantParams(4, 1, np.full(9, 0.5, np.float32), np.full(9, -8, np.int32), True)
    blocks = [values.reshape(-1)[i:i + 5] for i in range(0, values.size, 5)]   # 5, 5, ..., 3
    stream = TensorStream("w", "uint4", values.shape, lambda: iter(blocks), quant)
    paths = []
    for name, tensor in (("whole", Tensor("w", "uint4", values, quant)), ("stream", stream)):
        info = GraphInfo("g", (), (), (), (("", 17),), 8)
        paths.append(tmp_path / f"{name}.bin")
        write_ctxbin(paths[-1], [CtxGraph(info, b"", [tensor])], weights_packing=True,
                     weight_sharing=True, optimization_type=3, vtcm_mb=8, device={}, producer={})
    assert paths[0].read_bytes() == paths[1].read_bytes()
    with read_ctxbin(paths[1]) as ctx:
        np.testing.assert_array_equal(ctx.weight("g", "w"), values)


STEP = """
import json, os, sys, time
from pathlib import Path
from hexbundle.backends import CompileOptions, ConvertOptions, DeviceOptions
from hexbundle.backends.registry import get_backend
spec = json.loads(sys.argv[1])
backend = get_backend("reference")
if spec["step"] == "none":   # the interpreter and imports alone: the baseline
    pass
elif spec["step"] == "convert":
    backend.convert(Path(spec["onnx"]), Path(spec["encodings"]), Path(spec["out"]), spec["graph"],
                    ConvertOptions(), lambda m: None)
else:
    backend.compile([Path(p) for p in spec["dlcs"]], Path(spec["out"]),
                    CompileOptions(tuple(spec["graphs"]), DeviceOptions(77, "v73")), lambda m: None)
"""


def peak_rss(spec: dict) -> int:
    """Peak RSS (bytes) of one backend step in a fresh process."""
    proc = subprocess.Popen([sys.executable, "-c", STEP, json.dumps(spec)], cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    return usage.ru_maxrss * 1024


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_memory_stays_below_the_tensor_size(tmp_path):
    """A 256 MiB float32 embedding (16-bit codes: 128 MiB per DLC) converts and compiles in less
    memory than the tensor takes: it is never whole in memory, in any form. (Reading it whole,
    as a memmap or as codes, needs at least the tensor's size.)"""
    model = model_of(vocab=65536, hidden=1024)
    part = model.plans["p"].parts()[0]
    tensor_bytes = 65536 * 1024 * 4
    generate.generate_part(model, part, tmp_path, seed=1)
    graphs = model.graphs(part)
    dlcs = [tmp_path / f"{g.name}.dlc" for g in graphs]
    peaks = [peak_rss({"step": "convert", "onnx": str(tmp_path / f"{g.name}.onnx"),
                       "encodings": str(tmp_path / f"{g.name}.encodings"), "out": str(dlc),
                       "graph": g.name}) for g, dlc in zip(graphs, dlcs)]
    peaks.append(peak_rss({"step": "compile", "dlcs": [str(p) for p in dlcs],
                           "out": str(tmp_path / "p.bin"), "graphs": [g.name for g in graphs]}))
    # Measured over the interpreter's own footprint (imports, allocator arenas), which is not
    # what the steps are accountable for and varies with the machine.
    baseline = peak_rss({"step": "none"})
    grown = [p - baseline for p in peaks]
    assert max(grown) < tensor_bytes, [f"{p / 2**20:.0f} MiB over {baseline / 2**20:.0f} MiB"
                                       for p in peaks]
    assert (tmp_path / "p.bin").stat().st_size > tensor_bytes // 2   # 16-bit codes, stored once


def _rss_file_bytes() -> int:
    """This process's resident file-backed pages (Linux /proc): what an mmap'd bin adds."""
    with open("/proc/self/status") as fh:
        line = next(line for line in fh if line.startswith("RssFile:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux /proc")
def test_a_reader_done_with_a_file_for_now_gives_back_its_pages(tmp_path):
    """`doit verify` reads a part's bin, then runs the reference and the float ONNX: the bin's
    pages must not stay resident under their weights (the 7B-shaped peak RSS). The reader keeps
    working afterwards: the pages fault back in."""
    path, size = tmp_path / "c.bin", 64 << 20
    data = np.arange(size // 4, dtype=np.uint32)
    with container.ContainerWriter(path, b"TESTCONT") as writer:
        writer.add_blob("w", [data])
        writer.finish({})
    reader = container.FormatReader()
    reader._container = container.ContainerReader(path, b"TESTCONT", "test container")
    try:
        before = _rss_file_bytes()
        assert int(reader._container.blob("w").view(np.uint32).sum(dtype=np.uint64)) == \
            int(data.sum(dtype=np.uint64))
        touched = _rss_file_bytes()
        reader.release_pages()
        released = _rss_file_bytes()
        assert touched - before > size // 2, "reading the blob made its pages resident"
        assert touched - released > size // 2, (before, touched, released)
        assert np.array_equal(reader._container.blob("w").view(np.uint32), data)
    finally:
        reader.close()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux /proc")
def test_verifying_a_files_digests_leaves_its_pages_given_back(tmp_path):
    """The check of a fetched DLC or bin (steps/check.py) hashes every blob through the mmap:
    the file's pages must not stay resident after it (on the old code all 192 MiB stayed)."""
    path, size = tmp_path / "c.bin", 192 << 20   # more than _WRITE_CHUNK: several pieces
    data = np.arange(size // 4, dtype=np.uint32)
    with container.ContainerWriter(path, b"TESTCONT") as writer:
        writer.add_blob("w", [data])
        writer.finish({})
    reader = container.ContainerReader(path, b"TESTCONT", "test container")
    try:
        before = _rss_file_bytes()
        reader.verify_digests()
        after = _rss_file_bytes()
        assert after - before < container._WRITE_CHUNK + (1 << 20), (before, after)
        assert int(reader.blob("w").view(np.uint32)[-1]) == size // 4 - 1   # still readable
    finally:
        reader.close()
