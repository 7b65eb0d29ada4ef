"""Issue 35: a qai-hub-models 0.57-0.65 quantize checkpoint (model_dynamic.onnx + model.encodings
+ config.json [+ model.data] [+ args.json]) is imported, pinned per graph, split as
qai-hub-models 0.65's split_onnx does, and built.

The cut itself is checked against Qualcomm's own splitter output: tests/data/qaihm/export-*/
hold, for three families, the unsplit graph and the parts qai-hub-models 0.55.0's export split
from it (the same get_split_tensors / OnnxSplitter / split_onnx_by_names code 0.65.0 ships);
hexbundle's qaihm cut of the unsplit graph must give the same nodes, inputs, outputs,
initializers and per-part encodings.

The checkpoints (tests/data/qaihm-ckpt/, made by qai-hub-models' own quantize code with
make_checkpoints.py) are imported, split and compared with expected_split.json (qai-hub-models
0.65.0's own split of each, split_expected.py), built, verified and linted; copies of the 0.65.0
qwen3_4b one, each broken one way, are refused with a message naming the file.
"""
import json
import shutil
from pathlib import Path

import onnx
import pytest

from conftest import ROOT, copy_project
from hexbundle.config.model import Part
from hexbundle.formats.qaihm import qaihm_split_layers
from hexbundle.inputs.split import qaihm_part_encodings, qaihm_part_graph, residual_cuts
from hexbundle.support.errors import InputError

QAIHM = ROOT / "tests" / "data" / "qaihm"
# (export tree, AR dir, unsplit graph, the parts' stem, Qualcomm's plan for it)
QUALCOMM_SPLITS = {
    "qwen3": ("export-qwen3", "ar128_cl256", "Qwen3_4B_AIMETOnnx.aimet/model.onnx",
              "qwen3_4b_w4a16_ar128_cl256", (0, 2, 2, 2)),
    "llama32": ("export-llama32", "ar1_cl256", "Llama3_2_3B_AIMETOnnx.aimet/model.onnx",
                "llama_v3_2_3b_instruct_w4a16_ar1_cl256", (0, 1, 1)),
    "falcon3": ("export-falcon3", "ar128_cl256", "Falcon3_7B_AIMETOnnx.aimet/model.onnx",
                "falcon_v3_7b_instruct_w4a16_ar128_cl256", (0, 1, 1, 1, 1)),
}


def _names(section) -> list:
    return sorted(e["name"] for e in section) if isinstance(section, list) else sorted(section)


def _entries(section) -> list:
    items = section if isinstance(section, list) else [{k: v} for k, v in section.items()]
    return sorted(json.dumps(e, sort_keys=True) for e in items)


@pytest.mark.parametrize("family", sorted(QUALCOMM_SPLITS))
def test_the_qaihm_cut_equals_qualcomms_own_split(family):
    tree, ar_dir, unsplit, stem, plan = QUALCOMM_SPLITS[family]
    where = QAIHM / tree / ar_dir
    proto = onnx.load(str(where / unsplit), load_external_data=False)
    full = json.loads((where / unsplit).with_suffix(".encodings").read_text())
    count = len(plan)
    ar = int(ar_dir[2:].split("_")[0])
    for index in range(1, count + 1):
        mine = qaihm_part_graph(proto, Part(index, count, (), index == 1, index == count), plan,
                                (1, ar, 64), where / unsplit)
        part_dir = where / f"{stem}_{index}_of_{count}.aimet"
        theirs = onnx.load(str(part_dir / f"{stem}_{index}_of_{count}.onnx"),
                           load_external_data=False).graph
        assert [n.output[0] for n in mine.nodes] == [n.output[0] for n in theirs.node]
        assert [v.name for v in mine.inputs] == [v.name for v in theirs.input]
        assert [v.name for v in mine.outputs] == [v.name for v in theirs.output]
        assert sorted(t.name for t in mine.initializers) == sorted(
            t.name for t in theirs.initializer)
        # 0.55's classes adapt no encodings before splitting (0.65's dynamic ones do)
        encodings = qaihm_part_encodings(full, proto, mine, mine.cut_tensors, adapt=False)
        expected = json.loads((part_dir / f"{stem}_{index}_of_{count}.encodings").read_text())
        for key in ("activation_encodings", "param_encodings"):
            assert _names(encodings[key]) == _names(expected[key]), (index, key)
            assert _entries(encodings[key]) == _entries(expected[key]), (index, key)


def test_the_cut_tensors_are_the_embedding_and_each_layers_residual_output():
    _, ar_dir, unsplit, _, _ = QUALCOMM_SPLITS["qwen3"]
    proto = onnx.load(str(QAIHM / "export-qwen3" / ar_dir / unsplit), load_external_data=False)
    cuts = residual_cuts(proto, Path("x"))
    assert cuts == ["/model/model/embed_tokens/Gather_output_0"] + [
        f"/model/model/layers.{i}/Add_1_output_0" for i in range(6)]


