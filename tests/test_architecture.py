"""The package's shape: layers import downward only, no import cycles, doit stays in graph/.

Every import is counted, at module level and inside functions alike (an import inside a function
is still a dependency; it only hides a cycle from Python's import machinery).
"""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hexbundle"
# Lowest first: a package may import itself and the packages before it, nothing after it.
LAYERS = ("support", "config", "formats", "runtime", "inputs", "backends", "checks", "toolchain",
          "remote", "steps", "release", "deploy", "graph", "bench")
# Modules that also run alone, with the standard library only (copied into the offline kit).
STANDALONE = ("hexbundle.release.kit",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported_names(path: Path, name: str) -> list:
    """(module imported, line) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            out.append((source, node.lineno))
            out += [(f"{source}.{alias.name}", node.lineno) for alias in node.names]
    return out


def internal_edges() -> dict:
    """module -> {module it imports: line}, for hexbundle's own modules."""
    modules = all_modules()
    edges = {}
    for name, path in modules.items():
        targets = {}
        for imported, line in imported_names(path, name):
            if imported in modules and imported != name and not name.startswith(imported + "."):
                targets.setdefault(imported, line)
        edges[name] = targets
    return edges


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def find_cycle(edges: dict):
    """A list of modules forming a cycle, or None (iterative DFS, colours)."""
    state, stack_path = {}, []

    def visit(start):
        stack = [(start, iter(sorted(edges[start])))]
        state[start] = "open"
        stack_path.append(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = "done"
                stack_path.pop()
                stack.pop()
            elif state.get(child) == "open":
                return stack_path[stack_path.index(child):] + [child]
            elif child not in state:
                state[child] = "open"
                stack_path.append(child)
                stack.append((child, iter(sorted(edges[child]))))
        return None

    for module in sorted(edges):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def test_the_walker_sees_imports_inside_functions_and_relative_ones(tmp_path):
    source = tmp_path / "hexbundle" / "steps" / "x.py"
    source.parent.mkdir(parents=True)
    source.write_text("from . import runner\n\ndef f():\n    from ..graph import keys\n")
    names = {n for n, _ in imported_names(source, "hexbundle.steps.x")}
    assert {"hexbundle.steps.runner", "hexbundle.graph.keys"} <= names


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) is None


def test_every_package_has_a_layer():
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages == set(LAYERS), "add the package to LAYERS (and docs/layout.md)"
    assert not [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"], \
        "modules belong in a subpackage"


def test_no_import_cycles():
    cycle = find_cycle(internal_edges())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_layers_import_downward_only():
    wrong = []
    for module, targets in internal_edges().items():
        here = layer_of(module)
        if not here:
            continue
        for target, line in targets.items():
            there = layer_of(target)
            if there and LAYERS.index(there) > LAYERS.index(here):
                wrong.append(f"{module}:{line} imports {target} ({there} is above {here})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: module_name(p))
def test_doit_is_imported_only_by_graph(path):
    name = module_name(path)
    if layer_of(name) == "graph":
        return
    doit_imports = [line for imported, line in imported_names(path, name)
                    if imported == "doit" or imported.startswith("doit.")]
    assert not doit_imports, f"{name} imports doit at line(s) {doit_imports}: use hexbundle.graph"


def test_standalone_modules_import_only_the_standard_library():
    import sys
    for name in STANDALONE:
        path = all_modules()[name]
        for imported, line in imported_names(path, name):
            top = imported.split(".")[0]
            # docker (and requests, its own dependency, whose transport errors it lets through)
            # are imported only to load images, from the kit's venv when this Python lacks them
            assert top in sys.stdlib_module_names or top in ("docker", "requests", "__future__"), \
                f"{name}:{line} imports {imported}"


def test_layout_document_lists_every_package():
    layout = (ROOT / "docs" / "layout.md").read_text()
    for package in LAYERS:
        assert re.search(rf"^\s+{package}/\s+\S", layout, re.M), \
            f"docs/layout.md has no line for hexbundle/{package}/"


def test_dodo_docstring_maps_every_task_to_a_module_that_exists():
    dodo = ast.parse((ROOT / "dodo.py").read_text())
    tasks = [n.name[len("task_"):] for n in dodo.body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("task_")]
    doc = ast.get_docstring(dodo)
    rows = dict(re.findall(r"^  (\w+)\s+(\S+\.py)\s", doc, re.M))
    assert sorted(rows) == sorted(tasks), "dodo.py's docstring lists exactly the tasks"
    for task, module in rows.items():
        assert (PACKAGE / module).is_file(), f"task {task}: hexbundle/{module} does not exist"


def test_dodo_declares_tasks_and_nothing_else():
    """Module level: imports, constants from the config, and task_* / small helper functions;
    no loops or calls that act (the only calls are the loaders that resolve the config)."""
    dodo = ast.parse((ROOT / "dodo.py").read_text())
    for node in dodo.body:
        assert isinstance(node, (ast.Expr, ast.Import, ast.ImportFrom, ast.Assign,
                                 ast.FunctionDef)), f"dodo.py line {node.lineno}: {type(node)}"
        if isinstance(node, ast.Expr):
            assert isinstance(node.value, ast.Constant), f"dodo.py line {node.lineno} acts"


def test_dodo_names_every_action_as_an_existing_module_function():
    """dodo.py names its actions' functions as "module:function", imported when the action runs
    (hexbundle.graph.actions): each must be a top-level function of an existing module, so a
    typo fails here, not when someone first runs that task."""
    dodo = ast.parse((ROOT / "dodo.py").read_text())
    calls = [n for n in ast.walk(dodo) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id in ("action", "step_action")]
    assert len(calls) >= 15, "dodo.py's actions are made by action() and step_action()"
    modules = all_modules()
    for call in calls:
        ref = call.args[0]
        assert isinstance(ref, ast.Constant) and isinstance(ref.value, str), \
            f"dodo.py line {call.lineno}: name the function as \"module:function\""
        module, _, name = ref.value.partition(":")
        assert module in modules, f"dodo.py line {call.lineno}: no module {module}"
        defined = {n.name for n in ast.parse(modules[module].read_text()).body
                   if isinstance(n, ast.FunctionDef)}
        assert name in defined, f"dodo.py line {call.lineno}: {module} defines no {name}()"


# Temp-then-rename, and temp names inside our own directories, come from hexbundle.support.atomic
# only: one naming scheme, which the clean-up after a killed run (graph.recovery) knows.
RENAMES = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("shutil", "move")}
NAMED_TEMPS = {"mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryDirectory"}   # with dir=
# Renames that are not support.atomic's (module, function): why.
OTHER_RENAMES = {
    ("hexbundle.release.kit", "unpack_verified"): "standalone (runs before hexbundle is "
                                                  "installed): renames a verified kit into place "
                                                  "from support.atomic's temp name, spelled out "
                                                  "(tests/test_offline.py checks it)",
    ("hexbundle.graph.recovery", "set_aside_damaged_db"): "keeps an unreadable DB as .damaged",
    ("hexbundle.graph.recovery", "set_aside_bundle_link"): "moves a bundle/ symlink aside",
    ("hexbundle.graph.recovery", "set_aside_former_db"): "keeps the one DB of an older "
                                                          "hexbundle as .former",
    ("hexbundle.support.hashing", "_load"): "keeps a digest cache that is not a JSON object "
                                            "as .set-aside",
    ("hexbundle.backends.qairt", "_settle"): "moves a file the SDK saved elsewhere onto the "
                                             "temp path support.atomic gave it",
}


def module_calls(path: Path) -> list:
    """(function it is in, `name.attr` call node) for every call of an attribute of a name."""
    out = []

    def walk(node, func):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, child.name)
                continue
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and isinstance(child.func.value, ast.Name)):
                out.append((func, child))
            walk(child, func)

    walk(ast.parse(path.read_text(), str(path)), "")
    return out


