"""inputs.generate: inputs.synthetic's files, streamed tensor by tensor; the disk check; the script and doit task."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hexbundle.config.build import load_model
from hexbundle.config.model import Architecture, Model, Plan, Quantization
from hexbundle.inputs import generate, synthetic
from hexbundle.support.errors import DiskSpaceError
from conftest import CONFIGS

ROOT = Path(__file__).resolve().parent.parent
SEED = 3


def small_model() -> Model:
    arch = Architecture(num_layers=3, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                        head_dim=16, intermediate_size=192, vocab_size=512, rope_theta=1e6,
                        rms_norm_eps=1e-6)
    return Model("qwen2-test", "qwen2_test", arch, Quantization(), (160,), 128, 1,
                 {"test": Plan("test", (0, 2, 1))}, "test")


def huge_model() -> Model:
    """Bigger than any disk this runs on: a 1 TiB embedding."""
    arch = Architecture(num_layers=1, hidden_size=65536, num_attention_heads=512, num_kv_heads=64,
                        head_dim=128, intermediate_size=65536, vocab_size=1 << 22,
                        rope_theta=1e6, rms_norm_eps=1e-6)
    return Model("huge", "huge", arch, Quantization(), (4096,), 128, 1,
                 {"two": Plan("two", (0, 1))}, "two")


def test_streamed_files_are_the_synthetic_generators_bytes(tmp_path):
    """Drawing each weight in blocks of rows (a few hundred bytes here, so every tensor takes
    many blocks) writes exactly what inputs.synthetic writes from whole tensors."""
    model = small_model()
    for part in model.plans["test"].parts():
        whole = synthetic.generate_part(model, part, tmp_path / "whole", SEED)
        streamed = generate.generate_part(model, part, tmp_path / "streamed", SEED, chunk_bytes=300)
        assert [p.name for p in streamed] == [p.name for p in whole]
        for a, b in zip(whole, streamed):
            assert a.read_bytes() == b.read_bytes(), b.name


def test_both_graphs_record_the_parts_one_data_file_and_onnx_loads_it(tmp_path):
    """No hard link: onnx >= 1.21 refuses external data in a file with more than one link."""
    import onnx
    model = small_model()
    part = model.plans["test"].parts()[1]
    generate.generate_part(model, part, tmp_path, SEED)
    data = sorted(tmp_path.glob("*.data"))
    assert [p.name for p in data] == [f"{part.tag}.data"]
    assert data[0].stat().st_nlink == 1
    assert data[0].stat().st_size == generate.data_bytes(model, part)
    for graph in model.graphs(part):
        path = str(tmp_path / f"{graph.name}.onnx")
        structure = onnx.load(path, load_external_data=False)
        locations = {e.value for t in structure.graph.initializer for e in t.external_data
                     if e.key == "location"}
        assert locations == {f"{part.tag}.data"}
        assert all(t.raw_data for t in onnx.load(path).graph.initializer)   # onnx reads them
    generate.generate_part(model, part, tmp_path, SEED)   # again: replaced, still one file
    assert data[0].stat().st_nlink == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_7b_three_layer_part_needs_about_2_8_gb():
    model, _ = load_model(CONFIGS, "qwen2.5-7b-instruct")
    part = model.plans["eleven"].parts()[1]
    assert len(part.layers) == 3
    assert 2.7e9 < generate.data_bytes(model, part) < 2.9e9
    # the .data once (shared by both graphs) plus small .onnx/.encodings files
    assert generate.data_bytes(model, part) < generate.part_disk_bytes(model, part) < 2.9e9


def test_too_little_disk_is_refused_before_writing(tmp_path):
    model = huge_model()
    out = tmp_path / "out"
    with pytest.raises(DiskSpaceError) as err:
        generate.generate_parts(model, model.plans["two"].parts(), out, SEED)
    message = str(err.value)
    assert str(out) in message and "needs" in message and "GiB" in message and "free" in message
    assert not out.exists()


def test_script_writes_one_part_and_refuses_what_does_not_fit(project, tmp_path):
    script = project.root / "scripts" / "gen_7b_inputs.py"
    run = subprocess.run([sys.executable, str(script), "--model", "qwen2-tiny", "--part", "2",
                          "--out", str(tmp_path / "p2")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    names = sorted(p.name for p in (tmp_path / "p2").iterdir())
    assert "part_2_of_4.data" in names and "tokenizer.json" in names
    assert len(names) == 6   # 2 graphs x (onnx, encodings), the part's one .data, tokenizer

    config = project.root / "configs" / "models" / "qwen2-tiny.toml"
    text = config.read_text()
    config.write_text(text.replace("hidden_size = 128", "hidden_size = 65536")
                      .replace("vocab_size = 1024", "vocab_size = 4194304"))
    run = subprocess.run([sys.executable, str(script), "--model", "qwen2-tiny",
                          "--out", str(tmp_path / "big")], capture_output=True, text=True)
    assert run.returncode == 1
    assert "needs" in run.stderr and "GiB of free disk space" in run.stderr
    assert not (tmp_path / "big").exists()


def test_doit_gen_inputs_writes_one_part_and_names_a_bad_one(project):
    run = project.doit("gen_inputs", "--part", "3")
    inputs = project.root / "build" / "qwen2-tiny" / "inputs"
    assert (inputs / "token_ar1_cl256_3_of_4.onnx").is_file()
    assert not (inputs / "token_ar1_cl256_2_of_4.onnx").exists()
    assert "tokenizer.json" in run.out
    bad = project.doit("gen_inputs", "--part", "9", check=False)
    assert bad.code != 0 and "has parts 1..4" in bad.out + bad.err


def test_the_7b_shapes_tokenizer_is_generated_and_checked_by_its_step(project):
    """The scale path's tokenizer, by the real task: `doit inputs:tokenizer` on the 7B shape
    writes a tokenizer.json the bundle step's own check accepts, and runs that check itself."""
    project.doit("inputs:tokenizer", "model=qwen2.5-7b-shape")
    log = project.build_dir("qwen2.5-7b-shape", plan="three") / "logs" / "inputs__tokenizer.log"
    assert "checked as the bundle step reads it" in log.read_text()
    written = project.root / "build" / "qwen2.5-7b-shape" / "inputs" / "tokenizer.json"
    from hexbundle.formats.tokenizer import special_token_ids
    specials = {"bos": "<|im_start|>", "eos": "<|im_end|>", "eot": "<|endoftext|>"}
    assert max(special_token_ids(written, specials, 152064).values()) < 152064


def test_a_generator_writing_a_contradictory_tokenizer_fails_its_own_step(project):
    """The other direction: a generator that puts the specials at the top of a vocabulary the
    corpus does not fill (what broke the 7B shape) fails `inputs:tokenizer` in seconds, naming
    the file, rather than the bundle step after every part is built."""
    synthetic_py = project.root / "hexbundle" / "inputs" / "bpe.py"
    text = synthetic_py.read_text()
    fixed = "ids = generated_special_ids(len(vocab), special_tokens)"
    assert fixed in text
    synthetic_py.write_text(text.replace(
        fixed, "ids = generated_special_ids(vocab_size - len(special_tokens), "
               "special_tokens)"))
    run = project.doit("inputs:tokenizer", "model=qwen2.5-7b-shape", check=False)
    assert run.code != 0 and "Traceback" not in run.out + run.err
    assert ("tokenizer.json: added_tokens gives bos token '<|im_start|>' id 152061, but the "
            "tokenizer maps '<|im_start|>' to 1135") in run.out + run.err
    assert "numbers such added tokens from the vocabulary's end" in run.out + run.err
