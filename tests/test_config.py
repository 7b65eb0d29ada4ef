"""Config loading: the shipped configs load; every kind of mistake is a clean, named error."""
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexbundle.config.build import BUILD_SCHEMA, MODEL_SCHEMA, load_build
from hexbundle.config.schema import validate
from hexbundle.support.errors import ConfigError
from conftest import CONFIGS, copy_project

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(tmp_path):
    copy_project(tmp_path, ("configs",))
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_shipped_defaults_load():
    cfg = load_build(CONFIGS)
    assert cfg.model.name == "qwen2-tiny"
    assert cfg.device.soc_model == 77 and cfg.device.dsp_arch == "v73"
    assert cfg.backend == "reference" and cfg.executor == "local"
    assert cfg.compile.weights_packing is True


@pytest.mark.parametrize("alias", ["iq9075", "iq9100", "IQ-9100", "QCS9100"])
def test_board_aliases_resolve_to_the_board(alias):
    cfg = load_build(CONFIGS, {"device": alias})
    assert (cfg.device.name, cfg.device.kind, cfg.device.chipset) == ("iq9075", "board", "qcs9075")
    assert cfg.device.typed == alias


@pytest.mark.parametrize("alias, name", [("sa8775p", "sa8775p"), ("qualcomm-sa8775p", "sa8775p"),
                                         ("QCS9075", "qcs9075"), ("sm8550", "snapdragon-8gen2")])
def test_chipset_names_and_aliases_resolve_to_the_chipset(alias, name):
    cfg = load_build(CONFIGS, {"device": alias})
    assert (cfg.device.name, cfg.device.kind, cfg.device.chipset) == (name, "chipset", name)


def test_7b_six_split_plan():
    cfg = load_build(CONFIGS, {"model": "qwen2.5-7b-instruct"})
    assert cfg.plan.name == "six"
    assert cfg.plan.layers_per_part == (0, 6, 6, 6, 6, 4)
    names = [g.name for p in cfg.plan.parts() for g in cfg.model.graphs(p)]
    assert names[:2] == ["prompt_ar128_cl4096_1_of_6", "token_ar1_cl4096_1_of_6"]
    assert cfg.plan.parts()[-1].has_head and cfg.plan.parts()[0].has_embedding


def test_eleven_split_is_refused_on_iq9075():
    with pytest.raises(ConfigError, match="known to fail on iq9075.*contexts 8-10"):
        load_build(CONFIGS, {"model": "qwen2.5-7b-instruct", "plan": "eleven"})


def test_misordered_graph_names_are_refused(project):
    # A plan with 10+ parts on a device where it is not known to fail: the name order trap.
    model = project / "configs" / "models" / "qwen2.5-7b-instruct.toml"
    edit(model, 'known_to_fail_on = ["iq9075"]', "known_to_fail_on = []")
    with pytest.raises(ConfigError, match=r"'prompt_ar128_cl4096_10_of_11' sorts before"):
        load_build(project, {"model": "qwen2.5-7b-instruct", "plan": "eleven"})


def test_unknown_key_names_file_key_and_suggestion(project):
    edit(project / "configs" / "build.toml", "weights_packing =", "weights_pakcing =")
    with pytest.raises(ConfigError) as exc:
        load_build(project)
    msg = str(exc.value)
    assert "build.toml" in msg and "compile.weights_pakcing" in msg
    assert "did you mean 'compile.weights_packing'" in msg


def test_wrong_type_names_key_and_expected_type(project):
    edit(project / "configs" / "build.toml", "optimization_type = 3", 'optimization_type = "3"')
    with pytest.raises(ConfigError, match=r"build.toml: key 'compile.optimization_type' is str"):
        load_build(project)


def test_out_of_range_value(project):
    edit(project / "configs" / "build.toml", "optimization_type = 3", "optimization_type = 7")
    with pytest.raises(ConfigError, match=r"optimization_type.*\[1, 3\]"):
        load_build(project)


