"""Where every file lives: the project's configs and scripts, hexbundle's state, and each build's
outputs. Nothing else in hexbundle spells a path; it asks a layout.

ProjectLayout (the project alone):
  configs/{build,devices,toolchain}.toml, configs/models/<name>.toml, configs/boards/<name>.toml
  <build root>/.hexbundle/               digest cache, lock, doit's dependency DBs:
    db/<model>/doit-db.json              the model's own steps (inputs), shared by its variants
    db/<model>/<device>/<plan>/<backend>/doit-db.json    each variant's steps
  <build root>/.hexbundle/containers/    one record per step container alive (docker executor)
  <build root>/release/, release-work/   `doit release`
  <build root>/offline-kit/, offline-kit.tar(.sha256), load_kit.py    `doit offline_kit`
  build/image/, build/logs/image.log     `doit image` (always the project's own build/)
Layout (one variant: a model, a device, a plan, a backend), under the build root:
  <model>/inputs/                        generated or locally split inputs: the model's, shared
                                         by every device, plan and backend
  <model>/<device>/<plan>/<backend>/     the variant's own directory (variants side by side):
    dlc/                                 one DLC per graph
    bin/                                 one context binary per part
    bundle/                              the Genie bundle
    logs/                                one log per step
    origins/                             per step: built here or fetched from a remote cache
    verify/report.json                   `doit verify`

The build root is <project>/build, or $HEXBUNDLE_BUILD_ROOT (scratch and release builds). Paths
handed to doit are project-relative strings (`rel`), so a target of one task and the file_dep of
the next are the same string (doit matches them exactly).
"""
from __future__ import annotations

import functools
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hexbundle.support.errors import ConfigError

if TYPE_CHECKING:   # annotations only: `doit list` reads the layout without the model schema
    from hexbundle.config.model import Graph, Part

BUILD_ROOT_ENV = "HEXBUNDLE_BUILD_ROOT"
GENIE_CONFIG = "genie_config.json"
HTP_EXT_CONFIG = "htp_backend_ext_config.json"
TOKENIZER = "tokenizer.json"
BUNDLE_CONFIG_FILES = (GENIE_CONFIG, HTP_EXT_CONFIG, TOKENIZER)
MANIFEST = "manifest.json"
STATE_DIR = ".hexbundle"           # in a build root: hexbundle's own state
DB_DIR = "db"                      # in STATE_DIR: the dependency DBs, one per model and variant
DOIT_DB = "doit-db.json"
ROOT_MARKER = "build-root.json"    # in STATE_DIR: this build root is hexbundle's own
MD5_DOIT_DB = "doit-db-md5.json"   # `doit bench` only: doit's stock checker keeps its own DB
RELEASE_PROVENANCE = "provenance.json"   # beside the release archive, wherever it is copied
RELEASE_SUMS = "SHA256SUMS"
GRAPH_FILE_SUFFIXES = (".onnx", ".data", ".encodings")
# A name that becomes one component of a path hexbundle writes (a model, a board or chipset, a
# plan, a graph, a slug): no separator, no leading dot (so never "." or ".."), lower case (two
# names never share a directory on a case-insensitive disk), and short enough that every path
# built from a few of them stays far below NAME_MAX (255) and PATH_MAX.
MAX_NAME = 64
NAME = rf"[a-z0-9][a-z0-9._-]{{0,{MAX_NAME - 1}}}"
# device=NAME: a board or chipset by name or alias, any case (config.devices lowers it).
DEVICE_NAME = rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME - 1}}}"


def name_problem(name, pattern: str = NAME) -> str:
    """Why `name` cannot be a path component, or '' when it can."""
    if not isinstance(name, str):
        return f"is {type(name).__name__} {name!r}, not a string"
    if len(name) > MAX_NAME:
        return f"is {len(name)} characters long; at most {MAX_NAME}"
    if not re.fullmatch(pattern, name):
        return (f"is {name!r}; it becomes a directory or file name: use lower-case letters, "
                "digits, '.', '_' and '-', starting with a letter or digit")
    return ""


