"""Devices as data (issue 15): Qualcomm's chipset table, boards on it, one namespace of names;
the Genie configs as Qualcomm's own generator and schema have them.

- configs/devices.toml is byte for byte what scripts/make_devices.py makes of Qualcomm's files
  (tests/data/qualcomm/, from the qai-hub-models 0.65.0 wheel); the model configs' [genie]
  defaults are Qualcomm's generator's.
- device=sa8775p and device=qcs9075 compile and bundle soc_model 52 and 77; every chipset of
  the table builds the tiny model (real doit, one build root, inputs built once).
- a device name claimed twice is refused naming both files; the banner says what was typed and
  what it resolved to.
- genie_config.json and htp_backend_ext_config.json of every model pass Qualcomm's pydantic
  models (qairt-dev 0.6.0; marker real_qairt).
"""
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomli

import real_qairt
from conftest import CONFIGS, copy_project, embedded_models
from hexbundle.config.build import MODEL_SCHEMA, QUALCOMM_MAX_NUM_TOKENS, load_build
from hexbundle.config.devices_table import render_table
from hexbundle.config.qualcomm_wheel import CHIPSETS_FILE, GENERATOR_FILE, qualcomm_facts
from hexbundle.config.layout import Layout
from hexbundle.formats.ctxbin import read_ctxbin
from hexbundle.formats.genie import genie_config, htp_backend_ext_config
from hexbundle.steps.options import genie_options
from hexbundle.support.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
QUALCOMM = ROOT / "tests" / "data" / "qualcomm" / "qai-hub-models-0.65.0"
QUALCOMM_VERSION = "0.65.0"
WHEEL_SHA256 = "35198f76e3b98a759bc0d1ec94692b21f44e0cf20dc6f6fe51d8dceb05f12f2c"   # PyPI's
TABLE = tomli.loads((CONFIGS / "configs" / "devices.toml").read_text())
CHIPSETS = sorted(TABLE["chipset"])
MODELS = embedded_models()
TOKEN_IDS = {"bos": 151644, "eos": 151645, "eot": 151643}   # Qwen2's, for configs built unbuilt


def vendored_facts():
    return qualcomm_facts(QUALCOMM_VERSION, CHIPSETS_FILE, (QUALCOMM / CHIPSETS_FILE).read_text(),
                          GENERATOR_FILE, (QUALCOMM / GENERATOR_FILE).read_text(), WHEEL_SHA256)


def no_traceback(run) -> None:
    assert "Traceback" not in run.out + run.err, run.out + run.err


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.fixture
def configs(tmp_path):
    """A copy of the project's configs, for load_build in-process."""
    copy_project(tmp_path, ("configs",))
    return tmp_path


# ---------------------------------------------------------------------------------------------
# the table is Qualcomm's, as the script makes it

def test_the_committed_table_is_what_the_script_makes_of_qualcomms_files():
    facts = vendored_facts()
    assert (facts.chipsets_sha256, facts.generator_sha256) == (
        TABLE["source"]["chipsets_sha256"], TABLE["source"]["generator_sha256"])
    assert render_table(facts) == (CONFIGS / "configs" / "devices.toml").read_text()


