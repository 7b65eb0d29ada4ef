"""doit's own conventions, kept: --help on a task, `doit help TASK`, `doit list`, -v 0, -r json,
a dry run, "did you mean" on every name a user types, a run from a subdirectory.

Each through a real `python -m doit` on a copy of the project, with its pyproject.toml (where
hexbundle's run and help commands are registered, as in a checkout). One small build
(qwen2-tiny, `-r json`) is shared by the tests that need one.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import copy_project
from hexbundle.config.build import settable_keys


def with_commands(dest):
    """A project copy; its pyproject.toml registers the commands (conftest copies it)."""
    proj = copy_project(dest)
    assert (proj.root / "pyproject.toml").is_file()
    return proj


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Nothing built: help, list, typos and dry runs (none of them writes)."""
    return with_commands(tmp_path_factory.mktemp("cli") / "proj")


@pytest.fixture(scope="module")
def built_json(tmp_path_factory):
    """qwen2-tiny built once, with `-r json`."""
    proj = with_commands(tmp_path_factory.mktemp("cli-built") / "proj")
    proj.first_run = proj.doit("-r", "json")
    return proj


def one_line_error(run, *needles):
    assert run.code != 0, run.out
    assert "Traceback" not in run.err + run.out
    lines = [line for line in run.err.splitlines() if line.strip()]
    assert len(lines) == 1, run.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_help_flag_after_a_task_shows_its_help_and_settings(fresh):
    run = fresh.doit("bundle", "--help")
    assert run.out.startswith("bundle  Check sizes"), run.out
    for key in settable_keys():   # load_build's own keys, every one
        assert re.search(rf"^  {re.escape(key)}=", run.out, re.M), key
    assert "model=qwen2-tiny" in run.out and "device=iq9075" in run.out   # build.toml's values
    assert "weights_packing=true" in run.out and "container.memory=32g" in run.out
    assert not (fresh.root / "build" / ".hexbundle" / "lock").exists()   # nothing run


def test_help_flag_alone_is_the_default_tasks_help(fresh):
    assert fresh.doit("-h").out.startswith("bundle  Check sizes")


def test_help_task_gives_the_whole_description_and_the_settings(fresh):
    run = fresh.doit("help", "gen_inputs")
    assert "The same files as scripts/gen_7b_inputs.py" in run.out   # past the first line
    assert "--part" in run.out
    for key in settable_keys():
        assert f"\n  {key}=" in run.out, key
    wheelhouse = fresh.doit("help", "wheelhouse").out
    assert "none (this task does not read configs/build.toml)" in wheelhouse


def test_list_shows_whole_sentences(fresh):
    lines = fresh.doit("list").out.splitlines()
    assert len(lines) >= 15
    for line in lines:
        name, doc = line.split(None, 1)
        assert doc.rstrip().endswith("."), line   # doit shows a docstring's first line only


@pytest.mark.parametrize("args,needles", [
    (("bundel",), ("'bundel'", "did you mean 'bundle'?")),
    (("help", "bundel"), ("'bundel'", "did you mean 'bundle'?")),
    (("bundle", "modle=qwen2-tiny"), ("'modle'", "did you mean 'model'?")),
    (("bundle", "model=qwen2-tinny"), ("'qwen2-tinny'", "did you mean 'qwen2-tiny'?")),
    (("--dryrun",), ("--dryrun", "did you mean '--dry-run'?")),   # not doit's CmdOption(...) dump
    (("bundle", "--dryrun"), ("--dryrun", "did you mean '--dry-run'?")),
    # doit run's own options are parsed before a task's: only after a task name is the option
    # said to be possibly a task's
    (("--bogus", "bundle"), ("option --bogus is not an option of doit run;",)),
    (("bundle", "--bogus"), ("option --bogus is not an option of doit run or of the tasks named",)),
    (("bundle", "device=iq9076"), ("command line: device = 'iq9076': unknown device 'iq9076'",)),
])
def test_a_mistyped_name_gets_the_nearest_in_one_line(fresh, args, needles):
    one_line_error(fresh.doit(*args, check=False), *needles)


