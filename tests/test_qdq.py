"""runtime/qdq.py, the export's quantized reference: AIMET's formula on weights (the channel axis
from the consumer op), onnxruntime's own QuantizeLinear/DequantizeLinear on activations, and the
float-op form where Q/DQ cannot express the encoding -- each against the formula written out."""
import json

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT
from hexbundle.formats.encodings import load_encodings
from hexbundle.runtime.qdq import quantize_dequantize_weight, write_qdq_model


def aimet(x, scale, offset, bw):
    """AIMET's quantize-dequantize, element by element (scale/offset broadcast by the caller)."""
    q = np.clip(np.round(x / scale - offset), 0, 2 ** bw - 1)
    return (q + offset) * scale


def write_model(tmp_path, act_offset=-32768.0, weight_shape=(8, 6)):
    """x [2, 8] -> MatMul(W [8, 6]) -> h -> Relu -> y; encodings for W (4-bit per channel),
    h (16-bit) and y (16-bit); external data for W."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal(weight_shape).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "src" / "g.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path), save_as_external_data=True, location="g.data",
              size_threshold=0)
    w_scale = (np.abs(w).max(axis=0) / 7).astype(np.float32)
    encodings = {"version": "1.0.0",
                 "param_encodings": [{"name": "W", "bw": 4, "dtype": "INT", "enc_type":
                                      "PER_CHANNEL", "is_sym": True,
                                      "scale": w_scale.tolist(), "offset": [-8] * 6}],
                 "activation_encodings": [
                     {"name": n, "bw": 16, "dtype": "INT", "enc_type": "PER_TENSOR",
                      "is_sym": False, "scale": [s], "offset": [act_offset]}
                     for n, s in (("h", 1e-3), ("y", 7e-4))]}
    enc_path = tmp_path / "src" / "g.encodings"
    enc_path.write_text(json.dumps(encodings))
    return path, enc_path, w, w_scale


def test_a_matmul_weight_is_quantized_per_output_channel(tmp_path):
    path, enc_path, w, w_scale = write_model(tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    enc = load_encodings(enc_path).params["W"]
    got = quantize_dequantize_weight(w, enc, model.graph, "W")
    want = np.stack([aimet(w[:, c], w_scale[c], -8, 4) for c in range(6)], axis=1)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert len(np.unique(got[:, 0])) <= 16


@pytest.mark.parametrize("offset", [-32768.0, -32767.5])   # Q/DQ; a shifted zero point: float ops
def test_the_reference_equals_the_formula_on_every_encoded_tensor(tmp_path, offset):
    path, enc_path, w, w_scale = write_model(tmp_path, act_offset=offset)
    qdq = write_qdq_model(path, enc_path, tmp_path / "qdq")
    ops = [n.op_type for n in onnx.load(str(qdq), load_external_data=False).graph.node]
    assert ops.count("QuantizeLinear") == (2 if offset.is_integer() else 0)
    assert ops.count("Round") == (0 if offset.is_integer() else 2)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(qdq), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    got = session.run(None, {"x": x})[0]
    w_q = np.stack([aimet(w[:, c], w_scale[c], -8, 4) for c in range(6)], axis=1)
    h = aimet((x @ w_q).astype(np.float32), np.float32(1e-3), offset, 16)
    want = aimet(np.maximum(h, 0), np.float32(7e-4), offset, 16)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert np.abs(got - x @ w).max() > 1e-3   # the quantization is really there


@pytest.mark.parametrize("offset,rounding", [(-32768.0, "half-even"), (-32767.5, "half-even"),
                                             (-32768.0, "aimet"), (-32767.5, "aimet")])
def test_a_nan_lands_on_the_grids_bottom_in_every_qdq_form(tmp_path, offset, rounding):
    """QuantizeLinear saturates NaN to the grid's bottom; the float-op forms (a shifted zero point,
    AIMET's rounding) must do the same, or a NaN of a zero padding row (RMSNorm's eps quantized
    away: 0 / 0) reaches the real rows through attention in one reference and not the other
    (the second reference of tests/test_aimet_encodings' builds was not finite)."""
    path, enc_path, w, w_scale = write_model(tmp_path, act_offset=offset)
    qdq = write_qdq_model(path, enc_path, tmp_path / "qdq", rounding=rounding)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(qdq), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    x[1] = np.nan
    got = session.run(None, {"x": x})[0]
    assert np.isfinite(got).all()
    # row 1: h is NaN -> h's grid bottom (negative) -> Relu 0 -> y's grid point nearest 0
    want_row = aimet(np.zeros(6, np.float32), np.float32(7e-4), offset, 16)
    np.testing.assert_allclose(got[1], want_row, rtol=0, atol=1e-6)


def test_the_references_weights_are_the_weights_checks_integers_and_part_only_at_its_ties():
    """Issue 46: the Qwen3 kv16 export's 16-bit embedding (offset -33369), made by qai-hub-models'
    code. Subtracting the offset in float32 before rounding moves w / s by up to 2^-9 and
    resolves near-ties that the weights check (checks/exact.aimet_quantize) and the build do
    not: the two references then agreed with each other and not with a faithful bin. In the
    weights check's frame, half-to-even is its integers but at a tie (+-1) and half-up is them
    exactly, so the references part ways on every tie half-to-even rounds down."""
    from hexbundle.checks.exact import aimet_quantize
    from hexbundle.runtime.qdq import AIMET, HALF_EVEN, grid_integers
    folder = ROOT / "tests/data/qaihm/export-qwen3-kv16/ar128_cl256" \
        / "qwen3_4b_w4a16_ar128_cl256_1_of_4.aimet"
    name = "model.model.embed_tokens.weight"
    model = onnx.load(str(folder / "qwen3_4b_w4a16_ar128_cl256_1_of_4.onnx"))
    w = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == name),
                              base_dir=str(folder))
    enc = json.loads((folder / "qwen3_4b_w4a16_ar128_cl256_1_of_4.encodings").read_text())
    e = next(p for p in enc["param_encodings"] if p["name"] == name)
    scale, offset = np.float32(e["scale"][0]), np.float32(e["offset"][0])
    want, tie = aimet_quantize(w, scale, offset, e["bw"])
    even = np.clip(grid_integers(w, scale, offset, HALF_EVEN), 0, 2 ** 16 - 1)
    up = np.clip(grid_integers(w, scale, offset, AIMET), 0, 2 ** 16 - 1)
    assert np.array_equal(up, want)
    assert np.array_equal(even[~tie], want[~tie]) and np.all(np.abs(even - want)[tie] <= 1)
    assert np.array_equal(even != up, tie & (even != want)) and (even != up).any()
    # the data holds the near-ties the old frame resolved otherwise (the test can fail)
    old = np.clip(np.round(np.divide(w, scale, dtype=np.float32) - offset), 0, 2 ** 16 - 1)
    assert np.count_nonzero(old[~tie] != want[~tie]) > 0


