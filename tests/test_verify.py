"""`doit verify` and the CPU runner.

Every failure class verify must catch is injected into a COPY of a really built bundle (bins
re-written through the format's own writer, so digests and records stay valid: only the numbers
are wrong), and verify must fail naming the broken part while the parts before it pass.
"""
import ast
import json
import re
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from onnx import helper, numpy_helper

from hexbundle.checks.verify import compare_bundle_with_onnx
from hexbundle.config.build import load_build
from hexbundle.config.layout import Layout
from hexbundle.formats.container import QuantParams, Tensor
from hexbundle.formats.ctxbin import CtxGraph, read_ctxbin, write_ctxbin
from hexbundle.graph.codekey import code_files
from hexbundle.graph.keys import STEP_CODE
from hexbundle.runtime.conventions import causal_mask, rope_inputs
from hexbundle.runtime.interpreter import GraphRunner
from hexbundle.steps.options import verify_options
from hexbundle.support.errors import ConfigError, VerifyError

PARTS = 4
PACKAGE = Path(__file__).resolve().parent.parent / "hexbundle"


def bin_name(index):
    return f"qwen2_tiny_part_{index}_of_{PARTS}.bin"


# ------------------------------------------------------------------------------ helpers


@pytest.fixture(scope="module")
def tiny(built):
    cfg = load_build(built.root)
    return cfg, Layout(cfg)


@pytest.fixture
def bundle_copy(built, tmp_path):
    """A private copy of the built bundle (real files, not hard links to build/bin)."""
    return shutil.copytree(built.bundle(), tmp_path / "bundle")


def run_verify(tiny, bundle_dir):
    cfg, layout = tiny
    return compare_bundle_with_onnx(layout, verify_options(cfg), bundle_dir=bundle_dir,
                                    log=lambda line: None)


def rewrite_bin(path, alter_tensor=None, alter_topology=None, weight_sharing=None,
                alter_info=None):
    """Re-write a context binary in place through write_ctxbin, altering what it stores.

    alter_tensor(graph_name, Tensor) -> Tensor sees every graph's copy of every weight;
    weight_sharing=False gives each graph its own copy (so one graph's copy can differ).
    """
    with read_ctxbin(path) as reader:
        options = dict(reader.options)
        graphs = []
        for info in reader.graphs:
            topology = reader.topology(info.name)
            if alter_topology:
                alter_topology(topology)
            tensors = []
            for name in info.weights:
                q = reader.quant_params(info.name, name)
                if q is not None:
                    q = QuantParams(q.bitwidth, q.axis, q.scale.copy(), q.offset.copy(), q.symmetric)
                tensor = Tensor(name, reader.record(info.name, name).dtype,
                                np.array(reader.weight(info.name, name)), q)
                tensors.append(alter_tensor(info.name, tensor) if alter_tensor else tensor)
            info = alter_info(info) if alter_info else info
            graphs.append(CtxGraph(info, topology.SerializeToString(deterministic=True), tensors))
        device, producer = dict(reader.device), dict(reader.producer)
    if weight_sharing is not None:
        options["weight_sharing"] = weight_sharing
    write_ctxbin(path, graphs, weights_packing=options["weights_packing"],
                 weight_sharing=options["weight_sharing"],
                 optimization_type=options["optimization_type"], vtcm_mb=options["vtcm_mb"],
                 device=device, producer=producer)


def with_quant(tensor, scale_sign=1, offset_sign=1):
    if tensor.quant is None:
        return tensor
    q = tensor.quant
    return Tensor(tensor.name, tensor.dtype, tensor.values,
                  QuantParams(q.bitwidth, q.axis, (scale_sign * q.scale).astype(np.float32),
                              (offset_sign * q.offset).astype(np.int32), q.symmetric))


def assert_diverges_at(report, index):
    """verify failed, the message names part `index`, and every part before it passed."""
    assert not report.ok
    message = report.failure_message()
    assert f"part {index} of {PARTS} ({bin_name(index)}) diverged first" in message, message
    earlier = [r for r in report.rows if 0 < r.part_index < index]
    assert earlier and all(r.ok for r in earlier), report.table()
    return message


def edit_genie_config(bundle_dir, edit):
    path = bundle_dir / "genie_config.json"
    doc = json.loads(path.read_text())
    edit(doc["dialog"])
    path.write_text(json.dumps(doc, indent=2))


def set_toml(path, **values):
    text = path.read_text()
    for key, value in values.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key
    path.write_text(text)


