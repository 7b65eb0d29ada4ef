"""Every encodings file AIMET writes, against AIMET's own numbers.

tests/data/aimet/ was written by aimet-onnx 2.42.0 itself (tests/data/aimet/make_encodings.py,
README there): QuantizationSimModel on qwen2-tiny's part-2 prompt graph, 4-bit weights per
channel, per block (32) and LPBQ (4-bit blocks under an 8-bit per-channel scale), 16-bit
activations, exported as 0.6.1, 1.0.0 and 2.0.0 (AIMET refuses LPBQ in 0.6.1), plus a
per-channel set with a shifted zero point; and AIMET's own quantize-dequantize of three weights
(qdq_<kind>.npz). The graph is the one `doit inputs` generates (fixed seed), made here again.
"""
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import CONFIGS, ROOT, copy_project
from hexbundle.backends import ConvertOptions
from hexbundle.backends.registry import get_backend
from hexbundle.config.build import load_model
from hexbundle.formats.dlc import read_dlc
from hexbundle.formats.encodings import load_encodings
from hexbundle.inputs import generate
from hexbundle.support.errors import EncodingsError

DATA = ROOT / "tests" / "data" / "aimet"
FILES = {"per_channel": ("0.6.1", "1.0.0", "2.0.0"), "per_block": ("1.0.0", "2.0.0"),
         "lpbq": ("1.0.0", "2.0.0"), "per_channel_zps": ("0.6.1", "1.0.0", "2.0.0")}
CASES = [(kind, version) for kind, versions in FILES.items() for version in versions]
PROMPT, TOKEN = "prompt_ar128_cl256_2_of_4", "token_ar1_cl256_2_of_4"


def encodings_file(kind: str, version: str) -> Path:
    return DATA / f"{kind}_{version}.encodings"


@pytest.fixture(scope="module")
def part2(tmp_path_factory) -> Path:
    """qwen2-tiny's part 2 as `doit inputs` writes it: the graph AIMET quantized."""
    model, _ = load_model(CONFIGS, "qwen2-tiny")
    part = model.plans["four"].parts()[1]
    out = tmp_path_factory.mktemp("part2")
    generate.generate_part(model, part, out, 0)
    return out


def convert(part2: Path, encodings: Path, out: Path, graph: str = PROMPT) -> Path:
    dlc = out / f"{graph}.dlc"
    get_backend("reference").convert(part2 / f"{graph}.onnx", encodings, dlc, graph,
                                     ConvertOptions(float_bitwidth=16), lambda m: None)
    return dlc


