"""The CPU runner's op set for qai-hub-models exports (ONNX IR 11, opset 17), op by op.

Each small graph goes through the real reference backend (convert + compile, every tensor of the
ONNX, Constant values included, in external data as exports write them) and is run by
GraphRunner; onnxruntime on the same float ONNX is the reference.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from hexbundle.backends import CompileOptions, ConvertOptions, DeviceOptions
from hexbundle.backends.registry import get_backend
from hexbundle.formats.ctxbin import read_ctxbin
from hexbundle.runtime import interpreter
from hexbundle.runtime.interpreter import GraphRunner
from hexbundle.runtime.onnx_graph import OnnxGraph
from hexbundle.support.errors import VerifyError

GRAPH = "ops"
DEVICE = DeviceOptions(soc_model=77, dsp_arch="v73")
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


# ------------------------------------------------------------------------------ helpers


def make_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    """An IR 11, opset 17 model as qai-hub-models exports them (0.65's checkpoints: opset 18);
    I/O as (name, type, shape)."""
    graph = helper.make_graph(
        nodes, GRAPH, [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in dict(initializers).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 11
    return model


def constant(name, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}_node",
                            value=numpy_helper.from_array(np.asarray(value), name))


def per_channel_int8(w: np.ndarray, per_tensor: bool = False) -> list:
    """Legacy AIMET param encoding, symmetric 8-bit per output channel (axis 0) or per tensor."""
    scales = np.abs(w).reshape(1 if per_tensor else len(w), -1).max(axis=1) / 127
    return [{"bitwidth": 8, "dtype": "int", "is_symmetric": "True", "scale": float(s),
             "offset": -128, "min": float(-128 * s), "max": float(127 * s)} for s in scales]


def build_bin(model: onnx.ModelProto, tmp_path, params=None):
    """convert + compile with the reference backend; every tensor (Constant values too) saved as
    external data."""
    src = tmp_path / "ops.onnx"
    model = onnx.ModelProto.FromString(model.SerializeToString())   # saving moves data out
    onnx.save_model(model, str(src), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ops.data", size_threshold=0, convert_attribute=True)
    encodings = tmp_path / "ops.encodings"
    encodings.write_text(json.dumps({"version": "0.6.1", "activation_encodings": {},
                                     "param_encodings": params or {}}))
    backend = get_backend("reference")
    backend.convert(src, encodings, tmp_path / "ops.dlc", GRAPH,
                    ConvertOptions(float_bitwidth=32), lambda line: None)
    bin_path = tmp_path / "ops.bin"
    backend.compile([tmp_path / "ops.dlc"], bin_path,
                    CompileOptions(graph_names=(GRAPH,), device=DEVICE), lambda line: None)
    return bin_path


def run_runner(bin_path, feeds) -> dict:
    with read_ctxbin(bin_path) as reader:
        return GraphRunner(reader, GRAPH, quantize_io=False).run(feeds)


def run_onnxruntime(model_bytes, feeds) -> dict:
    session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def dequantized_model(bin_path) -> bytes:
    """The bin's graph as an ONNX model with every weight dequantized: what the runner should
    compute exactly."""
    with read_ctxbin(bin_path) as reader:
        info = reader.graph(GRAPH)
        graph = reader.topology(GRAPH)
        graph.initializer.extend(numpy_helper.from_array(reader.dequantize(GRAPH, w), w)
                                 for w in info.weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v)
                                                    for d, v in info.opset_import])
    model.ir_version = info.ir_version
    return model.SerializeToString()


def assert_runner_matches_onnxruntime(model, feeds, tmp_path, params=None, tol=1e-5):
    got = run_runner(build_bin(model, tmp_path, params), feeds)
    want = run_onnxruntime(model.SerializeToString(), feeds)
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_allclose(got[name], value, rtol=tol, atol=tol, err_msg=name)


RNG = np.random.default_rng(11)


def normal(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------ op by op


def test_constant_nodes_with_tensor_float_and_int_values(tmp_path):
    nodes = [constant("bias", normal(2, 3)),
             helper.make_node("Constant", [], ["half"], name="half_node", value_float=0.5),
             helper.make_node("Constant", [], ["scales"], name="scales_node", value_floats=[1.0, 2.0, 3.0]),
             helper.make_node("Constant", [], ["shape"], name="shape_node", value_ints=[3, 2]),
             helper.make_node("Add", ["x", "bias"], ["a"]),
             helper.make_node("Mul", ["a", "half"], ["b"]),
             helper.make_node("Mul", ["b", "scales"], ["c"]),
             helper.make_node("Reshape", ["c", "shape"], ["y"])]
    model = make_model(nodes, [("x", FLOAT, [2, 3])], [("y", FLOAT, [3, 2])])
    assert_runner_matches_onnxruntime(model, {"x": normal(2, 3)}, tmp_path)


@pytest.mark.parametrize("per_tensor", [False, True], ids=["per-channel", "per-tensor"])
def test_conv_1x1_with_bias_and_an_int8_weight(tmp_path, monkeypatch, per_tensor):
    """The qai-hub-models projection: NCHW (1, C, 1, S), 1x1 Conv, group 1, with bias. The runner
    must compute exactly the dequantized weight's product, and the float one within int8 error."""
    w, b = normal(96, 32, 1, 1) * 0.2, normal(96)
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="q_proj", group=1,
                          kernel_shape=[1, 1], pads=[0, 0, 0, 0], strides=[1, 1],
                          dilations=[1, 1])],
        [("x", FLOAT, [1, 32, 1, 7])], [("y", FLOAT, [1, 96, 1, 7])], {"w": w, "b": b})
    bin_path = build_bin(model, tmp_path, {"w": per_channel_int8(w, per_tensor)})
    monkeypatch.setattr(interpreter, "_direct_conv", None)     # must take the matmul path
    feeds = {"x": normal(1, 32, 1, 7)}
    got = run_runner(bin_path, feeds)["y"]
    np.testing.assert_allclose(got, run_onnxruntime(dequantized_model(bin_path), feeds)["y"],
                               rtol=1e-5, atol=1e-5)
    want = run_onnxruntime(model.SerializeToString(), feeds)["y"]
    np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want).max())


