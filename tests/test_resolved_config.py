"""The resolved config a step spec carries (config.resolved): written once by the doit run, read
back by the step runner as the same values, never resolved again from the command line."""
import json
import shutil

import pytest

from conftest import CONFIGS, copy_project, embedded_models, step_descriptions
from hexbundle.config import resolved
from hexbundle.config.build import load_build
from hexbundle.config.devices import Devices
from hexbundle.config.layout import Layout
from hexbundle.steps import runner
from hexbundle.steps.executor import described_spec
from hexbundle.support.errors import ConfigError


def every_device() -> list:
    """Every board and every chipset the project ships (the devices the steps can target)."""
    devices = Devices(CONFIGS)
    return [b.name for b in devices.boards] + sorted(devices.table["chipset"])


def every_build() -> list:
    """(model, device, plan): each shipped model with each of its plans on the default device,
    and the default model on each shipped device."""
    out = [(None, device, None) for device in every_device()]
    for model in embedded_models():
        out += [(model, None, plan) for plan in sorted(load_build(CONFIGS, {"model": model})
                                                       .model.plans)]
    return out


def through_json(cfg):
    """What the step runner receives: the spec's config through JSON text, as argv carries it."""
    return resolved.load(json.loads(json.dumps(resolved.dump(cfg), sort_keys=True)))


def test_every_shipped_config_round_trips():
    loaded = 0
    for model, device, plan in every_build():
        given = {"model": model, "device": device, "plan": plan}
        try:
            cfg = load_build(CONFIGS, {k: v for k, v in given.items() if v})
        except ConfigError:   # a plan refused at load (too many parts, a known failure)
            continue
        back = through_json(cfg)
        assert back == cfg, (model, device, plan)
        assert repr(back) == repr(cfg)   # the step keys are made of reprs of these values
        loaded += 1
    assert loaded >= len(embedded_models()) + len(every_device())


def test_every_section_setting_round_trips():
    """A changed value of each [compile] and [container] key and each remote_* setting survives."""
    from hexbundle.config.build import COMPILE_SCHEMA, CONTAINER_SCHEMA
    overrides = {"weights_packing": "false", "weight_sharing": "false", "float_bitwidth": "32",
                 "quantize_full_type": "w8a16", "container.cpus": "1.5",
                 "container.memory": "3g", "remote_cache": "grpc://127.0.0.1:9",
                 "remote_header": "x-a=b", "remote_timeout": "7"}
    assert {"weights_packing", "float_bitwidth"} <= set(COMPILE_SCHEMA)
    assert {"cpus", "memory"} <= set(CONTAINER_SCHEMA)
    cfg = load_build(CONFIGS, overrides)
    back = through_json(cfg)
    assert back == cfg
    assert (back.compile.weights_packing, back.compile.float_bitwidth) == (False, 32)
    assert (back.container.cpus, back.remote.timeout) == (1.5, 7)


def test_types_keep_their_kind():
    cfg = through_json(load_build(CONFIGS, {}))
    assert isinstance(cfg.model.context_lengths, tuple)
    assert isinstance(cfg.plan.layers_per_part, tuple)
    assert isinstance(cfg.tokenizer_specials, dict)
    assert type(cfg.inputs.pins).__name__ == "FrozenMap"
    assert hash(cfg.compile) == hash(load_build(CONFIGS, {}).compile)
    assert str(cfg.root) == str(CONFIGS.resolve()) or cfg.root == load_build(CONFIGS, {}).root


@pytest.mark.parametrize("bad, says", [
    ({"@type": "os:system"}, "not one of hexbundle.config's"),
    ({"@type": "hexbundle.config.build:load_build"}, "not a dataclass"),
    ({"@type": "hexbundle.config.model:Quantization", "bogus": 1}, "another hexbundle version"),
    ([1, 2], "untagged list"),
    ({"a": 1}, "untagged table"),
])
def test_a_spec_not_written_by_dump_is_refused(bad, says):
    with pytest.raises(resolved.SpecError, match=says):
        resolved.load(bad)


def test_a_value_with_no_json_form_is_refused():
    with pytest.raises(resolved.SpecError, match="no JSON form"):
        resolved.dump({"x": object()})


def test_the_spec_carries_no_command_line_and_no_config(tmp_path):
    root = copy_project(tmp_path / "proj", ("configs", "dodo.py")).root
    descriptions = step_descriptions(root, ("compile",))
    cfg = load_build(root, {})
    spec = described_spec(Layout(cfg), descriptions["compile:part_2_of_4"])
    assert set(spec) == {"step", "description", "digest_cache"}
    assert "overrides" not in json.dumps(spec) and "config" not in spec


def test_the_step_runs_on_its_description_not_the_files(tmp_path):
    """A step given a spec resolves nothing again: with the project's configs/ gone after the
    doit side resolved them, the tokenizer step still writes what its description says."""
    root = copy_project(tmp_path / "proj", ("configs", "dodo.py")).root
    cfg = load_build(root, {})
    layout = Layout(cfg)
    description = step_descriptions(root, ("inputs",))["inputs:tokenizer"]
    spec = json.loads(json.dumps({"step": "inputs", "description": description}))
    shutil.rmtree(root / "configs")   # a runner that called load_build would fail here
    lines = []
    assert runner.run(spec, lines.append) == 0, "\n".join(lines)
    assert layout.tokenizer.is_file()
    vocab = json.loads(layout.tokenizer.read_text())["model"]["vocab"]
    assert len(vocab) <= cfg.model.architecture.vocab_size