def check_name(name, what: str, where: str = "", pattern: str = NAME) -> str:
    """`name` if it can be a path component, else ConfigError naming where it was given and what
    it names (`what`: "plan", "model.name", ...). The one check of every name that becomes a
    path, whatever its source (a config file, the command line, a task's argument)."""
    problem = name_problem(name, pattern)
    if problem:
        shown = name if len(str(name)) <= 80 else f"{str(name)[:40]}...({len(name)} characters)"
        problem = problem.replace(repr(name), repr(shown))
        raise ConfigError(f"{where + ': ' if where else ''}{what} {problem}")
    return name


def dlc_name(graph: Graph) -> str:
    return f"{graph.name}.dlc"


def graph_files(directory: Path, graph: Graph) -> tuple:
    """(onnx, data, encodings) of a graph in a flat directory named by graph: the names the
    generators and the local split write, and a flat export uses. The .onnx records its .data by
    this bare name. The data file is the PART's: the prompt and token graphs of a part hold the
    same weights, so both ONNX record one shared file (as Qualcomm's asset does; never a hard
    link, which onnx >= 1.21 refuses to load external data from)."""
    directory = Path(directory)
    return (directory / f"{graph.name}.onnx", directory / part_data_name(graph.part),
            directory / f"{graph.name}.encodings")


def part_data_name(part: Part) -> str:
    return f"{part.tag}.data"


def _real(path: Path) -> Path:
    """The path with its symbolic links resolved as far as they go: a symlink loop (where an
    input belongs) stays a name, for the step that reads it to refuse with a message, instead of
    Path.resolve's RuntimeError while the task graph is declared."""
    return Path(os.path.realpath(path))


@dataclass(frozen=True)
class GraphInputs:
    """The files one graph is built from: its ONNX, the data files that ONNX records, and its
    AIMET encodings. Several graphs may name the same data file."""

    onnx: Path
    data: tuple
    encodings: Path

    @property
    def all(self) -> list:
        return [self.onnx, *self.data, self.encodings]


def check_build_root(root: Path, build_root: Path, origin: str = "") -> None:
    """Refuse a build root whose clean-up and outputs could reach files that are not the
    build's: the file-system root, the home directory, the source tree or a directory holding
    it. ConfigError naming it."""
    root, build_root = Path(root).resolve(), Path(build_root).resolve()
    home = Path(os.path.expanduser("~")).resolve()
    why = None
    if build_root == Path(build_root.anchor):
        why = "the root of the file system"
    elif build_root == home and home != Path(home.anchor):
        why = "your home directory"
    elif build_root == root or build_root in root.parents:
        why = f"the source tree {root} itself" if build_root == root else \
            f"a directory holding the source tree {root}"
    if why:
        raise ConfigError(f"{origin}build root {build_root} is {why}; hexbundle writes its "
                          "outputs there and cleans up its temporary files in it: use a "
                          "directory of its own (a new or empty one, e.g. <project>/build or "
                          "a scratch directory)")


