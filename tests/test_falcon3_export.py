"""A real Falcon 3 export, as it comes: the tree qai-hub-models 0.55.0's own
falcon_v3_7b_instruct code wrote (tests/data/qaihm/make_export_falcon3.py: a tiny random Falcon 3,
a LlamaForCausalLM of 4 layers, hidden 64, 4 query heads x head_dim 16, 2 KV heads, untied,
rope_theta 1000042, no rope scaling; 5 parts 0, 1, 1, 1, 1; quantized w4a16 by its quantize
entry point with AIMET-ONNX 2.26.0). Its config.json beside the tree (config-falcon3.json) gives
what the files cannot: its theta, epsilon and special tokens (bos = eos = <|endoftext|>, id 11),
which are not Llama 3's although its family is. Mistral has no such test: no qai-hub-models
release quantizes or exports mistral_7b_instruct_v0_3 (a precompiled collection in every one).
"""
import json
import tomllib

import pytest

from conftest import ROOT, copy_project, tree_digests
from test_llama_export import unsplit_only

DATA = ROOT / "tests" / "data" / "qaihm" / "export-falcon3"
MODEL_CONFIG = ROOT / "tests" / "data" / "qaihm" / "config-falcon3.json"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("falcon3") / "proj")
    before = tree_digests(DATA)
    run = project.doit("import_export", "--dir", str(DATA), "--name", "falcon3",
                       "--model-config", str(MODEL_CONFIG))
    return project, run, before


def test_the_import_names_the_family_architecture_and_its_own_tokens(imported):
    project, run, _ = imported
    cfg = tomllib.loads((project.root / "configs" / "models" / "falcon3.toml").read_text())
    assert cfg["architecture"] == {
        "family": "llama", "tie_word_embeddings": False, "num_layers": 4, "hidden_size": 64,
        "num_attention_heads": 4, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 192,
        "vocab_size": 1024, "rope_theta": 1000042.0, "rms_norm_eps": 1e-6}   # no rope_scaling
    assert cfg["tokenizer"] == {"bos": "<|endoftext|>", "eos": "<|endoftext|>",
                                "eot": "<|endoftext|>"}
    assert cfg["plans"]["export"]["layers_per_part"] == [0, 1, 1, 1, 1]   # Qualcomm's split
    assert "slug 'falcon_v3_7b_instruct', precision w4a16" in run.out, run.out


@pytest.mark.heavy   # built and verified: the full suite (`pytest --full`)
def test_the_falcon3_export_is_built_and_verified(imported):
    project, _, before = imported
    built = project.doit("bundle", "model=falcon3")
    assert "architecture formula gives" not in built.out, built.out
    genie = json.loads((project.bundle("falcon3", plan="export") / "genie_config.json")
                       .read_text())["dialog"]
    assert genie["context"]["bos-token"] == genie["context"]["eos-token"] == 11
    assert genie["engine"]["backend"]["QnnHtp"]["rope-theta"] == 1000042   # plain RoPE
    assert "positional-encoding" not in genie["engine"]["model"]
    run = project.doit("verify", "model=falcon3", check=False)
    assert run.code == 0 and "verify: PASSED" in run.out, run.out + run.err
    assert tree_digests(DATA) == before   # used in place, never written


@pytest.mark.heavy
def test_its_unsplit_graphs_alone_are_split_as_qualcomm_splits_and_verified(tmp_path):
    tree = unsplit_only(DATA, tmp_path / "tree")
    project = copy_project(tmp_path / "proj")
    run = project.doit("import_export", "--dir", str(tree), "--name", "unsplit",
                       "--model-config", str(MODEL_CONFIG))
    assert "slug 'falcon_v3_7b_instruct'" in run.out, run.out
    cfg = tomllib.loads((project.root / "configs" / "models" / "unsplit.toml").read_text())
    assert cfg["plans"]["export"]["layers_per_part"] == [0, 1, 1, 1, 1]
    project.doit("bundle", "model=unsplit")
    verified = project.doit("verify", "model=unsplit", check=False)
    assert verified.code == 0 and "verify: PASSED" in verified.out, verified.out