@pytest.mark.parametrize("kind,version", CASES, ids=[f"{k}-{v}" for k, v in CASES])
def test_stored_weights_dequantize_to_aimets_own_qdq(part2, tmp_path, kind, version):
    """Load -> quantize -> pack -> store -> dequantize equals AIMET's quantize_dequantize."""
    qdq = np.load(DATA / f"qdq_{kind}.npz")
    with read_dlc(convert(part2, encodings_file(kind, version), tmp_path)) as dlc:
        for name in qdq.files:
            ours = dlc.dequantize(name)
            mismatched = int(np.count_nonzero(ours != qdq[name]))
            assert mismatched == 0, (name, mismatched, float(np.abs(ours - qdq[name]).max()))
            record = dlc.record(name)
            assert record.dtype == "uint4"   # packed two per byte at compile
            if kind in ("per_block", "lpbq"):
                assert record.quant.block_size == 32 and record.quant.channels == 32 * (
                    record.shape[0] // 32) * record.shape[1] // 32


@pytest.mark.parametrize("kind", list(FILES))
def test_every_version_of_a_kind_loads_to_the_same_numbers(kind):
    loaded = [load_encodings(encodings_file(kind, v)) for v in FILES[kind]]
    reference = loaded[-1].for_graph(set(loaded[0].params))
    for other in loaded[:-1]:
        for name, enc in other.params.items():
            if kind == "per_block" and other.schema == "0.6.1":
                continue
            ref = reference.params[name]
            np.testing.assert_array_equal(enc.scale, ref.scale, err_msg=name)
            np.testing.assert_array_equal(enc.offset, ref.offset, err_msg=name)
            assert (enc.bitwidth, enc.block_size) == (ref.bitwidth, ref.block_size)


def test_the_shifted_zero_point_is_applied_not_ignored():
    enc = load_encodings(encodings_file("per_channel_zps", "1.0.0"))
    raw = json.loads(encodings_file("per_channel_zps", "1.0.0").read_text())
    entry = next(e for e in raw["param_encodings"] if "zero_point_shift" in e)
    assert entry["offset"][0] == -8 and entry["zero_point_shift"][0] == 0.5
    assert enc.params[entry["name"]].offset[0] == -7.5


def test_lpbq_block_scales_are_the_channel_scale_times_the_int_scale():
    enc = load_encodings(encodings_file("lpbq", "1.0.0")).params["model.layers.0.mlp.down_proj.weight"]
    channel_scale, ints, decompressed = enc.lpbq
    assert (enc.bitwidth, decompressed, enc.block_size) == (4, 8, 32)
    expected = (channel_scale.astype(np.float64)[:, None] * ints).astype(np.float32).reshape(-1)
    np.testing.assert_array_equal(enc.scale, expected)


def test_a_0_6_1_block_wise_list_is_refused_as_such(part2, tmp_path):
    with pytest.raises(EncodingsError) as err:
        convert(part2, encodings_file("per_block", "0.6.1"), tmp_path)
    message = str(err.value)
    assert "per_block_0.6.1.encodings" in message and "block-wise" in message
    assert "export the encodings as 1.0.0 or 2.0.0" in message


def test_an_activation_encoding_for_a_tensor_the_graph_lacks_is_refused(part2, tmp_path):
    data = json.loads(encodings_file("per_channel", "1.0.0").read_text())
    data["activation_encodings"][0]["name"] = "/no/such/tensor_output_0"
    bad = tmp_path / "bad.encodings"
    bad.write_text(json.dumps(data))
    with pytest.raises(EncodingsError) as err:
        convert(part2, bad, tmp_path)
    assert f"{bad}: activation encoding for '/no/such/tensor_output_0'" in str(err.value)


def test_a_version_hexbundle_does_not_know_is_refused(tmp_path):
    bad = tmp_path / "v3.encodings"
    bad.write_text(json.dumps({"version": "3.0.0", "encodings": []}))
    with pytest.raises(EncodingsError, match="unsupported encodings version '3.0.0'"):
        load_encodings(bad)


# ============================================================================ end to end

BUILDS = [case for case in CASES if case != ("per_block", "0.6.1")]   # that one is refused


@pytest.fixture(scope="module")
def aimet_project(tmp_path_factory):
    """A project whose qwen2-tiny part 2 (both graphs: one encodings file serves both, as real
    exports have) uses AIMET's encodings, one model config per (kind, version)."""
    project = copy_project(tmp_path_factory.mktemp("aimet") / "proj")
    project.doit("inputs")
    generated = project.root / "build" / "qwen2-tiny" / "inputs"
    base = (project.root / "configs" / "models" / "qwen2-tiny.toml").read_text()
    for kind, version in BUILDS:
        name = f"aimet-{kind.replace('_', '-')}-{version}"
        export = project.root / "exports" / name
        shutil.copytree(generated, export)
        for graph in (PROMPT, TOKEN):
            shutil.copy(encodings_file(kind, version), export / f"{graph}.encodings")
        text = base.replace('name = "qwen2-tiny"', f'name = "{name}"')
        text = text.replace('source = "generated"', f'source = "export"\ndir = "exports/{name}"')
        (project.root / "configs" / "models" / f"{name}.toml").write_text(text)
    return project


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("kind,version", BUILDS, ids=[f"{k}-{v}" for k, v in BUILDS])
def test_a_build_with_aimets_encodings_bundles_sizes_exactly_and_verifies(aimet_project, kind,
                                                                          version):
    name = f"aimet-{kind.replace('_', '-')}-{version}"
    run = aimet_project.doit("bundle", f"model={name}")
    part2 = next(line for line in run.out.splitlines() if line.strip().startswith("2  layers"))
    assert "+0.00  ok" in part2, run.out   # the size model counts block scales exactly
    log = (aimet_project.build_dir(name) / "logs" / "convert__part_2_of_4_prompt.log").read_text()
    if kind in ("per_block", "lpbq"):
        assert f"{kind.replace('_', '-')} 32 along axis 0" in log
    aimet_project.doit("verify", f"model={name}")
    report = json.loads((aimet_project.build_dir(name) / "verify" / "report.json").read_text())
    assert report["ok"] is True
    # the two references agree but for rounding: the floor is measured, not left to the backstop
    assert math.isfinite(report["noise_floor_lsb"]), report["noise_floor_from"]


def test_kv_outputs_take_their_producers_encoding_as_qnn_does(part2, tmp_path):
    """1.0.0 has no encoding for the KV outputs (Transpose outputs); 2.0.0 writes them as derived
    encodings. hexbundle derives the same ones from the 1.0.0 file and says so."""
    from hexbundle.backends.weightplan import graph_encodings, load_onnx_structure
    model = load_onnx_structure(part2 / f"{PROMPT}.onnx")
    v1 = graph_encodings(model, part2 / f"{PROMPT}.onnx", encodings_file("per_channel", "1.0.0"))
    v2 = graph_encodings(model, part2 / f"{PROMPT}.onnx", encodings_file("per_channel", "2.0.0"))
    assert "past_key_0_out" in v1.derived and "past_key_0_out" not in v2.derived
    for name in ("past_key_0_out", "past_value_1_out"):
        np.testing.assert_array_equal(v1.activations[name].scale, v2.activations[name].scale)
        np.testing.assert_array_equal(v1.activations[name].offset, v2.activations[name].offset)
    lines = []
    get_backend("reference").convert(part2 / f"{PROMPT}.onnx", encodings_file("per_channel", "1.0.0"),
                                     tmp_path / "g.dlc", PROMPT, ConvertOptions(), lines.append)
    assert any("carried through data-movement ops" in line and "past_key_0_out" in line
               for line in lines), lines
