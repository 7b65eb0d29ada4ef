"""The Qwen3 family: q/k RMSNorm per head before RoPE, no q/k/v biases, tied embeddings.

The generated graphs are checked against a numpy Qwen3 written here from Hugging Face's
modeling_qwen3 (independent of the generator: its own RoPE, its own head layout), the CPU runner
against the same numpy model on the bins' own weights, the size model against the seeds' Qwen3-4B
figure, and qwen3-tiny is built and verified by real doit runs.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from hexbundle.backends import CompileOptions, ConvertOptions, DeviceOptions
from hexbundle.backends.registry import get_backend
from hexbundle.checks import sizes
from hexbundle.config.build import load_build, load_model
from hexbundle.config.layout import graph_files
from hexbundle.config.model import Architecture, Model, Plan, part_weights
from hexbundle.formats.ctxbin import read_ctxbin
from hexbundle.inputs import generate, synthetic, synthetic_graph, synthetic_weights
from hexbundle.runtime.conventions import causal_mask, rope_inputs
from hexbundle.runtime.interpreter import GraphRunner
from hexbundle.support.errors import ConfigError
from conftest import CONFIGS

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
SEED = 3


def small_qwen3(tied: bool, heads: int, kv_heads: int, head_dim: int) -> Model:
    """A qwen3 model small enough for onnxruntime in milliseconds; query width != hidden."""
    arch = Architecture(num_layers=3, hidden_size=64, num_attention_heads=heads,
                        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=160,
                        vocab_size=256, rope_theta=1e6, rms_norm_eps=1e-6,
                        tie_word_embeddings=tied, family="qwen3")
    tiny, _ = load_model(CONFIGS, "qwen3-tiny")
    return replace(tiny, name="qwen3-test", slug="qwen3_test", architecture=arch,
                   context_lengths=(160,), plans={"test": Plan("test", (0, 2, 1))},
                   default_plan="test")


MODELS = {"qwen3-tiny": lambda: load_model(CONFIGS, "qwen3-tiny")[0],
          "untied-6-over-2-heads": lambda: small_qwen3(False, 6, 2, 16),
          "tied-mqa": lambda: small_qwen3(True, 4, 1, 20)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def generated(request, tmp_path_factory):
    """(model, parts, directory of its generated inputs)."""
    model = MODELS[request.param]()
    parts = model.plans[model.default_plan].parts()
    out = tmp_path_factory.mktemp(request.param)
    for part in parts:
        synthetic.generate_part(model, part, out, SEED)
    return model, parts, out


# --------------------------------------------------------------------------- numpy Qwen3


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(t, positions, theta):
    """HF Qwen3RotaryEmbedding + apply_rotary_pos_emb: t (heads, n, d), rotate-half."""
    d = t.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.outer(positions, inv_freq)
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    rotated = np.concatenate([-t[..., d // 2:], t[..., :d // 2]], axis=-1)
    return t * cos + rotated * sin


def qwen3_logits(a: Architecture, w: dict, lm_head: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Qwen3ForCausalLM over the whole sequence, float64. Per layer (modeling_qwen3):
    q = q_norm(q_proj(h).view(n, heads, d)), k = k_norm(k_proj(h).view(n, kv, d)), v unnormed,
    no biases, RoPE after the norms, repeat_kv, causal softmax(q k^T / sqrt(d)) v, o_proj.
    lm_head is [hidden, vocab]."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    n, nh, nkv, d, eps = ids.size, a.num_attention_heads, a.num_kv_heads, a.head_dim, a.rms_norm_eps
    positions = np.arange(n)
    causal = np.where(np.tri(n, dtype=bool), 0.0, -np.inf)
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(a.num_layers):
        p = f"model.layers.{layer}"
        h = rms_norm(x, w[f"{p}.input_layernorm.weight"], eps)
        q = rms_norm((h @ w[f"{p}.self_attn.q_proj.weight"]).reshape(n, nh, d),
                     w[f"{p}.self_attn.q_norm.weight"], eps).transpose(1, 0, 2)
        k = rms_norm((h @ w[f"{p}.self_attn.k_proj.weight"]).reshape(n, nkv, d),
                     w[f"{p}.self_attn.k_norm.weight"], eps).transpose(1, 0, 2)
        v = (h @ w[f"{p}.self_attn.v_proj.weight"]).reshape(n, nkv, d).transpose(1, 0, 2)
        q, k = rope(q, positions, a.rope_theta), rope(k, positions, a.rope_theta)
        k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d) + causal
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + (probs @ v).transpose(1, 0, 2).reshape(n, nh * d) @ w[f"{p}.self_attn.o_proj.weight"]
        h = rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], eps)
        gate = h @ w[f"{p}.mlp.gate_proj.weight"]
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w[f"{p}.mlp.up_proj.weight"])) @ w[f"{p}.mlp.down_proj.weight"]
    return rms_norm(x, w["model.norm.weight"], eps) @ lm_head.astype(np.float64)


def float_lm_head(a: Architecture, w: dict) -> np.ndarray:
    """The float model's LM head: tied, it is the embedding matrix itself (transposed)."""
    return w["model.embed_tokens.weight"].T if a.tie_word_embeddings else w["lm_head.weight"]