@pytest.mark.parametrize("args,needles", [
    (("import_export", "--name", ""), ("an empty argument after --name", "--name VALUE")),
    (("import_export", "--dir", "", "--name", "x"), ("an empty argument after --dir",)),
    (("bundle", ""), ("an empty argument",)),
])
def test_an_empty_argument_is_named_not_a_traceback(fresh, args, needles):
    """doit 0.37 indexes arg[0] of every argument (IndexError); hexbundle.graph.loader refuses
    an empty one first (issue 26 item 7)."""
    run = fresh.doit(*args, check=False)
    assert run.code == 3, run.out + run.err
    one_line_error(run, *needles)


def test_dry_run_says_what_would_run_and_writes_nothing(tmp_path):
    fresh = with_commands(tmp_path / "proj")   # its own: a mistyped task takes the build lock
    for args in (("bundle", "--dry-run"), ("--dry-run",)):
        run = fresh.doit(*args)
        assert "CmdOption" not in run.out + run.err
        assert run.out.startswith("dry run: 18 of 18 task(s) would run"), run.out
        assert re.search(r"^\.   inputs:tokenizer  \(target missing: ", run.out, re.M), run.out
        assert re.search(r"^\.   bundle  \(after ", run.out, re.M), run.out
    assert not list((fresh.root / "build").rglob("doit-db.json"))
    assert not list((fresh.root / "build").rglob("*.bin"))
    assert not (fresh.root / "build" / ".hexbundle" / "lock").exists()


def test_json_reporter_output_is_json(built_json):
    run = built_json.first_run
    report = json.loads(run.out)   # stdout is exactly the JSON
    assert len(report["tasks"]) == 18
    assert {t["result"] for t in report["tasks"]} == {"success"}
    assert "  ok bundle" in run.err   # hexbundle's progress went to stderr


def test_dry_run_reads_the_command_line_settings(built_json):
    run = built_json.doit("--dry-run")
    assert run.out.startswith("dry run: 0 of 18"), run.out
    run = built_json.doit("bundle", "--dry-run", "weights_packing=false")
    assert re.search(r"^\.   compile:part_1_of_4  \(", run.out, re.M), run.out
    assert re.search(r"^--  convert:part_1_of_4_prompt$", run.out, re.M), run.out


def test_verbosity_0_shows_only_doits_task_lines_and_the_summary(built_json):
    bins = built_json.build_dir() / "bin"
    next(bins.glob("*part_2_of_4.bin")).unlink()
    run = built_json.doit("-v", "0")
    *tasks, summary = run.out.splitlines()
    assert {"compile:part_2_of_4", "bundle"} == run.executed, run.out
    for line in tasks:   # a line a step that ran: no banner, progress, size table
        assert re.match(r"^\[\d+/\d+\] \S+ \[reference/local\] [\d.]+s$", line), run.out
    assert summary.startswith("hexbundle: bundle build/qwen2-tiny/"), run.out   # the one last line
    assert run.err == ""


@pytest.mark.parametrize("flag", ["--dry-run", "--explain"])
def test_a_hexbundle_flag_from_a_subdirectory_says_where_to_run(fresh, flag):
    proc = subprocess.run([sys.executable, "-m", "doit", "bundle", flag],
                          cwd=fresh.root / "configs", capture_output=True, text=True,
                          env={**os.environ, "DOIT_SEEK_FILE": "1"}, timeout=300)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert f"{flag} is hexbundle's" in proc.stderr and f"run it from {fresh.root}" in \
        proc.stderr, proc.stderr


def from_subdirectory(project, *args, seek_env=True):
    env = {**os.environ, "DOIT_SEEK_FILE": "1"} if seek_env else dict(os.environ)
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=project.root / "configs",
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("args", [("bundle",), ("-k", "inputs"), ("forget", "-k", "bundle")],
                         ids=" ".join)
def test_a_build_from_a_subdirectory_says_where_to_run(fresh, args):
    """hexbundle's dependency DB is a doit backend registered in pyproject.toml (graph.db), which
    doit reads only where it is started: a command that would write the DB is refused there,
    before anything is written."""
    proc = from_subdirectory(fresh, *args, seek_env=args[0] == "bundle")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "did not read pyproject.toml" in proc.stderr
    assert proc.stderr.rstrip().endswith(f"run it from {fresh.root}"), proc.stderr
    assert not (fresh.root / "build" / ".hexbundle" / "db").exists()


@pytest.mark.parametrize("args", [("list",), ("-k", "list"), ("info", "-k", "bundle")],
                         ids=" ".join)
