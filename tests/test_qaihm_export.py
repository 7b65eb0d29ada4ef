"""Real exports, as they come: the tree qai-hub-models 0.55.0's own code wrote.

tests/data/qaihm/export/ was made by tests/data/qaihm/make_export.py: qai-hub-models 0.55.0's
quantize path (AIMET) and export_model for the qwen2_5_7b_instruct class, on a small random
Qwen2 (9 layers, hidden 64), AI Hub calls stubbed (see tests/data/qaihm/README.md). The other
layouts are made here FROM those Qualcomm-made files, because no other qai-hub-models release
runs here: the 0.46 tree (prompt/, token/) and Qualcomm's asset (<slug>_ar<S>.onnx, one shared
<slug>.data) are the same graphs renamed, their external-data locations rewritten as those
layouts record them (`_relocate`). Nothing under tests/data is ever written by a test.
"""
import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import ROOT, copy_project, tree_digests, unsplit_only_tree
from hexbundle.formats.qaihm import scan_export
from hexbundle.support.errors import InputError

DATA = ROOT / "tests" / "data" / "qaihm" / "export"
SLUG = "qwen2_5_7b_instruct"
PLAN = [0, 2, 2, 2, 2, 1]      # what Qualcomm's splitter made of the 9 layers


def copy_export(dest: Path) -> Path:
    shutil.copytree(DATA, dest)
    return dest


def part_files(root: Path, ar: int, index: int) -> Path:
    stem = f"{SLUG}_w8a16_ar{ar}_cl256_{index}_of_6"
    return root / f"ar{ar}_cl256" / f"{stem}.aimet" / stem


def _relocate(src_onnx: Path, dst_onnx: Path, location: str) -> None:
    """Save the ONNX under a new name, its external data recorded as `location` (what a layout
    that names its files so records); the offsets stay."""
    model = onnx.load(str(src_onnx), load_external_data=False)
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = location
    dst_onnx.parent.mkdir(parents=True, exist_ok=True)
    dst_onnx.write_bytes(model.SerializeToString())


def make_046_tree(dest: Path) -> Path:
    for ar, kind in ((128, "prompt"), (1, "token")):
        for i in range(1, 7):
            src = part_files(DATA, ar, i)
            stem = f"{SLUG}_{kind}_{i}_of_6"
            d = dest / kind / f"{stem}.aimet"
            _relocate(src.with_suffix(".onnx"), d / f"{stem}.onnx", f"{stem}.data")
            shutil.copy(src.with_suffix(".data"), d / f"{stem}.data")
            shutil.copy(src.with_suffix(".encodings"), d / f"{stem}.encodings")
    shutil.copy(DATA / "tokenizer.json", dest)
    return dest


def make_asset(dest: Path) -> Path:
    """<slug>_ar128.onnx, <slug>_ar1.onnx, ONE <slug>.data, ONE <slug>.encodings."""
    unsplit = {ar: DATA / f"ar{ar}_cl256" / SLUG for ar in (128, 1)}
    assert unsplit[128].with_suffix(".data").read_bytes() == unsplit[1].with_suffix(".data").read_bytes()
    dest.mkdir(parents=True)
    for ar, stem in unsplit.items():
        _relocate(stem.with_suffix(".onnx"), dest / f"{SLUG}_ar{ar}.onnx", f"{SLUG}.data")
    shutil.copy(unsplit[128].with_suffix(".data"), dest / f"{SLUG}.data")
    shutil.copy(unsplit[128].with_suffix(".encodings"), dest / f"{SLUG}.encodings")
    shutil.copy(DATA / "tokenizer.json", dest)
    return dest


def chain(unsplit: Path, parts: list) -> tuple:
    """(reference outputs, chained outputs) of onnxruntime on the same random inputs."""
    import onnxruntime as ort
    rng = np.random.default_rng(0)
    whole = ort.InferenceSession(str(unsplit))
    feeds = {}
    for i in whole.get_inputs():
        if i.name == "input_ids":
            dtype = np.int32 if "int32" in i.type else np.int64
            feeds[i.name] = rng.integers(0, 1024, i.shape).astype(dtype)
        elif i.name == "attention_mask":
            feeds[i.name] = np.zeros(i.shape, np.float32)
        else:
            feeds[i.name] = rng.standard_normal(i.shape).astype(np.float32)
    ref = dict(zip([o.name for o in whole.get_outputs()], whole.run(None, feeds)))
    hidden, outs = None, {}
    for path in parts:
        s = ort.InferenceSession(str(path))
        res = s.run(None, {i.name: feeds.get(i.name, hidden) for i in s.get_inputs()})
        named = dict(zip([o.name for o in s.get_outputs()], res))
        hidden = res[0]
        outs.update(named)
    return ref, outs