def chipset_entry(project: Path, name: str) -> tuple:
    """(devices.toml, the text of [chipset.NAME]) in a copied project."""
    table = project / "configs" / "devices.toml"
    text = table.read_text()
    start = text.index(f"[chipset.{name}]\n")
    end = text.find("\n\n", start)
    return table, text[start:end if end > 0 else None]


def test_hand_edited_dsp_arch_is_rejected_naming_qualcomms_pair(project):
    table, entry = chipset_entry(project, "qcs9075")
    edit(table, entry, entry.replace('dsp_arch = "v73"', 'dsp_arch = "v75"'))
    with pytest.raises(ConfigError) as exc:
        load_build(project)   # the board iq9075 is on qcs9075; the table is checked whole
    msg = str(exc.value)
    assert msg.startswith(f"{table}: chipset.qcs9075: soc_model 77 with dsp_arch v75 is not what "
                          "Qualcomm's chipset table says (it gives qualcomm-qcs9075 soc_model 77, "
                          "v73; qai-hub-models 0.65.0 qai_hub_models/devices_and_chipsets.yaml)"), msg
    assert "regenerate the table with scripts/make_devices.py" in msg


def test_hand_edited_soc_model_is_rejected(project):
    table, entry = chipset_entry(project, "sa8775p")
    edit(table, entry, entry.replace("soc_model = 52", "soc_model = 77"))   # the seeds' mistake
    with pytest.raises(ConfigError, match=r"chipset.sa8775p: soc_model 77 with dsp_arch v73 is "
                                          r"not what Qualcomm's chipset table says \(it gives "
                                          r"qualcomm-sa8775p soc_model 52, v73;"):
        load_build(project)   # any device: the table is checked whole


def test_a_chipset_qualcomms_table_lacks_is_rejected(project):
    table, entry = chipset_entry(project, "sa8775p")
    edit(table, entry, entry + "\n\n" + entry.replace("[chipset.sa8775p]", "[chipset.sa8795p]")
         .replace('"qualcomm-sa8775p"', '"qualcomm-sa8795p"'))
    with pytest.raises(ConfigError, match=r"chipset.sa8795p: .*\(it has no qualcomm-sa8795p;"):
        load_build(project)


def test_a_board_cannot_restate_a_chipset_fact(project):
    edit(project / "configs" / "boards" / "iq9075.toml", 'chipset = "qcs9075"',
         'chipset = "qcs9075"\nsoc_model = 52')
    with pytest.raises(ConfigError, match=r"iq9075.toml: unknown key 'device.soc_model'"):
        load_build(project)


def test_a_board_on_an_unknown_chipset_is_rejected(project):
    edit(project / "configs" / "boards" / "iq9075.toml", 'chipset = "qcs9075"',
         'chipset = "qcs9057"')
    with pytest.raises(ConfigError, match=r"iq9075.toml: key 'device.chipset' is 'qcs9057', which "
                                          r"is not a chipset of .*devices.toml \(did you mean "
                                          r"'qcs9075'\?\)"):
        load_build(project)


def test_unknown_device_and_model():
    with pytest.raises(ConfigError, match=r"unknown device 'sm9999'.*known: iq9075, qcm6690"):
        load_build(CONFIGS, {"device": "sm9999"})
    with pytest.raises(ConfigError, match=r"unknown model 'llama'.*qwen2-tiny"):
        load_build(CONFIGS, {"model": "llama"})


def test_plan_layers_must_sum_to_num_layers(project):
    edit(project / "configs" / "models" / "qwen2-tiny.toml", "[0, 2, 1, 1]", "[0, 2, 1]")
    with pytest.raises(ConfigError, match=r"sums to 3 layers.*num_layers is 4"):
        load_build(project)


def test_command_line_overrides_are_typed_and_validated():
    assert load_build(CONFIGS, {"weights_packing": "false"}).compile.weights_packing is False
    with pytest.raises(ConfigError, match="expected true or false"):
        load_build(CONFIGS, {"weights_packing": "maybe"})
    with pytest.raises(ConfigError, match="unknown setting 'modle'"):
        load_build(CONFIGS, {"modle": "x"})
    with pytest.raises(ConfigError, match="allowed: 'reference', 'qairt'"):
        load_build(CONFIGS, {"backend": "cli"})


