"""scripts/generate.py and hexbundle.runtime.generation: host-side text generation through a
built bundle or its float ONNX."""
import json
import re
import subprocess
import sys

import pytest

from test_verify import set_toml
from hexbundle.config.build import load_build
from hexbundle.config.layout import Layout
from hexbundle.runtime.generation import generate_text


def library_generate(layout, prompt: str, *args, **kwargs):
    """runtime.generation.generate_text on the build's bundle and graph files."""
    return generate_text(layout.cfg, layout.bundle_dir, layout.every_graph_files(), prompt,
                         *args, **kwargs)


def generate(project, *args):
    proc = subprocess.run([sys.executable, "scripts/generate.py", *args], cwd=project.root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_generate_greedy_equals_the_float_onnx_when_quantization_error_is_small(project):
    """With 4-bit weights the random tiny model's argmax often flips (top-1 agreement ~0.75);
    with 16-bit weights the error is far below the logit gaps, and the bundle must then
    generate exactly what the float ONNX generates."""
    set_toml(project.root / "configs/models/qwen2-tiny.toml", decoder_linear_bitwidth="16",
             lm_head_bitwidth="16")
    project.doit("bundle")
    runs = {engine: json.loads(generate(project, "-p", "Hello, how are you today?", "-n", "32",
                                        "--greedy", "--json", "--engine", engine))
            for engine in ("bundle", "onnx")}
    assert runs["bundle"]["prompt_ids"] == runs["onnx"]["prompt_ids"]
    assert len(runs["bundle"]["token_ids"]) == 32
    assert runs["bundle"]["token_ids"] == runs["onnx"]["token_ids"]
    assert runs["bundle"]["text"] == runs["onnx"]["text"]
    cfg = load_build(project.root)
    chinese = {engine: library_generate(Layout(cfg), "你好，世界", 32, engine=engine,
                                        greedy=True).token_ids for engine in ("bundle", "onnx")}
    assert len(chinese["bundle"]) == 32 and chinese["bundle"] == chinese["onnx"]


def test_generate_samples_deterministically_with_the_bundle_settings_and_reports_speed(built):
    """The bundle's sampler (temp 0.8, top-k 40, top-p 0.95, seed 42): the same text in two
    processes, and the genie-t2t-run-like summary line."""
    out = generate(built, "-p", "The quick brown fox", "-n", "16")
    text, summary = out.rsplit("\n[", 1)
    assert re.fullmatch(r"bundle: \d+ prompt tokens in [\d.]+s; 16 tokens in [\d.]+s = [\d.]+ "
                        r"tokens/s; stopped: max tokens\]\n", summary), out
    cfg = load_build(built.root)
    again = library_generate(Layout(cfg), "The quick brown fox", 16)
    assert text == again.text and len(again.token_ids) == 16
    greedy = library_generate(Layout(cfg), "The quick brown fox", 16, greedy=True)
    assert greedy.token_ids != again.token_ids     # the sampler really samples