def test_the_script_reads_a_qai_hub_models_wheel(tmp_path):
    """scripts/make_devices.py on a wheel holding Qualcomm's files (as PyPI's does)."""
    wheel = tmp_path / f"qai_hub_models-{QUALCOMM_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in (CHIPSETS_FILE, GENERATOR_FILE):
            zf.write(QUALCOMM / name, name)
        zf.writestr(f"qai_hub_models-{QUALCOMM_VERSION}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: qai_hub_models\nVersion: {QUALCOMM_VERSION}\n")
    out = tmp_path / "devices.toml"
    proc = subprocess.run([sys.executable, "scripts/make_devices.py", "--wheel", str(wheel),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"28 chipsets with an HTP of 34 in qai-hub-models {QUALCOMM_VERSION}" in proc.stdout
    ours = hashlib.sha256(wheel.read_bytes()).hexdigest()
    expected = (CONFIGS / "configs" / "devices.toml").read_text().replace(WHEEL_SHA256, ours)
    assert out.read_text() == expected


def test_the_script_refuses_a_wheel_without_qualcomms_files(tmp_path):
    wheel = tmp_path / "qai_hub_models-0.55.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(QUALCOMM / CHIPSETS_FILE, CHIPSETS_FILE)
    out = tmp_path / "devices.toml"
    proc = subprocess.run([sys.executable, "scripts/make_devices.py", "--wheel", str(wheel),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{wheel}: has no {GENERATOR_FILE}" in proc.stderr
    assert not out.exists()


def test_sa8775p_and_the_iq9075_chipset_are_distinct_entries_with_qualcomms_soc_models():
    chips = TABLE["chipset"]
    assert (chips["sa8775p"]["soc_model"], chips["sa8775p"]["dsp_arch"]) == (52, "v73")
    assert (chips["qcs9075"]["soc_model"], chips["qcs9075"]["dsp_arch"]) == (77, "v73")
    assert "qualcomm-dragonwing-iq-9075" in chips["qcs9075"]["aliases"]
    assert len(CHIPSETS) == 28   # every chipset of Qualcomm's 34 with Hexagon v68 or later


def test_genie_defaults_are_qualcomms_generator_values():
    facts = vendored_facts()
    assert QUALCOMM_MAX_NUM_TOKENS == facts.max_num_tokens == 2048
    genie = MODEL_SCHEMA["genie"].type
    sampler = facts.genie["sampler"]
    assert {k: genie[k].default for k in ("sampler_seed", "temp", "top_k", "top_p")} == {
        "sampler_seed": sampler["seed"], "temp": sampler["temp"], "top_k": sampler["top-k"],
        "top_p": sampler["top-p"]}


# ---------------------------------------------------------------------------------------------
# max-num-tokens: Qualcomm's, capped by the context

def test_shipped_models_generate_up_to_qualcomms_max_num_tokens_capped_by_the_context():
    contexts = {}
    for model in MODELS:
        cfg = load_build(CONFIGS, {"model": model})
        contexts[model] = cfg.model.context_length
        assert cfg.genie.max_num_tokens == min(2048, cfg.model.context_length), model
    assert (contexts["qwen2-tiny"], contexts["qwen2.5-7b-instruct"]) == (256, 4096)


@pytest.mark.parametrize("model, expected", [("qwen2-tiny", 256), ("qwen2.5-7b-instruct", 2048)])
def test_max_num_tokens_left_out_is_qualcomms_capped_by_the_context(configs, model, expected):
    edit(configs / "configs" / "models" / f"{model}.toml", f"max_num_tokens = {expected}\n", "")
    assert load_build(configs, {"model": model}).genie.max_num_tokens == expected


def test_max_num_tokens_beyond_the_context_is_refused(configs):
    path = configs / "configs" / "models" / "qwen2-tiny.toml"
    edit(path, "max_num_tokens = 256", "max_num_tokens = 257")
    with pytest.raises(ConfigError, match=rf"{path}: key 'genie.max_num_tokens' is 257, beyond "
                                          r"graphs.context_length 256"):
        load_build(configs)


def test_a_fractional_rope_theta_is_refused(configs):
    path = configs / "configs" / "models" / "qwen2-tiny.toml"
    edit(path, "rope_theta = 1000000.0", "rope_theta = 10000.5")
    with pytest.raises(ConfigError, match=rf"{path}: architecture.rope_theta is 10000.5; Genie "
                                          r"takes a whole number"):
        load_build(configs)


# ---------------------------------------------------------------------------------------------
# one namespace: a name claimed twice is refused naming both files

def test_an_alias_claimed_by_two_boards_is_refused_naming_both_files(configs):
    boards = configs / "configs" / "boards"
    text = (boards / "iq9075.toml").read_text().replace('name = "iq9075"', 'name = "rb8"')
    (boards / "rb8.toml").write_text(text.replace('aliases = ["iq-9075", ', 'aliases = ['))
    with pytest.raises(ConfigError) as exc:
        load_build(configs, {"device": "sm8550"})   # any device: the namespace is checked whole
    assert str(exc.value) == (
        f"device name 'iq9100' is claimed twice: by {boards / 'iq9075.toml'} (board iq9075) and "
        f"by {boards / 'rb8.toml'} (board rb8); a name must lead to one device: remove it from "
        "one of them (configs/devices.toml is generated: change the board)")


def test_a_board_claiming_a_chipsets_name_is_refused_naming_both_files(configs):
    board = configs / "configs" / "boards" / "iq9075.toml"
    edit(board, 'aliases = ["iq-9075", ', 'aliases = ["SA8775P", "iq-9075", ')
    with pytest.raises(ConfigError, match=rf"device name 'SA8775P' is claimed twice: by "
                                          rf"{configs / 'configs' / 'devices.toml'} \(chipset "
                                          rf"sa8775p\) and by {board} \(board iq9075\)"):
        load_build(configs)


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_clash_fails_the_build_cleanly_and_keeps_the_bundle(tmp_path):
    proj = copy_project(tmp_path / "proj")
    proj.doit("bundle")
    before = {p.name: p.read_bytes() for p in proj.bundle().iterdir()}
    edit(proj.root / "configs" / "boards" / "iq9075.toml", 'aliases = ["iq-9075", ',
         'aliases = ["qcs9075", "iq-9075", ')
    run = proj.doit("bundle", check=False)
    assert run.code != 0
    assert "device name 'qcs9075' is claimed twice: by " in run.err
    assert "configs/devices.toml (chipset qcs9075) and by " in run.err
    assert "configs/boards/iq9075.toml (board iq9075)" in run.err
    no_traceback(run)
    assert {p.name: p.read_bytes() for p in proj.bundle().iterdir()} == before


def test_a_plan_known_to_fail_on_a_board_fails_on_its_chipset_by_any_name():
    for device in ("iq9075", "qcs9075", "qualcomm-dragonwing-iq-9075", "iq9100"):
        with pytest.raises(ConfigError, match="known to fail on iq9075.*contexts 8-10"):
            load_build(CONFIGS, {"model": "qwen2.5-7b-instruct", "plan": "eleven",
                              "device": device})


def test_an_unknown_device_suggests_the_nearest_name():
    with pytest.raises(ConfigError, match=r"unknown device 'sa8757p' \(did you mean 'sa8775p'\?\)"):
        load_build(CONFIGS, {"device": "sa8757p"})


# ---------------------------------------------------------------------------------------------
# real builds: every chipset, one build root

@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """One project: the default build first (inputs made once), then one device per test."""
    proj = copy_project(tmp_path_factory.mktemp("fleet") / "proj")
    proj.first_run = proj.doit("bundle")
    return proj


def built_device(proj, name: str) -> dict:
    """What a bundle and its bins say of the device they were built for."""
    bundle = proj.bundle(device=name)
    ext = json.loads((bundle / "htp_backend_ext_config.json").read_text())
    bins = sorted(bundle.glob("*.bin"))
    devices = []
    for path in bins:
        reader = read_ctxbin(path)
        devices.append(reader.device)
        reader.close()
    return {"ext": ext["devices"][0], "bins": devices, "manifest": proj.manifest(device=name)}


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("name", CHIPSETS)
def test_every_chipset_of_the_table_builds_the_tiny_model(fleet, name):
    chip = TABLE["chipset"][name]
    run = fleet.doit("bundle", f"device={name}")
    assert f"for device {name} ({chip['title']}, soc_model {chip['soc_model']}, " \
           f"{chip['dsp_arch']})" in run.out
    assert not [t for t in run.executed if t.startswith("inputs")], run.executed   # reused
    built = built_device(fleet, name)
    pair = {"soc_model": chip["soc_model"], "dsp_arch": chip["dsp_arch"]}
    assert {k: built["ext"][k] for k in pair} == pair
    assert [c["core_id"] for c in built["ext"]["cores"]] == chip["htp_cores"]
    assert built["bins"] == [pair] * 4   # the compile had the same entry as the bundle
    assert built["manifest"]["device"] == name


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_sa8775p_and_qcs9075_write_52_and_77(fleet):
    for name, soc_model in (("sa8775p", 52), ("qcs9075", 77)):
        fleet.doit("bundle", f"device={name}")
        built = built_device(fleet, name)
        assert built["ext"]["soc_model"] == soc_model and built["ext"]["dsp_arch"] == "v73"
        assert [b["soc_model"] for b in built["bins"]] == [soc_model] * 4


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_the_banner_says_what_was_typed_and_what_it_resolved_to(fleet):
    assert ("for device iq9075 (board on qcs9075: Dragonwing IQ-9075, soc_model 77, v73)"
            in fleet.first_run.out)
    expect = {"IQ9100": "device IQ9100 -> iq9075 (board on qcs9075: Dragonwing IQ-9075, "
                        "soc_model 77, v73)",
              "sa8775p": "device sa8775p (SA8775P, soc_model 52, v73)",
              "SM8550": "device SM8550 -> snapdragon-8gen2 (Snapdragon 8 Gen 2 Mobile, soc_model "
                        "43, v73)"}
    for typed, line in expect.items():
        assert line in fleet.doit("bundle", f"device={typed}").out.splitlines()[0]


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_the_board_keeps_the_seeds_vtcm_and_a_chipset_asks_for_the_socs_maximum(fleet):
    fleet.doit("bundle", "device=qcs9075")
    vtcm = {}
    for name in ("iq9075", "qcs9075"):
        for path in sorted(fleet.bundle(device=name).glob("*.bin")):
            reader = read_ctxbin(path)
            vtcm.setdefault(name, []).append(reader.options["vtcm_mb"])
            reader.close()
    assert vtcm == {"iq9075": [8] * 4, "qcs9075": [0] * 4}


# ---------------------------------------------------------------------------------------------
# Qualcomm's generator and schema

def qualcomm_key_paths(node, prefix=()):
    """Every (key path, value) of a nested dict: leaves only."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from qualcomm_key_paths(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def configs_of(model: str, device: str) -> tuple:
    """(genie_config.json, htp_backend_ext_config.json) as the bundle step writes them."""
    cfg = load_build(CONFIGS, {"model": model, "device": device})
    layout = Layout(cfg)
    bins = [layout.bin_name(p) for p in cfg.plan.parts()]
    options = genie_options(cfg)   # as the bundle step computes them
    return genie_config(options, TOKEN_IDS, bins), htp_backend_ext_config(options)


@pytest.mark.parametrize("model", MODELS)
def test_genie_config_has_every_key_and_value_qualcomms_generator_writes(model):
    """Qualcomm's create_genie_config, key for key: its constants are ours; where it computes a
    value (context, tokens, rope) ours comes from the model. Differences, each on purpose:
    max-num-tokens capped by a context shorter than 2048, and the eot-token Qwen2 needs."""
    facts = vendored_facts()
    ours, ext = configs_of(model, "iq9075")
    context = ours["dialog"]["context"]["size"]
    for path, value in qualcomm_key_paths(facts.genie):
        node = ours["dialog"]
        for key in path:
            assert key in node, f"{'.'.join(path)} is missing"
            node = node[key]
        if path == ("max-num-tokens",):
            value = min(value, context)
        assert node == value, (path, node, value)
    assert ext == {k: v for k, v in facts.htp_ext.items()} | {"devices": [
        {"soc_model": 77, "dsp_arch": "v73", "cores": facts.htp_ext["devices"][0]["cores"]}]}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    api = real_qairt.load_locked(tmp_path_factory.mktemp("qairt-dev"))
    yield api
    real_qairt.unload(api)


def passes_qualcomms_genie_schema(real, config: dict) -> None:
    """GenieConfig takes it, and gives it back unchanged: no key dropped, renamed or retyped."""
    parsed = real.GenieConfig.model_validate(config)
    assert type(parsed.dialog).__name__ == "BasicDialog"
    assert json.loads(str(parsed)) == config


def passes_qualcomms_htp_schema(real, ext: dict) -> None:
    """HtpConfigHelper parses every key into a declared field (nothing left as an extra) and
    serializes the same values back; the dsp_arch is one of QAIRT's."""
    helper = real.htp.HtpConfigHelper
    contexts, graphs, devices, memory, group, extras = helper.from_backend_extension_dict(ext)
    assert extras == {} and graphs == [] and group is None
    assert [o._extras for o in [*contexts, *devices, *devices[0].cores, memory]] == [{}] * 4
    back = helper.to_backend_extension_dict(contexts, None, devices, memory)
    assert back == {**ext, "context": [ext["context"]]}   # QAIRT writes a list of one
    options = real.modules["qairt.api.configs.common"].DspArchitecture.list_options()
    assert ext["devices"][0]["dsp_arch"] in options


@pytest.mark.real_qairt
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("device", ["iq9075", "sa8775p"])
def test_every_models_genie_configs_pass_qualcomms_schema(real, model, device):
    config, ext = configs_of(model, device)
    passes_qualcomms_genie_schema(real, config)
    passes_qualcomms_htp_schema(real, ext)


@pytest.mark.real_qairt
def test_every_chipsets_htp_config_passes_qualcomms_schema(real):
    for name in CHIPSETS:
        passes_qualcomms_htp_schema(real, configs_of("qwen2-tiny", name)[1])


@pytest.mark.real_qairt
def test_the_built_bundles_configs_pass_qualcomms_schema(real, fleet):
    bundle = fleet.bundle()
    passes_qualcomms_genie_schema(real, json.loads((bundle / "genie_config.json").read_text()))
    passes_qualcomms_htp_schema(real, json.loads(
        (bundle / "htp_backend_ext_config.json").read_text()))


@pytest.mark.real_qairt
def test_qualcomms_schema_refuses_what_hexbundle_must_never_write(real):
    """The check has teeth: a misspelt key, a string where an int goes, a fractional rope-theta."""
    from pydantic import ValidationError
    good, _ = configs_of("qwen2-tiny", "iq9075")
    for mutate in (lambda d: d["dialog"].update({"max-num-token": 5}),
                   lambda d: d["dialog"]["context"].update({"size": "large"}),
                   lambda d: d["dialog"]["engine"]["backend"]["QnnHtp"].update(
                       {"rope-theta": 10000.5})):
        bad = json.loads(json.dumps(good))
        mutate(bad)
        with pytest.raises(ValidationError):
            real.GenieConfig.model_validate(bad)
