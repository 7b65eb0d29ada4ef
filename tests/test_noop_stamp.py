"""A no-op run's stamp (graph.noopstamp): a second `doit bundle` with nothing changed says so
without resolving the config; anything its up-to-date decision reads, changed, and the run goes
the full way and does what a run without stamps does."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import copy_project

# A run of `doit ARGS` that reports whether it resolved the build (imported config.build).
RESOLVED = """
import runpy, sys
sys.argv = ["doit", *sys.argv[1:]]
try:
    runpy.run_module("doit", run_name="__main__")
except SystemExit as exc:
    code = exc.code or 0
else:
    code = 0
print("RESOLVED" if "hexbundle.config.build" in sys.modules else "REPLAYED", flush=True)
sys.exit(code)
"""


def run(project, *args, env=None) -> tuple:
    """(stdout, how: "RESOLVED" or "REPLAYED") of `doit ARGS` in the project."""
    environ = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-c", RESOLVED, *args], cwd=project.root, text=True,
                          capture_output=True, env=environ, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out, _, how = proc.stdout.rstrip().rpartition("\n")
    return out, how


def set_toml(path, **values):
    text = path.read_text()
    for key, value in values.items():
        text, n = re.subn(rf"^{key} = [^#\n]*", f"{key} = {value} ", text, flags=re.M)
        assert n == 1, key
    path.write_text(text)


def summary(out: str) -> str:
    return out.splitlines()[-1].rsplit(", ", 1)[0]


@pytest.fixture
def stamped(tmp_path):
    """A built project whose `doit bundle` has run once more with nothing to do (the stamp)."""
    project = copy_project(tmp_path / "proj")
    project.doit("bundle")
    out, how = run(project, "bundle")
    assert how == "RESOLVED" and " 0 built," in out
    return project


def test_a_second_no_op_replays_what_the_first_said(stamped):
    first, _ = run(stamped, "bundle")   # (stamps are made after a no-op: now one exists)
    again, how = run(stamped, "bundle")
    assert how == "REPLAYED"
    assert summary(again) == summary(first) and again.splitlines()[:-1] == first.splitlines()[:-1]


@pytest.mark.parametrize("change", ["input", "config", "setting", "environment", "bundle",
                                    "forget", "code"])
def test_anything_the_decision_reads_changed_and_the_run_checks_everything(stamped, change):
    """Each change is one the stamp must see: the run resolves the build again, and does what
    it would without a stamp (rebuilds what the change touches, or nothing)."""
    layout_dir = stamped.build_dir()
    args, env, expect_built = ["bundle"], {}, None
    if change == "input":   # an input's bytes: the steps that read it run again
        data = next((stamped.root / "build" / "qwen2-tiny" / "inputs").glob("*2_of_4.data"))
        with open(data, "r+b") as f:
            first = f.read(1)
            f.seek(0)
            f.write(bytes([first[0] ^ 0xFF]))
        expect_built = True
    elif change == "config":
        set_toml(stamped.root / "configs" / "build.toml", optimization_type="2")
        expect_built = True
    elif change == "setting":
        args.append("optimization_type=2")
        expect_built = True
    elif change == "environment":
        env = {"HEXBUNDLE_NOOP_STAMP_TEST": "1"}
        expect_built = False
    elif change == "bundle":   # a stray file in the bundle: bundle_in_place reruns the bundle
        (layout_dir / "bundle" / "stray.txt").write_text("x")
        expect_built = True
    elif change == "forget":
        stamped.doit("forget", "bundle")
        expect_built = True
    elif change == "code":   # a module of the package the run imports
        path = stamped.root / "hexbundle" / "formats" / "genie.py"
        path.write_text(path.read_text() + "\n# changed\n")
        expect_built = True
    out, how = run(stamped, *args, env=env)
    assert how == "RESOLVED", out
    assert (" 0 built," not in out) == expect_built, out


def test_a_run_with_doit_options_never_replays(stamped):
    run(stamped, "bundle")
    out, how = run(stamped, "bundle", "--explain")
    assert how == "RESOLVED"


def test_a_run_that_may_write_removes_the_stamps_first(stamped):
    """A stamp never outlives a run that changed something: any run that writes takes them
    away before its first task (graph.session.start_guard), and a run that built something
    writes none."""
    stamps = stamped.root / "build" / ".hexbundle" / "noop"
    assert list(stamps.glob("*.json"))
    set_toml(stamped.root / "configs" / "build.toml", optimization_type="2")
    out, how = run(stamped, "bundle")
    assert how == "RESOLVED" and " 0 built," not in out
    assert not list(stamps.glob("*.json"))


def test_a_stamp_of_another_command_or_a_damaged_one_is_not_used(stamped):
    stamps = stamped.root / "build" / ".hexbundle" / "noop"
    (stamp,) = stamps.glob("*.json")
    doc = json.loads(stamp.read_text())
    doc["key"]["argv"] = ["doit", "bundle", "model=other"]
    stamp.write_text(json.dumps(doc))
    assert run(stamped, "bundle")[1] == "RESOLVED"
    stamp = next(stamps.glob("*.json"))
    stamp.write_text("{not json")
    assert run(stamped, "bundle")[1] == "RESOLVED"
    stamp = next(stamps.glob("*.json"))
    doc = json.loads(stamp.read_text())
    del doc["summary"]   # its own command's, every stat the same, but not one `record` wrote
    stamp.write_text(json.dumps(doc))
    out, how = run(stamped, "bundle")
    assert how == "RESOLVED" and " 0 built," in out


def test_the_benchs_stock_doit_baseline_never_replays(stamped):
    """HEXBUNDLE_BENCH_CHECKER=md5 (bench rows 3 and 5): doit's own checker, measured as it
    comes, with no stamp of ours: its second no-op resolves and checks everything again."""
    md5 = {"HEXBUNDLE_BENCH_CHECKER": "md5"}
    run(stamped, "bundle", env=md5)   # its own DB: it may build
    out, how = run(stamped, "bundle", env=md5)
    assert " 0 built," in out and how == "RESOLVED"
    run(stamped, "bundle")   # the md5 runs took the stamps away: ours records again
    assert run(stamped, "bundle")[1] == "REPLAYED"