# --------------------------------------------------------------------------- running graphs


def window_feeds(model: Model, ar: int, n_valid: int) -> dict:
    """Mask and cos/sin of one call with no past (the past slots hold zeros, masked)."""
    a = model.architecture
    positions = np.pad(np.arange(n_valid), (0, ar - n_valid), mode="edge")
    cos, sin = rope_inputs(positions, a.head_dim, a.rope_theta)
    return {"attention_mask": causal_mask(ar, model.context_length, 0),
            "position_ids_cos": cos, "position_ids_sin": sin}


def run_prompt(model: Model, parts: list, run_graph, ids: np.ndarray) -> np.ndarray:
    """The prompt graphs chained part by part; run_graph(graph, feeds) -> {output: value}."""
    a, ar = model.architecture, model.prompt_ar
    past = model.context_length - ar
    main = {"input_ids": np.pad(ids, (0, ar - ids.size)).astype(np.int32).reshape(1, ar)}
    for part in parts:
        graph = model.graphs(part)[0]
        feeds = dict(main)
        if part.layers:
            feeds.update(window_feeds(model, ar, ids.size))
        for layer in part.layers:
            feeds[f"past_key_{layer}_in"] = np.zeros((a.num_kv_heads, 1, a.head_dim, past), np.float32)
            feeds[f"past_value_{layer}_in"] = np.zeros((a.num_kv_heads, 1, past, a.head_dim), np.float32)
        outs = run_graph(graph, feeds)
        name = synthetic_graph.graph_outputs(model, graph)[-1].name
        if not part.has_head:
            main = {synthetic_graph.input_hidden_name(model, parts[part.index]): outs[name]}
    return outs["logits"][0, :ids.size]


def float_weights(model: Model, parts: list, out: Path) -> dict:
    weights = {}
    for part in parts:
        proto = onnx.load(str(graph_files(out, model.graphs(part)[0])[0]))
        weights.update({t.name: numpy_helper.to_array(t) for t in proto.graph.initializer
                        if not t.name.startswith("/const/")})
    return weights


def build_bins(model: Model, parts: list, inputs: Path, out: Path) -> dict:
    """Every part converted and compiled by the reference backend: part index -> bin path."""
    backend = get_backend("reference")
    bins = {}
    for part in parts:
        dlcs = []
        for g in model.graphs(part):
            onnx_path, _, encodings = graph_files(inputs, g)
            dlcs.append(out / f"{g.name}.dlc")
            backend.convert(onnx_path, encodings, dlcs[-1], g.name, ConvertOptions(16), lambda l: None)
        bins[part.index] = out / f"{part.tag}.bin"
        backend.compile(dlcs, bins[part.index],
                        CompileOptions(tuple(g.name for g in model.graphs(part)),
                                       DeviceOptions(soc_model=0, dsp_arch="v73"), True, True),
                        lambda l: None)
    return bins


@pytest.fixture(scope="module")
def built_bins(generated, tmp_path_factory):
    model, parts, inputs = generated
    return build_bins(model, parts, inputs, tmp_path_factory.mktemp("bins"))


# --------------------------------------------------------------------------- config and weights


def test_family_qwen3_loads_and_an_unknown_family_is_refused(tmp_path):
    model, _ = load_model(CONFIGS, "qwen3-tiny")
    assert model.architecture.family == "qwen3" and model.architecture.tie_word_embeddings
    assert model.architecture.qk_norm and not model.architecture.qkv_bias
    (tmp_path / "configs" / "models").mkdir(parents=True)
    text = (CONFIGS / "configs" / "models" / "qwen3-tiny.toml").read_text()
    path = tmp_path / "configs" / "models" / "qwen3-tiny.toml"
    path.write_text(text.replace('family = "qwen3"', 'family = "gemma2"'))
    with pytest.raises(ConfigError, match=re.escape(f"{path}: key 'architecture.family' is "
                                                    "'gemma2'; allowed: 'qwen2', 'qwen3', "
                                                    "'llama'")):
        load_model(tmp_path, "qwen3-tiny")


