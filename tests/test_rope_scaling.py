"""Llama 3's scaled RoPE (issue 25): the runtime's tables against Hugging Face's own rotary
embeddings (tests/data/rope, written by transformers itself: make_hf_rope.py), genie_config.json's
positional-encoding block, and a bundle whose tables lack the scaling refused by `doit verify` and
`doit check_bundle --model-config`.

HF computes in float32 throughout; its tables drift from the exact angles by ~6.5e-8 per position
(tests/data/rope/README.md). The runtime computes in float64, so its tables are compared with a
tolerance that grows with the position, and its frequencies with HF's float64 rerun of the same
function to 1e-12.
"""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import CONFIGS, ROOT, copy_project
from hexbundle.checks.genie_bundle import check_bundle
from hexbundle.config.build import load_build, load_model
from hexbundle.config.devices import read_table
from hexbundle.config.layout import Layout, ProjectLayout
from hexbundle.config.model import RopeScaling
from hexbundle.formats.genie import genie_config, read_genie_config
from hexbundle.runtime.conventions import rope_inputs, rope_inv_freq
from hexbundle.steps.options import genie_options, verify_options
from hexbundle.support.errors import ConfigError

DATA = ROOT / "tests" / "data" / "rope"
HF = np.load(DATA / "hf_rope.npz")
CASES = json.loads((DATA / "hf_rope.json").read_text())["cases"]
TABLE = read_table(ProjectLayout(CONFIGS))
CHIPSETS = {soc: row["dsp_arch"] for soc, row in TABLE["qualcomm_soc_models"].items()}