# ------------------------------------------------------------------------------ doit verify


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_doit_verify_passes_on_the_built_bundle_and_prints_the_table(built):
    run = built.doit("verify")
    assert "verify" in run.executed
    for index in range(1, PARTS + 1):
        rows = [line for line in run.out.splitlines() if line.startswith(f"part {index}/4 ")]
        assert rows and all(line.rstrip().endswith("ok") for line in rows), run.out
    assert re.search(r"^end to end +chained vs reference .*ok$", run.out, re.M), run.out
    table = run.out[run.out.index("verify qwen2-tiny:"):run.out.index("every row, with the")]
    assert max(len(line) for line in table.splitlines()) <= 120, table
    report = json.loads((built.build_dir() / "verify" / "report.json").read_text(),
                        parse_constant=lambda name: pytest.fail(f"report.json holds {name}"))
    assert len(report["prompt_ids"]) == 160 + 32 and report["prompt_text"][:40] in run.out
    assert report["ok"] and {r["check"] for r in report["rows"]} >= {
        "prefill vs reference", "decode vs reference", "token vs prompt", "token vs prompt kv",
        "encodings vs the export's", "bundle drift from float"}
    last = [r for r in report["rows"] if r["part_index"] == PARTS
            and r["check"] == "decode vs reference"]
    assert last[0]["what"] == "logits" and last[0]["cos_min"] >= 0.9999
    again = built.doit("verify")                          # same bundle, same inputs: no rerun
    assert "verify" not in again.executed and again.up_to_date == 19, again.out


@pytest.mark.parametrize("key, replacement", [
    ("min_cosine_hidden", "floor_multiplier, min_floor_lsb"),
    ("min_cosine_logits", "floor_multiplier, min_floor_lsb"),
    ("min_cosine_prompt_vs_token", "token_vs_prompt_factor"),
    ("min_top1_agreement", "chained_max_ratio"),
    ("top1_tolerance", "chained_max_ratio"),
    ("max_drift_margin", "chained_max_ratio"),
    ("min_cosine_reference", "floor_multiplier"),
    ("chained_min_cosine", "chained_max_ratio")])
def test_a_retired_verify_key_is_refused_with_what_replaced_it(project, key, replacement):
    path = project.root / "configs/models/qwen2-tiny.toml"
    path.write_text(path.read_text().replace("[verify]\n", f"[verify]\n{key} = 0.95\n"))
    with pytest.raises(ConfigError, match=rf"key 'verify.{key}' is no longer read: .*"
                                          + re.escape(replacement)):
        load_build(project.root)


def test_verify_config_refuses_a_sequence_longer_than_the_context(project):
    set_toml(project.root / "configs/models/qwen2-tiny.toml", prompt_tokens="250")
    with pytest.raises(ConfigError, match=r"verify.prompt_tokens \+ verify.decode_steps = 282 "
                                          r"exceeds graphs.context_length 256"):
        load_build(project.root)


