"""The size model: the expectation from the inputs' tensors is what the reference backend builds
(generated model and a qai-hub-models-shaped part); the architecture formula reproduces the
seeds' measured Qwen2.5-7B figures; judging names unpacked and unshared weights."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hexbundle.backends import CompileOptions, ConvertOptions, DeviceOptions
from hexbundle.backends.registry import get_backend
from hexbundle.checks import sizes
from hexbundle.config.build import load_model
from hexbundle.config.layout import graph_files
from hexbundle.config.model import Plan
from hexbundle.formats.encodings import encodings_bytes
from hexbundle.inputs.synthetic import generate_part
from hexbundle.support.errors import HexbundleError, SizeError
from conftest import CONFIGS

ROOT = Path(__file__).resolve().parent.parent
MIB = sizes.MIB


@pytest.fixture(scope="module")
def qwen7b():
    model, _ = load_model(CONFIGS, "qwen2.5-7b-instruct")
    return model


def within(actual, expected, pct):
    return abs(actual - expected) <= expected * pct / 100


def test_eleven_split_parts_match_the_seed_within_one_percent(qwen7b):
    plan = qwen7b.plans["eleven"]
    exp = sizes.expect(qwen7b, plan)
    got = [e.packed / MIB for e in exp]
    for i, (g, seed) in enumerate(zip(got, plan.expected_part_mib), start=1):
        assert within(g, seed, 1.0), f"part {i}: model {g:.1f} MiB vs seed {seed} MiB"
    assert within(sum(got), 4710.4, 1.0)


def test_six_split_total_matches_the_seed_within_one_percent(qwen7b):
    total = sum(e.packed for e in sizes.expect(qwen7b, qwen7b.plans["six"])) / MIB
    assert within(total, 4710.4, 1.0), total


def test_unpacked_decoder_parts_are_about_twice(qwen7b):
    exp = sizes.expect(qwen7b, qwen7b.plans["eleven"])
    ratio = exp[1].unpacked / exp[1].packed
    assert 1.95 < ratio < 2.0, ratio        # seed: 672.6 / 337.3 = 1.994
    assert within(exp[1].unpacked / MIB, 672.6, 1.0)
    assert exp[0].unpacked == exp[0].packed  # the 16-bit embedding has nothing to pack


def judge_one(model, plan, factor_by_part):
    exp = sizes.expect(model, plan)
    actual = {e.part.index: int(e.packed * factor_by_part.get(e.part.index, 1.0)) for e in exp}
    rows = sizes.judge_sizes(model, plan, actual)
    return rows, sizes.format_table(model, plan, rows)


def test_judge_names_unpacked_weights(qwen7b):
    plan = qwen7b.plans["six"]
    exp = sizes.expect(qwen7b, plan)
    actual = {e.part.index: e.packed for e in exp}
    actual[3] = exp[2].unpacked
    rows = sizes.judge_sizes(qwen7b, plan, actual)
    assert [r.verdict for r in rows] == ["ok", "ok", "NOT PACKED", "ok", "ok", "ok"]
    table = sizes.format_table(qwen7b, plan, rows)
    with pytest.raises(SizeError, match=r"part\(s\) 3: 4-bit weights were not packed"):
        sizes.raise_on_failure(qwen7b, plan, rows, table)


def test_judge_names_unshared_weights_and_other_deviations(qwen7b):
    plan = qwen7b.plans["six"]
    exp = sizes.expect(qwen7b, plan)
    actual = {e.part.index: e.packed for e in exp}
    actual[2] = exp[1].unshared
    rows = sizes.judge_sizes(qwen7b, plan, actual)
    with pytest.raises(SizeError, match="stored 2 times"):
        sizes.raise_on_failure(qwen7b, plan, rows, "")
    actual[2] = int(exp[1].packed * 1.1)
    rows = sizes.judge_sizes(qwen7b, plan, actual)
    assert rows[1].verdict == "OFF"
    with pytest.raises(SizeError, match="outside tolerance"):
        sizes.raise_on_failure(qwen7b, plan, rows, "")


def test_within_tolerance_passes_and_prints_a_table(qwen7b):
    plan = qwen7b.plans["six"]
    rows, table = judge_one(qwen7b, plan, {2: 1.01})
    sizes.raise_on_failure(qwen7b, plan, rows, table)
    assert "total" in table and "(a known-good build measured 4710.4)" in table


# --- the expectation from the inputs' tensors vs what the reference backend builds ---------------

DEVICE = DeviceOptions(soc_model=0, dsp_arch="v73")   # as sizes.header_fields() assumes
BUILDS = {"packed": (True, True), "unpacked": (False, True), "unshared": (True, False)}


def build_part(graphs: list, out: Path) -> dict:
    """Convert every graph and compile the part three ways; -> {build: bin size}."""
    backend = get_backend("reference")
    dlcs = []
    for g in graphs:
        dlc = out / f"{g.name}.dlc"
        backend.convert(g.onnx, g.encodings, dlc, g.name, ConvertOptions(16), lambda line: None)
        dlcs.append(dlc)
    found = {}
    for build, (packing, sharing) in BUILDS.items():
        path = out / f"{build}.bin"
        backend.compile(dlcs, path, CompileOptions(tuple(g.name for g in graphs), DEVICE,
                                                   packing, sharing), lambda line: None)
        found[build] = path.stat().st_size
    return found


def expected_by_build(e) -> dict:
    return {"packed": e.packed, "unpacked": e.unpacked, "unshared": e.unshared}


@pytest.fixture(scope="module")
def tiny_built(tmp_path_factory):
    """The embedded qwen2-tiny model's generated inputs, every part built three ways."""
    model, _ = load_model(CONFIGS, "qwen2-tiny")
    out = tmp_path_factory.mktemp("tiny")
    parts = []
    for part in model.plans["four"].parts():
        generate_part(model, part, out, seed=0)
        graphs = [sizes.NamedGraph(g.name, graph_files(out, g)[0], graph_files(out, g)[2])
                  for g in model.graphs(part)]
        parts.append((part, graphs, build_part(graphs, out)))
    return model, parts