def test_qwen3_layers_hold_q_and_k_norms_and_no_qkv_biases():
    model, _ = load_model(CONFIGS, "qwen3-tiny")
    a = model.architecture
    layer = next(p for p in model.plans["four"].parts() if p.layers and not p.has_head)
    names = {w.name: w for w in part_weights(a, model.quantization, layer)}
    assert not [n for n in names if n.endswith(".bias")]
    for n in ("q", "k"):
        w = names[f"model.layers.0.self_attn.{n}_norm.weight"]
        assert w.shape == (a.head_dim,) and w.bitwidth is None
    assert names["model.layers.0.self_attn.q_proj.weight"].shape == (128, 8 * 24)   # 192 != 128
    qwen2, _ = load_model(CONFIGS, "qwen2-tiny")   # the qwen2 family is as it was
    qwen2_names = {w.name for w in part_weights(qwen2.architecture, qwen2.quantization,
                                                 qwen2.plans["four"].parts()[1])}
    assert "model.layers.0.self_attn.q_proj.bias" in qwen2_names
    assert not [n for n in qwen2_names if "q_norm" in n or "k_norm" in n]


def test_a_tied_lm_head_is_the_embedding_as_a_conv_weight_in_the_last_part():
    model, _ = load_model(CONFIGS, "qwen3-tiny")
    parts = model.plans["four"].parts()
    embedding = synthetic_weights.make_weights(model, parts[0], SEED)["model.embed_tokens.weight"]
    head = synthetic_weights.make_weights(model, parts[-1], SEED)["lm_head.weight"]
    assert head.shape == (1024, 128, 1, 1)
    assert head[:, :, 0, 0].tobytes() == embedding.tobytes()
    (spec,) = [w for w in part_weights(model.architecture, model.quantization, parts[-1])
               if w.name == "lm_head.weight"]
    assert (spec.bitwidth, spec.channels) == (8, 1024)   # its own 8-bit copy, per vocab entry


def test_streamed_qwen3_inputs_are_the_whole_tensor_generators_bytes(tmp_path):
    """The tied LM head drawn block by block from the embedding's stream, its per-row encoding
    accumulated over blocks: the same files as from whole tensors."""
    model, _ = load_model(CONFIGS, "qwen3-tiny")
    for part in model.plans["four"].parts():
        whole = synthetic.generate_part(model, part, tmp_path / "whole", SEED)
        streamed = generate.generate_part(model, part, tmp_path / "streamed", SEED, chunk_bytes=3000)
        assert [p.name for p in whole] == [p.name for p in streamed]
        for a, b in zip(whole, streamed):
            assert a.read_bytes() == b.read_bytes(), f"{part.tag}: {a.name}"


# --------------------------------------------------------------------------- the graphs


def test_generated_graphs_pass_the_full_checker(generated):
    model, parts, out = generated
    for part in parts:
        for graph in model.graphs(part):
            onnx.checker.check_model(str(graph_files(out, graph)[0]), full_check=True)


