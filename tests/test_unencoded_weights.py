"""A layer weight without an encoding: the model config's policy, said per tensor.

Qualcomm compiles its LLMs with `--quantize_full_type w8a16` (every float weight left quantized
to 8 bits); hexbundle refuses by default, or does that ("int8"), or keeps the weight float
("float") -- and says which, in the step log and the manifest.
"""

import numpy as np
import pytest

from conftest import CONFIGS, copy_project, drop_encoding
from hexbundle.backends import ConvertOptions
from hexbundle.backends.registry import get_backend
from hexbundle.config.build import load_model
from hexbundle.formats.dlc import read_dlc
from hexbundle.inputs import generate
from hexbundle.support.errors import EncodingsError

GRAPH = "prompt_ar128_cl256_2_of_4"
WEIGHT = "model.layers.0.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def part2(tmp_path_factory):
    model, _ = load_model(CONFIGS, "qwen2-tiny")
    out = tmp_path_factory.mktemp("part2")
    generate.generate_part(model, model.plans["four"].parts()[1], out, 0)
    drop_encoding(out / f"{GRAPH}.encodings", WEIGHT)
    return out


def convert(part2, tmp_path, policy: str):
    lines = []
    dlc = tmp_path / "g.dlc"
    get_backend("reference").convert(part2 / f"{GRAPH}.onnx", part2 / f"{GRAPH}.encodings", dlc,
                                     GRAPH, ConvertOptions(16, policy), lines.append)
    return dlc, lines


def test_refused_by_default_naming_the_weight_and_the_policy_key(part2, tmp_path):
    with pytest.raises(EncodingsError) as err:
        convert(part2, tmp_path, "refuse")
    message = str(err.value)
    assert f"no int encoding for weight '{WEIGHT}'" in message
    assert 'unencoded_weights = "int8"' in message


def test_int8_quantizes_it_per_channel_from_its_values_and_says_so(part2, tmp_path):
    import onnx
    dlc_path, lines = convert(part2, tmp_path, "int8")
    assert any(line.startswith(f"{WEIGHT}: int8 symmetric per-channel axis 1") and
               "unencoded_weights = int8" in line for line in lines), lines
    weights = {i.name: onnx.numpy_helper.to_array(i, base_dir=str(part2))
               for i in onnx.load(str(part2 / f"{GRAPH}.onnx")).graph.initializer}
    with read_dlc(dlc_path) as dlc:
        record, quant = dlc.record(WEIGHT), dlc.quant_params(WEIGHT)
        assert record.dtype == "uint8" and quant.axis == 1 and quant.channels == 512
        w = weights[WEIGHT]
        np.testing.assert_allclose(quant.scale, np.abs(w).max(axis=0) / 127, rtol=1e-6)
        assert np.all(np.abs(dlc.dequantize(WEIGHT) - w) <= quant.scale / 2 * (1 + 1e-5))


def test_float_keeps_it_at_float_bitwidth_and_says_so(part2, tmp_path):
    dlc_path, lines = convert(part2, tmp_path, "float")
    assert f"{WEIGHT}: float16 shape [128, 512] (no encoding: unencoded_weights = float)" in lines
    with read_dlc(dlc_path) as dlc:
        assert dlc.record(WEIGHT).dtype == "float16"


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_build_records_the_policy_and_each_tensor_in_the_manifest(tmp_path):
    project = copy_project(tmp_path / "proj")
    project.doit("inputs")
    generated = project.root / "build" / "qwen2-tiny" / "inputs"
    export = project.root / "exports" / "w8"
    import shutil
    shutil.copytree(generated, export)
    for graph in (GRAPH, "token_ar1_cl256_2_of_4"):
        drop_encoding(export / f"{graph}.encodings", WEIGHT)
    text = (project.root / "configs" / "models" / "qwen2-tiny.toml").read_text()
    text = text.replace('name = "qwen2-tiny"', 'name = "w8"')
    text = text.replace('source = "generated"', 'source = "export"\ndir = "exports/w8"')
    text = text.replace("activation_bitwidth = 16", 'activation_bitwidth = 16\nunencoded_weights = "int8"')
    (project.root / "configs" / "models" / "w8.toml").write_text(text)
    run = project.doit("bundle", "model=w8")
    assert "1 layer weight(s) without an encoding, stored by the policy unencoded_weights = 'int8'" \
        in run.out
    part2 = next(line for line in run.out.splitlines() if line.strip().startswith("2  layers"))
    assert "+0.00  ok" in part2   # the size model knows the derived int8 weight
    manifest = project.manifest("w8")
    assert manifest["unencoded_weights"] == {"policy": "int8", "tensors": {WEIGHT: "uint8"}}
    project.doit("verify", "model=w8")