def scaling_of(case: dict):
    s = case.get("rope_scaling")
    if not s or s.get("rope_type", "default") == "default":
        return None
    return RopeScaling(s["rope_type"], s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                       s["original_max_position_embeddings"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_frequencies_are_hugging_faces(name):
    case = CASES[name]
    ours = rope_inv_freq(case["head_dim"], case["rope_theta"], scaling_of(case))
    np.testing.assert_allclose(ours, HF[f"{name}.inv_freq_f64"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(ours, HF[f"{name}.inv_freq"], rtol=1e-6, atol=0)   # HF's float32


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cos_sin_tables_are_hugging_faces(name):
    case = CASES[name]
    positions = HF["positions"]
    cos, sin = rope_inputs(positions, case["head_dim"], case["rope_theta"], scaling_of(case))
    tolerance = (1e-6 + 1e-7 * positions.astype(np.float64))[:, None]   # HF's float32 drift
    for ours, theirs in ((cos, HF[f"{name}.cos"]), (sin, HF[f"{name}.sin"])):
        ours = ours.reshape(theirs.shape)
        assert np.all(np.abs(ours - theirs) <= tolerance), np.abs(ours - theirs).max()


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if scaling_of(CASES[n])])
def test_tables_without_the_scaling_are_not_hugging_faces(name):
    """The other direction: a runtime that forgot Llama 3's scaling fails the comparison above
    (from position 2 on, as the issue measured on Qualcomm's tables)."""
    case = CASES[name]
    positions = HF["positions"]
    cos, _ = rope_inputs(positions, case["head_dim"], case["rope_theta"], None)
    error = np.abs(cos.reshape(HF[f"{name}.cos"].shape) - HF[f"{name}.cos"]).max(axis=1)
    assert error[list(positions).index(100)] > 1e-3, error


def test_an_unknown_scaling_type_is_refused():
    with pytest.raises(ValueError, match="only 'llama3'"):
        rope_inv_freq(64, 1e4, RopeScaling("yarn", 4.0, 1.0, 4.0, 4096))


# ============================================================================ config and genie_config


def llama_model():
    model, _ = load_model(CONFIGS, "llama3-tiny")
    return model


def test_the_llama_config_reads_its_family_and_scaling():
    a = llama_model().architecture
    assert a.family == "llama" and not a.qkv_bias and not a.qk_norm and a.tie_word_embeddings
    assert a.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    assert load_model(CONFIGS, "qwen2-tiny")[0].architecture.rope_scaling is None


def test_a_scaling_whose_bands_cross_is_refused(tmp_path):
    shutil.copytree(CONFIGS / "configs", tmp_path / "configs")
    path = tmp_path / "configs" / "models" / "llama3-tiny.toml"
    path.write_text(path.read_text().replace("high_freq_factor = 4.0", "high_freq_factor = 1.0"))
    with pytest.raises(ConfigError, match="high_freq_factor .* must be greater than "
                                          "low_freq_factor"):
        load_model(tmp_path, "llama3-tiny")


def written_genie(model_name: str) -> dict:
    cfg = load_build(CONFIGS, {"model": model_name})
    ids = {"bos": 1, "eos": 2, "eot": 3}
    return genie_config(genie_options(cfg), ids, ["a.bin"])


def test_genie_config_carries_the_models_own_scaling_where_qualcomm_puts_it():
    """The block Qualcomm's generator writes (qai-hub-models create_genie_config: under
    dialog.engine.model, QnnHtp's rope keys removed), with this model's factor 32.0 where that
    generator writes 8.0 for every model."""
    engine = written_genie("llama3-tiny")["dialog"]["engine"]
    assert engine["model"]["positional-encoding"] == {
        "type": "rope", "rope-dim": 16, "rope-theta": 500000,
        "rope-scaling": {"rope-type": "llama3", "factor": 32.0, "low-freq-factor": 1.0,
                         "high-freq-factor": 4.0, "original-max-position-embeddings": 8192}}
    assert "rope-theta" not in engine["backend"]["QnnHtp"]
    assert "pos-id-dim" not in engine["backend"]["QnnHtp"]
    plain = written_genie("qwen2-tiny")["dialog"]["engine"]
    assert "positional-encoding" not in plain["model"]
    assert plain["backend"]["QnnHtp"]["rope-theta"] == 1000000


def test_the_runtime_reads_back_what_was_written(tmp_path):
    (tmp_path / "genie_config.json").write_text(json.dumps(written_genie("llama3-tiny")))
    settings = read_genie_config(tmp_path)
    assert settings.rope_scaling == llama_model().architecture.rope_scaling
    assert (settings.rope_theta, settings.pos_id_dim) == (500000.0, 16)


@pytest.mark.real_qairt
def test_qualcomms_own_class_accepts_the_block(tmp_path):
    """qairt-dev's GenieConfig (the pinned wheel) validates the block and keeps its values."""
    import real_qairt
    api = real_qairt.load_locked(tmp_path / "qairt-dev")
    try:
        written = written_genie("llama3-tiny")
        parsed = api.GenieConfig.model_validate(written)
        dumped = json.loads(parsed.model_dump_json(by_alias=True, exclude_none=True))
        block = dumped["dialog"]["engine"]["model"]["positional-encoding"]
        assert block["rope-scaling"]["factor"] == 32.0
        assert block["rope-scaling"]["rope-type"] == "llama3"
    finally:
        real_qairt.unload(api)


# ============================================================================ a built Llama bundle


@pytest.fixture(scope="module")
def llama_build(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("llama3") / "proj")
    project.doit("bundle", "model=llama3-tiny")
    return project


def without_scaling(bundle: Path) -> None:
    """What a build that lost the scaling writes: plain RoPE in QnnHtp, no block."""
    path = bundle / "genie_config.json"
    doc = json.loads(path.read_text())
    engine = doc["dialog"]["engine"]
    block = engine["model"].pop("positional-encoding")
    engine["backend"]["QnnHtp"].update({"pos-id-dim": block["rope-dim"],
                                        "rope-theta": block["rope-theta"]})
    path.write_text(json.dumps(doc, indent=2))


def hf_config(path: Path, factor: float = 32.0) -> Path:
    a = llama_model().architecture
    path.write_text(json.dumps({
        "model_type": "llama", "vocab_size": a.vocab_size, "head_dim": a.head_dim,
        "num_attention_heads": a.num_attention_heads, "rope_theta": a.rope_theta,
        "rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}))
    return path


@pytest.mark.heavy   # a doit build: the full suite (`pytest --full`)
def test_a_llama_bundle_is_built_verified_and_linted(llama_build, tmp_path):
    run = llama_build.doit("verify", "model=llama3-tiny")
    assert "verify: PASSED" in run.out, run.out
    config = hf_config(tmp_path / "config.json")
    assert check_bundle(llama_build.bundle("llama3-tiny"), CHIPSETS, config).problems == []


@pytest.mark.heavy
def test_a_llama_bundle_without_its_scaling_fails_verify_and_check_bundle(llama_build, tmp_path):
    from hexbundle.checks.verify import compare_bundle_with_onnx
    from hexbundle.support.errors import VerifyError
    bundle = shutil.copytree(llama_build.bundle("llama3-tiny"), tmp_path / "bundle")
    without_scaling(bundle)
    cfg = load_build(llama_build.root, {"model": "llama3-tiny"})
    with pytest.raises(VerifyError, match="positional-encoding.rope-scaling' is none .* but "
                                          "llama3-tiny.toml architecture.rope_scaling is llama3"):
        compare_bundle_with_onnx(Layout(cfg), verify_options(cfg), bundle_dir=bundle,
                                 log=lambda line: None)
    found = check_bundle(bundle, CHIPSETS, hf_config(tmp_path / "config.json")).problems
    assert any("has rope_scaling of type 'llama3' (factor 32.0)" in p and "is absent" in p
               for p in found), found


@pytest.mark.heavy
def test_qualcomms_hard_coded_factor_is_refused_for_llama_3_2(llama_build, tmp_path):
    """qai-hub-models' generator writes factor 8.0 for every llama3 model; Llama 3.2's is 32."""
    bundle = shutil.copytree(llama_build.bundle("llama3-tiny"), tmp_path / "bundle")
    path = bundle / "genie_config.json"
    doc = json.loads(path.read_text())
    doc["dialog"]["engine"]["model"]["positional-encoding"]["rope-scaling"]["factor"] = 8.0
    path.write_text(json.dumps(doc))
    found = check_bundle(bundle, CHIPSETS, hf_config(tmp_path / "config.json")).problems
    assert any("rope-scaling.factor' is 8.0, config.json rope_scaling.factor is 32.0" in p
               for p in found), found
    cfg = load_build(llama_build.root, {"model": "llama3-tiny"})
    from hexbundle.checks.verify import compare_bundle_with_onnx
    from hexbundle.support.errors import VerifyError
    with pytest.raises(VerifyError, match="llama3 \\(factor 8, .* but llama3-tiny.toml "
                                          "architecture.rope_scaling is llama3 \\(factor 32"):
        compare_bundle_with_onnx(Layout(cfg), verify_options(cfg), bundle_dir=bundle,
                                 log=lambda line: None)