@pytest.mark.parametrize("layers,splits,per,expected", [
    (6, 4, 12, (0, 2, 2, 2)),        # qwen3_4b's constants on 6 layers: ceil(6 / 3)
    (7, 4, 12, (0, 3, 3, 1)),        # the last block short
    (36, 4, 12, (0, 12, 12, 12)),    # Qwen3-4B itself
    (28, 2, 28, (0, 28)),            # qwen3_0_6b: one block with every layer
    (28, 5, 8, (0, 8, 8, 8, 4)),     # Falcon3-7B
])
def test_qaihm_split_layers_follows_split_onnx(layers, splits, per, expected):
    assert qaihm_split_layers(layers, splits, per, "x") == expected


def test_qaihm_split_layers_refuses_what_split_onnx_asserts_on():
    with pytest.raises(InputError, match="cannot split 5 layers into 5 parts"):
        qaihm_split_layers(5, 5, 9, "x")


# ============================================================================ a checkpoint

CKPT_DATA = ROOT / "tests" / "data" / "qaihm-ckpt"
BASE = CKPT_DATA / "qwen3_4b-0.65.0"   # qai-hub-models 0.65.0's qwen3_4b quantize wrote it


def make_checkpoint(dest: Path, change: dict = None) -> Path:
    """A copy of a real checkpoint, config.json changed by `change` (a key set to None goes)."""
    shutil.copytree(BASE, dest, ignore=shutil.ignore_patterns("expected_split*"))
    config = json.loads((dest / "config.json").read_text())
    for key, value in (change or {}).items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def base_config() -> dict:
    return json.loads((BASE / "config.json").read_text())


def _import(project, ckpt: Path, *extra):
    lengths = () if "--context-length" in extra else ("--context-length", "256")
    return project.doit("import_export", "--dir", str(ckpt), "--name", "ckpt",
                        "--model-id", "qwen3_4b", *lengths, *extra, check=False)


def _refused(run, *needles) -> str:
    text = run.out + run.err
    assert run.code != 0, text
    assert "Traceback" not in text, text
    for needle in needles:
        assert needle in text, text
    return text


def test_a_checkpoint_imports_with_its_format_release_and_qualcomms_plan(tmp_path):
    project = copy_project(tmp_path / "proj")
    ckpt = make_checkpoint(tmp_path / "ckpt")
    run = _import(project, ckpt)
    assert run.code == 0, run.out + run.err
    assert "format: qai-hub-models 0.57-0.65 quantize checkpoint" in run.out, run.out
    assert ("release: 0.60-0.65 (encodings 1.0.0, producer {\"package\": \"aimet-onnx\", "
            "\"version\": \"2.35.0\"}); weights inline") in run.out, run.out
    layers = base_config()["num_hidden_layers"]   # not the stock 36: blocks of ceil(7 / 3)
    per = -(-layers // 3)
    plan = qaihm_split_layers(layers, 4, per, "x")
    assert (f"plan {','.join(map(str, plan))} (qai-hub-models' qwen3_4b: NUM_SPLITS 4, "
            f"NUM_LAYERS_PER_SPLIT {per} for {layers} layers (the stock 36 layers: 12))"
            ) in run.out, run.out
    text = (project.root / "configs" / "models" / "ckpt.toml").read_text()
    assert 'cut = "qaihm"' in text and 'split = "local"' in text, text


def _off_by_one(key: str) -> tuple:
    value = base_config()[key]
    return {key: value * 2}, [f"{key} {value * 2} (the graphs: {value})"]


@pytest.mark.parametrize("change,needles", [
    ({"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"]},
     ["model_type 'gemma4': Gemma 4 is not a conventional decoder", "Supported checkpoints"]),
    ({"model_type": "qwen3_5"}, ["Qwen3.5 is a hybrid-attention model", "Supported"]),
    ({"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
      "text_config": {"model_type": "qwen2_5_vl_text"}, "num_attention_heads": None},
     ["a vision-language model"]),
    ({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]},
     ["model_type 'phi3'", "no qai-hub-models quantize checkpoint hexbundle knows",
      "Qwen3 (model_type qwen3"]),
    _off_by_one("num_hidden_layers"),
    _off_by_one("num_attention_heads"),
    _off_by_one("num_key_value_heads"),
    _off_by_one("vocab_size"),
    _off_by_one("intermediate_size"),
    _off_by_one("head_dim"),
], ids=["gemma4", "qwen3.5", "vlm", "phi3", "layers", "heads", "kv-heads", "vocab",
        "intermediate", "head-dim"])
