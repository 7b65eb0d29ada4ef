"""The code a build step executes, derived from its imports: one digest per step for its up-to-date key.

`code_digest("hexbundle.steps.convert")` is the XXH3 of the sorted (path, XXH3) of every
hexbundle module the entry module reaches, found by reading the sources (ast), never by
importing them: dodo.py computes it when doit checks a task, and a no-op `doit bundle` must not
pay for onnx or numpy (tests/test_startup.py). A module's imports are read once per change of
its bytes (ImportCache, kept under the build root by doit runs): a no-op run stats the package's
files and reads none (~3 ms for all five steps; reading them all is ~30 ms).

What the analysis follows, from each entry module, transitively:
  - `import a.b.c` (a, a.b and a.b.c) and `from a.b import c` (a.b, and a.b.c when it is a module
    rather than a name defined in a.b), relative ones (`from . import x`, `from ..y import z`)
    resolved against the importing module's package;
  - imports anywhere in a file: at module level, inside functions (a lazy import is still code
    the step runs), under `if`/`try`/`if TYPE_CHECKING` (every branch: this over-approximates);
  - the `__init__.py` of every package above an imported module (Python runs them first);
  - modules named by a string: in a module whose source names `import_module`, every quoted
    string that is exactly the dotted name of a hexbundle module counts as imported (the
    backends: hexbundle.backends.registry._BACKENDS maps "reference" -> "hexbundle.backends.reference",
    so a convert's key covers both backends' code, whichever one it runs).

What it does not follow:
  - modules outside hexbundle (numpy, onnx, the QAIRT SDK, the standard library): not in this
    digest. The toolchain key stands for them where there is one (graph.keys.toolchain_key, in
    the convert, compile and bundle keys: the backend's version, plus the toolchain image's ID
    under executor=docker); with the local executor, and for inputs and verify, which have no
    toolchain key, an upgraded numpy or onnx reruns nothing;
  - a module named any other way at run time (a name built from pieces, `__import__`, a
    "module:function" string resolved by graph.actions, steps.runner.STEPS' dispatch by step
    name): the callers' entry points are listed by hand (graph.keys.STEP_CODE: each step's
    modules, not the runner and executors that dispatch to them and log);
  - an import statement that does not begin a line (`x = 1; import y`, `if c: import y`): a
    statement is found by its first word (see _STATEMENT); tests/test_codekey.py checks, for
    every hexbundle module, that this finds every import an ast.walk of the whole file finds
    (it may find more: a quoted module name inside a docstring of a module naming import_module);
  - non-Python files a step reads (configs, data): those are its file_dep or options.
"""
from __future__ import annotations

import ast
import functools
import json
import os
import re
from pathlib import Path
from typing import Optional

from hexbundle.support import hashing
from hexbundle.support.atomic import atomic_output, set_aside_link
from hexbundle.support.files import LinkedStateError
from hexbundle.support.jsondoc import read_state_json

PACKAGE_NAME = "hexbundle"
PACKAGE = Path(__file__).resolve().parents[1]   # .../hexbundle


def _with_parents(name: str) -> list:
    """a.b.c -> [a, a.b, a.b.c]: importing a module runs its packages' __init__ first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


# The start of an import statement: a line that begins (after indentation) with `import` or
# `from`. Each such statement is cut out (through its parentheses and backslash continuations)
# and parsed with ast alone: parsing and walking whole files took ~1 s for the five steps, the
# statements alone take milliseconds.
_STATEMENT = re.compile(rb"^[ \t]*(?:import|from)[ \t]", re.M)
_MODULE_STRING = re.compile(rb"""["'](hexbundle(?:\.[A-Za-z_][A-Za-z0-9_]*)+)["']""")


def _statements(source: bytes):
    """The import statements of a module's source (ast nodes), wherever they are."""
    for match in _STATEMENT.finditer(source):
        start, depth = match.start(), 0
        while True:   # to the statement's end: its parentheses closed, no trailing backslash
            end = source.find(b"\n", start)
            end = len(source) if end < 0 else end
            code = source[start:end].split(b"#", 1)[0]
            depth += code.count(b"(") - code.count(b")")
            start = end + 1
            if end == len(source) or depth <= 0 and not code.rstrip().endswith(b"\\"):
                break
        try:
            tree = ast.parse(source[match.start():end].strip())
        except SyntaxError:
            continue   # not code: a line of a docstring that happens to start with "from "
        yield from (n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))


