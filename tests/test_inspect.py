"""`doit inspect`: what a real export holds, and every problem the build would refuse, at once.

Against the tree qai-hub-models 0.55.0's own code wrote (tests/data/qaihm/export/: ar128_cl256/
and ar1_cl256/, 6 parts each plus the unsplit graph). Broken copies are made in tmp_path;
nothing under tests/data is written.
"""
import json
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, copy_project
from hexbundle.checks.inspect import fold, inspect_command, inspect_path, render
from hexbundle.support.errors import InputError

DATA = ROOT / "tests" / "data" / "qaihm" / "export"
SLUG = "qwen2_5_7b_instruct"


def part(root: Path, ar: int, index: int) -> Path:
    """<root>/ar<ar>_cl256/<stem>.aimet/<stem> (add the suffix)."""
    stem = f"{SLUG}_w8a16_ar{ar}_cl256_{index}_of_6"
    return root / f"ar{ar}_cl256" / f"{stem}.aimet" / stem


def break_copy(dest: Path) -> dict:
    """A copy of the export with two faults: part 2's .data renamed, and a param entry of
    part 3's encodings renamed to a tensor its ONNX does not have."""
    shutil.copytree(DATA, dest)
    data = part(dest, 128, 2).with_suffix(".data")
    data.rename(data.with_name("renamed.data"))
    enc_path = part(dest, 128, 3).with_suffix(".encodings")
    enc = json.loads(enc_path.read_text())
    enc["param_encodings"][0]["name"] = "no_such_tensor"
    enc_path.write_text(json.dumps(enc))
    return {"onnx": part(dest, 128, 2).with_suffix(".onnx"), "location": data.name,
            "encodings": enc_path}


# ============================================================================ in-process

def test_the_tree_lists_every_graph_and_encodings_file_with_no_problem():
    found = inspect_path(DATA)
    assert found.problems == []
    assert len(found.graphs) == 14 and len(found.encodings) == 14    # 12 parts + 2 unsplit
    assert found.kind == "qai-hub-models 0.52-0.55 tree"
    names = {g.onnx.name for g in found.graphs}
    assert f"{SLUG}.onnx" in names and part(DATA, 1, 6).with_suffix(".onnx").name in names
    for g in found.graphs:   # each paired as the tree pairs it: <stem>.encodings next to it
        assert g.encodings == g.onnx.with_suffix(".encodings")
        assert g.data_files and all(size > 0 for _, size in g.data_files)
        assert g.external[0] > 0 and g.external[1] > 0
    unsplit = next(g for g in found.graphs if g.onnx == DATA / "ar128_cl256" / f"{SLUG}.onnx")
    assert unsplit.ops["Conv"] > 0 and unsplit.ops["Constant"] > 0
    assert unsplit.io.inputs["input_ids"] == ("int32", (1, 128))
    assert unsplit.io.outputs["logits"] == ("float32", (1, 128, 1024))
    assert unsplit.opsets == (("ai.onnx", 17),) and unsplit.ir_version > 0
    text = "\n".join(render(found))
    assert text.splitlines()[-1] == "14 graphs, 14 encodings files, 0 problems"
    assert "past_key_{0..8}_in" in text and "Constant 798" in text
    inspect_command(path=str(DATA))   # no problem: returns


def test_one_part_onnx_with_its_encodings():
    onnx_path = part(DATA, 128, 2).with_suffix(".onnx")
    found = inspect_path(onnx_path)
    assert found.problems == [] and len(found.graphs) == 1 and len(found.encodings) == 1
    g = found.graphs[0]
    assert g.encodings == onnx_path.with_suffix(".encodings")
    assert [p.name for p, _ in g.data_files] == [onnx_path.with_suffix(".data").name]
    assert g.ops["Conv"] == 20 and g.ops["MatMul"] == 20
    assert g.io.inputs["attention_mask"] == ("float32", (1, 1, 128, 256))
    lines = render(found)
    io = [line for line in lines if "attention_mask" in line or "position_ids_cos" in line]
    assert len({line.index("float32") for line in io}) == 1    # aligned columns
    assert lines[-1] == "1 graph, 1 encodings file, 0 problems"


def test_one_encodings_file_counts_per_class_and_kind():
    found = inspect_path(part(DATA, 128, 2).with_suffix(".encodings"))
    assert found.problems == [] and found.graphs == [] and len(found.encodings) == 1
    rows = found.encodings[0].rows()
    # (class, enc type, bitwidth, dtype, symmetric, block size, count): the real w4a16 part
    assert ("params", "PER_CHANNEL", 4, "int", True, 0, 24) in rows
    assert ("params", "PER_TENSOR", 16, "int", False, 0, 4) in rows
    assert sum(r[6] for r in rows if r[0] == "params") == 28
    assert sum(r[6] for r in rows if r[0] == "activations") == 291
    text = "\n".join(render(found))
    assert "schema 1.0.0; 28 params, 291 activations" in text
    assert "class        enc type     bw  dtype  sym  count" in text