def test_generated_model_bins_are_the_tensor_expectation_to_the_byte(tiny_built):
    model, parts = tiny_built
    for part, graphs, built in parts:
        e = sizes.part_expectation(part, graphs, 16, model=model)
        assert expected_by_build(e) == built, f"part {part.index}"
        # the architecture formula agrees within the plan's tolerance: no cross-check note
        assert sizes._cross_check(e, model.plans["four"].tolerance_pct) == ""


@pytest.mark.parametrize("wrong", [{"intermediate_size": 384}, {"intermediate_size": 768}])
def test_the_architecture_cross_check_sees_a_config_that_is_not_the_graphs(tiny_built, wrong):
    """The other direction: with the graphs' own topology, header and padding measured, what is
    left of the formula is the architecture's weights, and a config whose sizes are not the
    graphs' (here the MLP width, 512 in the graphs) is noted beyond the tolerance."""
    model, parts = tiny_built
    other = replace(model, architecture=replace(model.architecture, **wrong))
    notes = [sizes._cross_check(sizes.part_expectation(part, graphs, 16, model=other),
                                model.plans["four"].tolerance_pct)
             for part, graphs, _ in parts if part.layers]
    assert notes and all("the architecture formula gives" in n for n in notes), notes


# A part shaped like a qai-hub-models export: per-head 1x1 Conv q/v with float biases, o_proj and
# down_proj 1x1 Conv [out, in, 1, 1], gate/up and the LM head on anonymous MatMul initializers,
# 16-bit quantized norm weights, tensors under 1 KiB inline, a Constant node and small constants.
H, HEADS, HEAD_DIM, FFN, VOCAB = 256, 2, 128, 512, 512


def qaihm_weights(rng) -> dict:
    w = {}
    for h in range(HEADS):
        for proj in ("q", "v"):
            w[f"model.layers.0.self_attn.{proj}_proj_sha.{h}.weight"] = rng.normal(0, .05, (HEAD_DIM, H, 1, 1))
            w[f"model.layers.0.self_attn.{proj}_proj_sha.{h}.bias"] = rng.normal(0, .05, (HEAD_DIM,))
    w["model.layers.0.self_attn.o_proj.weight"] = rng.normal(0, .05, (H, 2 * HEADS * HEAD_DIM, 1, 1))
    w["model.layers.0.input_layernorm.weight"] = rng.normal(1, .1, (1, H, 1, 1))
    w["model.layers.0.post_attention_layernorm.weight"] = rng.normal(1, .1, (1, H, 1, 1))
    w["onnx::MatMul_1201"] = rng.normal(0, .05, (H, FFN))          # gate
    w["onnx::MatMul_1202"] = rng.normal(0, .05, (H, FFN))          # up
    w["model.layers.0.mlp.down_proj.weight"] = rng.normal(0, .05, (H, FFN, 1, 1))
    w["model.norm.weight"] = rng.normal(1, .1, (1, H, 1, 1))
    w["onnx::MatMul_2001"] = rng.normal(0, .05, (H, VOCAB))        # LM head
    w["eps"] = np.array([1e-6])                                     # small: stays in the topology
    return {k: v.astype(np.float32) for k, v in w.items()}


