"""Each step's key covers the code it runs, derived from its imports (graph.codekey; issue 23:
"code in the key, derived"): the modules each step must cover are found, the ones it must not
are not, an edit reruns exactly the steps whose code it is, and the fast statement scanner
finds every import an ast.walk of the whole file finds."""
from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import copy_project
from hexbundle.graph.codekey import (PACKAGE, ImportCache, PackageIndex, code_digest, code_files,
                                    imported_names)
from hexbundle.graph.keys import STEP_CODE

STEPS = sorted(STEP_CODE)


def covered(step: str, package: Path = PACKAGE) -> set:
    """The files of a step's code, as paths relative to the package (e.g. "formats/dlc.py")."""
    files = code_files(STEP_CODE[step], package, cached=False)
    return {p.relative_to(package).as_posix() for p in files.values()}


def digests(package: Path) -> dict:
    return {s: code_digest(*STEP_CODE[s], package=package, cached=False) for s in STEPS}


@pytest.fixture
def package_copy(tmp_path) -> Path:
    """A copy of the hexbundle package, to edit."""
    dest = tmp_path / "hexbundle"
    shutil.copytree(PACKAGE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


# ------------------------------------------------------------------------------ what is covered

MUST = {
    "inputs": {"steps/inputs.py", "inputs/synthetic.py", "inputs/generate.py", "inputs/split.py",
               "config/model.py", "runtime/conventions.py", "__init__.py", "inputs/__init__.py"},
    # convert and compile receive their description (steps/description.py): the types of their
    # options (config/step_options.py) are their code; steps/options.py, which computes the
    # value on the doit side, is not (the value itself is in the key)
    "convert": {"steps/convert.py", "steps/description.py", "config/step_options.py",
                "formats/dlc.py", "inputs/validate.py", "backends/__init__.py",
                "backends/reference.py", "backends/qairt.py"},
    "compile": {"steps/compile.py", "steps/description.py", "config/step_options.py",
                "formats/ctxbin.py", "backends/reference.py", "backends/qairt.py"},
    "bundle": {"steps/bundle.py", "checks/sizes.py", "formats/genie.py", "formats/manifest.py"},
    "verify": {"checks/verify.py", "runtime/conventions.py", "runtime/sessions.py",
               "runtime/interpreter.py", "runtime/onnx_graph.py", "runtime/parts.py"},
}
MUST_NOT = {
    "inputs": {"backends/reference.py", "formats/dlc.py", "runtime/interpreter.py",
               "steps/convert.py"},
    "convert": {"runtime/interpreter.py", "steps/compile.py", "inputs/synthetic.py",
                "steps/options.py"},
    "compile": {"runtime/interpreter.py", "steps/convert.py", "inputs/synthetic.py",
                "steps/options.py"},
    "bundle": {"runtime/interpreter.py", "checks/verify.py"},
    "verify": {"toolchain/docker.py", "backends/reference.py", "formats/dlc.py",
               "inputs/synthetic.py", "steps/bundle.py"},
}
# Layers above steps/ (and the runner and executors, which dispatch and log): no step's code.
NO_STEP = re.compile(r"^(graph|release|bench|remote)/|^steps/(runner|executor|docker_executor)\.py$")


@pytest.mark.parametrize("step", STEPS)
def test_a_steps_code_holds_what_it_must_and_not_what_it_must_not(step):
    files = covered(step)
    assert MUST[step] <= files, f"{step}: missing {sorted(MUST[step] - files)}"
    assert not MUST_NOT[step] & files, f"{step}: has {sorted(MUST_NOT[step] & files)}"
    assert not [f for f in files if NO_STEP.search(f)], sorted(f for f in files if NO_STEP.search(f))


def test_the_old_hand_lists_are_within_the_derived_code():
    """What graph.keys listed by hand before (GENERATOR_SOURCES, SPLITTER_SOURCES,
    RUNTIME_SOURCES) is all still covered."""
    assert {"inputs/synthetic.py", "inputs/generate.py", "runtime/conventions.py",
            "config/model.py", "inputs/split.py"} <= covered("inputs")
    assert {"runtime/conventions.py", "runtime/sessions.py", "runtime/interpreter.py",
            "runtime/onnx_graph.py", "runtime/parts.py", "checks/verify.py"} <= covered("verify")


def test_every_imported_packages_init_is_covered():
    for step in STEPS:
        files = covered(step)
        for f in files:
            parents = Path(f).parents
            for parent in list(parents)[:-1]:
                assert f"{parent.as_posix()}/__init__.py" in files, (step, f)
        assert "__init__.py" in files


# ------------------------------------------------------------------------------ edits

def append_comment(path: Path) -> None:
    with open(path, "a") as fh:
        fh.write("# edited by tests/test_codekey.py\n")


def only_in(step: str, package: Path) -> list:
    others = set().union(*(covered(s, package) for s in STEPS if s != step))
    return sorted(covered(step, package) - others)


@pytest.mark.parametrize("step", STEPS)
def test_editing_a_module_only_one_step_runs_changes_that_steps_digest_only(step, package_copy):
    before = digests(package_copy)
    assert len(set(before.values())) == len(STEPS)
    entries = {m.split(".", 1)[1].replace(".", "/") + ".py" for m in STEP_CODE[step]}
    own = [f for f in only_in(step, package_copy) if f not in entries] or \
        only_in(step, package_copy)
    assert own, f"no module is {step}'s alone"
    append_comment(package_copy / own[0])
    after = digests(package_copy)
    assert {s for s in STEPS if after[s] != before[s]} == {step}, own[0]


@pytest.mark.parametrize("edited, rerun", [
    ("formats/dlc.py", {"convert", "compile", "bundle"}),
    ("runtime/interpreter.py", {"verify"}),
    ("__init__.py", set(STEPS)),                   # hexbundle/__init__.py runs first, always
    ("backends/qairt.py", {"convert", "compile", "bundle"}),   # named by a string
    ("graph/dumpdb.py", set()),                    # doit's side: no step runs it
])
def test_an_edit_changes_the_digests_of_the_steps_that_run_it(edited, rerun, package_copy):
    before = digests(package_copy)
    append_comment(package_copy / edited)
    after = digests(package_copy)
    assert {s for s in STEPS if after[s] != before[s]} == rerun


def test_the_digest_does_not_depend_on_where_the_package_is(package_copy):
    assert digests(package_copy) == digests(PACKAGE)


def test_a_new_import_is_followed(package_copy):
    """Adding an import to a step's module brings the imported module's code into its key."""
    assert "bench/benchmark.py" not in covered("verify", package_copy)
    path = package_copy / "checks" / "verify.py"
    path.write_text(path.read_text() + "\n\ndef _lazy():\n    from ..bench import benchmark\n")
    assert "bench/benchmark.py" in covered("verify", package_copy)


# ------------------------------------------------------------------------------ the import cache

def closures(package: Path, cache_file: Path) -> tuple:
    """Each step's code files, through a PackageIndex whose imports are kept in `cache_file`;
    and how many sources that index read."""
    index = PackageIndex(package, ImportCache(cache_file))
    found = {s: sorted(index.closure(STEP_CODE[s])) for s in STEPS}
    return found, index.cache.parsed


def test_a_warm_import_cache_reads_no_source_and_finds_the_same(package_copy, tmp_path):
    cold, parsed = closures(package_copy, tmp_path / "imports.json")
    assert parsed > 20   # every module the steps reach, read once
    warm, parsed_again = closures(package_copy, tmp_path / "imports.json")
    assert (warm, parsed_again) == (cold, 0)
    assert cold == {s: sorted(code_files(STEP_CODE[s], package_copy, cached=False))
                    for s in STEPS}


def test_an_edited_module_is_read_again_through_a_warm_cache(package_copy, tmp_path):
    """The cache is keyed on a file's bytes: a new import in an edited file is followed."""
    before, _ = closures(package_copy, tmp_path / "imports.json")
    path = package_copy / "checks" / "verify.py"
    path.write_text(path.read_text() + "\n\ndef _lazy():\n    from ..bench import benchmark\n")
    found, parsed = closures(package_copy, tmp_path / "imports.json")
    assert "hexbundle.bench.benchmark" in found["verify"]
    reached = {m for ms in found.values() for m in ms} - {m for ms in before.values() for m in ms}
    assert parsed == 1 + len(reached)   # verify.py again, and each module newly reached


@pytest.mark.parametrize("text", ["[1, 2]", "{not json", '{"a b": "c"}', "[" * 100000])
def test_an_import_cache_of_the_wrong_shape_is_read_past_and_rewritten(package_copy, tmp_path,
                                                                         text):
    cache_file = tmp_path / "imports.json"
    cache_file.write_text(text)
    found, parsed = closures(package_copy, cache_file)
    assert parsed > 20 and found["verify"]
    assert isinstance(json.loads(cache_file.read_text()), dict)
    assert closures(package_copy, cache_file)[1] == 0


# ------------------------------------------------------------------------------ the scanner

def walked_names(source: bytes, name: str, is_package: bool) -> set:
    """What graph.codekey.imported_names must find, by the slow and sure way: ast.walk of the
    whole file (imports anywhere; module-name string constants where import_module is used)."""
    tree = ast.parse(source)
    pkg = name if is_package else name.rpartition(".")[0]
    names, strings = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names if a.name != "*")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"hexbundle(\.[A-Za-z_]\w*)+", node.value):
            strings.add(node.value)
    return names | (strings if b"import_module" in source else set())