def test_container_limits_come_from_build_toml_and_the_command_line():
    """[container]: the step containers' limits and uid, typed, in docker's units."""
    settings = load_build(CONFIGS).container
    assert (settings.pids_limit, settings.memory, settings.cpus, settings.tmp_size,
            settings.user) == (4096, 32 << 30, 0.0, 256 << 20, "65534:65534")
    given = load_build(CONFIGS, {"container.memory": "1g", "container.cpus": "1.5",
                              "container.pids_limit": "64", "container.tmp_size": "8m",
                              "container.user": "4242:4343"}).container
    assert (given.pids_limit, given.memory, given.cpus, given.tmp_size, given.user) == \
        (64, 1 << 30, 1.5, 8 << 20, "4242:4343")


@pytest.mark.parametrize("line, named", [
    ('user = "0:0"', r"build.toml: key 'container.user' is '0:0': steps never run as root"),
    ('user = "1000:0"', r"key 'container.user' is '1000:0': steps never run as root"),
    ('user = "nobody"', r"key 'container.user' is 'nobody'; expected a string matching"),
    ('memory = "32 GB"', r"key 'container.memory' is '32 GB'; expected a string matching"),
    ('memory = "32m"', r"key 'container.memory' is '32m': a step needs at least 64m"),
    ('tmp_size = "64g"', r"key 'container.tmp_size' is '64g'; expected at least 1m and less "
                         r"than container.memory \(32g\)"),
    ("pids_limit = 0", r"key 'container.pids_limit' is 0; expected an integer in \[64"),
    ("cpus = -1", r"key 'container.cpus' is -1.0; expected a number in \[0"),
    ("memroy = \"8g\"", r"unknown key 'container.memroy' \(did you mean 'container.memory'\?\)"),
])
def test_bad_container_settings_are_refused_naming_the_key(project, line, named):
    build = project / "configs" / "build.toml"
    key = line.split(" =")[0]
    kept = [ln for ln in build.read_text().splitlines() if not ln.startswith(key + " ")]
    kept += [] if "[container]" in kept else ["[container]"]
    kept.insert(kept.index("[container]") + 1, line)
    build.write_text("\n".join(kept) + "\n")
    with pytest.raises(ConfigError, match=named):
        load_build(project)


def test_bad_container_settings_on_the_command_line_name_it():
    with pytest.raises(ConfigError, match=r"command line: key 'container.user' is '0:0'"):
        load_build(CONFIGS, {"container.user": "0:0"})
    with pytest.raises(ConfigError, match=r"command line: container.cpus='two': expected a "
                                          "number"):
        load_build(CONFIGS, {"container.cpus": "two"})
    with pytest.raises(ConfigError, match=r"unknown setting 'container.mem' \(did you mean "
                                          r"'container.memory'\?\); allowed: .*container.memory"):
        load_build(CONFIGS, {"container.mem": "1g"})


def test_input_dir_outside_project_is_refused(project):
    model = project / "configs" / "models" / "qwen2.5-7b-instruct.toml"
    edit(model, 'dir = "exports/qwen2.5-7b-instruct"', 'dir = "../../etc"')
    with pytest.raises(ConfigError, match="points outside the project"):
        load_build(project, {"model": "qwen2.5-7b-instruct"})   # at load, not at first use


def test_invalid_toml_names_file(project):
    (project / "configs" / "build.toml").write_text("model = [unclosed\n")
    with pytest.raises(ConfigError, match=r"build.toml: not valid TOML"):
        load_build(project)


toml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                               max_size=3),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@given(st.dictionaries(st.sampled_from(list(MODEL_SCHEMA) + list(BUILD_SCHEMA) + ["x"]),
                       toml_values, max_size=6))
def test_validator_fuzz_only_raises_config_error(data):
    for schema in (MODEL_SCHEMA, BUILD_SCHEMA):
        try:
            validate(data, schema, "fuzz.toml")
        except ConfigError:
            pass