class ProjectLayout:
    """Paths that depend on the project alone."""

    def __init__(self, root: Path, build_root: Path | None = None):
        self.root = Path(root).resolve()
        self._given = build_root or os.environ.get(BUILD_ROOT_ENV)
        self._from_env = not build_root and bool(self._given)
        self.build_root = Path(self._given or self.root / "build").resolve()

    def check_build_root(self) -> None:
        """ConfigError if the build root may not be one (check_build_root): called where a run
        resolves it (graph.session.load, `doit dumpdb`), not on every construction."""
        if self._given:
            check_build_root(self.root, self.build_root,
                             f"{BUILD_ROOT_ENV}={self._given}: " if self._from_env else "")

    _real_dirs = None   # directory -> its real path, while paths_settled()

    @contextmanager
    def paths_settled(self):
        """While doit calls the task creators (graph.loader), which write nothing: each
        directory's real path is looked up once, not once per file in it (realpath lstats every
        component of every path; a task graph names hundreds of files in a few directories).
        A file that is itself a symbolic link is still resolved whole."""
        self._real_dirs = {}
        try:
            yield
        finally:
            self._real_dirs = None

    def _real_path(self, path: Path) -> Path:
        """_real(path), through paths_settled's directories when they are settled."""
        dirs = self._real_dirs
        if dirs is None or path.name in ("", "..") or os.path.islink(path):
            return _real(path)
        parent = path.parent
        real_parent = dirs.get(parent)
        if real_parent is None:
            real_parent = dirs[parent] = _real(parent)
        return real_parent / path.name

    def rel(self, path: Path) -> str:
        """Project-relative when inside the project (stable doit keys), else absolute."""
        path = Path(path)
        if not path.is_absolute():
            return str(path)
        real = self._real_path(path)
        try:
            return str(real.relative_to(self.root))
        except ValueError:
            return str(real)

    def logical(self, path: Path) -> str:
        """A path as recorded in manifests: relative to the project, with the build root spelled
        "build/" wherever it really is, so the record does not depend on where the build ran."""
        path = _real(Path(path))
        try:
            return "build/" + str(path.relative_to(self.build_root))
        except ValueError:
            return self.rel(path)

    # configs ----------------------------------------------------------------------------
    @property
    def configs_dir(self) -> Path:
        return self.root / "configs"

    @property
    def build_config(self) -> Path:
        return self.configs_dir / "build.toml"

    @property
    def models_dir(self) -> Path:
        return self.configs_dir / "models"

    def model_config(self, name: str) -> Path:
        return self.models_dir / f"{check_name(name, 'model')}.toml"

    @property
    def devices_table(self) -> Path:
        """Qualcomm's chipsets, generated by scripts/make_devices.py (config.devices)."""
        return self.configs_dir / "devices.toml"

    @property
    def boards_dir(self) -> Path:
        """Boards: a chipset plus the settings measured on that board (config.devices)."""
        return self.configs_dir / "boards"

    @property
    def toolchain_config(self) -> Path:
        return self.configs_dir / "toolchain.toml"

    # scripts ----------------------------------------------------------------------------
    def script(self, name: str) -> Path:
        return self.root / "scripts" / name

    def generated_inputs_dir(self, model_name: str) -> Path:
        """Where a generated model's inputs go (device-independent)."""
        return self.in_build_root(("model", model_name)) / "inputs"

    def in_build_root(self, *named: tuple, base: Path | None = None) -> Path:
        """base (the build root) / name / name ..., from (what, name) pairs: each name checked
        (check_name), and the path refused if it leaves the build root all the same. Every
        directory named after a model, device, plan or backend is made here."""
        base = self.build_root if base is None else base
        path = base.joinpath(*(check_name(name, what) for what, name in named))
        lexical = Path(os.path.normpath(path))
        if self.build_root not in lexical.parents:
            raise ConfigError(f"{path} is outside the build root {self.build_root}: hexbundle "
                              "writes only under it; check the names in the path")
        return path

    # hexbundle's state --------------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        """hexbundle's own state: digest cache, doit's dependency DBs, lock."""
        return self.build_root / STATE_DIR

    @property
    def digest_cache(self) -> Path:
        return self.state_dir / "digests.json"

    @property
    def code_imports_cache(self) -> Path:
        """What each hexbundle module imports, by its bytes (graph.codekey.ImportCache)."""
        return self.state_dir / "code-imports.json"

    @property
    def db_dir(self) -> Path:
        """doit's dependency DBs: one per model (its inputs steps), one per variant."""
        return self.state_dir / DB_DIR

    def model_doit_db(self, model_name: str, name: str = DOIT_DB) -> Path:
        """The DB of a model's own steps (inputs:*), whose files every variant of it shares."""
        return self.in_build_root(("model", model_name), base=self.db_dir) / name

    def doit_dbs(self, name: str = DOIT_DB) -> list:
        """Every dependency DB of the build root (models' and variants'), sorted."""
        return sorted(self.db_dir.rglob(name)) if self.db_dir.is_dir() else []

    @property
    def former_doit_db(self) -> Path:
        """The one DB of hexbundle before variants were kept side by side (graph.runguard sets
        it aside)."""
        return self.state_dir / DOIT_DB

    @property
    def lock(self) -> Path:
        return self.state_dir / "lock"

    @property
    def containers_dir(self) -> Path:
        """One record per step container the docker executor started and has not yet removed:
        what a run killed with kill -9 leaves, for the next run to remove (graph.runguard)."""
        return self.state_dir / "containers"

    @property
    def root_marker(self) -> Path:
        """Written when hexbundle creates (or first uses, empty) a build root: only a root with
        it is cleaned up after an interrupted run (graph.runguard)."""
        return self.state_dir / ROOT_MARKER

    # project-wide outputs -----------------------------------------------------------------
    @property
    def image_dir(self) -> Path:
        """The toolchain image's record: the project's own build/, whatever the build root (one
        image serves every build root, scratch and release builds included)."""
        return self.root / "build" / "image"

    @property
    def image_record(self) -> Path:
        return self.image_dir / "image.json"

    @property
    def image_id_file(self) -> Path:
        return self.image_dir / "image-id.txt"

    @property
    def image_log(self) -> Path:
        return self.root / "build" / "logs" / "image.log"

    @property
    def bench_dir(self) -> Path:
        """`doit bench`: its build trees (build roots of their own) and results.json."""
        return self.root / "build" / "bench"

    def bench_tree(self, small: bool) -> Path:
        return self.bench_dir / ("small-tree" if small else "tree")

    @property
    def bench_scratch(self) -> Path:
        """The benchmark's backend row writes here (in the benchmark tree's build root)."""
        return self.build_root / "backend-scratch"

    @property
    def bench_results(self) -> Path:
        return self.bench_dir / "results.json"

    @property
    def release_dir(self) -> Path:
        return self.build_root / "release"

    @property
    def release_work_dir(self) -> Path:
        return self.build_root / "release-work"

    @property
    def clean_build_log(self) -> Path:
        """The log of a release's clean build, in its scratch build root."""
        return self.build_root / "release-build.log"

    @property
    def offline_kit_dir(self) -> Path:
        return self.build_root / "offline-kit"

    @property
    def offline_kit_tar(self) -> Path:
        return self.build_root / "offline-kit.tar"

    @property
    def load_kit_script(self) -> Path:
        return self.build_root / "load_kit.py"

    @property
    def offline_kit_sha256(self) -> Path:
        """The archive's sha256, `sha256sum -c` format: the kit's authenticity, carried apart."""
        return self.build_root / "offline-kit.tar.sha256"