def test_verify_key_covers_every_runtime_module_verify_runs():
    """`doit verify` reruns when the code it runs changes (graph.keys.STEP_CODE["verify"], derived
    by graph.codekey): that code holds every hexbundle.runtime module checks/verify.py reaches
    through its imports (walked here independently), and checks/verify.py itself."""
    seen, todo = set(), ["hexbundle.checks.verify"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = PACKAGE.joinpath(*name.split(".")[1:]).with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            todo += [n for n in names if n.startswith("hexbundle.runtime.")]
    reached = {"/".join(name.split(".")[1:]) + ".py" for name in seen}
    assert "runtime/interpreter.py" in reached
    covered = {p.relative_to(PACKAGE).as_posix() for p in code_files(STEP_CODE["verify"]).values()}
    assert reached <= covered, f"not in verify's key: {sorted(reached - covered)}"


# ------------------------------------------------------------------------------ injected failures


def test_a_faithful_rewrite_of_every_bin_passes(tiny, bundle_copy):
    """The baseline of the injections below: the rewrite itself changes nothing numerically,
    even with weight sharing off (each graph its own, identical copy)."""
    for index in range(1, PARTS + 1):
        rewrite_bin(bundle_copy / bin_name(index), weight_sharing=(index != 3))
    report = run_verify(tiny, bundle_copy)
    assert report.ok, report.table()


def test_swapped_nibble_order_in_packed_weights_fails_at_that_part(tiny, bundle_copy):
    def swap_nibbles(graph, tensor):
        if tensor.dtype != "uint4":
            return tensor
        # what a packer writing element 2i to the HIGH nibble stores, read low-first
        pairs = tensor.values.reshape(-1, 2)[:, ::-1]
        return Tensor(tensor.name, tensor.dtype, pairs.reshape(tensor.values.shape).copy(),
                      tensor.quant)

    rewrite_bin(bundle_copy / bin_name(3), swap_nibbles)
    assert_diverges_at(run_verify(tiny, bundle_copy), 3)


@pytest.mark.parametrize("part, signs", [(2, {"scale_sign": -1}), (4, {"scale_sign": -1}),
                                         (3, {"offset_sign": -1}), (1, {"offset_sign": -1})])
def test_scale_or_offset_with_the_wrong_sign_fails_at_that_part(tiny, bundle_copy, part, signs):
    rewrite_bin(bundle_copy / bin_name(part), lambda graph, t: with_quant(t, **signs))
    if part == 1:   # nothing before part 1: just the name
        report = run_verify(tiny, bundle_copy)
        assert not report.ok and report.failure_message().startswith(
            f"verify failed: part 1 of 4 ({bin_name(1)}) diverged first")
    else:
        assert_diverges_at(run_verify(tiny, bundle_copy), part)


def test_prompt_and_token_graphs_bound_to_different_weight_copies_fail_at_that_part(
        tiny, bundle_copy):
    """weight_sharing off and the token graph's copy of one weight slightly different (10% of
    its 4-bit values off by one): the prompt path still matches the ONNX, only the token-vs-
    prompt check sees it."""
    name = "model.layers.2.mlp.up_proj.weight"

    def other_copy(graph, tensor):
        if not graph.startswith("token_") or tensor.name != name:
            return tensor
        rng = np.random.default_rng(7)
        step = np.where(rng.random(tensor.values.shape) < 0.1, rng.choice([-1, 1], tensor.values.shape), 0)
        values = np.clip(tensor.values.astype(np.int16) + step, 0, 15).astype(np.uint8)
        return Tensor(tensor.name, tensor.dtype, values, tensor.quant)

    rewrite_bin(bundle_copy / bin_name(3), other_copy, weight_sharing=False)
    with read_ctxbin(bundle_copy / bin_name(3)) as reader:
        graphs = reader.graph_names
        assert not np.array_equal(reader.weight(graphs[0], name), reader.weight(graphs[1], name))
    report = run_verify(tiny, bundle_copy)
    message = assert_diverges_at(report, 3)
    # the exact check names the token graph's copy and its first differing element ...
    assert re.search(rf"weights vs the export's: 1 difference\(s\): token_ar1_cl256_3_of_4: "
                     rf"weight '{re.escape(name)}': element \[\d+, \d+\] is \d+ in the bin, "
                     r"\d+ by AIMET's quantization", message), message
    # ... and the numbers agree: the token graph drifts from the prompt graph, the reference's
    # does not
    assert re.search(r"token vs prompt: [\d.]+ LSB > 2 x the floor", message), message
    prefill = [r for r in report.rows if r.part_index == 3 and r.check == "prefill vs reference"]
    assert prefill[0].ok


def test_parts_listed_out_of_order_in_ctx_bins_fail_naming_the_part(tiny, bundle_copy):
    def swap(dialog):
        bins = dialog["engine"]["model"]["binary"]["ctx-bins"]
        bins[1], bins[2] = bins[2], bins[1]

    edit_genie_config(bundle_copy, swap)
    with pytest.raises(VerifyError, match=re.escape(
            f"ctx-bins' is out of order: entry 1 is {bin_name(3)}, which holds part 3 of 4, but "
            f"Genie feeds position 2 with the output of position 1, so it must be part 2 of 4")):
        run_verify(tiny, bundle_copy)


def test_bins_swapped_on_disk_are_caught_by_their_graphs_not_their_names(tiny, bundle_copy):
    two, three = bundle_copy / bin_name(2), bundle_copy / bin_name(3)
    two.rename(bundle_copy / "tmp.bin")
    three.rename(two)
    (bundle_copy / "tmp.bin").rename(three)
    with pytest.raises(VerifyError, match=f"entry 1 is {bin_name(2)}, which holds part 3 of 4"):
        run_verify(tiny, bundle_copy)


def test_a_missing_bin_file_fails_naming_the_part(tiny, bundle_copy):
    (bundle_copy / bin_name(3)).unlink()
    with pytest.raises(VerifyError, match=f"'{bin_name(3)}', but .* has no such file: part 3 of 4 "
                                          f"is missing from the bundle"):
        run_verify(tiny, bundle_copy)


def test_a_part_left_out_of_ctx_bins_fails_naming_the_part(tiny, bundle_copy):
    edit_genie_config(bundle_copy, lambda d: d["engine"]["model"]["binary"]["ctx-bins"].pop(2))
    with pytest.raises(VerifyError, match=r"part 3 of 4 is missing: no bin listed in .* holds its "
                                          r"graphs \(prompt_ar128_cl256_3_of_4, token_ar1_cl256_3_of_4\)"):
        run_verify(tiny, bundle_copy)


def test_runtime_settings_in_genie_config_must_match_the_model(tiny, bundle_copy):
    edit_genie_config(bundle_copy, lambda d: d["engine"]["backend"]["QnnHtp"].update(
        {"rope-theta": 10000}))
    with pytest.raises(VerifyError, match=r"'dialog.engine.backend.QnnHtp.rope-theta' is 10000.0 "
                                          r"but qwen2-tiny.toml architecture.rope_theta is 1000000.0"):
        run_verify(tiny, bundle_copy)


# ------------------------------------------------------------------------------ the CPU runner


def random_feeds(runner, rng, n_past=100):
    feeds = {}
    for spec in runner.inputs:
        if spec.dtype == "int32":
            feeds[spec.name] = rng.integers(0, 1024, spec.shape).astype(np.int32)
        else:
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(np.float32)
    if "attention_mask" in feeds:
        ar, cl = feeds["attention_mask"].shape[2:]
        feeds["attention_mask"] = causal_mask(ar, cl, n_past)
        cos, sin = rope_inputs(n_past + np.arange(ar), 32, 1e6)
        feeds["position_ids_cos"], feeds["position_ids_sin"] = cos, sin
    return feeds


def dequantized_onnx(reader, graph_name):
    """The bin's graph as a float ONNX model: its topology plus every weight dequantized."""
    info = reader.graph(graph_name)
    graph = reader.topology(graph_name)
    graph.initializer.extend(numpy_helper.from_array(reader.dequantize(graph_name, w), w)
                             for w in info.weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v)
                                                    for d, v in info.opset_import])
    model.ir_version = info.ir_version
    return model.SerializeToString()


