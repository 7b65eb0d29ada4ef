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
], ids=["gemma4", "qwen3.5", "vlm", "phi3", "layers", "heads", "kv-heads", "vocab"])
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
