"""The test suite judges the project, not the machine it runs on: every module it imports is
declared in pyproject.toml (so the README's install in a fresh venv can run it), and a user's own
files in the checkout (an imported model, an edited build.toml) change nothing it sees."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from conftest import ROOT, copy_project

LOCAL = {"hexbundle", "conftest", "real_qairt", "hostile_reapi", "standin_runtime",
         "real_runtime"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions() -> set:
    """The project's dependencies and its [test] extra, by normalised distribution name."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    specs = project["dependencies"] + project["optional-dependencies"]["test"]
    return {_normal(re.match(r"[A-Za-z0-9_.\-]+", spec).group(0)) for spec in specs}


def imported_modules(path: Path) -> set:
    """Top-level names of every module `path` imports (at any depth in the file; strings that
    hold code for another interpreter are not parsed)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_module_the_tests_import_is_declared():
    dists = packages_distributions()
    declared = declared_distributions()
    missing = {}
    for path in sorted((ROOT / "tests").glob("*.py")):
        for module in imported_modules(path) - LOCAL - set(sys.stdlib_module_names):
            if module.startswith("test_"):
                continue
            owners = {_normal(d) for d in dists.get(module, [])}
            if not owners & declared:
                missing.setdefault(module, []).append(path.name)
    assert not missing, (f"imported by tests but not declared in pyproject.toml's dependencies "
                         f"or [test] extra: {missing}")


def test_the_pytest_plugins_the_configuration_asks_for_are_declared():
    with open(ROOT / "pyproject.toml", "rb") as fh:
        addopts = tomllib.load(fh)["tool"]["pytest"]["ini_options"].get("addopts", "")
    if re.search(r"(^|\s)(-n|--numprocesses|--dist)\b", addopts):
        assert "pytest-xdist" in declared_distributions()


def test_the_suite_ignores_a_users_own_models(tmp_path):
    """In a checkout where the user imported a model (configs/models/mine.toml, untracked, as
    `doit import_export` writes it), the tests still see only the shipped models: the
    parametrisations over every model, and the project copies end-to-end tests build in."""
    proj = copy_project(tmp_path / "checkout", ("dodo.py", "configs", "hexbundle", ".gitignore",
                                                "pyproject.toml"))
    (proj.root / "tests").mkdir()
    for name in ("conftest.py", "real_qairt.py", "test_devices.py"):
        shutil.copy(ROOT / "tests" / name, proj.root / "tests" / name)
    git = ["git", "-C", str(proj.root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    models = proj.root / "configs" / "models"
    (models / "mine.toml").write_text((models / "qwen2-tiny.toml").read_text()
                                      .replace('name = "qwen2-tiny"', 'name = "mine"'))
    probe = proj.root / "tests" / "test_probe.py"
    probe.write_text("from conftest import copy_project\n\n"
                     "def test_copy_has_no_user_model(tmp_path):\n"
                     "    copy = copy_project(tmp_path / 'p')\n"
                     "    assert not (copy.root / 'configs' / 'models' / 'mine.toml').exists()\n"
                     "    assert (copy.root / 'configs' / 'models' / 'qwen2-tiny.toml').exists()\n")

    def pytest(*args):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-o", "addopts=", *args], cwd=proj.root, capture_output=True,
                              text=True, timeout=300)

    listed = pytest("--collect-only", "tests/test_devices.py")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "qwen2-tiny" in listed.stdout and "mine" not in listed.stdout
    run = pytest("tests/test_probe.py")
    assert run.returncode == 0, run.stdout + run.stderr
