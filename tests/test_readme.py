"""The README's quick start is true: each command it shows runs, in the order shown, on a copy of
the project; its install and test commands are the ones .ci/run runs (in a fresh venv)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

from conftest import ROOT, copy_project


def quick_start_commands() -> list:
    """Every command line in the README's "Quick start" code blocks, comments dropped."""
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quick start\n(.*?)^## ", readme, re.S | re.M).group(1)
    lines = [line.split("  #")[0].strip()
             for block in re.findall(r"^```\n(.*?)^```", section, re.S | re.M)
             for line in block.splitlines()]
    return [line for line in lines if line]


def test_the_quick_starts_install_and_test_commands_are_what_ci_runs():
    commands = quick_start_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    install = next(c for c in commands if " pip install " in c)
    assert install == "python3 -m pip install -e '.[test]'"
    assert "python3 -m venv" in ci and "python3 -m pip install --quiet -e '.[test]'" in ci
    assert "python3 -m pytest -q --full" in commands
    assert re.search(r"^python3 -m pytest -q --full$", ci, re.M)


def test_every_doit_command_of_the_quick_start_runs(tmp_path):
    project = copy_project(tmp_path / "proj")
    doit = [c for c in quick_start_commands() if c.startswith("python3 -m doit")]
    assert len(doit) >= 5, doit
    for command in doit:
        args = shlex.split(command)[1:]
        proc = subprocess.run([sys.executable, *args], cwd=project.root, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stdout + proc.stderr, command
    assert (project.root / "build" / "qwen2-tiny" / "iq9075" / "four" / "reference" / "bundle"
            / "genie_config.json").is_file()