def write_narrowing_model(tmp_path):
    """x [580, 6] (16-bit) -> MatMul(W = I, 4-bit per channel, exact) -> h (8-bit) -> Relu -> y
    (16-bit): an op whose 16-bit activation input has an 8-bit output, as a V projection feeding
    the 8-bit KV cache in qai-hub-models' checkpoints. h = x's grid values exactly, chosen so that
    some lie within half a 16-bit step of an 8-bit rounding tie."""
    x = (np.arange(-1740, 1740, dtype=np.float32) * np.float32(1e-3)).reshape(-1, 6)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(np.eye(6, dtype=np.float32), "W")])
    path = tmp_path / "src" / "g.onnx"
    path.parent.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    act = [("x", 16, 1e-3, -32768), ("h", 8, 0.01371, -128), ("y", 16, 7e-5, 0)]
    encodings = {"version": "1.0.0",
                 "param_encodings": [{"name": "W", "bw": 4, "dtype": "INT", "enc_type":
                                      "PER_CHANNEL", "is_sym": True, "scale": [0.25] * 6,
                                      "offset": [-8] * 6}],
                 "activation_encodings": [
                     {"name": n, "bw": bw, "dtype": "INT", "enc_type": "PER_TENSOR",
                      "is_sym": False, "scale": [s], "offset": [o]} for n, bw, s, o in act]}
    enc_path = tmp_path / "src" / "g.encodings"
    enc_path.write_text(json.dumps(encodings))
    return path, enc_path, x


