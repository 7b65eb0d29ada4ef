"""Two exports made by qai-hub-models 0.55.0's own code in shapes no other test export has
(issue 34: verify is judged on exports its gates were not tuned on):

- export-llama32-deep (tests/data/qaihm/make_export_llama32_deep.py): a tiny random Llama 3.2 by
  the llama_v3_2_3b_instruct code, 11 layers split [0, 6, 5], hidden 48, 2 query heads x head_dim
  24, 1 KV head, intermediate 128, llama3 rope_scaling factor 32, seed 4321;
- export-qwen3-kv16 (make_export_qwen3_kv16.py): a tiny random Qwen3 by the qwen3_4b code, 10
  layers split [0, 4, 4, 2], hidden 40, 2 query heads x head_dim 48, 1 KV head, intermediate
  112, seed 2718, and a 16-bit KV cache (Qualcomm's quantize sets it to 8 bits; the script's
  patch K keeps AIMET's 16-bit quantizers).

Each is imported with its config.json, built, linted with `doit check_bundle` and verified at the
default seed. Nothing under tests/data is written.
"""
import json
import tomllib

import pytest

from conftest import ROOT, copy_project, tree_digests

QAIHM = ROOT / "tests" / "data" / "qaihm"
KV = ("past_key_", "past_value_")

LLAMA32_DEEP = {"family": "llama", "tie_word_embeddings": True, "num_layers": 11,
                "hidden_size": 48, "num_attention_heads": 2, "num_kv_heads": 1, "head_dim": 24,
                "intermediate_size": 128, "vocab_size": 1024, "rope_theta": 500000.0,
                "rms_norm_eps": 1e-5}
QWEN3_KV16 = {"family": "qwen3", "tie_word_embeddings": True, "num_layers": 10,
              "hidden_size": 40, "num_attention_heads": 2, "num_kv_heads": 1, "head_dim": 48,
              "intermediate_size": 112, "vocab_size": 1024, "rope_theta": 1e6,
              "rms_norm_eps": 1e-6}

EXPORTS = [
    pytest.param("export-llama32-deep", "config-llama32-deep.json", "l32deep",
                 "llama_v3_2_3b_instruct", LLAMA32_DEEP, [0, 6, 5], id="llama32-deep"),
    pytest.param("export-qwen3-kv16", "config-qwen3-kv16.json", "q3kv16", "qwen3_4b",
                 QWEN3_KV16, [0, 4, 4, 2], id="qwen3-kv16"),
]


def kv_bitwidths(export: str) -> set:
    """The bit widths of the KV cache inputs and outputs in every encodings file of an export."""
    widths = set()
    for path in (QAIHM / export).rglob("*.encodings"):
        for enc in json.loads(path.read_text())["activation_encodings"]:
            if enc["name"].startswith(KV):
                widths.add(enc["bw"])
    return widths


@pytest.mark.parametrize("export, widths", [("export-qwen3-kv16", {16}),
                                            ("export-qwen3", {8}),
                                            ("export-llama32-deep", {8})])
def test_the_kv_cache_is_as_wide_as_the_export_says(export, widths):
    # the one export made with a 16-bit KV cache, and two made as Qualcomm ships them (8 bits)
    assert kv_bitwidths(export) == widths


@pytest.mark.heavy   # three doit runs per export, about a minute each: the full suite
@pytest.mark.parametrize("export, config, name, slug, arch, plan", EXPORTS)
def test_a_new_export_is_imported_built_linted_and_verified(tmp_path, export, config, name, slug,
                                                            arch, plan):
    data, model_config = QAIHM / export, QAIHM / config
    before = tree_digests(data)
    project = copy_project(tmp_path / "proj")
    run = project.doit("import_export", "--dir", str(data), "--name", name,
                       "--model-config", str(model_config))
    assert f"slug '{slug}', precision w4a16, context length 256" in run.out, run.out
    cfg = tomllib.loads((project.root / "configs" / "models" / f"{name}.toml").read_text())
    got = dict(cfg["architecture"])
    got.pop("rope_scaling", None)
    assert got == arch
    assert cfg["plans"]["export"]["layers_per_part"] == plan   # Qualcomm's split

    built = project.doit("bundle", f"model={name}", "plan=export")
    assert f"size check: {name}, plan export ({len(plan)} parts)" in built.out, built.out
    assert "architecture formula gives" not in built.out, built.out
    bundle = project.bundle(name, plan="export")
    linted = project.doit("check_bundle", "--path", str(bundle),
                          "--model-config", str(model_config), check=False)
    assert linted.code == 0 and ": no problem" in linted.out, linted.out + linted.err

    verified = project.doit("verify", f"model={name}", "plan=export", check=False)
    report = json.loads((project.build_dir(name, plan="export") / "verify" /
                         "report.json").read_text())
    assert report["ok"] is True and verified.code == 0, verified.out + verified.err
    assert tree_digests(data) == before   # used in place, never written