@pytest.mark.parametrize("attrs, x_shape, w_shape", [
    ({"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 2}, [1, 4, 9, 8], [6, 2, 3, 3]),
    ({"dilations": [2, 1], "pads": [2, 0, 1, 1]}, [2, 3, 7, 6], [4, 3, 3, 2]),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, [1, 3, 7, 6], [4, 3, 3, 2]),
    ({"auto_pad": "SAME_LOWER", "strides": [2, 1]}, [1, 2, 6, 5], [2, 2, 2, 2]),
    ({"group": 4}, [1, 4, 5, 5], [8, 1, 1, 1]),          # depthwise 1x1: not the matmul path
    ({"pads": [2, 1], "strides": [3]}, [1, 3, 11], [5, 3, 4]),   # 1-D
], ids=["strided-padded-grouped", "dilated", "same-upper", "same-lower", "depthwise", "1d"])
def test_general_conv(tmp_path, attrs, x_shape, w_shape):
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", **attrs)],
                       [("x", FLOAT, x_shape), ("w", FLOAT, w_shape), ("b", FLOAT, [w_shape[0]])],
                       [("y", FLOAT, None)])
    feeds = {"x": normal(*x_shape), "w": normal(*w_shape), "b": normal(w_shape[0])}
    assert_runner_matches_onnxruntime(model, feeds, tmp_path, tol=1e-4)


def test_cast_sub_and_integer_div(tmp_path):
    nodes = [helper.make_node("Cast", ["x"], ["x_int"], to=INT64),        # truncates toward 0
             helper.make_node("Div", ["x_int", "two"], ["halves"]),       # int: truncates too
             helper.make_node("Cast", ["halves"], ["halves_float"], to=FLOAT),
             helper.make_node("Sub", ["x", "halves_float"], ["y"])]
    model = make_model(nodes, [("x", FLOAT, [6])], [("y", FLOAT, [6]), ("halves", INT64, [6])],
                       {"two": np.array(2, np.int64)})
    x = np.array([-7.9, -3.5, -0.2, 0.7, 5.5, 9.9], np.float32)
    assert_runner_matches_onnxruntime(model, {"x": x}, tmp_path)


