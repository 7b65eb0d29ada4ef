"""`doit bundle` end to end, in real doit subprocesses: a fresh build, minimal rebuilds, traps."""
import json
import os
import shutil

import numpy as np
import pytest
import onnx

from hexbundle.formats.ctxbin import read_ctxbin

TINY_PARTS = ["part_1_of_4", "part_2_of_4", "part_3_of_4", "part_4_of_4"]


def all_files(directory):
    return sorted(p for p in directory.rglob("*") if p.is_file())


# --- a fresh build -----------------------------------------------------------------------------

def test_fresh_build_makes_a_complete_bundle(built):
    run = built.first_run
    first_line = run.out.splitlines()[0]
    assert first_line.startswith("hexbundle ") and "qwen2-tiny" in first_line
    assert "backend reference" in run.out and "executor local" in run.out
    assert "NOT deployable" in run.out
    assert "size check: qwen2-tiny" in run.out and "total" in run.out
    bundle = built.bundle()
    names = sorted(p.name for p in bundle.iterdir())
    assert names == sorted(["genie_config.json", "htp_backend_ext_config.json", "tokenizer.json",
                            "manifest.json"] + [f"qwen2_tiny_{t}.bin" for t in TINY_PARTS])


def test_genie_config_is_derived_from_model_device_and_tokenizer(built):
    cfg = json.loads((built.bundle() / "genie_config.json").read_text())["dialog"]
    tok = json.loads((built.bundle() / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert cfg["context"]["size"] == 256 and cfg["context"]["n-vocab"] == 1024
    assert cfg["context"]["bos-token"] == ids["<|im_start|>"]
    assert cfg["context"]["eos-token"] == ids["<|im_end|>"]
    assert cfg["context"]["eot-token"] == ids["<|endoftext|>"]
    htp = cfg["engine"]["backend"]["QnnHtp"]
    assert (htp["kv-dim"], htp["pos-id-dim"], htp["rope-theta"]) == (32, 16, 1000000)
    assert htp["use-mmap"] is True and htp["mmap-budget"] == 0
    assert cfg["engine"]["model"]["binary"]["ctx-bins"] == [f"qwen2_tiny_{t}.bin"
                                                           for t in TINY_PARTS]
    ext = json.loads((built.bundle() / "htp_backend_ext_config.json").read_text())
    assert ext["devices"][0]["soc_model"] == 77 and ext["devices"][0]["dsp_arch"] == "v73"
    assert ext["context"]["weight_sharing_enabled"] is True


def test_bins_are_hard_linked_and_hold_both_graphs_in_order(built):
    for i, tag in enumerate(TINY_PARTS, start=1):
        src = built.build_dir() / "bin" / f"qwen2_tiny_{tag}.bin"
        dst = built.bundle() / src.name
        assert os.stat(src).st_ino == os.stat(dst).st_ino
        reader = read_ctxbin(dst)
        assert [g.name for g in reader.graphs] == [f"prompt_ar128_cl256_{i}_of_4",
                                                   f"token_ar1_cl256_{i}_of_4"]
        assert reader.device["soc_model"] == 77


def test_manifest_records_sizes_digests_inputs_and_configs(built):
    from hexbundle.support.hashing import file_digest
    man = built.manifest()
    for name, entry in man["files"].items():
        path = built.bundle() / name
        assert entry["size"] == path.stat().st_size
        assert entry["xxh3_128"] == file_digest(path)
    assert man["backend"] == "reference" and man["deployable"] is False
    assert "configs/build.toml" in man["configs"]
    assert any(k.endswith("prompt_ar128_cl256_2_of_4.onnx") for k in man["inputs"])
    assert man["bins_total_bytes"] == sum(v["size"] for k, v in man["files"].items()
                                          if k.endswith(".bin"))


def test_doit_list_reads_as_a_manual(built):
    out = built.doit("list", "--all").out
    for task in ("inputs", "convert", "compile", "check_sizes", "bundle"):
        line = next(l for l in out.splitlines() if l.split()[0] == task)
        assert len(line.split()) > 1, f"task {task} has no docstring"


# --- incremental behaviour ---------------------------------------------------------------------

@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_reading_commands_create_nothing_and_ask_no_docker_engine(project):
    """`doit list`, `help` and `info` in a fresh tree: no build/ (no lock, no directories, no
    digest cache), and under executor=docker no engine is asked (none answers here: the
    DOCKER_HOST points nowhere), so they work on a machine without one."""
    nowhere = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    for args in (["list"], ["list", "--all"], ["help", "bundle"], ["list", "executor=docker"],
                 ["help", "compile", "executor=docker"]):
        run = project.doit(*args, env=nowhere)
        assert "no Docker engine" not in run.out + run.err, args
        assert not (project.root / "build").exists(), f"doit {' '.join(args)} created build/"
    run = project.doit("info", "bundle", check=False)
    assert run.code in (0, 1), run.err       # 1: "bundle" is not up to date, as it should be
    assert not (project.root / "build").exists(), "doit info bundle created build/"


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_second_run_executes_nothing_and_touch_hashes_once(project, tmp_path):
    project.doit("bundle")
    again = project.doit("bundle")
    assert again.executed == set(), again.out

    for path in all_files(project.root / "build" / "qwen2-tiny" / "inputs") + \
            all_files(project.root / "configs"):
        os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    trace = tmp_path / "hashed.txt"
    env = {"HEXBUNDLE_HASH_TRACE": str(trace)}
    after_touch = project.doit("bundle", env=env)
    assert after_touch.executed == set(), after_touch.out
    hashed = trace.read_text().splitlines()
    assert hashed, "the touched files had to be hashed once"
    assert len(hashed) == len(set(hashed)), "a file was hashed twice in one run"

    trace.unlink()
    project.doit("bundle", env=env)
    assert not trace.exists(), f"the run after a touch hashed: {trace.read_text()}"


def scale_weight(onnx_path, tensor_name, factor):
    """Change one weight's bytes in place in the external .data file."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name == tensor_name)
    info = {e.key: e.value for e in init.external_data}
    data_path = onnx_path.parent / info["location"]
    offset, length = int(info.get("offset", 0)), int(info["length"])
    with open(data_path, "r+b") as fh:
        fh.seek(offset)
        values = np.frombuffer(fh.read(length), dtype=np.float32) * factor
        fh.seek(offset)
        fh.write(values.astype(np.float32).tobytes())


def test_changing_one_parts_weights_rebuilds_only_that_part(project):
    project.doit("bundle")
    inputs = project.root / "build" / "qwen2-tiny" / "inputs"
    for graph in ("prompt_ar128_cl256_3_of_4", "token_ar1_cl256_3_of_4"):
        scale_weight(inputs / f"{graph}.onnx", "model.layers.2.mlp.up_proj.weight", 0.5)
    run = project.doit("bundle")
    assert run.executed == {"convert:part_3_of_4_prompt", "convert:part_3_of_4_token",
                            "compile:part_3_of_4", "bundle"}, run.out


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("source", ["hexbundle/config/model.py", "hexbundle/inputs/synthetic.py"])
def test_a_changed_generator_source_regenerates_the_inputs(project, source):
    """config/model.py says which weights and graphs the generator writes, as synthetic.py says
    how: a change to either regenerates every part's inputs (the outputs then follow them)."""
    project.doit("bundle")
    with open(project.root / source, "a") as f:
        f.write("\n# changed\n")
    run = project.doit("bundle")
    assert {f"inputs:part_{i}_of_4" for i in range(1, 5)} <= run.executed, run.out


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_weights_packing_off_reruns_compile_and_bundle_only_and_fails_loudly(project):
    project.doit("bundle")
    good_manifest = project.manifest()
    run = project.doit("bundle", "weights_packing=false", check=False)
    assert run.code != 0
    assert "4-bit weights were not packed" in run.out + run.err
    assert not any(t.startswith(("convert:", "inputs:")) for t in run.executed), run.out
    assert {f"compile:{t}" for t in TINY_PARTS} <= run.executed
    assert project.manifest() == good_manifest, "the good bundle was damaged"
    sizes = project.doit("check_sizes", "weights_packing=false", check=False)
    assert sizes.code != 0 and "4-bit weights were not packed" in sizes.out + sizes.err
    assert "NOT PACKED" in sizes.out + sizes.err

    back = project.doit("bundle")
    assert {f"compile:{t}" for t in TINY_PARTS} <= back.executed
    assert not any(t.startswith("convert:") for t in back.executed)


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_deleted_bin_is_rebuilt(project):
    project.doit("bundle")
    victim = project.build_dir() / "bin" / "qwen2_tiny_part_2_of_4.bin"
    before = victim.read_bytes()
    victim.unlink()
    run = project.doit("bundle")
    assert "compile:part_2_of_4" in run.executed
    assert victim.read_bytes() == before


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_parallel_build_gives_the_same_bytes(project, tmp_path):
    project.doit("-n", "2", "bundle")
    parallel = {p.name: p.read_bytes() for p in all_files(project.bundle())}
    shutil.rmtree(project.root / "build")
    project.doit("-n", "1", "bundle")
    serial = {p.name: p.read_bytes() for p in all_files(project.bundle())}
    assert parallel == serial


def test_another_model_config_builds_without_code_changes(project):
    tiny = (project.root / "configs" / "models" / "qwen2-tiny.toml").read_text()
    other = (tiny.replace('name = "qwen2-tiny"', 'name = "qwen2-mini"')
             .replace('slug = "qwen2_tiny"', 'slug = "qwen2_mini"')
             .replace("num_layers = 4", "num_layers = 3")
             .replace("hidden_size = 128", "hidden_size = 96")
             .replace("head_dim = 32", "head_dim = 24")
             .replace('default_plan = "four"', 'default_plan = "three"')
             .replace("[plans.four]\nlayers_per_part = [0, 2, 1, 1]",
                      "[plans.three]\nlayers_per_part = [0, 1, 2]"))
    (project.root / "configs" / "models" / "qwen2-mini.toml").write_text(other)
    run = project.doit("bundle", "model=qwen2-mini")
    bundle = project.bundle("qwen2-mini")
    assert sorted(p.name for p in bundle.glob("*.bin")) == [
        f"qwen2_mini_part_{i}_of_3.bin" for i in (1, 2, 3)]
    assert "size check: qwen2-mini, plan three (3 parts)" in run.out


def test_bad_config_fails_before_building_with_a_clear_message(project):
    run = project.doit("bundle", "device=nosuchboard", check=False)
    assert run.code != 0
    assert "unknown device 'nosuchboard'" in run.err
    assert "Traceback" not in run.err
    assert not (project.root / "build" / "qwen2-tiny").exists()


def test_missing_export_names_expected_paths_and_how_to_produce_them(project):
    run = project.doit("bundle", "model=qwen2.5-7b-instruct", check=False)
    assert run.code != 0
    out = run.out + run.err
    assert "exports/qwen2.5-7b-instruct/prompt_ar128_cl4096_1_of_6.onnx" in out
    assert "How to produce them" in out
    assert not any(t.startswith(("convert:", "compile:")) for t in run.executed)