def test_a_bad_config_json_is_refused_by_name(tmp_path, change, needles):
    project = copy_project(tmp_path / "proj")
    ckpt = make_checkpoint(tmp_path / "ckpt", change)
    _refused(_import(project, ckpt), "config.json", *needles)
    assert not (project.root / "configs" / "models" / "ckpt.toml").exists()


def test_model_data_missing_or_truncated_is_refused(tmp_path):
    """A checkpoint >= 2 GiB keeps its weights in model.data (aimet-onnx's QuantSim writes it
    then): the small one here is saved that way, as onnx.save writes external data."""
    project = copy_project(tmp_path / "proj")
    ckpt = make_checkpoint(tmp_path / "ckpt")
    proto = onnx.load(str(ckpt / "model_dynamic.onnx"))
    onnx.save(proto, str(ckpt / "model_dynamic.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.data", size_threshold=1024)
    assert _import(project, ckpt).code == 0
    data = (ckpt / "model.data").read_bytes()
    (ckpt / "model.data").write_bytes(data[: len(data) // 2])
    _refused(_import(project, ckpt), "model.data", "truncated",
             "copy it again from the quantize output")
    (ckpt / "model.data").unlink()
    _refused(_import(project, ckpt), "model_dynamic.onnx", "'model.data'", "does not exist")


def test_encodings_of_another_model_are_refused(tmp_path):
    project = copy_project(tmp_path / "proj")
    ckpt = make_checkpoint(tmp_path / "ckpt")
    other = QAIHM / "export-llama32" / "ar1_cl256" / "Llama3_2_3B_AIMETOnnx.aimet"
    shutil.copy(other / "model.encodings", ckpt / "model.encodings")
    _refused(_import(project, ckpt), "model.encodings", "model_dynamic.onnx does not have",
             "the encodings of another model")


def test_a_dynamic_dim_where_a_fixed_one_belongs_is_refused(tmp_path):
    project = copy_project(tmp_path / "proj")
    ckpt = make_checkpoint(tmp_path / "ckpt")
    proto = onnx.load(str(ckpt / "model_dynamic.onnx"), load_external_data=False)
    key = next(v for v in proto.graph.input if v.name == "past_key_0_in")
    key.type.tensor_type.shape.dim[2].Clear()
    key.type.tensor_type.shape.dim[2].dim_param = "head_dim"
    onnx.save(proto, str(ckpt / "model_dynamic.onnx"))
    _refused(_import(project, ckpt), "'past_key_0_in' axis 2 is dynamic (head_dim)",
             f"fixed size belongs ({base_config()['head_dim']})")


def test_a_graph_qai_hub_models_never_writes_is_refused(tmp_path):
    """No past_key_<L>_in inputs: not the KV-cache decoder graph qai-hub-models writes."""
    project = copy_project(tmp_path / "proj")
    ckpt = make_checkpoint(tmp_path / "ckpt")
    proto = onnx.load(str(ckpt / "model_dynamic.onnx"), load_external_data=False)
    kept = [v for v in proto.graph.input if not v.name.startswith("past_")]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    onnx.save(proto, str(ckpt / "model_dynamic.onnx"))
    _refused(_import(project, ckpt), "model_dynamic.onnx", "past_key_<L>_in",
             "not a qai-hub-models LLM")


# ============================================================================ real checkpoints
# tests/data/qaihm-ckpt/<module>-<release>/: checkpoints written by qai-hub-models' own quantize
# code (tests/data/qaihm-ckpt/make_checkpoints.py), each with expected_split.json: what
# qai-hub-models 0.65.0's own split made of it (split_expected.py), context length 4096.

REAL = sorted(p.name for p in CKPT_DATA.glob("*") if (p / "expected_split.json").is_file()) \
    if CKPT_DATA.is_dir() else []


def _expected(name: str) -> dict:
    return json.loads((CKPT_DATA / name / "expected_split.json").read_text())


def _io(values) -> list:
    return [(v["name"], list(v["shape"])) for v in values]


def _onnx_io(values) -> list:
    return [(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values]


@pytest.mark.heavy   # measured 8-13 s a checkpoint: the full suite (`pytest --full`)
@pytest.mark.parametrize("name", REAL)
def test_a_real_checkpoint_splits_as_qai_hub_models_does(tmp_path, name):
    """Import as the user would (the model id is the quantize module's), run the split step, and
    compare each graph it wrote with qai-hub-models 0.65.0's own split of the same checkpoint:
    the cut tensors, each part's inputs and outputs (names and the compile's pinned shapes),
    initializers, node count and encodings."""
    expected = _expected(name)
    cl = expected["context_length"]
    project = copy_project(tmp_path / "proj")
    run = project.doit("import_export", "--dir", str(CKPT_DATA / name), "--name", "real",
                       "--model-id", expected["module"], "--context-length", str(cl),
                       check=False)
    assert run.code == 0, run.out + run.err
    assert "format: qai-hub-models 0.57-0.65 quantize checkpoint" in run.out, run.out
    made_by = expected["checkpoint_release"]   # the release whose quantize wrote it
    old = made_by.startswith(("0.57.", "0.58.", "0.59."))
    assert f"release: {'0.57-0.59' if old else '0.60-0.65'} (encodings" in run.out, run.out
    for cut in expected["cuts"]:
        assert cut[0] in run.out, (cut, run.out)
    project.doit("inputs", "model=real")
    inputs = project.root / "build" / "real" / "inputs"
    count = len(expected["parts"])
    assert count == expected["num_splits"]
    for part in expected["parts"]:
        index = part["part"]
        enc = json.loads((CKPT_DATA / name / part["encodings_file"]).read_text())
        for graph_name, spec in part["graphs"].items():
            assert graph_name.endswith(f"_{index}_of_{count}"), graph_name
            proto = onnx.load(str(inputs / f"{graph_name}.onnx"), load_external_data=False)
            graph = proto.graph
            assert _onnx_io(graph.input) == _io(spec["inputs"]), graph_name
            assert _onnx_io(graph.output) == _io(spec["outputs"]), graph_name
            assert sorted(t.name for t in graph.initializer) == part["initializers"]
            assert len(graph.node) == part["num_nodes"], graph_name
            mine = json.loads((inputs / f"{graph_name}.encodings").read_text())
            for key in ("activation_encodings", "param_encodings"):
                assert _entries(mine[key]) == _entries(enc[key]), (graph_name, key)


@pytest.mark.heavy   # an import, a build, a verify and a lint of the bundle: > 30 s each
@pytest.mark.parametrize("name", REAL)   # verify's gates are relative (issue 34): all pass
def test_a_real_checkpoint_builds_verifies_and_lints(tmp_path, name):
    expected = _expected(name)
    ckpt = CKPT_DATA / name
    project = copy_project(tmp_path / "proj")
    run = project.doit("import_export", "--dir", str(ckpt), "--name", "real",
                       "--model-id", expected["module"], "--context-length", "512", check=False)
    assert run.code == 0, run.out + run.err
    bundle = project.doit("bundle", "model=real", check=False)
    assert bundle.code == 0, bundle.out + bundle.err
    graphs = project.manifest("real")["graphs"]
    assert len(graphs) == 2 * expected["num_splits"], graphs
    verify = project.doit("verify", "model=real", check=False)
    assert verify.code == 0, verify.out + verify.err
    lint = project.doit("check_bundle", "--path", str(project.bundle("real")),
                        "--model-config", str(ckpt / "config.json"), check=False)
    assert lint.code == 0, lint.out + lint.err


def test_each_context_length_is_its_own_pinned_graph(tmp_path):
    """--context-length 256,512: one dynamic graph becomes a prompt and a token graph per part
    and length, each with the compile's shapes (past = CL - AR), named so they sort."""
    project = copy_project(tmp_path / "proj")
    run = _import(project, BASE, "--context-length", "512,256")
    assert run.code == 0, run.out + run.err
    assert "context lengths 256, 512" in run.out, run.out
    project.doit("inputs", "model=ckpt")
    inputs = project.root / "build" / "ckpt" / "inputs"
    cfg = base_config()
    kv, head_dim = cfg["num_key_value_heads"], cfg["head_dim"]
    count = len(qaihm_split_layers(cfg["num_hidden_layers"], 4, 12, "x"))
    names = sorted(p.stem for p in inputs.glob("*.onnx"))
    assert names == sorted(f"{kind}_ar{ar}_cl{cl}_{i}_of_{count}"
                           for kind, ar in (("prompt", 128), ("token", 1))
                           for cl in (256, 512) for i in range(1, count + 1))
    for kind, ar in (("prompt", 128), ("token", 1)):
        for cl in (256, 512):
            graph = onnx.load(str(inputs / f"{kind}_ar{ar}_cl{cl}_2_of_{count}.onnx"),
                              load_external_data=False).graph
            shapes = dict(_onnx_io(graph.input))
            assert shapes["attention_mask"] == [1, 1, ar, cl]
            assert shapes["position_ids_cos"] == [1, 1, ar, head_dim // 2]
            assert shapes["past_key_0_in"] == [kv, 1, head_dim, cl - ar]
            assert shapes["past_value_0_in"] == [kv, 1, cl - ar, head_dim]
            outputs = dict(_onnx_io(graph.output))
            assert outputs["past_key_0_out"] == [kv, 1, head_dim, ar]


# ======================================================================= 0.55's static checkpoint
# tests/data/qaihm-ckpt/llama_v3_2_3b_instruct-0.55.0/: what qai-hub-models 0.55.0's own quantize
# wrote (model_seqlen128_cl256.onnx and model_seqlen1_cl256.onnx sharing model.data; fixed
# shapes, context length 256). Its expected split is tests/data/qaihm/export-llama32/: 0.55.0's
# own export of this very checkpoint (make_checkpoints.py llama3_2_static rebuilt that tree byte
# for byte from it). No 0.57-0.59 release writes a static checkpoint: each text LLM's quantize
# passes a dynamic PreSplit class (tests/data/qaihm-ckpt/README.md).

STATIC = CKPT_DATA / "llama_v3_2_3b_instruct-0.55.0"
STATIC_EXPORT = QAIHM / "export-llama32"
STATIC_STEM = "llama_v3_2_3b_instruct_w4a16_ar{ar}_cl256_{i}_of_{n}"


def _import_static(project, ckpt: Path, *extra):
    return project.doit("import_export", "--dir", str(ckpt), "--name", "static",
                        "--model-id", "llama_v3_2_3b_instruct", *extra, check=False)


def test_a_static_055_checkpoint_splits_as_its_own_export(tmp_path):
    """Imported as it comes (its graphs' context length, no --context-length), split by the
    `inputs` step, each graph equal to the part 0.55.0's export wrote from the same checkpoint:
    nodes, inputs and outputs with their shapes, initializers, per-part encodings."""
    project = copy_project(tmp_path / "proj")
    run = _import_static(project, STATIC)
    assert run.code == 0, run.out + run.err
    assert "format: qai-hub-models 0.55-0.56 static quantize checkpoint" in run.out, run.out
    assert "release: 0.55-0.56 (static model_seqlen<S>_cl<C>.onnx" in run.out, run.out
    assert ("graphs: model_seqlen128_cl256.onnx, model_seqlen1_cl256.onnx (static: context "
            "length 256), weights model.data") in run.out, run.out
    assert "at context length 256 (the static graphs' own)" in run.out, run.out
    project.doit("inputs", "model=static")
    inputs = project.root / "build" / "static" / "inputs"
    count = 3   # llama_v3_2_3b_instruct's NUM_SPLITS
    for kind, ar in (("prompt", 128), ("token", 1)):
        for index in range(1, count + 1):
            stem = STATIC_STEM.format(ar=ar, i=index, n=count)
            theirs_dir = STATIC_EXPORT / f"ar{ar}_cl256" / f"{stem}.aimet"
            theirs = onnx.load(str(theirs_dir / f"{stem}.onnx"), load_external_data=False).graph
            name = f"{kind}_ar{ar}_cl256_{index}_of_{count}"
            mine = onnx.load(str(inputs / f"{name}.onnx"), load_external_data=False).graph
            assert [n.output[0] for n in mine.node] == [n.output[0] for n in theirs.node], name
            assert _onnx_io(mine.input) == _onnx_io(theirs.input), name
            assert _onnx_io(mine.output) == _onnx_io(theirs.output), name
            assert sorted(t.name for t in mine.initializer) == sorted(
                t.name for t in theirs.initializer), name
            enc = json.loads((inputs / f"{name}.encodings").read_text())
            expected = json.loads((theirs_dir / f"{stem}.encodings").read_text())
            for key in ("activation_encodings", "param_encodings"):
                assert _entries(enc[key]) == _entries(expected[key]), (name, key)


@pytest.mark.heavy   # an import, a build, a verify and a lint of the bundle
def test_a_static_055_checkpoint_builds_verifies_and_lints(tmp_path):
    project = copy_project(tmp_path / "proj")
    run = _import_static(project, STATIC, "--context-length", "256")
    assert run.code == 0, run.out + run.err
    bundle = project.doit("bundle", "model=static", check=False)
    assert bundle.code == 0, bundle.out + bundle.err
    assert len(project.manifest("static")["graphs"]) == 2 * 3
    verify = project.doit("verify", "model=static", check=False)
    assert verify.code == 0, verify.out + verify.err
    lint = project.doit("check_bundle", "--path", str(project.bundle("static")),
                        "--model-config", str(STATIC / "config.json"), check=False)
    assert lint.code == 0, lint.out + lint.err


def test_a_static_checkpoint_at_another_context_length_is_refused(tmp_path):
    project = copy_project(tmp_path / "proj")
    _refused(_import_static(project, STATIC, "--context-length", "256,512"),
             str(STATIC), "model_seqlen128_cl256.onnx", "fixed to context length 256",
             "--context-length 512 has no graph", "re-run the 0.55-0.56 quantize with "
             "--context-length 512", "model_dynamic.onnx serves every context length")
    assert not (project.root / "configs" / "models" / "static.toml").exists()


def test_a_static_checkpoint_without_its_token_graph_is_refused(tmp_path):
    project = copy_project(tmp_path / "proj")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(STATIC, ckpt)
    (ckpt / "model_seqlen1_cl256.onnx").unlink()
    _refused(_import_static(project, ckpt), "static graphs model_seqlen128_cl256.onnx",
             "model_seqlen1_cl<C>.onnx (token)", "copy the whole folder the quantize wrote")


def test_a_static_graph_renamed_to_another_context_length_is_refused(tmp_path):
    """The file name is what the import pairs the graphs by; a graph whose inputs say other
    lengths than its name is named, not built at the wrong length."""
    project = copy_project(tmp_path / "proj")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(STATIC, ckpt)
    for ar in (128, 1):
        (ckpt / f"model_seqlen{ar}_cl256.onnx").rename(ckpt / f"model_seqlen{ar}_cl512.onnx")
    _refused(_import_static(project, ckpt), "model_seqlen128_cl512.onnx",
             "sequence length 128 and context length 256 (attention_mask), but its name says "
             "128 and 512", "restore the files the quantize wrote")


def test_a_static_checkpoints_truncated_model_data_is_refused(tmp_path):
    project = copy_project(tmp_path / "proj")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(STATIC, ckpt)
    data = (ckpt / "model.data").read_bytes()
    (ckpt / "model.data").write_bytes(data[: len(data) // 3])
    _refused(_import_static(project, ckpt), "model_seqlen128_cl256.onnx", "model.data",
             "copy it again from the quantize output")
    (ckpt / "model.data").unlink()
    _refused(_import_static(project, ckpt), "model_seqlen128_cl256.onnx", "'model.data'",
             "does not exist")


def test_a_graph_without_residual_adds_is_refused(tmp_path):
    """Every Add written as the equivalent two-input Sum: the same model, but no residual Add,
    hence no layer boundary qai-hub-models' splitter (get_split_tensors) could cut at."""
    project = copy_project(tmp_path / "proj")
    ckpt = make_checkpoint(tmp_path / "ckpt")
    proto = onnx.load(str(ckpt / "model_dynamic.onnx"), load_external_data=False)
    for node in proto.graph.node:
        if node.op_type == "Add":
            node.op_type = "Sum"
    onnx.save(proto, str(ckpt / "model_dynamic.onnx"))
    _refused(_import(project, ckpt), "model_dynamic.onnx", "no residual Add",
             "not a decoder graph qai-hub-models writes")
    assert not (project.root / "configs" / "models" / "ckpt.toml").exists()


# ======================================================================= sizes from the structure
# Issue 46, item 3: each size the import writes is read from the role of what shows it (the
# attention's query projections, the MLP's gate/up/down, the KV cache, the embedding, logits:
# hexbundle/inputs/structure.py), never from which width a weight has, and checked against
# config.json.

EXPORTS_WITH_CONFIG = {"export-llama32": "config-llama32.json",
                       "export-falcon3": "config-falcon3.json",
                       "export-llama32-deep": "config-llama32-deep.json",
                       "export-qwen3-kv16": "config-qwen3-kv16.json"}


def _graphs_and_configs() -> list:
    """(unsplit graph, its config.json) for every committed checkpoint and export that has one."""
    out = []
    for folder in sorted(CKPT_DATA.iterdir()):
        if (folder / "config.json").is_file():
            out += [(g, folder / "config.json") for g in sorted(folder.glob("model_*.onnx"))
                    if not g.name.startswith("model_seqlen1_")]
    for tree, config in EXPORTS_WITH_CONFIG.items():
        out += [(g, QAIHM / config)
                for g in sorted((QAIHM / tree).glob("ar*_cl*/*.aimet/model.onnx"))]
    return out


@pytest.mark.parametrize("graph,config", _graphs_and_configs(),
                         ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name}")
def test_the_structure_shows_the_sizes_config_json_states(graph, config):
    """Every committed graph Qualcomm's code wrote: its attention's query projections are heads
    x head_dim wide, its keys KV heads x head_dim, every layer's MLP is the config's width, the
    LM head maps hidden to the vocabulary; one attention and one MLP per layer."""
    from types import SimpleNamespace
    from hexbundle.formats.qaihm import load_structure
    from hexbundle.inputs.structure import read_structure
    cfg = json.loads(config.read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    structure = read_structure([load_structure(graph)], [SimpleNamespace(onnx=graph)])
    layers = cfg["num_hidden_layers"]
    assert structure.query_widths == {n: cfg["num_attention_heads"] * head_dim
                                      for n in range(layers)}
    assert structure.key_widths == {n: cfg["num_key_value_heads"] * head_dim
                                    for n in range(layers)}
    width = cfg["intermediate_size"]
    assert [w[1:] for w in structure.mlp_widths] == [(width, width, width)] * layers
    assert (structure.head.in_width, structure.head.out_width) == (cfg["hidden_size"],
                                                                   cfg["vocab_size"])


def _hide_the_gate_and_up_projections(ckpt: Path) -> None:
    """Each MLP's gate and up MatMul reads its weight through an Identity: the same model, but
    no MatMul of an initializer there, so the structure shows no MLP (a graph of a shape
    hexbundle does not know)."""
    proto = onnx.load(str(ckpt / "model_dynamic.onnx"))
    weights = {t.name for t in proto.graph.initializer}
    gates = [n for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in weights
             and any(r.op_type == "Sigmoid" and r.input[0] == n.output[0]
                     for r in proto.graph.node)]
    ups = [n for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in weights
           and n.input[0] in {g.input[0] for g in gates} and n not in gates]
    assert len(gates) == len(ups) == base_config()["num_hidden_layers"]
    for node in gates + ups:
        hidden = node.input[1] + "_hidden"
        proto.graph.node.append(onnx.helper.make_node("Identity", [node.input[1]], [hidden]))
        node.input[1] = hidden
    nodes = list(proto.graph.node)   # the Identities first: the graph stays sorted
    del proto.graph.node[:]
    proto.graph.node.extend([n for n in nodes if n.op_type == "Identity"]
                            + [n for n in nodes if n.op_type != "Identity"])
    onnx.save(proto, str(ckpt / "model_dynamic.onnx"))


def test_a_size_the_structure_does_not_show_is_config_jsons_said_or_refused(tmp_path):
    project = copy_project(tmp_path / "proj")
    ckpt = make_checkpoint(tmp_path / "ckpt")
    _hide_the_gate_and_up_projections(ckpt)
    run = _import(project, ckpt)
    assert run.code == 0, run.out + run.err
    width = base_config()["intermediate_size"]
    assert (f"note: intermediate_size = {width}: config.json's intermediate_size; "
            f"{ckpt / 'model_dynamic.onnx'} does not show it (no MLP found") in run.out, run.out
    text = (project.root / "configs" / "models" / "ckpt.toml").read_text()
    assert f"intermediate_size = {width}\n" in text
    config = json.loads((ckpt / "config.json").read_text())
    del config["intermediate_size"]
    (ckpt / "config.json").write_text(json.dumps(config))
    (project.root / "configs" / "models" / "ckpt.toml").unlink()
    _refused(_import(project, ckpt), f"{ckpt / 'model_dynamic.onnx'}: no MLP found",
             "does not show the intermediate_size", f"{ckpt / 'config.json'} has no "
             "intermediate_size either", "--model-config PATH/config.json")
    assert not (project.root / "configs" / "models" / "ckpt.toml").exists()


def test_a_disagreement_names_both_files_both_values_and_the_flag(tmp_path):
    project = copy_project(tmp_path / "proj")
    width = base_config()["intermediate_size"]
    ckpt = make_checkpoint(tmp_path / "ckpt", {"intermediate_size": width + 64})
    _refused(_import(project, ckpt), f"{ckpt / 'config.json'}: intermediate_size {width + 64} "
             f"(the graphs: {width})", f"intermediate_size {width}: "
             f"{ckpt / 'model_dynamic.onnx'}: the MLP's gate, up and down projections",
             "Give the one the checkpoint was made from: --model-config PATH/config.json")
    # the right config.json given with --model-config is taken instead of the folder's
    run = _import(project, ckpt, "--model-config", str(BASE / "config.json"))
    assert run.code == 0, run.out + run.err


@pytest.mark.parametrize("change,needle", [
    # past any count a config can hold (support.jsondoc's and hf_config's bounds) or past
    # config/build.py's range for the key (the importer's own check): either names file and key
    ({"num_hidden_layers": 10 ** 30}, "key 'num_hidden_layers' is an integer of 31 digits"),
    ({"vocab_size": 1 << 40}, "vocab_size is 1099511627776"),
    ({"intermediate_size": 1 << 31}, "intermediate_size is 2147483648, outside [8, 1.04858e+06]"),
    ({"rope_theta": 1e300}, "rope_theta is 1e+300"),
], ids=["layers", "vocab", "intermediate", "theta"])
def test_an_absurd_config_json_value_is_refused_cleanly(tmp_path, change, needle):
    """Issue 46, item 4: a value of the right type but no model's size is refused before it
    sizes anything (the graphs pinned from config.json's sizes), naming the file and the fix."""
    project = copy_project(tmp_path / "proj")
    ckpt = make_checkpoint(tmp_path / "ckpt", change)
    _refused(_import(project, ckpt), f"{ckpt / 'config.json'}: {needle}",
             "--model-config PATH/config.json")
    assert not (project.root / "configs" / "models" / "ckpt.toml").exists()


def test_a_mistyped_model_id_gets_did_you_mean(tmp_path):
    project = copy_project(tmp_path / "proj")
    run = project.doit("import_export", "--dir", str(BASE), "--name", "ckpt", "--model-id",
                       "qwen3-4b", check=False)
    _refused(run, "--model-id 'qwen3-4b'", "(did you mean 'qwen3_4b'?)", "give one of")


LLAMA_CKPT = CKPT_DATA / "llama_v3_2_1b_instruct-0.65.0"   # args.json: context_length 1024


def test_the_context_length_args_json_records_is_the_default_and_said(tmp_path):
    project = copy_project(tmp_path / "proj")
    recorded = json.loads((LLAMA_CKPT / "args.json").read_text())["context_length"]
    run = project.doit("import_export", "--dir", str(LLAMA_CKPT), "--name", "ckpt",
                       "--model-id", "llama_v3_2_1b_instruct", check=False)
    assert run.code == 0, run.out + run.err
    assert (f"at context length {recorded} (args.json: the context length the quantize "
            "calibrated at; --context-length N,... builds others)") in run.out, run.out
    text = (project.root / "configs" / "models" / "ckpt.toml").read_text()
    assert f"context_length = {recorded}\n" in text, text
    # given, --context-length wins, and args.json is not read at all
    ckpt = tmp_path / "ckpt"
    shutil.copytree(LLAMA_CKPT, ckpt, ignore=shutil.ignore_patterns("expected_split*"))
    (ckpt / "args.json").write_text('{"context_length": "long"}')
    run = project.doit("import_export", "--dir", str(ckpt), "--name", "ckpt",
                       "--model-id", "llama_v3_2_1b_instruct", "--context-length", "512",
                       check=False)
    assert run.code == 0, run.out + run.err
    assert "context_length = 512\n" in (project.root / "configs" / "models" /
                                        "ckpt.toml").read_text()
    # not given, a broken args.json is named with the flag that makes it unneeded
    for text, says in (('{"context_length": "long"}', 'context_length is "long"'),
                       ('{"context_length": 64}', "context length 64 is outside (128,"),
                       ("[1, 2]", "a JSON list"), ("{", "not valid JSON")):
        (ckpt / "args.json").write_text(text)
        _refused(project.doit("import_export", "--dir", str(ckpt), "--name", "ckpt2",
                              "--model-id", "llama_v3_2_1b_instruct", check=False),
                 f"{ckpt / 'args.json'}", says, "--context-length N")
    (ckpt / "args.json").unlink()   # no args.json: qai-hub-models' default, said so
    run = project.doit("import_export", "--dir", str(ckpt), "--name", "ckpt",
                       "--model-id", "llama_v3_2_1b_instruct", check=False)
    assert run.code == 0 and "(qai-hub-models' default for llama_v3_2_1b_instruct" in run.out


WIDE_MLP = CKPT_DATA / "qwen3_8b-0.64.0"   # MLP width 256 == 2 query heads x head_dim 128


@pytest.mark.heavy   # an import and a build of the bundle
def test_a_checkpoint_whose_mlp_is_as_wide_as_its_queries_imports_and_builds(tmp_path):
    """Issue 46, item 3: qai-hub-models 0.64.0's own qwen3_8b quantize of a Qwen3-8B-class
    model (hidden 160, 2 heads x head_dim 128, one KV head, intermediate 256: the MLP as wide
    as the query projections). The width rule before the structure found no MLP here ("no MLP
    weight [hidden, intermediate] found"); imported as a user would (no --context-length: the
    2048 its args.json records), every size is config.json's, and it builds."""
    cfg = json.loads((WIDE_MLP / "config.json").read_text())
    assert cfg["intermediate_size"] == cfg["num_attention_heads"] * cfg["head_dim"]
    project = copy_project(tmp_path / "proj")
    run = project.doit("import_export", "--dir", str(WIDE_MLP), "--name", "wide",
                       "--model-id", "qwen3_8b", check=False)
    assert run.code == 0, run.out + run.err
    assert (f"settings: num_layers {cfg['num_hidden_layers']}, hidden_size {cfg['hidden_size']}, "
            f"num_attention_heads {cfg['num_attention_heads']}, num_kv_heads "
            f"{cfg['num_key_value_heads']}, head_dim {cfg['head_dim']}, intermediate_size "
            f"{cfg['intermediate_size']}, vocab_size {cfg['vocab_size']}") in run.out, run.out
    recorded = json.loads((WIDE_MLP / "args.json").read_text())["context_length"]
    assert f"at context length {recorded} (args.json" in run.out, run.out
    bundle = project.doit("bundle", "model=wide", check=False)
    assert bundle.code == 0, bundle.out + bundle.err
    expected = _expected(WIDE_MLP.name)
    assert len(project.manifest("wide")["graphs"]) == 2 * expected["num_splits"]