def test_only_support_atomic_renames_outputs_into_place():
    found, others = [], set()
    for name, path in sorted(all_modules().items()):
        if name == "hexbundle.support.atomic":
            continue
        for func, call in module_calls(path):
            pair = (call.func.value.id, call.func.attr)
            temp = (pair[0] == "tempfile" and pair[1] in NAMED_TEMPS
                    and any(k.arg == "dir" for k in call.keywords))
            if pair in RENAMES and (name, func) in OTHER_RENAMES:
                others.add((name, func))
            elif pair in RENAMES or temp:
                found.append(f"{name}:{call.lineno} {'.'.join(pair)} in {func or '<module>'}")
    assert not found, ("write through hexbundle.support.atomic (atomic_output, output_path, "
                       "staged_dir, temp_dir) instead:\n" + "\n".join(found))
    assert others == set(OTHER_RENAMES), "OTHER_RENAMES lists a rename that is gone"


CONTAINER_PROBE = """
import re, sys
from pathlib import Path
allowed = set(sys.stdlib_module_names) | {"hexbundle", "_distutils_hack"}
for line in Path("requirements/container.in").read_text().splitlines():
    m = re.match(r"([A-Za-z0-9_.\\-]+)", line.strip())
    if m and not line.lstrip().startswith("#"):
        allowed.add(m.group(1).lower().replace("-", "_"))
allowed |= {"yaml", "typing_extensions", "google", "ml_dtypes", "huggingface_hub",
            "exceptiongroup", "jsonschema"}   # import names of locked packages and their deps
class Gate:
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in allowed and not top.startswith("_") and not top.endswith("__mypyc"):
            raise ImportError(f"{name} is not in requirements/container.in")
sys.meta_path.insert(0, Gate())
import hexbundle.steps.runner
import hexbundle.backends.qairt, hexbundle.backends.reference
print("ok")
"""