def test_reciprocal_of_a_dynamo_rmsnorm(tmp_path):
    """qai-hub-models 0.65's torch.export graphs normalise with x * Reciprocal(Sqrt(...))."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
             helper.make_node("Add", ["ms", "eps"], ["ms_eps"]),
             helper.make_node("Sqrt", ["ms_eps"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["inv"]),
             helper.make_node("Mul", ["x", "inv"], ["y"])]
    model = make_model(nodes, [("x", FLOAT, [2, 8])], [("y", FLOAT, None)],
                       {"axes": np.array([-1], np.int64), "eps": np.array(1e-6, np.float32)},
                       opset=18)
    assert_runner_matches_onnxruntime(model, {"x": normal(2, 8)}, tmp_path, tol=1e-6)


def test_unsqueeze_and_squeeze_take_axes_as_an_input(tmp_path):
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["u"]),
             helper.make_node("Squeeze", ["u", "axes"], ["s"]),
             helper.make_node("Unsqueeze", ["s", "one"], ["v"]),
             helper.make_node("Squeeze", ["v"], ["y"])]          # no axes: every 1 goes
    model = make_model(nodes, [("x", FLOAT, [3, 1, 4])], [("u", FLOAT, None), ("y", FLOAT, None)],
                       {"axes": np.array([0, -1], np.int64), "one": np.array([1], np.int64)})
    assert_runner_matches_onnxruntime(model, {"x": normal(3, 1, 4)}, tmp_path)


def test_gather_with_int64_indices_from_an_activation_and_from_the_embedding(tmp_path):
    embed = normal(50, 16)
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["x"], axis=0),
             helper.make_node("Gather", ["x", "pick"], ["y"], axis=2)]
    model = make_model(nodes, [("input_ids", INT64, [1, 5])], [("x", FLOAT, [1, 5, 16]),
                                                               ("y", FLOAT, [1, 5, 2])],
                       {"embed": embed, "pick": np.array([-1, 3], np.int64)})
    bin_path = build_bin(model, tmp_path, {"embed": per_channel_int8(embed)})
    feeds = {"input_ids": np.array([[0, 49, 7, 7, 3]], np.int64)}
    got = run_runner(bin_path, feeds)
    for name, value in run_onnxruntime(dequantized_model(bin_path), feeds).items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-6, err_msg=name)


def test_identity_of_a_weight_and_as_a_graph_output(tmp_path):
    """Real parts alias deduplicated weights (norm weights, biases) through Identity nodes: a
    weight behind one still reaches MatMul (streamed), and an Identity output comes back as an
    array. (Per-tensor: convert cannot tell a channel axis through an Identity.)"""
    w = normal(24, 40)
    nodes = [helper.make_node("Identity", ["w"], ["w_alias"]),
             helper.make_node("MatMul", ["x", "w_alias"], ["y"]),
             helper.make_node("Identity", ["y"], ["y_out"])]
    model = make_model(nodes, [("x", FLOAT, [3, 24])], [("y_out", FLOAT, [3, 40])], {"w": w})
    bin_path = build_bin(model, tmp_path, {"w": per_channel_int8(w, per_tensor=True)})
    feeds = {"x": normal(3, 24)}
    np.testing.assert_allclose(run_runner(bin_path, feeds)["y_out"],
                               run_onnxruntime(dequantized_model(bin_path), feeds)["y_out"],
                               rtol=1e-5, atol=1e-5)


def test_a_failing_op_names_the_node_the_op_and_its_inputs(tmp_path):
    model = make_model([helper.make_node("Squeeze", ["x", "axes"], ["y"], name="bad_squeeze")],
                       [("x", FLOAT, [3, 4])], [("y", FLOAT, None)],
                       {"axes": np.array([0], np.int64)})
    with pytest.raises(VerifyError, match=r"ops.bin: graph ops: node bad_squeeze \(Squeeze\) "
                                          r"failed on 'x' float32\[3, 4\], 'axes' int64\[1\]"):
        run_runner(build_bin(model, tmp_path), {"x": normal(3, 4)})


# ------------------------------------------------------------------------------ end to end


def qaihm_like_block(vocab=64, hidden=32, ffn=96, seq=6):
    """A decoder-ish block written the way qai-hub-models exports: int64 input_ids, Constants,
    RMSNorm from Pow/ReduceMean/Sqrt/Div, projections as 1x1 Conv over (1, C, 1, S), SiLU from
    Sigmoid, Slice/Concat, Softmax; every op of those exports."""
    weights = {"embed": normal(vocab, hidden), "norm": 1 + 0.1 * normal(hidden),
               "up": normal(ffn, hidden, 1, 1) * 0.2, "up_bias": 0.1 * normal(ffn),
               "down": normal(hidden, ffn, 1, 1) * 0.1, "down_bias": 0.1 * normal(hidden)}
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["x"], axis=0),               # 1 S H
        constant("two", np.float32(2)), constant("eps", np.float32(1e-6)),
        constant("last", np.array([-1], np.int64)),
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["ms_eps"]),
        helper.make_node("Sqrt", ["ms_eps"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["normed"]),
        helper.make_node("Mul", ["normed", "norm"], ["h"]),
        helper.make_node("Transpose", ["h"], ["h_t"], perm=[0, 2, 1]),                   # 1 H S
        constant("axis2", np.array([2], np.int64)),
        helper.make_node("Unsqueeze", ["h_t", "axis2"], ["h4"]),                         # 1 H 1 S
        helper.make_node("Conv", ["h4", "up", "up_bias"], ["u"], name="up_proj", group=1,
                         kernel_shape=[1, 1]),
        helper.make_node("Sigmoid", ["u"], ["gate"]),
        helper.make_node("Mul", ["u", "gate"], ["act"]),
        helper.make_node("Conv", ["act", "down", "down_bias"], ["d"], name="down_proj",
                         kernel_shape=[1, 1]),
        helper.make_node("Squeeze", ["d", "axis2"], ["d3"]),
        helper.make_node("Transpose", ["d3"], ["d_t"], perm=[0, 2, 1]),                  # 1 S H
        helper.make_node("Sub", ["d_t", "x"], ["res"]),
        constant("zero", np.array([0], np.int64)), constant("four", np.array([4], np.int64)),
        helper.make_node("Slice", ["res", "zero", "four", "last"], ["head"]),
        helper.make_node("Concat", ["head", "res"], ["cat"], axis=-1),
        helper.make_node("Softmax", ["cat"], ["probs"], axis=-1),
        helper.make_node("Cast", ["input_ids"], ["ids_float"], to=FLOAT),
        helper.make_node("Unsqueeze", ["ids_float", "last"], ["ids3"]),
        helper.make_node("Mul", ["probs", "ids3"], ["out"]),
    ]
    model = make_model(nodes, [("input_ids", INT64, [1, seq])],
                       [("out", FLOAT, [1, seq, hidden + 4])], weights)
    params = {name: per_channel_int8(weights[name]) for name in ("embed", "up", "down")}
    return model, params


def test_a_qaihm_like_block_converted_and_compiled_runs_like_onnxruntime(tmp_path):
    model, params = qaihm_like_block()
    bin_path = build_bin(model, tmp_path, params)
    feeds = {"input_ids": np.array([[1, 5, 63, 0, 17, 5]], np.int64)}
    got = run_runner(bin_path, feeds)["out"]
    exact = run_onnxruntime(dequantized_model(bin_path), feeds)["out"]
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-6)
    want = run_onnxruntime(model.SerializeToString(), feeds)["out"]
    np.testing.assert_allclose(got, want, atol=0.03 * np.abs(want).max())


def test_convert_inlines_constant_values_saved_as_external_data(tmp_path):
    model, params = qaihm_like_block()
    with read_ctxbin(build_bin(model, tmp_path, params)) as reader:
        topology = reader.topology(GRAPH)
        info = reader.graph(GRAPH)
    values = [a.t for n in topology.node if n.op_type == "Constant" for a in n.attribute]
    assert values and all(t.data_location != TensorProto.EXTERNAL for t in values)
    assert {n.name: numpy_helper.to_array(n.attribute[0].t).tolist() for n in topology.node
            if n.op_type == "Constant"}["last_node"] == [-1]
    assert info.ir_version == 11 and info.inputs[0].dtype == "int64"


def test_float_reference_names_the_file_when_onnxruntime_refuses_its_ir_version(tmp_path):
    model = make_model([helper.make_node("Sqrt", ["x"], ["y"])], [("x", FLOAT, [2])],
                       [("y", FLOAT, [2])])
    model.ir_version = 99
    path = tmp_path / "future.onnx"
    onnx.save_model(model, str(path))
    with pytest.raises(VerifyError, match=r"future.onnx: onnxruntime .* cannot load IR version 99"):
        OnnxGraph(path).run({"x": np.ones(2, np.float32)})