def test_float_onnx_is_a_numpy_qwen3(generated):
    """What `doit verify` compares the bundle with -- the float ONNX in onnxruntime -- computes
    Qwen3: a generator without the q/k norms, with q/k/v biases or an LM head other than the
    embedding fails here."""
    model, parts, out = generated
    sessions = {g.name: ort.InferenceSession(str(graph_files(out, g)[0]),
                                             providers=["CPUExecutionProvider"])
                for p in parts for g in model.graphs(p)}

    def run_graph(graph, feeds):
        session = sessions[graph.name]
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))

    ids = np.random.default_rng(1).integers(0, model.architecture.vocab_size, 100)
    got = run_prompt(model, parts, run_graph, ids)
    weights = float_weights(model, parts, out)
    want = qwen3_logits(model.architecture, weights, float_lm_head(model.architecture, weights), ids)
    assert len(set(want.argmax(-1))) > 10                       # not a degenerate model
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_cpu_runner_on_the_bins_is_a_numpy_qwen3_on_their_weights(generated, built_bins):
    """The interpreter, chained over the bins (I/O not rounded), against the numpy Qwen3 fed the
    bins' dequantized weights: the embedding's 16-bit copy in part 1, the LM head's 8-bit one."""
    model, parts, _ = generated
    readers = {i: read_ctxbin(path) for i, path in built_bins.items()}
    try:
        weights = {name: r.dequantize(r.graph_names[0], name)
                   for r in readers.values() for name in r.graph(r.graph_names[0]).weights}

        def run_graph(graph, feeds):
            return GraphRunner(readers[graph.part.index], graph.name, quantize_io=False).run(feeds)

        ids = np.random.default_rng(2).integers(0, model.architecture.vocab_size, 100)
        got = run_prompt(model, parts, run_graph, ids)
    finally:
        for r in readers.values():
            r.close()
    head = weights.pop("lm_head.weight")
    head = head[:, :, 0, 0].T if head.ndim == 4 else head
    want = qwen3_logits(model.architecture, weights, head, ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_cpu_runner_equals_onnxruntime_on_every_qwen3_graph(generated, built_bins):
    """Each graph of each bin: the interpreter vs onnxruntime running the bin's own topology with
    its weights dequantized, on random inputs."""
    model, parts, _ = generated
    rng = np.random.default_rng(4)
    for index, path in built_bins.items():
        with read_ctxbin(path) as reader:
            for name in reader.graph_names:
                runner = GraphRunner(reader, name, quantize_io=False)
                feeds = {s.name: (rng.integers(0, model.architecture.vocab_size, s.shape).astype(np.int32)
                                  if s.dtype == "int32" else rng.standard_normal(s.shape).astype(np.float32))
                         for s in runner.inputs}
                if "attention_mask" in feeds:
                    graph = next(g for g in model.graphs(parts[index - 1]) if g.name == name)
                    feeds.update(window_feeds(model, graph.ar, graph.ar))
                info, topology = reader.graph(name), reader.topology(name)
                topology.initializer.extend(numpy_helper.from_array(reader.dequantize(name, w), w)
                                            for w in info.weights)
                proto = helper.make_model(topology, opset_imports=[
                    helper.make_opsetid(d, v) for d, v in info.opset_import])
                proto.ir_version = info.ir_version
                session = ort.InferenceSession(proto.SerializeToString(),
                                               providers=["CPUExecutionProvider"])
                want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
                got = runner.run(feeds)
                for out, value in want.items():
                    np.testing.assert_allclose(got[out], value, rtol=1e-4,
                                               atol=1e-4 * max(1.0, np.abs(value).max()),
                                               err_msg=f"{name}: {out}")


# --------------------------------------------------------------------------- sizes


def test_qwen3_tiny_bins_are_the_tensor_expectation_and_the_formula_agrees(tmp_path):
    model, _ = load_model(CONFIGS, "qwen3-tiny")
    plan = model.plans["four"]
    parts = plan.parts()
    for part in parts:
        generate.generate_part(model, part, tmp_path, SEED)
    bins = build_bins(model, parts, tmp_path, tmp_path)
    for part in parts:
        graphs = [sizes.NamedGraph(g.name, graph_files(tmp_path, g)[0], graph_files(tmp_path, g)[2])
                  for g in model.graphs(part)]
        e = sizes.part_expectation(part, graphs, model=model)
        assert e.packed == bins[part.index].stat().st_size, part.tag
        assert sizes._cross_check(e, plan.tolerance_pct) == "", part.tag


def test_qwen3_4b_plan_is_within_tolerance_of_the_seeds_3_0_gb():
    """The seeds: Qwen3-4B w4a16, 4 parts, 3.0 GB on IQ-9075 (no per-part figures)."""
    model, _ = load_model(CONFIGS, "qwen3-4b")
    plan = model.plans[model.default_plan]
    assert plan.layers_per_part == (0, 12, 12, 12)            # qai-hub-models' split
    assert round(plan.expected_total_mib * MIB / 1e9, 1) == 3.0   # the config records the seed
    expected = sizes.expect(model, plan)
    total = sum(e.packed for e in expected) / MIB
    assert abs(total - plan.expected_total_mib) <= plan.expected_total_mib * plan.tolerance_pct / 100, total
    embedding, *layers, last = [e.packed / MIB for e in expected]
    assert embedding == pytest.approx(151936 * 2560 * 2 / MIB, rel=1e-3)     # 16-bit table
    assert layers[0] == pytest.approx(layers[1])
    # the last part: 12 layers + its own 8-bit copy of the tied matrix (+ a scale and an
    # offset per vocab entry, 1.2 MiB)
    assert last - layers[0] == pytest.approx(151936 * 2560 / MIB, rel=5e-3)


# --------------------------------------------------------------------------- end to end


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_qwen3_tiny_builds_and_verifies_with_real_doit(project):
    run = project.doit("bundle", "model=qwen3-tiny")
    assert "size check: qwen3-tiny, plan four (4 parts)" in run.out
    table = run.out[run.out.index("size check: qwen3-tiny"):]
    assert len(re.findall(r"^\s+\d .*  ok$", table, re.M)) == 4, table
    with read_ctxbin(project.bundle("qwen3-tiny") / "qwen3_tiny_part_4_of_4.bin") as reader:
        record = reader.record(reader.graph_names[0], "lm_head.weight")
        assert (record.shape, record.dtype, record.quant.axis) == ((1024, 128, 1, 1), "uint8", 0)
    verify = project.doit("verify", "model=qwen3-tiny")
    assert "verify qwen3-tiny:" in verify.out and "FAIL" not in verify.out, verify.out
    assert re.search(r"^end to end .* ok$", verify.out, re.M), verify.out
    cfg = load_build(project.root, {"model": "qwen3-tiny"})
    assert cfg.model.architecture.family == "qwen3"
