"""hexbundle extends doit through doit's own extension points (issue 23), never by patching it.

- the dependency DB: a backend plugin (graph.db.DurableJsonDB, pyproject.toml's
  [tool.doit.plugins.backend]) chosen by DOIT_CONFIG's `backend`;
- the checkers: FileChangedChecker subclasses passed as `check_file_uptodate` (graph.checker);
- the commands: command plugins (graph.commands, graph.dumpdb), the reporter: `reporter`.

The scan below fails on any assignment to an attribute of something imported from doit (the way
doit was monkeypatched before: JsonDB.dump, Dependency.close, dependency.get_file_md5). The other
tests pin the doit behaviour those extension points rely on, so a doit upgrade that changes it
fails here, not in a user's build.
"""
import ast
import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from doit import dependency
from doit.cmd_base import DoitCmdBase
from doit.dependency import Dependency, JSONCodec, JsonDB, MD5Checker

from hexbundle.graph import db as durable
from hexbundle.graph.checker import TracedMD5Checker, comparison_checker
from hexbundle.graph.db import BACKEND, DbSaveError, DurableJsonDB
from hexbundle.support.hashing import TRACE_ENV

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hexbundle"
# Modules allowed to assign to an attribute of doit's (module: why). None is: every extension
# is one of doit's plugin points or a subclass. A patch that has to come back goes here, alone,
# with a test below pinning the doit behaviour it depends on.
PATCH_MODULES: dict = {}


# ---------------------------------------------------------------------------------------------
# no monkeypatching of doit

def doit_names(tree: ast.AST) -> set:
    """The names a module binds to doit's modules, classes or functions (import doit,
    from doit.x import y [as z])."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name == "doit" or a.name.startswith("doit.")}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                (node.module == "doit" or node.module.startswith("doit.")):
            names |= {a.asname or a.name for a in node.names}
    return names


def base_name(node):
    """`a` of a.b.c, a.b[0].c; None if it does not start with a name."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def doit_patches(source: str, filename: str = "<source>") -> list:
    """(line, what) for each assignment to an attribute of a doit name, setattr() on one included
    (`JsonDB.dump = f`, `dependency.get_file_md5 = f`, `setattr(Globals, "x", y)`)."""
    tree = ast.parse(source, filename)
    names = doit_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("setattr", "delattr") and node.args
              and base_name(node.args[0]) in names):
            found.append((node.lineno, f"{node.func.id}({ast.unparse(node.args[0])}, ...)"))
        flat = []
        for target in targets:
            flat += target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        for target in flat:
            if isinstance(target, ast.Attribute) and base_name(target) in names:
                found.append((node.lineno, ast.unparse(target)))
    return found


@pytest.mark.parametrize("source,expected", [
    ("from doit.dependency import JsonDB\nJsonDB.dump = f\n", ["JsonDB.dump"]),
    ("def f():\n    from doit.dependency import Dependency\n    Dependency.close = g\n",
     ["Dependency.close"]),
    ("from doit import dependency\ndependency.get_file_md5 = f\n",
     ["dependency.get_file_md5"]),
    ("import doit.dependency\ndoit.dependency.get_file_md5 = f\n",
     ["doit.dependency.get_file_md5"]),
    ("from doit.globals import Globals as G\nsetattr(G, 'dep_manager', x)\n",
     ["setattr(G, ...)"]),
    ("from doit.dependency import JsonDB\nJsonDB.dump, x = f, 1\n", ["JsonDB.dump"]),
    # not patches: a subclass's own attribute, one of our objects, a local of the same name
    ("from doit.dependency import JsonDB\nclass D(JsonDB):\n    dump = f\n", []),
    ("from doit.dependency import JsonDB\nd = D()\nd.dump = f\n", []),
    ("import json\njson.x = 1\n", []),
], ids=range(9))
def test_the_scan_finds_patches_of_doit(source, expected):
    assert [what for _, what in doit_patches(source)] == expected