def qaihm_graph(weights: dict, seq: int) -> onnx.GraphProto:
    L0 = "model.layers.0."
    shapes = {"to_2d": np.array([H, seq], np.int64), "to_4d": np.array([1, FFN, 1, seq], np.int64),
              "to_4d_h": np.array([1, H, 1, seq], np.int64)}
    n = helper.make_node
    nodes = [n("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32))),
             n("Mul", ["hidden", L0 + "input_layernorm.weight"], ["x0"])]
    heads = []
    for h in range(HEADS):
        for proj in ("q", "v"):
            name = f"{L0}self_attn.{proj}_proj_sha.{h}"
            nodes.append(n("Conv", ["x0", name + ".weight", name + ".bias"], [f"{proj}{h}"]))
            heads.append(f"{proj}{h}")
    nodes += [
        n("Concat", heads, ["attn"], axis=1),
        n("Conv", ["attn", L0 + "self_attn.o_proj.weight"], ["o"]),
        n("Add", ["hidden", "o"], ["r1"]),
        n("Mul", ["r1", L0 + "post_attention_layernorm.weight"], ["x1"]),
        n("Reshape", ["x1", "to_2d"], ["x1_2d"]), n("Transpose", ["x1_2d"], ["x1_t"], perm=[1, 0]),
        n("MatMul", ["x1_t", "onnx::MatMul_1201"], ["g"]), n("Sigmoid", ["g"], ["gs"]),
        n("MatMul", ["x1_t", "onnx::MatMul_1202"], ["u"]), n("Mul", ["gs", "u"], ["gu"]),
        n("Transpose", ["gu"], ["gu_t"], perm=[1, 0]), n("Reshape", ["gu_t", "to_4d"], ["gu_4d"]),
        n("Conv", ["gu_4d", L0 + "mlp.down_proj.weight"], ["d"]),
        n("Add", ["r1", "d"], ["r2"]), n("Mul", ["r2", "two"], ["r3"]), n("Add", ["r3", "eps"], ["r4"]),
        n("Mul", ["r4", "model.norm.weight"], ["y"]),
        n("Reshape", ["y", "to_2d"], ["y_2d"]), n("Transpose", ["y_2d"], ["y_t"], perm=[1, 0]),
        n("MatMul", ["y_t", "onnx::MatMul_2001"], ["logits"]),
    ]
    inits = [numpy_helper.from_array(v, name=k) for k, v in {**weights, **shapes}.items()]
    return helper.make_graph(
        nodes, "qaihm_part",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, H, 1, seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [seq, VOCAB])], inits)


def per_channel(w: np.ndarray, axis: int, bw: int) -> dict:
    amax = np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis))
    return {"enc_type": "PER_CHANNEL", "is_sym": True, "bw": bw, "dtype": "INT",
            "scale": [float(s) for s in amax / (2 ** (bw - 1) - 1)],
            "offset": [-(2 ** (bw - 1))] * len(amax)}


def qaihm_encodings(weights: dict) -> dict:
    """AIMET 1.0.0: 4-bit per-channel decoder weights, 8-bit per-channel LM head, 16-bit norms."""
    params = []
    for name, w in weights.items():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            enc = {"enc_type": "PER_TENSOR", "is_sym": True, "bw": 16, "dtype": "INT",
                   "scale": [float(np.abs(w).max()) / 32767], "offset": [-32768]}
        elif name == "onnx::MatMul_2001":
            enc = per_channel(w, 1, 8)
        elif name.startswith("onnx::MatMul"):
            enc = per_channel(w, 1, 4)
        elif name.endswith("weight"):
            enc = per_channel(w, 0, 4)          # 1x1 Conv [out, in, 1, 1]: output axis 0
        else:
            continue                            # biases and eps: no encoding
        params.append({"name": name, **enc})
    act = [{"name": t, "bw": 16, "dtype": "INT", "enc_type": "PER_TENSOR", "is_sym": True,
            "scale": [1e-3], "offset": [-32768]} for t in ("hidden", "logits")]
    return {"version": "1.0.0", "activation_encodings": act, "param_encodings": params,
            "excluded_layers": [], "quantizer_args": {}}


