"""Several context lengths per bundle (issue 15): `graphs.context_lengths = [...]` builds, per
part, a prompt and a token graph for each length, all in one context binary sharing one copy of
the weights; Genie's context size is the largest; the size check and `doit verify` follow.

End-to-end tests run real `doit` in a copy of the project; the config tests load configs
in-process."""
import json
import re
import shutil

import pytest
import tomli

from conftest import ROOT, copy_project, tree_digests
from hexbundle.config.build import load_build
from hexbundle.config.model import Part, part_graphs
from hexbundle.formats.ctxbin import read_ctxbin
from hexbundle.formats.qaihm import scan_export
from hexbundle.support.errors import ConfigError

MODEL = "qwen2-tiny-2cl"          # configs/models: qwen2-tiny at context lengths 256 and 512
TINY_PARTS = ["part_1_of_4", "part_2_of_4", "part_3_of_4", "part_4_of_4"]


@pytest.fixture(scope="module")
def two_lengths(tmp_path_factory):
    """qwen2-tiny-2cl built and verified once for the module's checks."""
    project = copy_project(tmp_path_factory.mktemp("ctx") / "proj")
    bundle = project.doit("bundle", f"model={MODEL}")
    verify = project.doit("verify", f"model={MODEL}")
    return project, bundle, verify


# ============================================================================ the model config

def graphs_line(project, line: str):
    """Load MODEL with its [graphs] context line replaced by `line`."""
    path = project.root / "configs" / "models" / f"{MODEL}.toml"
    text = path.read_text()
    old = next(l for l in text.splitlines() if l.startswith("context_lengths"))
    path.write_text(text.replace(old, line))
    return load_build(project.root, {"model": MODEL})


def test_lengths_are_sorted_and_genie_gets_the_largest(project):
    cfg = graphs_line(project, "context_lengths = [512, 256]")
    assert cfg.model.context_lengths == (256, 512) and cfg.model.context_length == 512
    assert cfg.genie.max_num_tokens == 512     # min(Qualcomm's 2048, the largest length)
    names = [g.name for g in cfg.model.graphs(cfg.part(2))]
    assert names == ["prompt_ar128_cl256_2_of_4", "token_ar1_cl256_2_of_4",
                     "prompt_ar128_cl512_2_of_4", "token_ar1_cl512_2_of_4"]
    assert [g.slot for g in cfg.model.graphs(cfg.part(2))] == \
        ["prompt_cl256", "token_cl256", "prompt_cl512", "token_cl512"]


def test_one_length_keeps_its_names(project):
    cfg = load_build(project.root, {"model": "qwen2-tiny"})
    assert [g.slot for g in cfg.model.graphs(cfg.part(1))] == ["prompt", "token"]
    assert part_graphs(Part(1, 1, (), True, True), (256,), 128, 1)[0].name == \
        "prompt_ar128_cl256_1_of_1"


@pytest.mark.parametrize("line, message", [
    ("context_lengths = [256, 256]", "names a length twice"),
    ("context_lengths = []", "context_lengths is empty"),
    ("context_lengths = [100, 512]", "must be < every context length (the smallest is 100)"),
    ("context_lengths = [256]\ncontext_length = 256", "give exactly one of"),
    ("context_lengths = [256, 1]", "key 'graphs.context_lengths[1]' is 1; expected an integer in [2"),
])
def test_bad_lengths_are_refused_naming_the_key(project, line, message):
    with pytest.raises(ConfigError, match="qwen2-tiny-2cl.toml") as err:
        graphs_line(project, line)
    assert message in str(err.value)


def test_verify_tokens_must_fit_the_smallest_length(project):
    with pytest.raises(ConfigError, match="exceeds the smallest of graphs.context_lengths, 180"):
        graphs_line(project, "context_lengths = [180, 512]")


# ============================================================================ the build