def _run(model, x):
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_an_op_narrowing_its_activation_is_computed_wide_then_requantized_in_the_compilers_form(
        tmp_path):
    """HTP has no MatMul/Conv from a 16-bit activation to an 8-bit output (the QNN EP leaves its
    weight's DequantizeLinear on the CPU: a Qualcomm-written Qwen3 checkpoint's V projections
    failed the ortqnn convert so). The compiler's form (integer_weights) writes the output at 16
    bits over the 8-bit range (scale / 256, zero point x 256), then requantizes to 8 bits, as
    QNN's Convert does; the references' float form keeps AIMET's single rounding. The two
    differ only at an 8-bit tie the 16-bit grid lands on, by one 8-bit step."""
    path, enc_path, x = write_narrowing_model(tmp_path)
    direct = write_qdq_model(path, enc_path, tmp_path / "direct")
    wide = write_qdq_model(path, enc_path, tmp_path / "wide", integer_weights=True)
    onnx.checker.check_model(str(wide), full_check=True)

    def after_matmul(model_path):
        model = onnx.load(str(model_path))
        consumers = {i: n for n in model.graph.node for i in n.input}
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        chain, tensor = [], "h"
        while tensor in consumers and consumers[tensor].op_type in ("QuantizeLinear",
                                                                     "DequantizeLinear"):
            node = consumers[tensor]
            chain.append((node.op_type, inits[node.input[1]].item(), inits[node.input[2]]))
            tensor = node.output[0]
        return chain

    assert [(op, zp.dtype) for op, _, zp in after_matmul(direct)] == [
        ("QuantizeLinear", np.uint8), ("DequantizeLinear", np.uint8)]
    chain = after_matmul(wide)
    assert [(op, zp.dtype) for op, _, zp in chain] == [
        ("QuantizeLinear", np.uint16), ("DequantizeLinear", np.uint16),
        ("QuantizeLinear", np.uint8), ("DequantizeLinear", np.uint8)]
    assert chain[0][1] == np.float32(0.01371) / 256 and chain[0][2] == 128 * 256
    assert chain[2][1] == np.float32(0.01371) and chain[2][2] == 128

    got_direct, got_wide = _run(direct, x), _run(wide, x)
    step = np.float32(0.01371)
    differ = got_direct != got_wide
    assert differ.any(), "no 8-bit tie was met: the test data no longer exercises the rounding"
    # each difference: one 8-bit step of h (through Relu and y's finer grid), at a near-tie of h
    np.testing.assert_allclose(np.abs(got_direct - got_wide)[differ], step, atol=2e-4)
    h = np.maximum(x, 0)[differ] / step + 128
    assert np.all(np.abs(h - np.floor(h) - 0.5) < 1 / 512 + 1e-4), h
    assert differ.mean() < 1 / 256


def write_rsqrt_model(tmp_path):
    """x -> Sqrt -> s -> Reciprocal -> y, 16-bit encodings on all three, x in [0, 6.6e-4]: an
    RMSNorm's mean square in a Qualcomm-written Qwen3 export, so s stays below 0.026 and y is
    up to ~1000."""
    graph = helper.make_graph(
        [helper.make_node("Sqrt", ["x"], ["s"]), helper.make_node("Reciprocal", ["s"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    path = tmp_path / "src" / "rsqrt.onnx"
    path.parent.mkdir()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10    # what the pinned onnxruntime.dll (1.31.1) loads
    onnx.save(model, str(path))
    act = [("x", 6.6e-4 / 65535), ("s", 0.0258 / 65535), ("y", 60.0 / 65535)]
    encodings = {"version": "1.0.0", "param_encodings": [], "activation_encodings": [
        {"name": n, "bw": 16, "dtype": "INT", "enc_type": "PER_TENSOR", "is_sym": False,
         "scale": [s], "offset": [0]} for n, s in act]}
    enc_path = tmp_path / "src" / "rsqrt.encodings"
    enc_path.write_text(json.dumps(encodings))
    x = np.random.default_rng(4).uniform(1.5e-4, 6.6e-4, (1, 64)).astype(np.float32)
    return path, enc_path, x


def test_the_compilers_form_divides_by_a_one_of_its_own_encoding(tmp_path):
    """The QNN EP quantizes the 1 of a Reciprocal on its input's encoding, which saturates where
    that range is below 1 (tests/test_ortqnn.py measures it on the simulator). The compiler's
    form (integer_weights) has no Reciprocal: a Div of a 16-bit constant that is exactly 1.0,
    the same values as the reference's Reciprocal, bit for bit; the references keep theirs."""
    path, enc_path, x = write_rsqrt_model(tmp_path)
    plain = write_qdq_model(path, enc_path, tmp_path / "plain")
    compiled = write_qdq_model(path, enc_path, tmp_path / "int", integer_weights=True)
    onnx.checker.check_model(str(compiled), full_check=True)
    ops = [n.op_type for n in onnx.load(str(compiled)).graph.node]
    assert "Reciprocal" not in ops and "Div" in ops
    assert "Reciprocal" in [n.op_type for n in onnx.load(str(plain)).graph.node]
    model = onnx.load(str(compiled))
    div = next(n for n in model.graph.node if n.op_type == "Div")
    one = next(n for n in model.graph.node if n.output[0] == div.input[0])
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    q, scale, zero = (inits[i] for i in one.input)
    assert one.op_type == "DequantizeLinear" and q.dtype == np.uint16
    assert (np.float32(q) - np.float32(zero)) * scale == np.float32(1.0)
    np.testing.assert_array_equal(_run(compiled, x), _run(plain, x))