# ============================================================================ scanning

def test_the_055_tree_is_read_as_it_comes():
    tree = scan_export(DATA)
    assert tree.layout == "qai-hub-models 0.52-0.55 tree" and tree.slug == SLUG
    assert tree.precision == "w8a16" and tree.context_length == 256 and not tree.problems
    assert sorted(tree.parts) == [(1, 256), (128, 256)] and tree.part_count == 6
    assert all(sorted(tree.parts[ar, 256]) == list(range(1, 7)) for ar in (1, 128))
    assert sorted(tree.unsplit) == [(1, 256), (128, 256)]
    files = tree.parts[128, 256][2]
    assert files.data == (part_files(DATA, 128, 2).with_suffix(".data"),)   # as the ONNX records
    assert tree.tokenizer == DATA / "tokenizer.json"


def test_the_046_tree_and_the_asset_are_read(tmp_path):
    old = scan_export(make_046_tree(tmp_path / "t046"))
    assert old.layout == "qai-hub-models 0.46 tree" and old.slug == SLUG and not old.problems
    assert sorted(old.parts) == [(1, 256), (128, 256)] and old.context_length == 256
    asset = scan_export(make_asset(tmp_path / "asset"))
    assert asset.layout == "Qualcomm asset (unsplit)" and not asset.problems
    assert asset.unsplit[128, 256].data == asset.unsplit[1, 256].data == \
        (tmp_path / "asset" / f"{SLUG}.data",)


def test_a_missing_part_is_named(tmp_path):
    root = copy_export(tmp_path / "x")
    shutil.rmtree(part_files(root, 1, 3).parent)
    tree = scan_export(root)
    assert any("AR 1: part(s) 3 of 6 missing" in p for p in tree.problems), tree.problems


def test_a_renamed_data_file_names_the_onnx_and_the_location_it_records(tmp_path):
    root = copy_export(tmp_path / "x")
    stem = part_files(root, 128, 4)
    stem.with_suffix(".data").rename(stem.parent / "renamed.data")
    problems = " ".join(scan_export(root).problems)
    assert f"{stem.with_suffix('.onnx')}: records its weights in '{stem.name}.data'" in problems
    assert "restore its original name" in problems


def test_not_an_export_is_refused(tmp_path):
    with pytest.raises(InputError, match="no qai-hub-models export found"):
        scan_export(tmp_path)


# ============================================================================ the local split

@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_local_split_chains_to_the_unsplit_graph_bit_for_bit(tmp_path):
    """hexbundle's split, run by doit on the unsplit graphs alone, equals the unsplit graph."""
    project = copy_project(tmp_path / "proj")
    export = unsplit_only_tree(tmp_path / "export")
    before = tree_digests(export)
    run = project.doit("import_export", "--dir", str(export), "--name", "mine", "--plan",
                       "0,3,3,3")
    assert 'split = "local"' in (project.root / "configs/models/mine.toml").read_text(), run.out
    project.doit("inputs", "model=mine")
    split = project.root / "build" / "mine" / "inputs"
    for kind, ar in (("prompt", 128), ("token", 1)):
        parts = [split / f"{kind}_ar{ar}_cl256_{i}_of_4.onnx" for i in range(1, 5)]
        ref, outs = chain(export / f"ar{ar}_cl256" / f"{SLUG}.onnx", parts)
        assert set(ref) <= set(outs)
        for name, value in ref.items():
            assert np.array_equal(outs[name], value), (kind, name)
    # one .data per part, shared by both graphs, each weight once
    assert sorted(p.name for p in split.glob("*.data")) == [f"part_{i}_of_4.data" for i in range(1, 5)]
    assert tree_digests(export) == before   # used in place, never written


def test_qualcomms_own_parts_chain_to_the_unsplit_graph():
    """The cut hexbundle makes is the one Qualcomm's splitter made (same check, their parts)."""
    parts = [part_files(DATA, 128, i).with_suffix(".onnx") for i in range(1, 7)]
    ref, outs = chain(DATA / "ar128_cl256" / f"{SLUG}.onnx", parts)
    assert all(np.array_equal(outs[n], v) for n, v in ref.items())


# ============================================================================ end to end

@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """The Qualcomm-made tree imported as it is and built: (project, run of bundle)."""
    project = copy_project(tmp_path_factory.mktemp("qaihm") / "proj")
    before = tree_digests(DATA)
    run = project.doit("import_export", "--dir", str(DATA), "--name", "qaihm")
    assert "prompt_ar128_cl256_1_of_6 <- ar128_cl256/" in run.out
    bundle = project.doit("bundle", "model=qaihm")
    assert tree_digests(DATA) == before
    return project, run, bundle