@pytest.mark.parametrize("index", [1, 2, 4])
def test_runner_computes_what_onnxruntime_computes_with_the_same_weights(built, index):
    rng = np.random.default_rng(index)
    with read_ctxbin(built.bundle() / bin_name(index)) as reader:
        for graph in reader.graph_names:
            runner = GraphRunner(reader, graph, quantize_io=False)
            feeds = random_feeds(runner, rng)
            got = runner.run(feeds)
            session = onnxruntime.InferenceSession(dequantized_onnx(reader, graph),
                                                   providers=["CPUExecutionProvider"])
            want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
            for name, value in want.items():
                np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-4, err_msg=name)


def test_runner_refuses_an_op_it_does_not_implement(built, bundle_copy):
    def erf_instead_of_sigmoid(topology):
        node = next(n for n in topology.node if n.op_type == "Sigmoid")
        node.op_type = "Erf"

    rewrite_bin(bundle_copy / bin_name(3), alter_topology=erf_instead_of_sigmoid)
    with read_ctxbin(bundle_copy / bin_name(3)) as reader:
        with pytest.raises(VerifyError, match=rf"{bin_name(3)}: graph prompt_ar128_cl256_3_of_4: "
                                              r"node .*Sigmoid_1 is a Erf, which the CPU runner "
                                              r"does not implement"):
            GraphRunner(reader, "prompt_ar128_cl256_3_of_4")


def test_runner_memory_is_bounded_by_the_largest_weight_not_the_part(built):
    """Weights are dequantized when their node runs and dropped after: the peak of a token step
    stays far below the part's weights in float32. (I/O rounding off: its temporaries scale with
    the KV window, which in this tiny model is as big as a weight.)"""
    with read_ctxbin(built.bundle() / bin_name(2)) as reader:
        graph = reader.graph_names[1]
        runner = GraphRunner(reader, graph, quantize_io=False)
        feeds = random_feeds(runner, np.random.default_rng(0))
        sizes = [reader.record(graph, w).count * 4 for w in reader.graph(graph).weights]
        runner.run(feeds)                       # warm up (lazy imports, caches)
        tracemalloc.start()
        try:
            runner.run(feeds)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert max(sizes) < peak < sum(sizes) / 2, (peak, max(sizes), sum(sizes))
