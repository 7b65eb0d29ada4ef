"""Writes outside the build root by a dependency (issue 40, kind 10): `doit verify` runs
onnxruntime, whose telemetry wrote ~/.cache/Microsoft/DeveloperTools/.onnxruntime/deviceid and
$TMPDIR/.ses on every run. A real `doit verify` with HOME and TMPDIR pointed at empty
directories leaves them empty."""
import os

import pytest

from conftest import copy_project


@pytest.mark.heavy   # measured ~24 s: a bundle and a verify (the full suite, `pytest --full`)
def test_verify_leaves_home_and_tmpdir_as_they_were(tmp_path):
    project = copy_project(tmp_path / "p")
    project.doit("bundle")
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    env.update(HOME=str(home), TMPDIR=str(tmp))
    project.doit("verify", env=env)
    left = sorted(str(p.relative_to(tmp_path)) for d in (home, tmp) for p in d.rglob("*"))
    assert left == []