def test_a_broken_copy_lists_every_problem_at_once(tmp_path):
    broken = break_copy(tmp_path / "export")
    found = inspect_path(tmp_path / "export")
    assert len(found.graphs) == 14     # the graph with a broken record is still listed
    renamed = [p for p in found.problems if str(broken["onnx"]) in p and broken["location"] in p]
    unknown = [p for p in found.problems if str(broken["encodings"]) in p and "no_such_tensor" in p]
    assert renamed and unknown, found.problems
    with pytest.raises(InputError, match=r"problems \(listed above\)"):
        inspect_command(path=str(tmp_path / "export"))


def test_a_plain_directory_pairs_each_onnx_with_its_encodings(tmp_path):
    src = part(DATA, 1, 2)
    for suffix in (".onnx", ".data", ".encodings"):
        shutil.copy(src.with_suffix(suffix), tmp_path)
    shutil.copy(part(DATA, 1, 3).with_suffix(".onnx"), tmp_path)   # no .data, no encodings
    found = inspect_path(tmp_path)
    assert found.kind == "directory of ONNX models" and len(found.graphs) == 2
    assert [g.encodings is not None for g in found.graphs] == [True, False]
    assert len(found.problems) == 1 and "does not exist" in found.problems[0]


def test_an_encodings_file_that_does_not_load_is_a_problem(tmp_path):
    bad = tmp_path / "x.encodings"
    bad.write_text('{"version": "1.0.0", "param_encodings": {}}')
    found = inspect_path(bad)
    assert len(found.problems) == 1 and str(bad) in found.problems[0]
    assert render(found)[-1] == "0 graphs, 1 encodings file, 1 problem"


def test_missing_or_nonexistent_path_is_a_clean_error(tmp_path):
    with pytest.raises(InputError, match="--path"):
        inspect_command(path="")
    with pytest.raises(InputError, match="nowhere"):
        inspect_command(path=str(tmp_path / "nowhere"))


def test_fold_names_that_differ_in_one_number():
    assert fold(["past_key_0_in", "past_key_1_in", "past_key_2_in"]) == "past_key_{0..2}_in"
    assert fold(["k_0", "k_3"]) == "k_{0,3}"
    assert fold(["a"]) == "a"


# ============================================================================ doit, end to end

@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_doit_inspect_end_to_end(tmp_path):
    proj = copy_project(tmp_path / "proj")
    ok = proj.doit("inspect", "--path", str(DATA))
    assert ok.out.rstrip().splitlines()[-1] == "14 graphs, 14 encodings files, 0 problems"
    assert "ops (" in ok.out and "Conv" in ok.out

    broken = break_copy(tmp_path / "broken")
    bad = proj.doit("inspect", "--path", str(tmp_path / "broken"), check=False)
    assert bad.code != 0
    assert "problems the build would refuse" in bad.out
    assert str(broken["onnx"]) in bad.out and broken["location"] in bad.out
    assert str(broken["encodings"]) in bad.out and "no_such_tensor" in bad.out
    assert "14 graphs, 14 encodings files, " in bad.out

    none = proj.doit("inspect", check=False)
    assert none.code != 0 and "--path" in none.out + none.err
    gone = proj.doit("inspect", "--path", str(tmp_path / "gone"), check=False)
    assert gone.code != 0 and str(tmp_path / "gone") in gone.out + gone.err


QAIHM = ROOT / "tests" / "data" / "qaihm"


@pytest.mark.parametrize("export, graphs", [("export-qwen3", 10), ("export-llama32", 8),
                                            ("export-falcon3", 12)])
def test_every_familys_export_is_inspected_with_no_problem(export, graphs):
    """Each family's tokenizer judged by the tokens it has: a Qwen's by the family's, a Llama-
    style decoder's only for validity without its config.json (Llama 3.x, Mistral and Falcon 3
    differ), and by config.json's ids with it."""
    found = inspect_path(QAIHM / export)
    assert found.problems == [] and len(found.graphs) == graphs, found.problems


def test_a_falcon3_tokenizer_is_judged_by_its_config_json():
    from hexbundle.formats.hf_config import read_hf_config
    own = inspect_path(QAIHM / "export-falcon3", hf=read_hf_config(QAIHM / "config-falcon3.json"))
    assert own.problems == []
    other = inspect_path(QAIHM / "export-falcon3",
                         hf=read_hf_config(QAIHM / "config-llama32.json"))
    assert any("'<|begin_of_text|>' (bos" in p for p in other.problems), other.problems