def test_reading_commands_work_from_a_subdirectory(fresh, args):
    proc = from_subdirectory(fresh, *args, seek_env="-k" not in args)
    # doit info's exit code says whether the task is up to date (1: it is not)
    assert proc.returncode == (1 if args[0] == "info" else 0), proc.stdout + proc.stderr
    assert proc.stderr == "" and "bundle" in proc.stdout, proc.stdout + proc.stderr


# An option's value is never a setting, whatever it holds (issue 47, kind 6): doit splits
# `key=value` settings from the command line before any option is parsed; hexbundle's split
# (graph.session.split_settings, installed by graph.loader) skips an option's value.
@pytest.mark.parametrize("argv, rest, settings", [
    (["deploy", "--run", "what is x=1+1"], ["deploy", "--run", "what is x=1+1"], {}),
    (["deploy", "--to", "ssh://b/x=1", "backend=qairt"], ["deploy", "--to", "ssh://b/x=1"],
     {"backend": "qairt"}),
    (["import_export", "--dir", "a=b", "--name", "n=m"],
     ["import_export", "--dir", "a=b", "--name", "n=m"], {}),
    (["deploy", "--no-push", "backend=qairt"], ["deploy", "--no-push"], {"backend": "qairt"}),
    (["bench", "--small", "model=x"], ["bench", "--small"], {"model": "x"}),
    (["-n", "2", "bundle", "model=x"], ["-n", "2", "bundle"], {"model": "x"}),
    (["--dry-run", "model=x"], ["--dry-run"], {"model": "x"}),
    (["deploy", "--run=a=b", "model=x"], ["deploy", "--run=a=b"], {"model": "x"}),
    (["model=x", "bundle", "device=y"], ["bundle"], {"model": "x", "device": "y"}),
])
def test_split_settings_leaves_an_options_value_alone(argv, rest, settings):
    from doit.doit_cmd import DoitMain
    from hexbundle.graph.session import command_line_overrides, split_settings, \
        with_option_values
    assert split_settings(argv) == (rest, settings)
    assert command_line_overrides(argv) == settings
    # what doit hands the run command (its own split), given back its options' values
    doits = DoitMain().process_args(list(argv))      # no command named: all go to `run`
    assert with_option_values(doits, argv) == rest


def test_every_flag_task_option_is_known_to_take_no_value():
    """The argument after a task's boolean option is not its value: every boolean param that
    dodo.py declares (and its inverse) must be in graph.session.TASK_FLAGS."""
    import ast
    from pathlib import Path
    from hexbundle.graph.session import TASK_FLAGS
    dodo = Path(__file__).resolve().parent.parent / "dodo.py"
    flags = set()
    for node in ast.walk(ast.parse(dodo.read_text())):
        if isinstance(node, ast.Dict):
            items = {k.value: v for k, v in zip(node.keys, node.values)
                     if isinstance(k, ast.Constant)}
            if getattr(items.get("type"), "id", None) == "bool":
                flags.update(f"--{items[k].value}" for k in ("long", "inverse") if k in items)
    assert flags and flags <= TASK_FLAGS, sorted(flags - TASK_FLAGS)


@pytest.mark.parametrize("args, named", [
    (("import_export", "--dir", "/nonexistent/a=b", "--name", "x"), "/nonexistent/a=b"),
    (("deploy", "--to", "ssh://board/x=1", "--path", "/nonexistent/p=q"), "/nonexistent/p=q"),
])
def test_an_option_value_holding_an_equals_sign_reaches_the_option(fresh, args, named):
    run = fresh.doit(*args, check=False)
    text = run.out + run.err
    assert run.code != 0 and "Traceback" not in text
    assert "unknown setting" not in text and named in text, text


@pytest.mark.parametrize("argv, doits, expect", [
    (["run", "deploy", "--run", "x=1"], ["deploy", "--run"], ["deploy", "--run", "x=1"]),
    (["-f", "dodo.py", "deploy", "--to", "ssh://b/a=b", "model=m"], ["deploy", "--to"],
     ["deploy", "--to", "ssh://b/a=b"]),
    (["deploy", "--run", "a=b", "--run", "a=b"], ["deploy", "--run", "--run"],
     ["deploy", "--run", "a=b", "--run", "a=b"]),
])
def test_with_option_values_after_a_command_name_or_loader_options(argv, doits, expect):
    from hexbundle.graph.session import with_option_values
    assert with_option_values(doits, argv) == expect