def imported_names(source: bytes, name: str, is_package: bool) -> set:
    """Every dotted name the module's source imports, relative imports resolved: for `from a
    import b` both a and a.b (b may be a submodule); in a module whose source names
    import_module, also every quoted string that is a hexbundle module's dotted name."""
    pkg = name if is_package else name.rpartition(".")[0]
    names = set()
    for node in _statements(source):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        names.add(module)
        names.update(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
    if b"import_module" in source:
        names.update(m.decode() for m in _MODULE_STRING.findall(source))
    return names


class ImportCache:
    """(module name, file digest) -> the names its source imports (imported_names), persisted as
    JSON: keyed on the bytes (the digest cache's, by stat), so an entry is never stale; a file of
    the wrong shape is ignored and rewritten (it only costs reading the sources again)."""

    def __init__(self, path: Optional[Path] = None):
        self.path = Path(path) if path else None
        self.entries = self._load()
        self.parsed = 0   # sources read and parsed by this process (tests)
        self._dirty = False

    def _load(self) -> dict:
        try:   # never through a symbolic link (support.files.read_state)
            data = read_state_json(self.path) if self.path else {}
        except LinkedStateError:
            set_aside_link(self.path, "the import cache", "hexbundle's sources are read again")
            return {}
        except (OSError, ValueError, RecursionError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, list)
                and all(isinstance(n, str) for n in v)}

    def names(self, path: Path, name: str, is_package: bool, digest: str = "") -> set:
        """`digest`: the file's, if the caller has it (else taken through the digest cache)."""
        key = f"{name} {digest or hashing.digest(path)}"
        found = self.entries.get(key)
        if found is None:
            found = sorted(imported_names(path.read_bytes(), name, is_package))
            self.entries[key], self._dirty = found, True
            self.parsed += 1
        return set(found)

    def save(self, current) -> None:
        """Written when something was parsed, keeping the entries `current()` names (the files as
        they are now: an edited file's old entry goes)."""
        if not (self.path and self._dirty):
            return
        keep = current()
        self.entries = {k: v for k, v in self.entries.items() if k in keep}
        try:
            with atomic_output(self.path, "w", user_errors=False, sync=False, perms=0o600) as fh:
                json.dump(self.entries, fh, sort_keys=True)
            self._dirty = False
        except OSError:
            pass   # a full disk: the sources are read again next run


_import_cache = ImportCache()


def use_cache(path: Path) -> ImportCache:
    """Keep modules' imports in a file (graph.session, for a doit run: the layout's
    code_imports_cache); else they stay in memory."""
    global _import_cache
    if _import_cache.path != Path(path):
        _import_cache = ImportCache(path)
        package_index.cache_clear()
        _cached_digest.cache_clear()
    return _import_cache


class PackageIndex:
    """hexbundle's modules under a package directory, and their imports (each file read once per
    change of its bytes, through the ImportCache)."""

    def __init__(self, package: Path, cache: Optional[ImportCache] = None):
        self.package = package
        self.cache = cache or ImportCache()
        self.files = {}   # module name -> file
        for dirpath, dirnames, filenames in os.walk(package):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            parts = (PACKAGE_NAME, *Path(dirpath).relative_to(package).parts)
            for f in filenames:
                if f.endswith(".py"):
                    name = ".".join(parts if f == "__init__.py" else (*parts, f[:-3]))
                    self.files[name] = Path(dirpath, f)
        self._imports = {}
        self._digests = {}

    def digest(self, name: str) -> str:
        """The module file's XXH3 (through the digest cache), once per process: every step's
        code digest and the import cache ask for the same files (like code_digest itself, a
        source edited while the process runs counts from the next run)."""
        if name not in self._digests:
            self._digests[name] = hashing.digest(self.files[name])
        return self._digests[name]

    def imports(self, name: str) -> set:
        """The hexbundle modules (with their packages) that module `name` imports."""
        if name not in self._imports:
            path = self.files[name]
            found = self.cache.names(path, name, path.name == "__init__.py", self.digest(name))
            self._imports[name] = {m for n in found for m in _with_parents(n)
                                   if m in self.files and m != name}
        return self._imports[name]

    def closure(self, entries) -> dict:
        """module name -> file, for every hexbundle module the entry modules run (themselves,
        their packages' __init__ and everything those import, transitively)."""
        seen, todo = set(), []
        for entry in entries:
            if entry not in self.files:
                raise ValueError(f"{entry} is not a module under {self.package}")
            todo += _with_parents(entry)
        while todo:
            name = todo.pop()
            if name in seen or name not in self.files:
                continue
            seen.add(name)
            todo += self.imports(name) - seen
        self.cache.save(self.current_keys)
        return {name: self.files[name] for name in sorted(seen)}

    def current_keys(self) -> set:
        """The ImportCache keys of the package's modules as their files are now."""
        return {f"{name} {self.digest(name)}" for name in self.files}


@functools.lru_cache(maxsize=None)
def package_index(package: Path = PACKAGE) -> PackageIndex:
    """The index of a package directory, once per process (dodo.py asks per task)."""
    return PackageIndex(package, _import_cache)


def code_files(entries, package: Optional[Path] = None, cached: bool = True) -> dict:
    """module name -> file of the code the entry modules run."""
    package = Path(package).resolve() if package else PACKAGE
    index = package_index(package) if cached else PackageIndex(package)
    return index.closure(entries)


def _digest(entries: tuple, package: Path, cached: bool) -> str:
    index = package_index(package) if cached else PackageIndex(package)
    files = index.closure(entries)
    lines = sorted(f"{p.relative_to(package.parent).as_posix()} {index.digest(name)}"
                   for name, p in files.items())
    return hashing.bytes_digest("\n".join(lines).encode())


@functools.lru_cache(maxsize=None)
def _cached_digest(entries: tuple, package: Path) -> str:
    return _digest(entries, package, True)


def code_digest(*entries: str, package: Optional[Path] = None, cached: bool = True) -> str:
    """The digest of the hexbundle code the entry modules run: XXH3 of the sorted (path relative
    to the package's parent, XXH3 of the file) of code_files(entries), so the same sources give
    the same digest wherever the project is. Computed once per process (dodo.py asks for it per
    task); `cached=False` reads the sources again (tests that edit them)."""
    package = Path(package).resolve() if package else PACKAGE
    key = tuple(sorted(set(entries)))
    return _cached_digest(key, package) if cached else _digest(key, package, False)