def test_nothing_in_hexbundle_patches_doit():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in PATCH_MODULES:
            continue
        found += [f"{rel}:{line} assigns {what}" for line, what in
                  doit_patches(path.read_text(), str(path))]
    assert not found, ("extend doit through its plugin points (pyproject.toml "
                       "[tool.doit.plugins.*], DOIT_CONFIG) or a subclass, not by assigning to "
                       "its attributes:\n" + "\n".join(found))


def test_dodo_patches_nothing_of_doit():
    assert doit_patches((ROOT / "dodo.py").read_text()) == []


# ---------------------------------------------------------------------------------------------
# the DB backend: registered, selected, what doit calls

def test_pyproject_registers_the_backend_doit_config_selects():
    doit_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["doit"]
    assert doit_cfg["plugins"]["backend"] == {BACKEND: "hexbundle.graph.db:DurableJsonDB"}


def test_doit_finds_the_backend_plugin_in_pyproject(monkeypatch):
    """doit 0.37 reads pyproject.toml where it is started and makes each command's backends
    from its [tool.doit.plugins.backend] (DoitMain, DoitCmdBase.get_backends)."""
    from doit.cmd_base import get_loader
    from doit.doit_cmd import DoitMain
    monkeypatch.chdir(ROOT)
    main = DoitMain()
    cmds = main.get_cmds()
    run = cmds.get_plugin("run")(task_loader=get_loader(main.config, None, cmds),
                                 config=main.config, bin_name="doit", cmds=cmds)
    assert isinstance(run, DoitCmdBase)
    assert run._backends[BACKEND] is DurableJsonDB
    assert run._backends["json"] is JsonDB       # doit's own, for the read-only commands elsewhere


def test_the_backend_reads_and_writes_doits_json_format(tmp_path):
    path = tmp_path / "db.json"
    ours = DurableJsonDB(str(path), codec=JSONCodec())
    ours.set("t", "_values_:", {"a": 1})
    ours.set("t", "deps:", ["f"])
    ours.save()
    assert JsonDB(str(path), codec=JSONCodec())._db == ours._db == json.loads(path.read_text())
    assert DurableJsonDB(str(path), codec=JSONCodec())._db == ours._db


