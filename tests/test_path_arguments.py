"""Issue 36: every path a user names on the command line, in every shape it can wrongly take.

One table: each command-line path argument of each task (ARGUMENTS; `test_the_table_names_every
path_argument_of_every_task` reads dodo.py's tasks, so an argument added later must join it) x
each shape (SHAPES): a symbolic link out of the tree, a dangling one, a FIFO, /dev/zero, the other
kind (a directory where a file belongs, a file where a directory does), a name too long, an
unreadable file, an empty one, a huge (sparse) one. Each through a real `doit` run, with the same
verdict: a clear error naming the argument (its option, or the path for a positional one),
non-zero exit, no traceback, no hang (a timeout), nothing written outside the build root.

Unreadable: the tests run as root in CI and here, and root reads a chmod 000 file; that shape is
skipped when the process is root (it says so), and checked otherwise.

The whole table is long (one doit run per cell, ~80): the fast tier runs FAST, which has every
argument and every shape at least once; the rest is marked heavy (`pytest --full`).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, copy_project, tree_digests

EXPORT = ROOT / "tests" / "data" / "qaihm" / "export-llama32"
MODEL_CONFIG = ROOT / "tests" / "data" / "qaihm" / "config-llama32.json"
TIMEOUT_S = 120   # a hang's bound (the runs here take seconds), not a timing

# argument -> (task, the option or None (positional), what it names: file | dir | name,
#              the other arguments, valid, that the run needs to reach it)
ARGUMENTS = {
    "import_export --dir": ("import_export", "--dir", "dir", ["--name", "x-import"]),
    "import_export --model-config": ("import_export", "--model-config", "file",
                                     ["--dir", str(EXPORT), "--name", "x-import"]),
    "import_export --tokenizer": ("import_export", "--tokenizer", "file",
                                  ["--dir", str(EXPORT), "--name", "x-import",
                                   "--model-config", str(MODEL_CONFIG)]),
    "import_export --name": ("import_export", "--name", "name", ["--dir", str(EXPORT)]),
    "inspect --path": ("inspect", "--path", "file", []),
    "inspect --model-config": ("inspect", "--model-config", "file", ["--path", str(EXPORT)]),
    "check_bundle --path": ("check_bundle", "--path", "dir", []),
    "check_bundle --model-config": ("check_bundle", "--model-config", "file",
                                    ["--path", "BUNDLE"]),
    "verify_release ARCHIVE": ("verify_release", None, "file", []),
    "load_kit KIT": ("load_kit", None, "file", []),
    "deploy --path": ("deploy", "--path", "dir", ["--to", "ssh://nobody@127.0.0.1:1/x"]),
    "deploy --ssh-config": ("deploy", "--ssh-config", "file",
                            ["--to", "ssh://nobody@127.0.0.1:1/x", "--path", "BUNDLE"]),
}
# the arguments of dodo.py's tasks that name no path (tested elsewhere: config/build's ranges)
NOT_PATHS = {("import_export", "plan"), ("import_export", "rope_theta"), ("image", "base"),
             ("import_export", "context_length"), ("import_export", "model_id"),
             ("image", "network"), ("gen_inputs", "part"), ("bench", "small"),
             ("bench", "keep"), ("bench", "rows"), ("load_kit", "expect_sha256"),
             ("deploy", "to"), ("deploy", "run"), ("deploy", "push_first"),
             ("deploy", "timeout")}

SHAPES = ("symlink out of the tree", "dangling symlink", "FIFO", "/dev/zero", "the other kind",
          "name too long", "unreadable", "empty", "huge")
# for --name, a name, not a path: the shapes that apply to it
NAME_SHAPES = {"name too long": "a" * 300, "symlink out of the tree": "../../etc/passwd"}

FAST = {("import_export --model-config", "/dev/zero"), ("import_export --model-config", "FIFO"),
        ("import_export --dir", "the other kind"), ("import_export --tokenizer", "huge"),
        ("import_export --name", "name too long"), ("inspect --path", "FIFO"),
        ("inspect --model-config", "dangling symlink"), ("check_bundle --path", "FIFO"),
        ("check_bundle --model-config", "symlink out of the tree"),
        ("check_bundle --model-config", "empty"), ("verify_release ARCHIVE", "name too long"),
        ("load_kit KIT", "/dev/zero"), ("import_export --dir", "unreadable"),
        ("deploy --path", "FIFO"), ("deploy --ssh-config", "/dev/zero")}


# shapes that are a valid value of the argument: an empty ssh config is one ssh accepts
VALID = {("deploy --ssh-config", "empty")}


def cases():
    for argument, (_, _, kind, _) in ARGUMENTS.items():
        for shape in SHAPES:
            if kind == "name" and shape not in NAME_SHAPES:
                continue
            if (argument, shape) in VALID:
                continue
            marks = () if (argument, shape) in FAST else (pytest.mark.heavy,)
            yield pytest.param(argument, shape, marks=marks, id=f"{argument}-{shape}")


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    """A project with a built bundle (check_bundle --model-config needs one to reach it)."""
    project = copy_project(tmp_path_factory.mktemp("paths") / "proj")
    project.doit("bundle")
    return project


def make_shape(shape: str, kind: str, place: Path, outside: Path) -> str:
    """The path of `shape` for an argument naming a `kind`, made under `place`."""
    place.mkdir(parents=True, exist_ok=True)
    path = place / "arg"
    if shape == "symlink out of the tree":
        # outside the project, and no valid input: the link is followed (Hugging Face's cache is
        # links), what it reaches is judged
        target = Path("/etc") if kind == "dir" else Path("/etc/passwd")
        path.symlink_to(target)
    elif shape == "dangling symlink":
        path.symlink_to(outside / "nothing-here")
    elif shape == "FIFO":
        os.mkfifo(path)
    elif shape == "/dev/zero":
        return "/dev/zero"
    elif shape == "the other kind":
        if kind == "dir":
            path.write_text("{}")
        else:
            path.mkdir()
    elif shape == "name too long":
        return str(place / ("a" * 300))
    elif shape == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads a chmod 000 file: an unreadable input cannot be made here")
        (path.mkdir() if kind == "dir" else path.write_text("{}"))
        path.chmod(0)
    elif shape == "empty":
        (path.mkdir() if kind == "dir" else path.write_bytes(b""))
    elif shape == "huge":
        with open(path, "wb") as fh:
            fh.truncate(5 << 30)   # sparse: no disk used
    return str(path)


@pytest.mark.parametrize("argument, shape", list(cases()))
def test_a_path_argument_of_a_wrong_shape_is_refused_naming_it(proj, tmp_path, argument, shape):
    task, option, kind, others = ARGUMENTS[argument]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the user's")
    value = NAME_SHAPES[shape] if kind == "name" else \
        make_shape(shape, kind, tmp_path / "given", outside)
    others = [str(proj.bundle()) if a == "BUNDLE" else a for a in others]
    args = [task, *others, *([option, value] if option else [value])]
    before_outside, before_project = tree_digests(outside), project_state(proj)
    try:
        proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=proj.root,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"doit {' '.join(args)}: no answer in {TIMEOUT_S}s (a hang)")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "Traceback" not in text, text
    named = option if option else value
    errors = [line for line in text.splitlines() if named in line]
    assert errors, f"no line names {named}:\n{text}"
    assert tree_digests(outside) == before_outside
    assert project_state(proj) == before_project, "written outside the build root"


def project_state(proj) -> dict:
    """Every file of the project but its build root."""
    return {rel: digest for rel, digest in tree_digests(proj.root).items()
            if not rel.startswith("build/") and "__pycache__" not in rel}


def test_the_table_names_every_path_argument_of_every_task(proj):
    """dodo.py's tasks, as doit loads them: each option (params) and positional argument
    (pos_arg) is in ARGUMENTS or declared a non-path in NOT_PATHS."""
    script = ("import json, types, dodo\n"
              "found = []\n"
              "for name in dir(dodo):\n"
              "    if not name.startswith('task_'): continue\n"
              "    made = getattr(dodo, name)()\n"
              "    tasks = list(made) if isinstance(made, types.GeneratorType) else [made]\n"
              "    for t in tasks:\n"
              "        found += [[name[5:], p['name'], p.get('long')] for p in t.get('params', [])]\n"
              "        if t.get('pos_arg'): found.append([name[5:], t['pos_arg'], None])\n"
              "print(json.dumps(found))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=proj.root, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=True)
    import json
    covered = {(task, option) for task, option, _, _ in ARGUMENTS.values()}
    missing = [(task, name, long) for task, name, long in json.loads(proc.stdout.splitlines()[-1])
               if (task, name) not in NOT_PATHS
               and (task, f"--{long}" if long else None) not in covered]
    assert missing == []