def all_modules(package: Path) -> dict:
    out = {}
    for path in package.rglob("*.py"):
        parts = ("hexbundle", *path.relative_to(package).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def test_the_scanner_finds_every_import_ast_walk_finds_in_every_module():
    """Every name ast.walk finds, the scanner finds. It may find more in one case only: a
    quoted module name inside a longer string (a docstring) of a module that names
    import_module (hexbundle.graph.codekey's own docstring): more code in a key, never less."""
    modules = all_modules(PACKAGE)
    assert len(modules) > 80
    for name, path in modules.items():
        source = path.read_bytes()
        is_package = path.name == "__init__.py"
        scanned = imported_names(source, name, is_package)
        walked = walked_names(source, name, is_package)
        assert walked <= scanned, f"{name}: missed {sorted(walked - scanned)}"
        extra = scanned - walked
        assert not extra or b"import_module" in source, f"{name}: {sorted(extra)}"
        assert all(f'"{n}"'.encode() in source or f"'{n}'".encode() in source
                   for n in extra), f"{name}: {sorted(extra)}"


SAMPLE = b'''"""A docstring.

from the layout import nothing: this line is prose, not code
"""
from __future__ import annotations
import os, hexbundle.support.atomic as atomic
from . import sibling
from ..formats import (dlc,   # (a comment with parentheses)
                       ctxbin)
from hexbundle.config.build import \\
    load_build

BACKENDS = {"ref": ("hexbundle.backends.reference", "Ref")}


def lazy():
    if os.environ:
        import hexbundle.runtime.interpreter
    try:
        from .. import checks
    except ImportError:
        pass
    return importlib.import_module(BACKENDS["ref"][0])
'''


def test_the_scanner_on_every_form_of_import():
    found = imported_names(SAMPLE, "hexbundle.steps.sample", False)
    assert found == walked_names(SAMPLE, "hexbundle.steps.sample", False)
    assert {"os", "hexbundle.support.atomic", "hexbundle.steps.sibling", "hexbundle.formats.dlc",
            "hexbundle.formats.ctxbin", "hexbundle.config.build.load_build",
            "hexbundle.runtime.interpreter", "hexbundle.checks",
            "hexbundle.backends.reference"} <= found
    assert not any(n.startswith("the") for n in found)


# ------------------------------------------------------------------------------ doit itself

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("codekey") / "proj")
    project.doit("bundle")
    return project


def would_run(project) -> set:
    """The tasks `doit bundle --dry-run` says would run."""
    run = project.doit("bundle", "--dry-run")
    return set(re.findall(r"^\.\s+(\S+)", run.out, re.M))


def test_doit_reruns_the_steps_whose_code_changed_and_no_other(built):
    assert would_run(built) == set()
    append_comment(built.root / "hexbundle" / "checks" / "verify.py")
    assert would_run(built) == set()     # verify's code: no step of `doit bundle` runs it
    append_comment(built.root / "hexbundle" / "formats" / "dlc.py")
    tasks = would_run(built)
    assert tasks == {f"convert:part_{p}_of_4_{g}" for p in range(1, 5)
                     for g in ("prompt", "token")} \
        | {f"compile:part_{p}_of_4" for p in range(1, 5)} | {"bundle"}