def test_dependency_close_saves_through_the_backends_dump(tmp_path, monkeypatch, capsys):
    """doit's last save is Dependency.close -> backend.dump (once): ours is atomic, and a full
    disk there ends the run with one message and exit code 3."""
    path = tmp_path / "db.json"
    manager = Dependency(DurableJsonDB, str(path))
    assert isinstance(manager.backend, DurableJsonDB)
    manager.backend.set("t", "k", 1)
    manager.close()
    assert json.loads(path.read_text()) == {"t": {"k": 1}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.json"]

    monkeypatch.setattr(durable, "_reported_db_failure", False)
    manager = Dependency(DurableJsonDB, str(path))
    manager.backend.set("t", "k", 2)

    def full(path, encode):
        raise DbSaveError(f"cannot save the dependency DB {path} (test)")
    monkeypatch.setattr(durable, "save_file", full)
    with pytest.raises(SystemExit) as stop:
        manager.close()
    assert stop.value.code == 3
    assert capsys.readouterr().err == f"hexbundle: cannot save the dependency DB {path} (test)\n"
    assert json.loads(path.read_text()) == {"t": {"k": 1}}


def test_a_save_of_what_the_db_holds_writes_nothing(tmp_path, monkeypatch):
    """A no-op run (and the final save after the last task's) writes no DB: same bytes, same
    file. A changed record, or a file changed since it was read, is written as ever."""
    path = tmp_path / "db.json"
    first = DurableJsonDB(str(path), codec=JSONCodec())
    first.set("t", "k", 1)
    first.save()
    writes = []
    real_atomic_output = durable.atomic_output   # the one way the DB file is written
    monkeypatch.setattr(durable, "atomic_output", lambda p, *a, **k: (
        writes.append(p), real_atomic_output(p, *a, **k))[1])
    db = DurableJsonDB(str(path), codec=JSONCodec())
    before = os.stat(path)
    db.save()
    db.dump()
    assert writes == [] and os.stat(path).st_ino == before.st_ino   # untouched
    db.set("t", "k", 2)
    db.save()
    assert len(writes) == 1 and json.loads(path.read_text()) == {"t": {"k": 2}}
    db.save()
    assert len(writes) == 1   # what it just wrote: nothing again
    path.write_text(json.dumps({"t": {"k": 3}}))   # changed under it: its own records go back
    db.save()
    assert len(writes) == 2 and json.loads(path.read_text()) == {"t": {"k": 2}}


def test_save_progress_saves_the_db_doit_opened_last(tmp_path):
    first = DurableJsonDB(str(tmp_path / "a.json"), codec=JSONCodec())
    second = DurableJsonDB(str(tmp_path / "b.json"), codec=JSONCodec())
    first.set("t", "k", 1)
    second.set("t", "k", 2)
    durable.save_progress()
    assert not (tmp_path / "a.json").exists()
    assert json.loads((tmp_path / "b.json").read_text()) == {"t": {"k": 2}}


def test_a_variants_save_writes_the_models_records_back_when_they_change(tmp_path):
    variant, model = tmp_path / "v" / "doit-db.json", tmp_path / "doit-db.json"
    variant.parent.mkdir()
    durable.pair_with_model(variant, model, {})
    db = DurableJsonDB(str(variant), codec=JSONCodec())
    db.set("convert:a", "k", 1)
    db.save()
    assert not model.exists()   # no model step's record changed
    db.set("inputs:g", "k", 2)
    db.save()
    assert json.loads(model.read_text()) == {"inputs:g": {"k": 2}}
    assert json.loads(variant.read_text()) == {"convert:a": {"k": 1}, "inputs:g": {"k": 2}}


# A real doit, started where a pyproject.toml registers the backend as the project's does: task
# `a` succeeds, task `b` kills doit (SIGKILL, no clean-up). `a`'s record must be in the DB, whole:
# doit chose the plugin by name, our reporter saved after `a`, and the save is temp + rename.
DODO = '''
import os, signal
from hexbundle.graph.reporter import Reporter
DOIT_CONFIG = {"backend": %r, "dep_file": "db.json", "reporter": Reporter, "verbosity": 2}

def task_a():
    return {"actions": [lambda: print("a ran")], "file_dep": ["in.txt"], "targets": []}

def task_b():
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    return {"actions": [die], "task_dep": ["a"]}
'''


def tiny_project(path: Path) -> Path:
    path.mkdir()
    plugins = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["doit"]["plugins"]
    backend = "\n".join(f'{k} = "{v}"' for k, v in plugins["backend"].items())
    (path / "pyproject.toml").write_text(f"[tool.doit.plugins.backend]\n{backend}\n")
    (path / "dodo.py").write_text(DODO % BACKEND)
    (path / "in.txt").write_text("x")
    return path


def run_doit(cwd: Path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_killed_doit_run_keeps_the_record_of_each_finished_task(tmp_path):
    root = tiny_project(tmp_path / "p")
    proc = run_doit(root, "b")
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert "a ran" in proc.stdout
    records = json.loads((root / "db.json").read_text())
    assert set(records) == {"a"}, records
    assert records["a"]["deps:"] == ["in.txt"] and "in.txt" in records["a"]
    assert sorted(p.name for p in root.iterdir() if p.name != "__pycache__") == \
        ["db.json", "dodo.py", "in.txt", "pyproject.toml"]   # no temp file left beside it
    again = run_doit(root, "a")
    # up to date from the kept record: it does not run again (the reporter says nothing of it)
    assert again.returncode == 0 and "a ran" not in again.stdout, again.stdout + again.stderr


def test_without_the_registration_doit_does_not_know_the_backend(tmp_path):
    """Why session.doit_config selects doit's `json` outside the project directory (and why
    commands that write are refused there): the name is unknown to a doit that did not read our
    pyproject.toml, and doit 0.37 then fails with a traceback."""
    root = tiny_project(tmp_path / "p")
    (root / "pyproject.toml").unlink()
    proc = run_doit(root, "a")
    assert proc.returncode != 0
    assert not (root / "db.json").exists()


# ---------------------------------------------------------------------------------------------
# the bench's MD5 trace: a subclass of doit's MD5Checker

def test_the_comparison_checker_is_doits_md5_checker_subclassed():
    checker, _ = comparison_checker("md5")
    assert checker is TracedMD5Checker and issubclass(checker, MD5Checker)
    assert TracedMD5Checker.__mro__[1] is MD5Checker


def test_the_md5_trace_names_exactly_the_files_doit_hashes(tmp_path, monkeypatch):
    """The trace mirrors MD5Checker's own conditions for hashing (doit 0.37): it must list each
    call of doit's get_file_md5, no more, no fewer. Counted here by wrapping get_file_md5 for the
    test only."""
    calls = []
    real = dependency.get_file_md5
    monkeypatch.setattr(dependency, "get_file_md5", lambda p: calls.append(os.path.abspath(p))
                        or real(p))
    trace = tmp_path / "trace.txt"
    monkeypatch.setenv(TRACE_ENV, str(trace))
    checker = TracedMD5Checker()
    path = tmp_path / "f.bin"
    path.write_bytes(b"1234" * 100)
    name = str(path)

    state = checker.get_state(name, None)                       # hashes
    assert checker.get_state(name, state) is None               # same mtime: no hash
    assert checker.check_modified(name, os.stat(path), state) is False   # same mtime
    os.utime(path, ns=(10**9, 10**9))
    assert checker.check_modified(name, os.stat(path), state) is False   # touched: hashes
    path.write_bytes(b"4321" * 100)
    os.utime(path, ns=(2 * 10**9, 2 * 10**9))
    assert checker.check_modified(name, os.stat(path), state) is True    # same size: hashes
    path.write_bytes(b"1234" * 101)
    assert checker.check_modified(name, os.stat(path), state) is True    # size: no hash
    state = checker.get_state(name, state)                      # new mtime: hashes
    assert state is not None and state[2] == real(name)

    traced = trace.read_text().split()
    assert calls == traced == [os.path.abspath(name)] * 4
    assert MD5Checker().check_modified(name, os.stat(path), state) is \
        checker.check_modified(name, os.stat(path), state)


# ---------------------------------------------------------------------------------------------
# which command doit runs (session.command_name: the refusal outside the project)

@pytest.mark.parametrize("argv,command,writes", [
    ([], "", True),                                   # doit alone: run the default tasks
    (["bundle"], "bundle", True),
    (["list"], "list", False),
    (["-k", "list"], "list", False),                  # dodo-finding options may come first
    (["--seek-file", "list", "--all"], "list", False),
    (["-f", "dodo.py", "--dir", ".", "bundle"], "bundle", True),
    (["--file=dodo.py", "-kd", ".", "info", "bundle"], "info", False),
    (["model=x", "list"], "list", False),             # variables are not the command
    (["-v", "2", "list"], "-v", True),                # doit then takes `run`: so do we
    (["--version"], "--version", False),
    (["bundle", "--dry-run"], "bundle", False),
    (["bundle", "--explain"], "bundle", True),        # it builds: the lock, the DB
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_the_command_is_the_one_doit_takes(argv, command, writes):
    from hexbundle.graph import session
    assert session.command_name(["doit", *argv]) == command
    assert session.command_writes(["doit", *argv]) is writes


@pytest.mark.parametrize("argv", [["-k", "list"], ["-f", "dodo.py", "list"], ["model=x", "list"],
                                  ["-v", "2", "list"]], ids=" ".join)
def test_doit_itself_takes_the_same_command(argv):
    """doit 0.37's own parsing (DoitMain.run: the loader's options first, then the variables),
    as session.command_name mirrors it."""
    from doit.cmd_base import get_loader
    from doit.cmdparse import CmdOption, CmdParse, CmdParseError
    from doit.doit_cmd import DoitMain
    from hexbundle.graph import session
    main = DoitMain(config_filenames=())
    cmds = main.get_cmds()
    loader = get_loader(main.config, None, cmds)
    try:
        _, args = CmdParse([CmdOption(o) for o in loader.cmd_options]).parse_only(argv)
    except CmdParseError:
        args = argv
    args = main.process_args(args)
    doit_takes = args[0] if args and args[0] in cmds else "run"
    ours = session.command_name(["doit", *argv])
    assert doit_takes == (ours if ours in cmds else "run")