@pytest.fixture(scope="module")
def qaihm_built(tmp_path_factory):
    out = tmp_path_factory.mktemp("qaihm")
    weights = qaihm_weights(np.random.default_rng(0))
    graphs = []
    for name, seq in (("prompt_ar8_cl64_1_of_1", 8), ("token_ar1_cl64_1_of_1", 1)):
        model = helper.make_model(qaihm_graph(weights, seq), opset_imports=[helper.make_opsetid("", 17)])
        onnx_path = out / f"{name}.onnx"
        # as qai-hub-models exports: tensors under 1 KiB inline, the rest in external data
        onnx.save_model(model, str(onnx_path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=f"{name}.data", size_threshold=1024)
        encodings = out / f"{name}.encodings"
        encodings.write_bytes(encodings_bytes(qaihm_encodings(weights)))
        graphs.append(sizes.NamedGraph(name, onnx_path, encodings))
    return graphs, build_part(graphs, out)


def one_part_plan() -> Plan:
    return Plan("one", (1,), tolerance_pct=2.0)


def test_qaihm_shaped_part_gets_what_the_reference_backend_builds(qaihm_built):
    graphs, built = qaihm_built
    inline = {i.name for i in onnx.load(str(graphs[0].onnx), load_external_data=False).graph.initializer
              if i.data_location != TensorProto.EXTERNAL}
    assert "model.layers.0.self_attn.q_proj_sha.0.bias" in inline and "eps" in inline
    e = sizes.part_expectation(one_part_plan().parts()[0], graphs, 16)
    assert expected_by_build(e) == built
    assert e.has_4bit


def test_expectation_reads_no_weight_data(qaihm_built, tmp_path):
    graphs, built = qaihm_built
    bare = []
    for g in graphs:   # the .onnx and .encodings without the external data next to them
        for path in (g.onnx, g.encodings):
            (tmp_path / path.name).write_bytes(path.read_bytes())
        bare.append(sizes.NamedGraph(g.name, tmp_path / g.onnx.name, tmp_path / g.encodings.name))
    assert sizes.part_expectation(one_part_plan().parts()[0], bare, 16).packed == built["packed"]


def test_qaihm_shaped_unpacked_part_is_named_not_packed(qaihm_built, qwen7b):
    graphs, built = qaihm_built
    plan = one_part_plan()
    # an architecture figure far off (the config's tensors are not the export's): noted, not judged
    e = replace(sizes.part_expectation(plan.parts()[0], graphs, 16), architecture=built["packed"] * 2)
    rows = sizes.judge([e], plan, {1: built["packed"]})
    assert rows[0].verdict == "ok" and "+100.0% vs the inputs' tensors" in rows[0].note
    assert "note: part 1: the architecture formula" in sizes.format_table(qwen7b, plan, rows)
    rows = sizes.judge([e], plan, {1: built["unpacked"]})
    assert rows[0].verdict == "NOT PACKED"
    with pytest.raises(SizeError, match=r"part\(s\) 1: 4-bit weights were not packed"):
        sizes.raise_on_failure(qwen7b, plan, rows, "")


def test_a_graph_is_planned_once_for_the_same_bytes(tiny_built, tmp_path):
    """The bundle task's size check and its step plan the same graphs in one process: the plan
    is made once for the same bytes, and made again when the encodings change."""
    model, parts = tiny_built
    g = parts[1][1][0]
    for path in (g.onnx, g.encodings):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    graph = sizes.NamedGraph(g.name, tmp_path / g.onnx.name, tmp_path / g.encodings.name)
    first = sizes.plan_graph(graph)
    assert sizes.plan_graph(graph) is first
    # another part's encodings (other layers' weights) under the same name: read again, refused
    graph.encodings.write_bytes(parts[2][1][0].encodings.read_bytes())
    with pytest.raises(HexbundleError, match="encoding"):
        sizes.plan_graph(graph)