def test_import_infers_the_model_from_the_files(imported):
    import tomli
    project, run, _ = imported
    cfg = tomli.loads((project.root / "configs/models/qaihm.toml").read_text())
    assert cfg["architecture"]["num_layers"] == 9 and cfg["architecture"]["hidden_size"] == 64
    assert cfg["architecture"]["num_attention_heads"] == 4
    assert cfg["architecture"]["num_kv_heads"] == 2 and cfg["architecture"]["head_dim"] == 16
    assert cfg["architecture"]["intermediate_size"] == 128
    assert cfg["architecture"]["vocab_size"] == 1024
    assert cfg["graphs"] == {"context_length": 256, "prompt_ar": 128, "token_ar": 1}
    assert cfg["quantization"] == {"decoder_linear_bitwidth": 4, "lm_head_bitwidth": 8,
                                   "embedding_bitwidth": 16, "activation_bitwidth": 16,
                                   "unencoded_weights": "int8"}   # as Qualcomm compiles it
    assert cfg["plans"]["export"]["layers_per_part"] == PLAN
    assert cfg["inputs"]["split"] == "export" and cfg["inputs"]["source"] == "qai-hub-models"
    # the family from the tensors; what they cannot say, the family's known values, named
    assert cfg["architecture"]["family"] == "qwen2" and "family qwen2: q/k/v biases" in run.out
    assert cfg["architecture"]["tie_word_embeddings"] is False   # its head differs from the table
    assert "rope_theta = 1e+06: not in the files: the qwen2 family's value" in run.out


def test_the_architecture_formula_agrees_with_the_tensors(imported):
    """The cross-check over the graphs' own topology (issue 25): no note on this Qwen2 export,
    as on the Qwen3, Llama 3.2 and Falcon 3 ones."""
    _, _, bundle = imported
    assert "size check: qaihm" in bundle.out and "architecture formula gives" not in bundle.out


def test_the_bundle_records_which_file_each_graph_came_from(imported):
    project, _, bundle = imported
    manifest = project.manifest("qaihm")
    graphs = manifest["graphs"]
    assert len(graphs) == 12
    src = graphs["token_ar1_cl256_3_of_6"]["onnx"]
    assert src.endswith(f"ar1_cl256/{SLUG}_w8a16_ar1_cl256_3_of_6.aimet/{SLUG}_w8a16_ar1_cl256_3_of_6.onnx")
    assert "size check: qaihm, plan export (6 parts)" in bundle.out
    assert "NOT PACKED" not in bundle.out


def test_unpacked_real_parts_fail_the_size_check(imported):
    project, _, _ = imported
    run = project.doit("bundle", "model=qaihm", "weights_packing=false", check=False)
    assert run.code != 0
    assert "4-bit weights were not packed" in run.out + run.err


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_verify_passes_on_the_qualcomm_made_export(imported):
    project, _, _ = imported
    run = project.doit("verify", "model=qaihm", check=False)
    assert run.code == 0, run.out + run.err
    report = json.loads((project.build_dir("qaihm") / "verify" / "report.json").read_text())
    assert report["ok"] is True and report["decode_steps"] == 32
    end = [r for r in report["rows"] if r["part"] == "end to end"
           and r["check"] == "chained vs reference"]
    assert end and end[0]["cos_min"] >= 0.9999, end


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_the_asset_is_split_locally_and_built(tmp_path):
    project = copy_project(tmp_path / "proj")
    asset = make_asset(tmp_path / "asset")
    # the asset holds no parts: the 7B class's split rule applied to these 9 layers gives what
    # Qualcomm's splitter made of them in export/ (PLAN)
    project.doit("import_export", "--dir", str(asset), "--name", "asset")
    cfg = tomllib.loads((project.root / "configs" / "models" / "asset.toml").read_text())
    assert cfg["plans"]["export"]["layers_per_part"] == PLAN
    project.doit("bundle", "model=asset")
    assert len(list((project.bundle("asset")).glob("*.bin"))) == 6
    assert project.manifest("asset")["graphs"]["prompt_ar128_cl256_2_of_6"]["split_from"].endswith(
        f"asset/{SLUG}_ar128.onnx")
    project.doit("verify", "model=asset")


def test_a_missing_tokenizer_is_said_and_tokenizer_config_alone_gets_a_message(tmp_path):
    project = copy_project(tmp_path / "proj")
    export = unsplit_only_tree(tmp_path / "export")
    (export / "tokenizer.json").rename(export / "tokenizer_config.json")
    run = project.doit("import_export", "--dir", str(export), "--name", "m", "--plan", "0,9")
    assert "tokenizer_config.json alone is not enough" in run.out
    assert "--tokenizer FILE" in run.out
    assert "tokenizer: missing" in run.out
    given = project.doit("import_export", "--dir", str(export), "--name", "m", "--plan", "0,9",
                         "--tokenizer", str(DATA / "tokenizer.json"))
    assert "tokenizer: missing" not in given.out, given.out   # it is given (issue 25)
    text = (project.root / "configs/models/m.toml").read_text()
    assert f'tokenizer = "{DATA / "tokenizer.json"}"' in text


