"""Where every file of a build lives. Paths handed to doit are project-relative strings, so a
target of one task and the file_dep of the next are the same string (doit matches them exactly).

build/<model>/inputs/                  generated inputs (tiny models), device-independent
build/<model>/<device>/dlc/            one DLC per graph
build/<model>/<device>/bin/            one context binary per part
build/<model>/<device>/bundle/         the Genie bundle
build/<model>/<device>/logs/           one log per step
build/<model>/<device>/verify/         `doit verify`'s report
"""
from __future__ import annotations

from pathlib import Path

from hexbundle.config.build import BuildConfig
from hexbundle.config.model import Graph, Part

GENIE_CONFIG = "genie_config.json"
HTP_EXT_CONFIG = "htp_backend_ext_config.json"
TOKENIZER = "tokenizer.json"
BUNDLE_CONFIG_FILES = (GENIE_CONFIG, HTP_EXT_CONFIG, TOKENIZER)
MANIFEST = "manifest.json"


class Layout:
    def __init__(self, cfg: BuildConfig):
        self.cfg = cfg
        self.root = cfg.root

    def rel(self, path: Path) -> str:
        """Project-relative when inside the project (stable doit keys), else absolute."""
        path = Path(path)
        if not path.is_absolute():
            return str(path)
        try:
            return str(path.resolve().relative_to(self.root))
        except ValueError:
            return str(path.resolve())

    def logical(self, path: Path) -> str:
        """A path as recorded in manifests: relative to the project, with the build root spelled
        "build/" wherever it really is, so the record does not depend on where the build ran."""
        path = Path(path).resolve()
        try:
            return "build/" + str(path.relative_to(self.cfg.build_root.resolve()))
        except ValueError:
            return self.rel(path)

    # directories ------------------------------------------------------------------------
    @property
    def inputs_dir(self) -> Path:
        return self.cfg.inputs_dir

    @property
    def build_dir(self) -> Path:
        return self.cfg.build_dir

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
    def digest_cache(self) -> Path:
        return self.state_dir / "digests.json"

    @property
    def state_dir(self) -> Path:
        """hexbundle's own state: digest cache, doit database, lock."""
        return self.cfg.build_root / ".hexbundle"

    # files ------------------------------------------------------------------------------
    def onnx(self, graph: Graph) -> Path:
        return self.inputs_dir / f"{graph.name}.onnx"

    def onnx_data(self, graph: Graph) -> Path:
        return self.inputs_dir / f"{graph.name}.data"

    def encodings(self, graph: Graph) -> Path:
        return self.inputs_dir / f"{graph.name}.encodings"

    def graph_inputs(self, graph: Graph) -> list:
        return [self.onnx(graph), self.onnx_data(graph), self.encodings(graph)]

    def all_inputs(self) -> list:
        """Every input file of the build: each graph's ONNX, .data, .encodings; the tokenizer."""
        out = []
        for part in self.cfg.plan.parts():
            for graph in self.cfg.model.graphs(part):
                out += self.graph_inputs(graph)
        return out + [self.tokenizer]

    @property
    def tokenizer(self) -> Path:
        return self.inputs_dir / TOKENIZER

    def dlc(self, graph: Graph) -> Path:
        return self.dlc_dir / f"{graph.name}.dlc"

    def bin_name(self, part: Part) -> str:
        return f"{self.cfg.model.slug}_{part.tag}.bin"

    def bin(self, part: Part) -> Path:
        return self.bin_dir / self.bin_name(part)

    def bundle_files(self) -> list:
        names = list(BUNDLE_CONFIG_FILES)
        names += [self.bin_name(p) for p in self.cfg.plan.parts()] + [MANIFEST]
        return [self.bundle_dir / n for n in names]

    @property
    def build_info(self) -> Path:
        return self.build_dir / "build-info.json"

    @property
    def manifest(self) -> Path:
        return self.bundle_dir / MANIFEST

    @property
    def verify_report(self) -> Path:
        """`doit verify`'s JSON report."""
        return self.build_dir / "verify" / "report.json"

    def log(self, task: str) -> Path:
        return self.logs_dir / (task.replace(":", "__") + ".log")
