"""hexbundle.config.layout: every path of a build, from one place."""

from hexbundle.config.build import load_build
from hexbundle.config.layout import BUILD_ROOT_ENV, Layout, ProjectLayout, graph_files
from conftest import CONFIGS

ROOT = CONFIGS.resolve()   # the project root the configs are loaded from


def test_build_paths_hang_off_the_build_root(monkeypatch, tmp_path):
    monkeypatch.setenv(BUILD_ROOT_ENV, str(tmp_path / "scratch"))
    layout = Layout(load_build(CONFIGS))
    scratch = (tmp_path / "scratch").resolve()
    assert layout.build_dir == scratch / "qwen2-tiny" / "iq9075" / "four" / "reference"
    assert layout.inputs_dir == scratch / "qwen2-tiny" / "inputs"
    assert layout.state_dir == scratch / ".hexbundle"
    assert layout.doit_db() == scratch / ".hexbundle" / "db" / "qwen2-tiny" / "iq9075" / "four" / \
        "reference" / "doit-db.json"
    assert layout.model_db() == scratch / ".hexbundle" / "db" / "qwen2-tiny" / "doit-db.json"
    assert layout.release_archive == scratch / "release" / "qwen2-tiny-iq9075-four.tar.gz"
    # the toolchain image is recorded in the project's own build/, whatever the build root
    assert layout.image_record == ROOT / "build" / "image" / "image.json"
    # manifests record "build/..." wherever the build root is
    assert layout.logical(layout.bundle_dir) == "build/qwen2-tiny/iq9075/four/reference/bundle"


def test_an_exported_model_reads_its_inputs_where_its_config_says():
    layout = Layout(load_build(CONFIGS, {"model": "qwen2.5-7b-instruct"}))
    assert layout.inputs_dir == ROOT / "exports" / "qwen2.5-7b-instruct"
    part = layout.cfg.part(1)
    graph = layout.cfg.model.graphs(part)[0]
    assert layout.graph_inputs(graph) == list(graph_files(layout.inputs_dir, graph))
    assert [p.suffix for p in layout.graph_inputs(graph)] == [".onnx", ".data", ".encodings"]
    assert layout.all_inputs()[-1] == layout.inputs_dir / "tokenizer.json"


def test_project_paths_need_no_build_config(tmp_path):
    project = ProjectLayout(tmp_path, tmp_path / "b")
    assert project.model_config("m") == tmp_path.resolve() / "configs" / "models" / "m.toml"
    assert project.script("step.py") == tmp_path.resolve() / "scripts" / "step.py"
    assert project.rel(tmp_path / "configs" / "x.toml") == "configs/x.toml"
    assert project.rel("/elsewhere/y") == "/elsewhere/y"


def test_rel_with_settled_directories_is_rel(tmp_path):
    """While the task graph is declared (ProjectLayout.paths_settled) each directory's real path
    is looked up once; every path still comes out as rel gives it: through a linked directory,
    a linked file, a link loop, a missing file, '..', outside the project."""
    import os
    root = tmp_path / "proj"
    (root / "real" / "sub").mkdir(parents=True)
    (root / "real" / "f.onnx").write_text("x")
    (root / "linked").symlink_to(root / "real")
    (root / "real" / "file_link").symlink_to(root / "real" / "f.onnx")
    (root / "real" / "outside").symlink_to(tmp_path)
    (root / "loop").symlink_to(root / "loop")
    project = ProjectLayout(root, tmp_path / "build")
    paths = [root / "real" / "f.onnx", root / "linked" / "f.onnx", root / "linked" / "sub",
             root / "linked" / "file_link", root / "linked" / "missing.data",
             root / "loop" / "x", root / "loop", root / "linked" / "sub" / "..",
             root / "linked" / "outside" / "elsewhere", tmp_path / "other" / "y", root]
    plain = [project.rel(p) for p in paths]
    with project.paths_settled():
        settled = [project.rel(p) for p in paths] + [project.rel(p) for p in paths]
    assert settled == plain + plain
    assert plain[1] == os.path.join("real", "f.onnx") and plain[3] == plain[1]
    # the directories are looked up once only while settled: a link changed afterwards counts
    (root / "linked").unlink()
    (root / "linked").symlink_to(root / "real" / "sub")
    assert project.rel(root / "linked" / "f.onnx") == os.path.join("real", "sub", "f.onnx")
