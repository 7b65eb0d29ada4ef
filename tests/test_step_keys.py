"""A step's key covers every setting the step reads: the convert step's options
(steps/options.py) are its doit key, so flipping any of them reruns the converts, and the
incremental build then equals a clean build with the new setting (issue 23's first case: a
model's [quantization] unencoded_weights, which the hand-kept key list missed)."""
from __future__ import annotations

import dataclasses
import re
import shutil

import pytest

from conftest import copy_project, drop_encoding, snapshot
from hexbundle.backends import ConvertOptions

GRAPH = "prompt_ar128_cl256_2_of_4"
WEIGHT = "model.layers.0.mlp.up_proj.weight"
MODEL = "w8"


def with_unencoded_weight(project, policy: str):
    """qwen2-tiny's inputs as an export `w8` in which part 2 has a weight without an encoding,
    stored by `policy` (the model config's [quantization] unencoded_weights)."""
    project.doit("inputs")
    export = project.root / "exports" / MODEL
    shutil.copytree(project.root / "build" / "qwen2-tiny" / "inputs", export)
    for graph in (GRAPH, "token_ar1_cl256_2_of_4"):
        drop_encoding(export / f"{graph}.encodings", WEIGHT)
    text = (project.root / "configs" / "models" / "qwen2-tiny.toml").read_text()
    text = text.replace('name = "qwen2-tiny"', f'name = "{MODEL}"')
    text = re.sub(r'source = "generated"\n(seed = \d+\n)?',
                  f'source = "export"\ndir = "exports/{MODEL}"\n', text)
    assert "activation_bitwidth = 16\n" in text
    text = text.replace("activation_bitwidth = 16\n",
                        f'activation_bitwidth = 16\nunencoded_weights = "{policy}"\n', 1)
    (project.root / "configs" / "models" / f"{MODEL}.toml").write_text(text)
    return project


def set_policy(project, policy: str) -> None:
    path = project.root / "configs" / "models" / f"{MODEL}.toml"
    path.write_text(re.sub(r'unencoded_weights = "\w+"', f'unencoded_weights = "{policy}"',
                           path.read_text()))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = with_unencoded_weight(copy_project(tmp_path_factory.mktemp("keys") / "proj"),
                                    "int8")
    project.doit("bundle", f"model={MODEL}")
    return project


def would_run(project, *settings) -> set:
    """The tasks `doit bundle --dry-run` says would run."""
    run = project.doit("bundle", f"model={MODEL}", "--dry-run", *settings)
    return set(re.findall(r"^\.\s+(\S+)", run.out, re.M))


# Each ConvertOptions field, and how a user changes it: a command-line setting, or (None) the
# model config's [quantization] unencoded_weights.
FLIPS = {"float_bitwidth": "float_bitwidth=32", "truncate_64bit_io": "truncate_64bit_io=false",
         "quantize_io": "quantize_io=true", "quantize_full_type": "quantize_full_type=w8a16",
         "unencoded_weights": None}


def test_every_convert_option_has_a_flip_here():
    assert set(FLIPS) == {f.name for f in dataclasses.fields(ConvertOptions)}


@pytest.mark.parametrize("option", sorted(FLIPS))
def test_flipping_a_convert_option_reruns_every_convert(built, option):
    converts = {t for t in would_run(built) if t.startswith("convert:")}
    assert converts == set()   # built: nothing to do
    if FLIPS[option] is None:
        set_policy(built, "float")
        try:
            flipped = would_run(built)
        finally:
            set_policy(built, "int8")
    else:
        flipped = would_run(built, FLIPS[option])
    assert {t for t in flipped if t.startswith("convert:")} == \
        {f"convert:part_{p}_of_4_{g}" for p in range(1, 5) for g in ("prompt", "token")}


def test_a_changed_unencoded_weights_policy_builds_what_a_clean_build_does(built, tmp_path):
    set_policy(built, "float")
    try:
        run = built.doit("bundle", f"model={MODEL}")
        assert "convert:part_2_of_4_prompt" in run.executed
        incremental = snapshot(built.bundle(MODEL))
        assert built.manifest(MODEL)["unencoded_weights"]["policy"] == "float"
    finally:
        set_policy(built, "int8")
    clean = with_unencoded_weight(copy_project(tmp_path / "clean"), "float")
    clean.doit("bundle", f"model={MODEL}")
    assert snapshot(clean.bundle(MODEL)) == incremental
