"""docs/walkthrough.md gives the exact commands (issue 49 item 6): every `python3 -m doit` line
in it names a task dodo.py has, only options that task takes (as its own --help lists them)
and only settings it reads; the bundle paths it names are where the build puts an imported
model's bundle; it links to nothing outside the repository."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

WALKTHROUGH = ROOT / "docs" / "walkthrough.md"


def doit_lines(text: str) -> list:
    """The `python3 -m doit ...` commands of the page's code blocks, as argument lists (a
    trailing comment dropped; `A && B` split)."""
    blocks = re.findall(r"```\n(.*?)```", text, re.S)
    found = []
    for line in (ln for block in blocks for ln in block.splitlines()):
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words[:3] == ["python3", "-m", "doit"]:
                found.append(words[3:])
    return found


def task_help(task: str) -> tuple:
    """(the options, the command-line settings) `doit TASK --help` lists."""
    out = subprocess.run([sys.executable, "-m", "doit", task, "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"doit {task} --help: {out.stdout}{out.stderr}"
    options = set(re.findall(r"^\s+(--[a-z][a-z0-9-]*)", out.stdout, re.M))
    settings = set(re.findall(r"^\s+([a-z_]+)=", out.stdout, re.M))
    return options, settings


def problems(command: list, helps: dict) -> list:
    task, args = command[0], command[1:]
    if task not in helps:
        helps[task] = task_help(task)
    options, settings = helps[task]
    wrong = []
    for arg in args:
        if arg.startswith("--") and arg.split("=")[0] not in options:
            wrong.append(f"doit {task}: no option {arg}")
        elif re.fullmatch(r"[a-z_]+=.*", arg) and arg.split("=")[0] not in settings:
            wrong.append(f"doit {task}: no setting {arg.split('=')[0]}")
    return wrong


@pytest.fixture(scope="module")
def helps() -> dict:
    return {}


def test_every_doit_command_of_the_walkthrough_is_one_the_task_takes(helps):
    commands = doit_lines(WALKTHROUGH.read_text())
    tasks = [c[0] for c in commands]
    assert {"import_export", "bundle", "check_bundle", "deploy", "image"} <= set(tasks)
    assert [p for c in commands for p in problems(c, helps)] == []


def test_a_mistyped_option_or_setting_is_caught(helps):
    """The other direction: the same check refuses what the tasks do not take."""
    assert problems(["import_export", "--dir", "OUT", "--contxt-length", "1024"], helps) == \
        ["doit import_export: no option --contxt-length"]
    assert problems(["bundle", "model=m", "backnd=qairt"], helps) == \
        ["doit bundle: no setting backnd"]


def test_the_bundle_path_it_names_is_an_imported_models(helps):
    """`export` is the plan an imported model's config gets (inputs/import_export.py)."""
    text = WALKTHROUGH.read_text()
    source = (ROOT / "hexbundle" / "inputs" / "import_export.py").read_text()
    plan = re.search(r"'default_plan = \"(\w+)\"'", source).group(1)
    paths = set(re.findall(r"build/qwen3-0\.6b/[\w-]+/([\w<>-]+)/qairt/bundle", text))
    assert paths == {plan}


def test_it_links_to_nothing_outside_the_repository():
    for target in re.findall(r"\]\(([^)\s]+)\)", WALKTHROUGH.read_text()):
        if not re.match(r"[a-z]+:", target):
            path = (WALKTHROUGH.parent / target.split("#")[0]).resolve()
            assert path.exists() and ROOT.resolve() in path.parents, target