def test_import_command_errors_are_clean(tmp_path):
    project = copy_project(tmp_path / "proj")
    run = project.doit("import_export", "--dir", str(tmp_path / "nope"), "--name", "m",
                       check=False)
    assert run.code != 0 and "no such directory" in run.out + run.err
    assert "Traceback" not in run.out + run.err



@pytest.mark.parametrize("slug, layers, parts", [
    ("qwen2_5_7b_instruct", 28, (0, 6, 6, 6, 6, 4)),   # the seeds' 6 parts
    ("qwen3_4b", 36, (0, 12, 12, 12)),
    ("qwen3_4b", 6, (0, 2, 2, 2)),                     # tests/data/qaihm/export-qwen3
    ("llama_v3_2_3b_instruct", 28, (0, 14, 14)),
    ("llama_v3_2_3b_instruct", 2, (0, 1, 1)),          # tests/data/qaihm/export-llama32
    ("llama_v3_1_8b_instruct", 32, (0, 9, 9, 9, 5)),
    ("falcon_v3_7b_instruct", 28, (0, 8, 8, 8, 4)),
    ("not_a_qaihm_model", 8, None),
])
def test_qualcomms_split_rule(slug, layers, parts):
    """split_onnx_utils' rule (0.55): groups of NUM_LAYERS_PER_SPLIT, or ceil(layers /
    (NUM_SPLITS - 1)) when that does not give NUM_SPLITS - 1 groups; the two exports in
    tests/data were cut by Qualcomm's own code as the rule says."""
    from hexbundle.formats.qaihm import qaihm_split
    assert qaihm_split(slug, layers) == parts


def _graph_with(initializers=(), conv_bias=None):
    from onnx import TensorProto, helper
    inits = [helper.make_tensor(name, TensorProto.FLOAT, [1], [0.0]) for name in initializers]
    nodes = []
    if conv_bias:
        inits.append(helper.make_tensor(conv_bias, TensorProto.FLOAT, [1], [0.0]))
        nodes.append(helper.make_node("Conv", ["x", "w", conv_bias], ["y"],
                                      name="/model/layers.0/self_attn/q_proj_sha.0/Conv"))
    return helper.make_model(helper.make_graph(nodes, "g", [], [], inits))


@pytest.mark.parametrize("initializers, conv_bias, family", [
    (["model.model.layers.0.self_attn.q_proj_sha.0.bias"], None, "qwen2"),       # 0.55's names
    (["model_layers_0_self_attn_q_proj_sha_0_Conv.bias"], None, "qwen2"),        # the asset's
    ([], "onnx::Conv_1234", "qwen2"),                                            # anonymous bias
    (["model.model.layers.0.self_attn.q_norm_sha.0.weight"], None, "qwen3"),
    (["model.model.layers.0.input_layernorm.weight"], None, "llama"),
    (["model.freq_norm.weight", "model.seq_proj.bias"], None, "llama"),   # no q/k/v's
])
def test_the_family_is_read_from_the_tensors(initializers, conv_bias, family):
    from hexbundle.inputs.import_export import family_from_graphs
    assert family_from_graphs([_graph_with(initializers, conv_bias)], [None])[0] == family


def test_biases_and_norms_together_are_no_known_family(tmp_path):
    from types import SimpleNamespace
    from hexbundle.inputs.import_export import family_from_graphs
    proto = _graph_with(["a.q_proj.bias", "a.k_norm.weight"])
    with pytest.raises(InputError, match="no family hexbundle knows has both"):
        family_from_graphs([proto], [SimpleNamespace(onnx=tmp_path / "m.onnx")])


@pytest.mark.parametrize("stem, slug, precision", [
    ("qwen3_4b_w4a16_ar128_cl256", "qwen3_4b", "w4a16"),
    ("qwen3_4b_w4a16_my_ckpt_ar128_cl256", "qwen3_4b", "w4a16"),   # a custom --checkpoint
    ("llama_v3_2_3b_instruct_w4a16_ar1_cl4096", "llama_v3_2_3b_instruct", "w4a16"),
])
def test_the_slug_and_precision_of_a_part_directory(stem, slug, precision):
    """export_main names parts <model_id>_<precision>[_<checkpoint stem>]_ar<S>_cl<C>."""
    from hexbundle.formats.qaihm import PRECISION, _slug_of
    assert _slug_of(stem) == slug and PRECISION.search(stem)["precision"] == precision
