"""Names that become paths (issue 40, kind 1): every name a config file, the command line or a
task's argument gives that ends up a component of a path hexbundle writes is checked in one place
(config.layout.check_name), and the layout refuses a path outside the build root whatever the
name's source."""
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from hexbundle.config.build import load_build
from hexbundle.config.layout import MAX_NAME, Layout, ProjectLayout
from hexbundle.inputs.import_export import import_export
from hexbundle.support.errors import ConfigError, HexbundleError
from conftest import copy_project

LONG = "a" * 100_000          # a 100 KB name: was ENAMETOOLONG, not a message
TOO_LONG = "b" * (MAX_NAME + 1)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def plan_named(name: str):
    """A second plan named `name` in the tiny model's config (the default stays "four")."""
    def setup(root: Path) -> dict:
        path = root / "configs/models/qwen2-tiny.toml"
        path.write_text(path.read_text() + f'\n[plans."{name}"]\nlayers_per_part = [0, 2, 1, 1]\n')
        return {}
    return setup


def default_plan_named(name: str):
    def setup(root: Path) -> dict:
        path = root / "configs/models/qwen2-tiny.toml"
        edit(path, "[plans.four]", f'[plans."{name}"]')
        edit(path, 'default_plan = "four"', f'default_plan = "{name}"')
        return {}
    return setup


def override(**settings):
    return lambda root: settings


def model_config_key(old: str, new: str):
    def setup(root: Path) -> dict:
        edit(root / "configs/models/qwen2-tiny.toml", old, new)
        return {}
    return setup


def board_named(name: str):
    """A board whose name (and file name) is `name`: every board is read at load."""
    def setup(root: Path) -> dict:
        text = (root / "configs/boards/iq9075.toml").read_text()
        text = text.replace('name = "iq9075"', f'name = "{name}"')
        text = re.sub(r"aliases = \[.*\]", "aliases = []", text)
        (root / "configs/boards/iq9075.toml").unlink()
        (root / f"configs/boards/{name}.toml").write_text(text)
        return {}
    return setup


# Every source of a name that becomes a path component: (id, setup, what the message names).
CASES = [
    ("plan-dotdot", plan_named("../../../../pv"), "plan name"),
    ("plan-absolute", plan_named("/tmp/hexbundle-outside"), "plan name"),
    ("plan-other-device", plan_named("../sa8775p/four"), "plan name"),
    ("plan-too-long", plan_named(TOO_LONG), "plan name"),
    ("default-plan-dotdot", default_plan_named("../../x"), "key 'model.default_plan'"),
    ("plan-on-command-line", override(plan="../four"), "key 'plan'"),
    ("model-100KB-on-command-line", override(model=LONG), "key 'model'"),
    ("model-too-long", override(model=TOO_LONG), "key 'model'"),
    ("device-100KB-on-command-line", override(device=LONG), "key 'device'"),
    ("slug-too-long", model_config_key('slug = "qwen2_tiny"', f'slug = "{"s" * 300}"'),
     "model.slug"),
    ("board-name-too-long", board_named("c" * (MAX_NAME + 1)), "device.name"),
]


@pytest.mark.parametrize("setup, named", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_name_that_becomes_a_path_is_checked_where_it_is_given(tmp_path, setup, named):
    copy_project(tmp_path, ("configs",))
    overrides = setup(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_build(tmp_path, overrides)
    message = str(caught.value)
    assert named in message
    assert len(message) < 2000, "a long name is named, not printed whole"


def test_import_export_name_is_checked_as_a_path_component(tmp_path):
    copy_project(tmp_path, ("configs",))
    models = tmp_path / "configs/models"
    before = sorted(os.listdir(models))
    for name in ("../x", LONG, TOO_LONG):
        with pytest.raises(HexbundleError, match="--name") as caught:
            import_export(tmp_path, str(tmp_path), name)
        assert len(str(caught.value)) < 2000
    assert sorted(os.listdir(models)) == before


@pytest.mark.parametrize("field, value", [
    ("plan", "../../../../pv"), ("plan", "/abs"), ("plan", "../sa8775p/four"),
    ("device", ".."), ("model", "../m"), ("backend", "../../r"), ("plan", "a/b"),
])
def test_the_layout_refuses_a_path_outside_the_build_root_whatever_the_names_source(
        tmp_path, field, value):
    """A config built by other means than load_build (a name never checked) still cannot lead
    the layout outside the build root."""
    cfg = load_build(copy_project(tmp_path, ("configs",)).root)
    if field == "plan":
        cfg = replace(cfg, plan=replace(cfg.plan, name=value))
    elif field == "device":
        cfg = replace(cfg, device=replace(cfg.device, name=value))
    elif field == "model":
        cfg = replace(cfg, model=replace(cfg.model, name=value))
    else:
        cfg = replace(cfg, backend=value)
    layout = Layout(cfg)
    for where in (lambda: layout.build_dir, lambda: layout.doit_db(),
                  lambda: layout.bundle_dir, lambda: layout.logs_dir):
        with pytest.raises(ConfigError, match=field):
            where()
    if field == "model":
        for where in (lambda: layout.model_dir, lambda: layout.model_db(),
                      lambda: layout.generated_inputs_dir(value),
                      lambda: ProjectLayout(tmp_path).model_config(value)):
            with pytest.raises(ConfigError, match="model"):
                where()


def test_a_plan_name_leading_out_of_the_build_root_writes_nothing_there(tmp_path):
    """End to end (issue 40's case): `[plans."../../../../pv"]` with plan=../../../../pv was a
    whole variant written outside the build root, and the bundle swap replaced a directory there
    (deleting the user's file in it)."""
    project = copy_project(tmp_path / "p")
    edit(project.root / "configs/models/qwen2-tiny.toml", "[plans.four]",
         '[plans."../../../../pv"]')
    victim = project.root / "pv" / "bundle"
    victim.mkdir(parents=True)
    (victim / "mine.txt").write_text("the user's file")
    before = sorted(os.listdir(tmp_path))
    run = project.doit("bundle", "plan=../../../../pv", check=False)
    assert run.code != 0
    assert "Traceback" not in run.err + run.out
    assert "plan" in run.err and "expected a string matching" in run.err
    assert (victim / "mine.txt").read_text() == "the user's file"
    assert sorted(os.listdir(tmp_path)) == before
    assert sorted(os.listdir(project.root / "pv")) == ["bundle"]
