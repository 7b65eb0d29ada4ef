"""Reference backend: convert (ONNX + external data + encodings -> DLC) and compile (DLCs -> ctxbin).

The model is built here: Gather embedding (16-bit per-tensor), MatMul W1 (4-bit symmetric
per-channel), float bias b1, MatMul W2 (8-bit asymmetric per-channel), small bias b2, Reshape
with a shape constant, Gemm transB LM head (8-bit per-channel along axis 0).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hexbundle.backends import CompileOptions, ConvertOptions, DeviceOptions
from hexbundle.backends.registry import get_backend
from hexbundle.formats.container import ALIGN, PREAMBLE, container_size, tensor_blob_nbytes
from hexbundle.formats.ctxbin import read_ctxbin
from hexbundle.formats.dlc import read_dlc
from hexbundle.support.errors import BackendError, EncodingsError, InputError

VOCAB, HIDDEN, FFN, HEAD = 128, 64, 256, 96
PROMPT = "prompt_ar4_cl16_1_of_1"
TOKEN = "token_ar1_cl16_1_of_1"
DEVICE = DeviceOptions(soc_model=77, dsp_arch="v73")


def make_weights(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "embed": rng.normal(0, 1, (VOCAB, HIDDEN)).astype(np.float32),
        "w1": rng.normal(0, 0.2, (HIDDEN, FFN)).astype(np.float32),
        "b1": rng.normal(0, 0.1, (FFN,)).astype(np.float32),
        "w2": (rng.normal(0, 0.1, (FFN, HIDDEN)) + 0.02).astype(np.float32),
        "b2": rng.normal(0, 0.1, (HIDDEN,)).astype(np.float32),
        "head": rng.normal(0, 0.1, (HEAD, HIDDEN)).astype(np.float32),
    }


def build_onnx(path: Path, weights: dict, seq: int) -> None:
    """Save the model with ALL initializers (even the shape constant) in external data."""
    inits = [numpy_helper.from_array(v, name=k) for k, v in weights.items()]
    inits.append(numpy_helper.from_array(np.array([-1, HIDDEN], np.int64), name="shape2d"))
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["x"], axis=0),
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["y0"]),
        helper.make_node("Add", ["y0", "b2"], ["y1"]),
        helper.make_node("Reshape", ["y1", "shape2d"], ["y2"]),
        helper.make_node("Gemm", ["y2", "head"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [seq, HEAD])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.stem + ".data", size_threshold=0)


# --- encodings computed from the weights (same numbers in both schemas) ---------------------------

def per_channel_symmetric(w: np.ndarray, axis: int, bw: int):
    reduce_axes = tuple(i for i in range(w.ndim) if i != axis)
    scale = np.abs(w).max(axis=reduce_axes) / (2 ** (bw - 1) - 1)
    return scale.astype(np.float32), np.full(scale.shape, -(2 ** (bw - 1)), np.int64)


def per_channel_asymmetric(w: np.ndarray, axis, bw: int):
    reduce_axes = tuple(i for i in range(w.ndim) if i != axis) if axis is not None else None
    lo = np.minimum(w.min(axis=reduce_axes), 0)
    hi = np.maximum(w.max(axis=reduce_axes), 0)
    scale = ((hi - lo) / (2 ** bw - 1)).astype(np.float32)
    offset = np.round(lo / scale).astype(np.int64)
    return np.atleast_1d(scale), np.atleast_1d(offset)


def encoding_table(weights: dict) -> dict:
    """name -> (bitwidth, symmetric, scales, offsets); None = float encoding."""
    return {
        "embed": (16, False, *per_channel_asymmetric(weights["embed"], None, 16)),
        "w1": (4, True, *per_channel_symmetric(weights["w1"], 1, 4)),
        "w2": (8, False, *per_channel_asymmetric(weights["w2"], 1, 8)),
        "head": (8, True, *per_channel_symmetric(weights["head"], 0, 8)),
        "b1": None,
    }


def legacy_json(table: dict) -> dict:
    params = {}
    for name, enc in table.items():
        if enc is None:
            params[name] = [{"bitwidth": 16, "dtype": "float"}]
            continue
        bw, sym, scales, offsets = enc
        params[name] = [{"bitwidth": bw, "dtype": "int", "is_symmetric": str(sym), "scale": float(s),
                         "offset": int(o), "min": float(s * o), "max": float(s * (o + 2 ** bw - 1))}
                        for s, o in zip(scales, offsets)]
    act = [{"bitwidth": 16, "dtype": "int", "is_symmetric": "False", "scale": 0.001, "offset": -32768}]
    return {"version": "0.6.1", "activation_encodings": {"logits": act}, "param_encodings": params}


def v1_json(table: dict) -> dict:
    params = []
    for name, enc in table.items():
        if enc is None:
            params.append({"name": name, "bw": 16, "dtype": "FLOAT"})
            continue
        bw, sym, scales, offsets = enc
        params.append({"name": name, "bw": bw, "dtype": "INT", "is_sym": sym,
                       "enc_type": "PER_CHANNEL" if len(scales) > 1 else "PER_TENSOR",
                       "scale": [float(s) for s in scales], "offset": [int(o) for o in offsets]})
    act = [{"name": "logits", "bw": 16, "dtype": "INT", "enc_type": "PER_TENSOR", "is_sym": False,
            "scale": [0.001], "offset": [-32768]}]
    return {"version": "1.0.0", "activation_encodings": act, "param_encodings": params,
            "excluded_layers": [], "quantizer_args": {}}


# --- fixtures ------------------------------------------------------------------------------------

@pytest.fixture
def backend():
    return get_backend("reference")


@pytest.fixture
def inputs(tmp_path):
    """prompt (legacy encodings) and token (v1.0.0 encodings) exports of the same weights."""
    weights = make_weights()
    table = encoding_table(weights)
    src = tmp_path / "export"
    src.mkdir()
    build_onnx(src / "prompt.onnx", weights, seq=4)
    build_onnx(src / "token.onnx", weights, seq=1)
    (src / "prompt.encodings").write_text(json.dumps(legacy_json(table)))
    (src / "token.encodings").write_text(json.dumps(v1_json(table)))
    return {"dir": src, "weights": weights, "table": table}


def convert_both(backend, inputs, out: Path, log=lambda line: None):
    out.mkdir(exist_ok=True)
    src = inputs["dir"]
    for stem, graph in (("prompt", PROMPT), ("token", TOKEN)):
        backend.convert(src / f"{stem}.onnx", src / f"{stem}.encodings", out / f"{stem}.dlc",
                        graph, ConvertOptions(float_bitwidth=16), log)
    return [out / "prompt.dlc", out / "token.dlc"]


def compile_bin(backend, dlcs, path: Path, packing=True, sharing=True):
    options = CompileOptions(graph_names=(PROMPT, TOKEN), device=DEVICE,
                             weights_packing=packing, weight_sharing=sharing)
    backend.compile(dlcs, path, options, lambda line: None)
    return path


def header_length(path: Path) -> int:
    with open(path, "rb") as f:
        return PREAMBLE.unpack(f.read(PREAMBLE.size))[4]


# --- convert -------------------------------------------------------------------------------------

def test_backend_identity(backend):
    assert backend.name == "reference" and backend.deployable is False
    assert "hexbundle-reference" in backend.toolchain_version()


def test_get_backend_unknown_names_choices():
    with pytest.raises(BackendError, match="choose reference, qairt or ortqnn"):
        get_backend("nonsense")


def test_convert_writes_quantized_unpacked_dlc(backend, inputs, tmp_path):
    lines = []
    dlcs = convert_both(backend, inputs, tmp_path / "out", lines.append)
    with read_dlc(dlcs[0]) as dlc:
        assert dlc.graph_name == PROMPT
        assert dlc.deployable is False
        assert dlc.header["source"] == {"onnx": "prompt.onnx", "encodings": "prompt.encodings"}
        assert dlc.producer["name"] == "reference"
        assert list(dlc.tensors) == ["embed", "w1", "b1", "w2", "head"]   # b2 (64 elems) stays in topology
        kinds = {n: (r.dtype, r.packed, r.quant and r.quant.axis) for n, r in dlc.tensors.items()}
        assert kinds == {"embed": ("uint16", False, None), "w1": ("uint4", False, 1),
                         "b1": ("float16", False, None), "w2": ("uint8", False, 1),
                         "head": ("uint8", False, 0)}
        assert dlc.tensors["w1"].data_nbytes == HIDDEN * FFN      # one byte per 4-bit value
        assert dlc.graph.inputs[0].name == "input_ids" and dlc.graph.inputs[0].shape == (1, 4)
        assert "logits" in dlc.graph.activations
        topo = dlc.topology()
        assert {i.name for i in topo.initializer} == {"b2", "shape2d"}
        assert all(not i.external_data for i in topo.initializer)
    tensor_lines = [l for l in lines if l.startswith(("embed:", "w1:", "b1:", "w2:", "head:"))]
    assert len(tensor_lines) == 10       # one per tensor per graph


def test_dequantized_weights_within_half_a_step(backend, inputs, tmp_path):
    dlcs = convert_both(backend, inputs, tmp_path / "out")
    weights, table = inputs["weights"], inputs["table"]
    with read_dlc(dlcs[1]) as dlc:
        for name in ("embed", "w1", "w2", "head"):
            record = dlc.tensors[name]
            scale = dlc.quant_params(name).scale
            shape = [1] * len(record.shape)
            if record.quant.axis is not None:
                shape[record.quant.axis] = -1
            err = np.abs(dlc.dequantize(name) - weights[name])
            assert np.all(err <= scale.reshape(shape) / 2 * (1 + 1e-5) + 1e-7), name
            np.testing.assert_array_equal(scale, table[name][2])
        np.testing.assert_allclose(dlc.dequantize("b1"), weights["b1"], rtol=1e-3, atol=1e-4)


def test_convert_is_deterministic_and_path_independent(backend, inputs, tmp_path):
    first = convert_both(backend, inputs, tmp_path / "a")
    second = convert_both(backend, inputs, tmp_path / "b")
    moved = dict(inputs, dir=tmp_path / "moved")
    shutil.copytree(inputs["dir"], moved["dir"])
    third = convert_both(backend, moved, tmp_path / "c")
    for a, b, c in zip(first, second, third):
        assert a.read_bytes() == b.read_bytes() == c.read_bytes()


def test_float_bitwidth_32_keeps_float32(backend, inputs, tmp_path):
    src = inputs["dir"]
    backend.convert(src / "prompt.onnx", src / "prompt.encodings", tmp_path / "p.dlc", PROMPT,
                    ConvertOptions(float_bitwidth=32), lambda line: None)
    with read_dlc(tmp_path / "p.dlc") as dlc:
        assert dlc.tensors["b1"].dtype == "float32"
        np.testing.assert_array_equal(dlc.dequantize("b1"), inputs["weights"]["b1"])


# --- convert errors ------------------------------------------------------------------------------

def convert_prompt(backend, inputs, tmp_path, encodings=None):
    src = inputs["dir"]
    enc_path = src / "prompt.encodings"
    if encodings is not None:
        enc_path = tmp_path / "edited.encodings"
        enc_path.write_text(json.dumps(encodings))
    backend.convert(src / "prompt.onnx", enc_path, tmp_path / "p.dlc", PROMPT,
                    ConvertOptions(), lambda line: None)


def test_missing_external_data_names_onnx_tensor_and_file(backend, inputs, tmp_path):
    (inputs["dir"] / "prompt.data").unlink()
    with pytest.raises(InputError) as info:
        convert_prompt(backend, inputs, tmp_path)
    message = str(info.value)
    assert "prompt.onnx" in message and "prompt.data" in message and "tensor 'b2'" in message
    assert not (tmp_path / "p.dlc").exists()


def test_short_external_data_is_an_input_error(backend, inputs, tmp_path):
    data = inputs["dir"] / "prompt.data"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(InputError, match="truncated"):
        convert_prompt(backend, inputs, tmp_path)
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "p.dlc").exists()


def test_encoding_for_unknown_tensor(backend, inputs, tmp_path):
    enc = legacy_json(inputs["table"])
    enc["param_encodings"]["not_in_graph"] = enc["param_encodings"]["head"]
    with pytest.raises(EncodingsError, match="not_in_graph") as info:
        convert_prompt(backend, inputs, tmp_path, enc)
    assert "edited.encodings" in str(info.value) and "prompt.onnx" in str(info.value)


def test_linear_weight_without_int_encoding_is_refused(backend, inputs, tmp_path):
    enc = legacy_json(inputs["table"])
    del enc["param_encodings"]["w2"]
    with pytest.raises(EncodingsError, match="'w2'") as info:
        convert_prompt(backend, inputs, tmp_path, enc)
    assert "edited.encodings" in str(info.value) and "prompt.onnx" in str(info.value)


def test_channel_count_must_match_output_axis(backend, inputs, tmp_path):
    enc = legacy_json(inputs["table"])
    enc["param_encodings"]["w1"] = enc["param_encodings"]["w1"][:HIDDEN]   # input axis length
    with pytest.raises(EncodingsError, match=r"'w1' has 64 per-channel encodings.*axis 1 has length 256"):
        convert_prompt(backend, inputs, tmp_path, enc)


def test_missing_onnx_is_an_input_error(backend, inputs, tmp_path):
    with pytest.raises(InputError, match="nope.onnx"):
        backend.convert(tmp_path / "nope.onnx", inputs["dir"] / "prompt.encodings",
                        tmp_path / "p.dlc", PROMPT, ConvertOptions(), lambda line: None)


# --- compile -------------------------------------------------------------------------------------

def expected_bin_size(path: Path, dlcs, packing: bool, sharing: bool) -> int:
    """Size from first principles: topology blobs + weight blobs (x graphs if not shared)."""
    blobs = []
    for dlc_path in dlcs:
        with read_dlc(dlc_path) as dlc:
            blobs.append(dlc.blobs["topology"].nbytes)
            if sharing and dlc_path != dlcs[0]:
                continue
            for record in dlc.tensors.values():
                channels = record.quant.channels if record.quant else 0
                blobs.append(tensor_blob_nbytes(record.shape, record.dtype,
                                                packing and record.dtype == "uint4", channels))
    return container_size(blobs, header_length(path))


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("sharing", [True, False])
def test_compile_sizes_follow_the_size_model(backend, inputs, tmp_path, packing, sharing):
    dlcs = convert_both(backend, inputs, tmp_path / "out")
    path = compile_bin(backend, dlcs, tmp_path / "model.bin", packing, sharing)
    assert path.stat().st_size == expected_bin_size(path, dlcs, packing, sharing)
    with read_ctxbin(path) as ctx:
        ctx.verify_digests()
        assert ctx.graph_names == [PROMPT, TOKEN]
        assert ctx.options == {"weights_packing": packing, "weight_sharing": sharing,
                               "optimization_type": 3, "vtcm_mb": 8}
        assert ctx.device == {"soc_model": 77, "dsp_arch": "v73"}
        assert ctx.deployable is False
        assert ctx.record(TOKEN, "w1").packed is packing
        weight_blobs = [b for b in ctx.blobs if "/weight/" in b or b.startswith("weight/")]
        assert len(weight_blobs) == 5 * (1 if sharing else 2)


def test_unpacked_and_unshared_cost_exactly_the_expected_pages(backend, inputs, tmp_path):
    dlcs = convert_both(backend, inputs, tmp_path / "out")
    sizes = {(p, s): compile_bin(backend, dlcs, tmp_path / f"{p}{s}.bin", p, s).stat().st_size
             for p in (True, False) for s in (True, False)}
    headers = {(p, s): header_length(tmp_path / f"{p}{s}.bin") for p in (True, False) for s in (True, False)}
    w1_unpacked = tensor_blob_nbytes((HIDDEN, FFN), "uint4", False, FFN)
    w1_packed = tensor_blob_nbytes((HIDDEN, FFN), "uint4", True, FFN)
    page = lambda n: -(-n // ALIGN) * ALIGN
    unpack_cost = page(w1_unpacked) - page(w1_packed)
    assert unpack_cost > 0
    assert sizes[(False, True)] - headers[(False, True)] == sizes[(True, True)] - headers[(True, True)] + unpack_cost
    with read_dlc(dlcs[0]) as dlc:
        packed_weight_pages = sum(
            page(tensor_blob_nbytes(r.shape, r.dtype, r.dtype == "uint4", r.quant.channels if r.quant else 0))
            for r in dlc.tensors.values())
    assert (sizes[(True, False)] - headers[(True, False)]
            == sizes[(True, True)] - headers[(True, True)] + packed_weight_pages)


def test_weights_round_trip_through_the_context_binary(backend, inputs, tmp_path):
    dlcs = convert_both(backend, inputs, tmp_path / "out")
    packed = compile_bin(backend, dlcs, tmp_path / "packed.bin", True, True)
    unpacked = compile_bin(backend, dlcs, tmp_path / "unpacked.bin", False, False)
    with read_dlc(dlcs[0]) as dlc, read_ctxbin(packed) as a, read_ctxbin(unpacked) as b:
        for name in dlc.tensors:
            for graph in (PROMPT, TOKEN):
                np.testing.assert_array_equal(a.weight(graph, name), dlc.tensor_data(name))
                np.testing.assert_array_equal(b.weight(graph, name), dlc.tensor_data(name))
                np.testing.assert_array_equal(a.dequantize(graph, name), dlc.dequantize(name))


def test_compile_is_deterministic(backend, inputs, tmp_path):
    dlcs = convert_both(backend, inputs, tmp_path / "out")
    a = compile_bin(backend, dlcs, tmp_path / "a.bin")
    b = compile_bin(backend, dlcs, tmp_path / "b.bin")
    assert a.read_bytes() == b.read_bytes()


def test_shared_weight_mismatch_names_both_graphs(backend, inputs, tmp_path):
    table = dict(inputs["table"])
    bw, sym, scales, offsets = table["w1"]
    table["w1"] = (bw, sym, scales * 1.5, offsets)
    (inputs["dir"] / "token.encodings").write_text(json.dumps(v1_json(table)))
    dlcs = convert_both(backend, inputs, tmp_path / "out")
    with pytest.raises(BackendError) as info:
        compile_bin(backend, dlcs, tmp_path / "model.bin", sharing=True)
    message = str(info.value)
    assert PROMPT in message and TOKEN in message and "'w1'" in message and "scales" in message
    assert not (tmp_path / "model.bin").exists()
    compile_bin(backend, dlcs, tmp_path / "unshared.bin", sharing=False)   # fine without sharing


def test_compile_checks_graph_names(backend, inputs, tmp_path):
    dlcs = convert_both(backend, inputs, tmp_path / "out")
    wrong_order = CompileOptions(graph_names=(TOKEN, PROMPT), device=DEVICE)
    with pytest.raises(BackendError, match="pass the DLCs in bin order"):
        backend.compile(dlcs, tmp_path / "x.bin", wrong_order, lambda line: None)
    duplicate = CompileOptions(graph_names=(PROMPT, PROMPT), device=DEVICE)
    with pytest.raises(BackendError, match="distinct"):
        backend.compile(dlcs, tmp_path / "x.bin", duplicate, lambda line: None)


# --- the context binary still computes the model --------------------------------------------------

def reassemble(ctx, graph_name: str) -> onnx.ModelProto:
    graph = ctx.topology(graph_name)
    info = ctx.graph(graph_name)
    for name in info.weights:
        graph.initializer.append(numpy_helper.from_array(ctx.dequantize(graph_name, name), name=name))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in info.opset_import])
    model.ir_version = info.ir_version
    return model


def run(model: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"input_ids": ids})[0]


@pytest.mark.parametrize("packing", [True, False])
def test_reassembled_model_matches_float_model(backend, inputs, tmp_path, packing):
    dlcs = convert_both(backend, inputs, tmp_path / "out")
    path = compile_bin(backend, dlcs, tmp_path / "model.bin", packing, True)
    ids = {PROMPT: np.array([[3, 17, 99, 127]], np.int32), TOKEN: np.array([[42]], np.int32)}
    sources = {PROMPT: "prompt.onnx", TOKEN: "token.onnx"}
    with read_ctxbin(path) as ctx:
        for graph in (PROMPT, TOKEN):
            # ORT cannot shape-infer through an external shape constant: load the data in memory.
            expected = run(onnx.load(str(inputs["dir"] / sources[graph])), ids[graph])
            got = run(reassemble(ctx, graph), ids[graph])
            assert got.shape == expected.shape
            rel_rms = np.sqrt(np.mean((got - expected) ** 2)) / np.sqrt(np.mean(expected ** 2))
            assert rel_rms < 0.1, f"{graph}: relative RMS error {rel_rms:.3f}"


# --- after compile: the binary as its own reader sees it (backends.bincheck, as for qairt) ---

def test_the_compiled_bin_is_checked_by_its_reader(backend, inputs, tmp_path):
    from hexbundle.backends.bincheck import check_bin_facts, facts_from_ctxbin
    from hexbundle.formats.ctxbin import read_ctxbin
    dlcs = convert_both(backend, inputs, tmp_path)
    lines = []
    options = CompileOptions(graph_names=(PROMPT, TOKEN), device=DEVICE)
    backend.compile(dlcs, tmp_path / "ok.bin", options, lines.append)
    assert any("checked by hexbundle's context-binary reader" in line and "1 weight copy" in line
               for line in lines)
    compile_bin(backend, dlcs, tmp_path / "unshared.bin", sharing=False)   # asked for: kept
    reader = read_ctxbin(tmp_path / "unshared.bin")
    facts = facts_from_ctxbin(reader)
    reader.close()
    assert facts.weight_copies == 2 and facts.graphs == (PROMPT, TOKEN)
    with pytest.raises(BackendError, match="holds 2 copies of the weights although "
                                           "weight_sharing is on"):
        check_bin_facts(tmp_path / "unshared.bin", facts, (PROMPT, TOKEN), DEVICE.soc_model,
                        DEVICE.dsp_arch, True, lines.append)
    with pytest.raises(BackendError, match=r"is built for soc_model \d+, not the configured 1"):
        check_bin_facts(tmp_path / "unshared.bin", facts, (PROMPT, TOKEN), 1,
                        DEVICE.dsp_arch, False, lines.append)
    with pytest.raises(BackendError, match=r"\(missing: extra_graph\)"):
        check_bin_facts(tmp_path / "unshared.bin", facts, (PROMPT, TOKEN, "extra_graph"),
                        DEVICE.soc_model, DEVICE.dsp_arch, False, lines.append)


def test_topology_keeps_a_scalar_constant_a_scalar(backend, tmp_path):
    """A 0-d constant (eps, 1/sqrt(d)) goes into the topology with the ONNX's shape: the graph run
    from the bin is the exported one, and the size model, which counts the constant as the ONNX
    has it, matches the topology's bytes (np.ascontiguousarray made it [1]: 2 bytes more each)."""
    scale = numpy_helper.from_array(np.array(0.5, np.float32), name="scale")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "scale"], ["y"])], "scalar",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(tmp_path / "scalar.onnx"))
    (tmp_path / "scalar.encodings").write_text(json.dumps(
        {"version": "1.0.0", "activation_encodings": [], "param_encodings": []}))
    backend.convert(tmp_path / "scalar.onnx", tmp_path / "scalar.encodings", tmp_path / "s.dlc",
                    "scalar", ConvertOptions(float_bitwidth=16), lambda line: None)
    with read_dlc(tmp_path / "s.dlc") as dlc:
        (inlined,) = dlc.topology().initializer
    assert list(inlined.dims) == []
    assert numpy_helper.to_array(inlined) == np.float32(0.5)