class Layout(ProjectLayout):
    """Paths of one build: a model on a device (a BuildConfig)."""

    def __init__(self, cfg):
        super().__init__(cfg.root, cfg.build_root)
        self.cfg = cfg

    @property
    def model_config_path(self) -> Path:
        return self.model_config(self.cfg.model.name)

    # directories ------------------------------------------------------------------------
    @functools.cached_property
    def inputs_dir(self) -> Path:
        """Generated inputs under the build root; an export where the model config's inputs.dir
        says (resolved and checked when the config loaded). Made once per layout: every graph's
        files are under it (build_dir's reason)."""
        if self.cfg.export_dir is not None:
            return self.cfg.export_dir
        return self.generated_inputs_dir(self.cfg.model.name)

    @property
    def model_dir(self) -> Path:
        """Everything a build step writes, bar the digest cache: generated or split inputs, and
        per variant DLCs, bins, the bundle, logs."""
        return self.in_build_root(("model", self.cfg.model.name))

    @property
    def variant(self) -> tuple:
        """What a build is kept apart by: (model, device, plan, backend). Each variant has its
        own directory and dependency DB, so switching between variants rebuilds nothing that
        was built for either (graph.variants)."""
        cfg = self.cfg
        return cfg.model.name, cfg.device.name, cfg.plan.name, cfg.backend

    @property
    def _named_variant(self) -> tuple:
        return tuple(zip(("model", "device", "plan", "backend"), self.variant))

    @functools.cached_property
    def build_dir(self) -> Path:
        """The variant's own directory, under its model's. Made (its names checked) once per
        layout: the task graph asks for it hundreds of times (every DLC, bin and bundle file)."""
        return self.in_build_root(*self._named_variant)

    def doit_db(self, name: str = DOIT_DB) -> Path:
        """This variant's dependency DB (`name`: doit-db-md5.json for `doit bench`)."""
        return self.in_build_root(*self._named_variant, base=self.db_dir) / name

    def model_db(self, name: str = DOIT_DB) -> Path:
        """The dependency DB of this model's own steps (inputs:*)."""
        return self.model_doit_db(self.cfg.model.name, name)

    @property
    def dlc_dir(self) -> Path:
        return self.build_dir / "dlc"

    @property
    def bin_dir(self) -> Path:
        return self.build_dir / "bin"

    @property
    def bundle_dir(self) -> Path:
        return self.build_dir / "bundle"

    @property
    def logs_dir(self) -> Path:
        return self.build_dir / "logs"

    @property
    def split_dir(self) -> Path:
        """A qai-hub-models export split locally: the parts' files, under the build root."""
        return self.generated_inputs_dir(self.cfg.model.name)

    @property
    def is_tree(self) -> bool:
        return self.cfg.inputs.source == "qai-hub-models"

    @property
    def splits_locally(self) -> bool:
        return self.is_tree and self.cfg.inputs.split == "local"

    # files ------------------------------------------------------------------------------
    def graph_files(self, graph: Graph) -> GraphInputs:
        """Where a graph's files are: written by hexbundle (generated, split locally) or the
        export's own files in place, as the import recorded them ([inputs.graphs])."""
        if self.is_tree and not self.splits_locally:
            entry = self.cfg.inputs.graphs[graph.name]
            return GraphInputs(self.inputs_dir / entry.onnx,
                               tuple(self.inputs_dir / d for d in entry.data),
                               self.inputs_dir / entry.encodings)
        directory = self.split_dir if self.splits_locally else self.inputs_dir
        onnx_path, data, encodings = graph_files(directory, graph)
        return GraphInputs(onnx_path, (data,), encodings)

    def every_graph_files(self) -> dict:
        """Graph name -> its files (graph_files), for every graph of the plan: what the
        runtime's float and quantized references read (runtime.parts)."""
        return {g.name: self.graph_files(g) for p in self.cfg.plan.parts()
                for g in self.cfg.model.graphs(p)}

    def unsplit_slots(self) -> list:
        """The unsplit graphs of an export split locally, by Graph.slot: prompt, token (or
        prompt_cl<C>, token_cl<C> for each of several context lengths)."""
        return [g.slot for g in self.cfg.model.graphs(self.cfg.part(1))]

    def unsplit_files(self, slot: str) -> GraphInputs:
        """The unsplit graph in `slot` (Graph.slot) of an export split locally."""
        entry = self.cfg.inputs.unsplit[slot]
        return GraphInputs(self.inputs_dir / entry.onnx,
                           tuple(self.inputs_dir / d for d in entry.data),
                           self.inputs_dir / entry.encodings)

    def onnx(self, graph: Graph) -> Path:
        return self.graph_files(graph).onnx

    def onnx_data(self, graph: Graph) -> Path:
        """The (first) data file the graph's ONNX records."""
        return self.graph_files(graph).data[0]

    def encodings(self, graph: Graph) -> Path:
        return self.graph_files(graph).encodings

    def graph_inputs(self, graph: Graph) -> list:
        return self.graph_files(graph).all

    def part_inputs(self, part: Part) -> list:
        """The files of a part's graphs, each once (the graphs share their data file)."""
        return _unique(p for g in self.cfg.model.graphs(part) for p in self.graph_inputs(g))

    def all_inputs(self) -> list:
        """Every input file of the build, each once: the graphs' ONNX, data and encodings (the
        split parts' files when the export is split locally); the tokenizer."""
        return _unique([p for part in self.cfg.plan.parts() for p in self.part_inputs(part)]
                       + [self.tokenizer])

    def source_inputs(self) -> list:
        """The user's files the build reads: the unsplit graphs when split locally, else the
        graphs' files; the tokenizer."""
        if not self.splits_locally:
            return self.all_inputs()
        return _unique([p for slot in self.unsplit_slots() for p in self.unsplit_files(slot).all]
                       + [self.tokenizer])

    @property
    def tokenizer(self) -> Path:
        if self.is_tree and self.cfg.inputs.tokenizer:
            return self.inputs_dir / self.cfg.inputs.tokenizer
        return self.inputs_dir / TOKENIZER

    def dlc(self, graph: Graph) -> Path:
        return self.dlc_dir / dlc_name(graph)

    def bin_name(self, part: Part) -> str:
        return f"{check_name(self.cfg.model.slug, 'model.slug')}_{part.tag}.bin"

    def bin(self, part: Part) -> Path:
        return self.bin_dir / self.bin_name(part)

    def bundle_files(self) -> list:
        names = list(BUNDLE_CONFIG_FILES)
        names += [self.bin_name(p) for p in self.cfg.plan.parts()] + [MANIFEST]
        return [self.bundle_dir / n for n in names + self.runtime_bundle_files()]

    def runtime_bundle_files(self) -> list:
        """A qairt or ortqnn bundle's launcher and required runtime files
        (config/runtime_files.py), and the other clients' files, as bundle-relative POSIX
        paths; the optional ones are there when the SDK or wheel has them. An ortqnn bundle
        has no genie-t2t-run (no wheel carries it: run.sh takes the board's)."""
        cfg = self.cfg
        if cfg.backend not in ("qairt", "ortqnn"):
            return []
        from hexbundle.config.runtime_files import (RUNNER, client_paths,   # its table
                                                    runtime_files, script_name)
        out = [script_name(cfg.device.os)]
        if cfg.runtime == "bundled":
            out += [f.bundle_path for f in runtime_files(cfg.device.os, cfg.device.dsp_arch)
                    if f.required and not (cfg.backend == "ortqnn" and f.role == RUNNER)]
            out += list(client_paths(cfg.model.name, cfg.device.os, cfg.device.dsp_arch).values())
        return out

    @property
    def build_info(self) -> Path:
        return self.build_dir / "build-info.json"

    @property
    def manifest(self) -> Path:
        return self.bundle_dir / MANIFEST

    @property
    def release_name(self) -> str:
        """The release archive's name and top directory: model-device-plan."""
        return f"{self.cfg.model.name}-{self.cfg.device.name}-{self.cfg.plan.name}"

    @property
    def release_archive(self) -> Path:
        return self.release_dir / f"{self.release_name}.tar.gz"

    @property
    def release_provenance(self) -> Path:
        return self.release_dir / RELEASE_PROVENANCE

    @property
    def release_sums(self) -> Path:
        return self.release_dir / RELEASE_SUMS

    @property
    def verify_report(self) -> Path:
        """`doit verify`'s JSON report."""
        return self.build_dir / "verify" / "report.json"

    def log(self, task: str) -> Path:
        return self.logs_dir / (task.replace(":", "__") + ".log")

    @property
    def origins_dir(self) -> Path:
        return self.build_dir / "origins"

    def step_origin(self, task: str) -> Path:
        """Where task's outputs came from (formats.origins): built here, or a remote cache."""
        return self.origins_dir / (task.replace(":", "__") + ".json")

    @functools.cached_property
    def records(self) -> "Records":
        """What formats.origins reads and writes: paths and the naming of files, no Layout."""
        return Records(self.origins_dir, self.state_dir, self.root, self.build_root,
                       self.logical)


class Records:
    """Where the doit side keeps its records of a variant's steps (formats.origins): the
    origin records' directory, the build root's state directory, the project and the build
    root (a record's file names are resolved against them), and `logical`, how a manifest
    names a file (Layout.logical)."""
    __slots__ = ("origins_dir", "state_dir", "root", "build_root", "logical")

    def __init__(self, origins_dir: Path, state_dir: Path, root: Path, build_root: Path,
                 logical):
        self.origins_dir, self.state_dir = origins_dir, state_dir
        self.root, self.build_root, self.logical = root, build_root, logical

    def step_origin(self, task: str) -> Path:
        return self.origins_dir / (task.replace(":", "__") + ".json")


def _unique(paths) -> list:
    out, seen = [], set()
    for p in paths:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out