def test_the_container_step_runner_imports_only_what_the_image_locks():
    """scripts/step.py runs hexbundle.steps.runner in the toolchain image, whose wheels are
    requirements/container.in's: a host-only library (a table or progress-bar package) imported
    at module level by anything the runner imports would fail every docker step."""
    proc = subprocess.run([sys.executable, "-c", CONTAINER_PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


# A format's byte layout lives in its module in hexbundle/formats/ (one reader, one writer, one
# plan_layout): elsewhere nothing decodes or encodes fixed binary records (the struct module,
# int.from_bytes/to_bytes), reads bytes as typed values (numpy's frombuffer/fromfile/memmap, an
# ndarray over a buffer), or uses a format's layout constants (a magic, the container's preamble
# and alignment, the weight data's alignment). Bytes go through the formats' functions instead.
BYTE_DECODERS = {"frombuffer", "fromfile", "memmap", "from_bytes", "to_bytes"}
LAYOUT_CONSTANT = re.compile(r"^(\w+_MAGIC|PREAMBLE|ALIGN|DATA_ALIGNMENT|QUANT_PARAM_ALIGN)$")


def byte_layout_uses(path: Path, name: str) -> list:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for imported, line in imported_names(path, name):
        top, _, last = imported.rpartition(".")
        if imported == "struct" or imported.startswith("struct."):
            found.append(f"{name}:{line} imports struct")
        elif top.startswith("hexbundle.formats.") and LAYOUT_CONSTANT.match(last):
            found.append(f"{name}:{line} imports {imported}, a format's layout constant")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in BYTE_DECODERS:
            found.append(f"{name}:{node.lineno} uses .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "ndarray" and any(k.arg == "buffer" for k in node.keywords)):
            found.append(f"{name}:{node.lineno} makes an ndarray over a buffer")
    return found


def test_byte_layout_uses_are_seen(tmp_path):
    """The rule below sees each kind of use it forbids."""
    source = tmp_path / "x.py"
    source.write_text("import struct\nfrom hexbundle.formats.ctxbin import CTXBIN_MAGIC\n"
                      "from hexbundle.formats.container import PREAMBLE as P\n"
                      "import numpy as np\nnp.frombuffer(b'', 'u1')\nint.from_bytes(b'', 'little')\n"
                      "np.ndarray((1,), 'u1', buffer=b'x')\n")
    found = byte_layout_uses(source, "hexbundle.checks.x")
    assert sorted(f.split(" ", 1)[1] for f in found) == sorted([
        "imports struct", "imports hexbundle.formats.ctxbin.CTXBIN_MAGIC, a format's layout "
        "constant", "imports hexbundle.formats.container.PREAMBLE, a format's layout constant",
        "uses .frombuffer", "uses .from_bytes", "makes an ndarray over a buffer"])


def test_no_format_byte_layout_outside_formats():
    found = []
    for name, path in sorted(all_modules().items()):
        if layer_of(name) != "formats":
            found += byte_layout_uses(path, name)
    assert not found, ("a format's byte layout belongs in its module in hexbundle/formats/ "
                       "(its reader, writer or plan_layout):\n" + "\n".join(found))