@pytest.mark.heavy   # its module fixture builds (30-113 s measured): the full suite (`pytest --full`)
def test_one_bin_per_part_holds_four_graphs_and_one_copy_of_the_weights(two_lengths):
    project, run, _ = two_lengths
    bundle = project.bundle(MODEL)
    genie = json.loads((bundle / "genie_config.json").read_text())
    bins = genie["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    assert bins == [f"qwen2_tiny_2cl_{p}.bin" for p in TINY_PARTS]     # ctx-bins unchanged
    assert genie["dialog"]["context"]["size"] == 512                  # the largest
    assert sorted(p.name for p in bundle.glob("*.bin")) == sorted(bins)
    for index, name in enumerate(bins, start=1):
        reader = read_ctxbin(bundle / name)
        try:
            assert reader.graph_names == [f"prompt_ar128_cl256_{index}_of_4",
                                          f"token_ar1_cl256_{index}_of_4",
                                          f"prompt_ar128_cl512_{index}_of_4",
                                          f"token_ar1_cl512_{index}_of_4"]
            weights = [set(g.weights) for g in reader.graphs]
            assert weights[0] and all(w == weights[0] for w in weights)   # every graph, all
            blobs = {reader.record(g.name, w).blob for g in reader.graphs for w in g.weights}
            assert len(blobs) == len(weights[0])        # one blob per weight: one copy in all
        finally:
            reader.close()
    for part in TINY_PARTS:   # a DLC per graph, each converted once
        for slot in ("prompt_cl256", "token_cl256", "prompt_cl512", "token_cl512"):
            assert f"convert:{part}_{slot}" in run.executed


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_the_size_check_counts_every_graph(two_lengths, project):
    """The four-graph bins are judged against an expectation of four graphs (exact for the
    reference backend), and each is larger than the one-length bin by topologies only."""
    two, _, _ = two_lengths
    one = project.doit("bundle")
    assert "size check: qwen2-tiny, plan four" in one.out
    sizes = {}
    for proj, model in ((two, MODEL), (project, "qwen2-tiny")):
        sizes[model] = [(proj.bundle(model) / f"{model.replace('-', '_')}_{p}.bin").stat().st_size
                        for p in TINY_PARTS]
    check = two.doit("check_sizes", f"model={MODEL}").out
    assert "total" in check and "+0.00" in check.split("total", 1)[1].splitlines()[0]
    for two_size, one_size in zip(sizes[MODEL], sizes["qwen2-tiny"]):
        assert one_size < two_size < 1.25 * one_size      # not a second copy of the weights


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_unshared_weights_across_lengths_are_refused(two_lengths, tmp_path):
    """weight_sharing off stores the weights once per graph: four copies, caught by size."""
    project = copy_project(tmp_path / "proj")
    run = project.doit("bundle", f"model={MODEL}", "weight_sharing=false", check=False)
    assert run.code != 0 and "Traceback" not in run.out + run.err
    assert "weights are stored 4 times (the prompt and token graph of every context length " \
           "each hold a copy)" in run.out + run.err, run.out[-3000:]


@pytest.mark.heavy   # its module fixture builds (30-113 s measured): the full suite (`pytest --full`)
def test_verify_runs_every_length(two_lengths):
    project, _, run = two_lengths
    report = json.loads((project.build_dir(MODEL) / "verify" / "report.json").read_text())
    assert report["ok"] and {r["part"] for r in report["rows"]} >= {"end to end cl 256",
                                                                    "end to end cl 512"}
    rows = {(r["part"], r["check"]) for r in report["rows"]}
    for cl in (256, 512):
        for part in range(1, 5):
            assert (f"part {part} of 4 (qwen2_tiny_2cl_part_{part}_of_4.bin) cl {cl}",
                    "prefill vs reference") in rows, sorted(rows)
            # the terminal's table (120 columns) names the part short
            assert re.search(rf"part {part}/4 cl {cl} +prefill vs reference", run.out), \
                run.out[-3000:]
        assert f"end to end cl {cl}" in run.out
    assert "ok in" in run.out


# ============================================================================ a real export

# Written by qai-hub-models 0.55.0's own export loop at context lengths 256 and 512 (ar128/ar1
# x cl256/cl512, six parts each, the generic path's <ClassName>.aimet/model.onnx unsplit graphs):
# tests/data/qaihm/make_export.py --two-context-lengths; README there.
EXPORT_2CL = ROOT / "tests" / "data" / "qaihm" / "export-2cl"
SLUG = "qwen2_5_7b_instruct"


def bin_graphs(bundle, name: str) -> list:
    reader = read_ctxbin(bundle / name)
    try:
        return reader.graph_names
    finally:
        reader.close()


@pytest.fixture(scope="module")
def imported_2cl(tmp_path_factory):
    """Qualcomm's two-length tree imported as it is, built and verified."""
    project = copy_project(tmp_path_factory.mktemp("qaihm2cl") / "proj")
    before = tree_digests(EXPORT_2CL)
    run = project.doit("import_export", "--dir", str(EXPORT_2CL), "--name", "two")
    bundle = project.doit("bundle", "model=two")
    verify = project.doit("verify", "model=two", check=False)
    assert tree_digests(EXPORT_2CL) == before       # used in place, never written
    return project, run, bundle, verify


def test_the_two_length_tree_is_scanned_with_every_ar_and_length():
    tree = scan_export(EXPORT_2CL)
    assert not tree.problems and tree.context_lengths == [256, 512] and tree.context_length == 512
    assert sorted(tree.parts) == [(1, 256), (1, 512), (128, 256), (128, 512)]
    assert all(sorted(p) == list(range(1, 7)) for p in tree.parts.values())
    assert tree.unsplit[(128, 512)].onnx == \
        EXPORT_2CL / "ar128_cl512" / "TinyQwen2_AIMETOnnx.aimet" / "model.onnx"


def test_a_missing_length_directory_is_named(tmp_path):
    export = tmp_path / "export"
    shutil.copytree(EXPORT_2CL, export)
    shutil.rmtree(export / "ar1_cl512")
    tree = scan_export(export)
    assert any("context length 512 has no AR 1 graphs (ar1_cl512/ is missing)" in p
               for p in tree.problems), tree.problems


@pytest.mark.heavy   # its module fixture builds (30-113 s measured): the full suite (`pytest --full`)
def test_import_writes_both_lengths_and_the_file_of_every_graph(imported_2cl):
    project, run, _, _ = imported_2cl
    cfg = tomli.loads((project.root / "configs/models/two.toml").read_text())
    assert cfg["graphs"] == {"context_lengths": [256, 512], "prompt_ar": 128, "token_ar": 1}
    assert cfg["genie"]["max_num_tokens"] == 512
    stem = f"{SLUG}_w4a16_ar1_cl512_3_of_6"
    assert cfg["inputs"]["graphs"]["token_ar1_cl512_3_of_6"]["onnx"] == \
        f"ar1_cl512/{stem}.aimet/{stem}.onnx"
    assert len(cfg["inputs"]["graphs"]) == 24
    assert f"prompt_ar128_cl512_1_of_6 <- ar128_cl512/" in run.out


@pytest.mark.heavy   # its module fixture builds (30-113 s measured): the full suite (`pytest --full`)
def test_the_export_builds_one_bin_per_part_with_its_four_graphs(imported_2cl):
    project, _, bundle, _ = imported_2cl
    out = project.bundle("two")
    genie = json.loads((out / "genie_config.json").read_text())
    assert genie["dialog"]["context"]["size"] == 512
    bins = genie["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    assert len(bins) == 6 and "size check: two, plan export (6 parts)" in bundle.out
    assert bin_graphs(out, bins[2]) == ["prompt_ar128_cl256_3_of_6", "token_ar1_cl256_3_of_6",
                                        "prompt_ar128_cl512_3_of_6", "token_ar1_cl512_3_of_6"]
    graphs = project.manifest("two")["graphs"]
    assert len(graphs) == 24
    assert graphs["prompt_ar128_cl512_2_of_6"]["onnx"].endswith(
        f"ar128_cl512/{SLUG}_w4a16_ar128_cl512_2_of_6.aimet/{SLUG}_w4a16_ar128_cl512_2_of_6.onnx")


@pytest.mark.heavy   # its module fixture builds (30-113 s measured): the full suite (`pytest --full`)
def test_the_export_verifies_at_both_lengths(imported_2cl):
    project, _, _, run = imported_2cl
    assert run.code == 0, run.out + run.err
    report = json.loads((project.build_dir("two") / "verify" / "report.json").read_text())
    ends = {r["part"]: r for r in report["rows"] if r["part"].startswith("end to end")
            and r["check"] == "chained vs reference"}
    assert sorted(ends) == ["end to end cl 256", "end to end cl 512"]
    assert all(r["cos_min"] >= 0.9999 and not r["problems"] for r in ends.values()), ends


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_the_export_splits_locally_at_both_lengths(tmp_path):
    """--plan: every length's unsplit graphs cut into the plan's parts; one .data per part."""
    project = copy_project(tmp_path / "proj")
    project.doit("import_export", "--dir", str(EXPORT_2CL), "--name", "mine", "--plan", "0,3,3,3")
    cfg = tomli.loads((project.root / "configs/models/mine.toml").read_text())
    assert cfg["inputs"]["split"] == "local"
    assert sorted(cfg["inputs"]["unsplit"]) == ["prompt_cl256", "prompt_cl512", "token_cl256",
                                               "token_cl512"]
    project.doit("bundle", "model=mine")
    out = project.bundle("mine", plan="export")
    assert bin_graphs(out, f"{SLUG}_part_2_of_4.bin") == [
        "prompt_ar128_cl256_2_of_4", "token_ar1_cl256_2_of_4",
        "prompt_ar128_cl512_2_of_4", "token_ar1_cl512_2_of_4"]
    split = project.root / "build" / "mine" / "inputs"
    assert sorted(p.name for p in split.glob("*.data")) == [f"part_{i}_of_4.data" for i in range(1, 5)]
    project.doit("verify", "model=mine")


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_weight_that_differs_between_lengths_is_refused_naming_both_graphs_files(tmp_path):
    """Weight sharing needs every length's copy of a weight to be the same bytes; a CL-512
    export whose weight differs is refused at compile, naming the two graphs and their files."""
    import numpy as np
    import onnx
    export = tmp_path / "export"
    shutil.copytree(EXPORT_2CL, export)
    stem = f"{SLUG}_w4a16_ar1_cl512_3_of_6"
    part = export / "ar1_cl512" / f"{stem}.aimet"
    model = onnx.load(str(part / f"{stem}.onnx"), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name.endswith("o_proj_conv.weight"))
    record = {e.key: e.value for e in init.external_data}
    offset, length = int(record.get("offset", 0)), int(record["length"])
    with open(part / f"{stem}.data", "r+b") as f:
        f.seek(offset)
        values = np.frombuffer(f.read(length), np.float32) * np.float32(1.5)
        f.seek(offset)
        f.write(values.tobytes())
    project = copy_project(tmp_path / "proj")
    project.doit("import_export", "--dir", str(export), "--name", "odd")
    run = project.doit("bundle", "model=odd", check=False)
    out = run.out + run.err
    assert run.code != 0 and "Traceback" not in out
    assert f"tensor '{init.name}' differs between graphs 'prompt_ar128_cl256_3_of_6' and " \
           "'token_ar1_cl512_3_of_6'" in out, out[-3000:]
    sources = out.split("the part's graphs were converted from", 1)[1]
    # the files relative to the export (the key and remote Action hold no absolute path)
    assert str((part / f"{stem}.data").relative_to(export)) in sources
    assert "ar128_cl512" not in sources and "ar1_cl256" not in sources   # only the two named
