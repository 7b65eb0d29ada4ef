"""A real Qwen3 export, as it comes: the tree qai-hub-models 0.55.0's own qwen3_4b code wrote.

tests/data/qaihm/export-qwen3/ was made by tests/data/qaihm/make_export_qwen3.py: a small random
Qwen3 (6 layers, hidden 64, 4 query heads x head_dim 32 = 128 query width, 2 KV heads, per-head
q/k RMSNorm, no q/k/v biases, intermediate 192, vocab 1024, tied embeddings), quantized w4a16 by
qwen3_4b's own quantize entry point (AIMET-ONNX 2.26.0) and exported by its own export entry
point (4 parts: 0, 2, 2, 2 layers), AI Hub calls stubbed (see tests/data/qaihm/README.md). Here
it is imported, built and verified with the default gates. Nothing under tests/data is written.
"""
import json
import tomllib

import pytest

from conftest import ROOT, copy_project, tree_digests

DATA = ROOT / "tests" / "data" / "qaihm" / "export-qwen3"


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_the_qwen3_export_is_imported_built_and_verified(tmp_path):
    project = copy_project(tmp_path / "proj")
    before = tree_digests(DATA)
    run = project.doit("import_export", "--dir", str(DATA), "--name", "qwen3x")
    assert "slug 'qwen3_4b', precision w4a16, context length 256" in run.out, run.out
    assert "prompt_ar128_cl256_1_of_4 <- ar128_cl256/" in run.out, run.out
    config = project.root / "configs" / "models" / "qwen3x.toml"
    cfg = tomllib.loads(config.read_text())
    arch = cfg["architecture"]
    assert {k: arch[k] for k in ("num_layers", "hidden_size", "num_attention_heads",
                                 "num_kv_heads", "head_dim", "intermediate_size",
                                 "vocab_size")} == {
        "num_layers": 6, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2,
        "head_dim": 32, "intermediate_size": 192, "vocab_size": 1024}
    # Not in the files; the import writes the Qwen family's values, which are also this
    # model's (and Qwen3-4B's config.json): rope_theta 1e6, rms_norm_eps 1e-6.
    assert arch["rope_theta"] == 1e6 and arch["rms_norm_eps"] == 1e-6
    assert cfg["graphs"] == {"context_length": 256, "prompt_ar": 128, "token_ar": 1}
    assert cfg["quantization"] == {"decoder_linear_bitwidth": 4, "lm_head_bitwidth": 8,
                                   "embedding_bitwidth": 16, "activation_bitwidth": 16,
                                   "unencoded_weights": "int8"}
    assert cfg["plans"]["export"]["layers_per_part"] == [0, 2, 2, 2]   # Qualcomm's split

    # What the files say, no hand edit (issue 25): q/k norms and no q/k/v biases make it Qwen3;
    # the export's LM head equals its embedding (Qwen3-4B's tie_word_embeddings true).
    assert arch["family"] == "qwen3" and arch["tie_word_embeddings"] is True, arch
    assert "family qwen3: q/k norms" in run.out, run.out

    bundle = project.doit("bundle", "model=qwen3x")
    assert "size check: qwen3x, plan export (4 parts)" in bundle.out, bundle.out
    assert "architecture formula gives" not in bundle.out, bundle.out   # was -66.6% (issue 25)
    assert len(project.manifest("qwen3x")["graphs"]) == 8
    run = project.doit("verify", "model=qwen3x", check=False)
    assert run.code == 0, run.out + run.err
    report = json.loads((project.build_dir("qwen3x") / "verify" / "report.json").read_text())
    assert report["ok"] is True and report["decode_steps"] == 32
    end = [r for r in report["rows"] if r["part"] == "end to end"
           and r["check"] == "chained vs reference"]
    assert end and end[0]["cos_min"] >= 0.9999, end
    assert tree_digests(DATA) == before   # used in place, never written
