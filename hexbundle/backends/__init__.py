"""Backends turn ONNX + encodings into a DLC (convert) and DLCs into a context binary (compile).

"reference" is embedded (numpy + onnx, open formats, not deployable); "qairt" drives the real
SDK; "ortqnn" drives QAIRT's HTP compiler from the onnxruntime-qnn wheel through ONNX Runtime. Backends are imported lazily so nothing here needs the SDK.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from hexbundle import __version__
# The values a convert and a compile are given (re-exported: a backend's interface)
from hexbundle.config.backend_options import CompileOptions, ConvertOptions, DeviceOptions
from hexbundle.formats import FORMAT_VERSION   # not formats.container: describe() needs no numpy
from hexbundle.support.errors import BackendError


class Backend(Protocol):
    name: str
    deployable: bool                  # False: outputs are for inspection, not for a device
    # True: convert checks each weight's values (inputs.validate.WeightValueCheck) in the pass
    # that reads them anyway; False: the convert step scans them before the backend runs
    checks_weight_values: bool
    # True: its outputs record the key they were made for (made_for); a fetched one that
    # records none or another is refused (steps/check.py)
    marks_outputs: bool

    def toolchain_version(self) -> str: ...

    # `made_for`: the step's output key (steps/outputkey.py), recorded in the output by a
    # backend whose format can hold it (reference); a real SDK's files cannot (qairt).
    # `part_graphs`: ((onnx, encodings), ...) of the part's other graphs, given to a backend of
    # steps.options.READS_PART_GRAPHS (ortqnn); the others are given none.
    def convert(self, onnx_path: Path, encodings_path: Path, dlc_path: Path, graph_name: str,
                options: ConvertOptions, log: Callable[[str], None],
                made_for: str = ..., part_graphs: tuple = ...) -> None: ...

    def compile(self, dlc_paths: list, bin_path: Path, options: CompileOptions,
                log: Callable[[str], None], made_for: str = ...) -> None: ...

    # The key an output records it was made for; None when the backend's format cannot record
    # one (then only remote_cache_trust says whether a fetched one is believed).
    def made_for(self, path: Path) -> "str | None": ...

    # What the backend checks of an output it made, for one it did not make here (a remote
    # cache's): a BackendError/FormatError if the file is not what it must be.
    def check_dlc(self, dlc_path: Path, graph_name: str, log: Callable[[str], None]) -> None: ...

    def check_bin(self, bin_path: Path, options: CompileOptions,
                  log: Callable[[str], None]) -> None: ...




def reference_toolchain_version() -> str:
    return f"hexbundle-reference {__version__} format {FORMAT_VERSION}"


def describe(name: str) -> tuple:
    """(toolchain version, deployable) without importing the backend: every doit run asks
    (banner, up-to-date keys), and importing onnx or the SDK would cost a no-op build a second."""
    if name == "reference":
        return reference_toolchain_version(), False
    if name == "qairt":
        from hexbundle.config.toolchain import pinned_sdk_version
        return f"QAIRT {pinned_sdk_version()}", True
    if name == "ortqnn":   # the module imports no onnx at import time
        from hexbundle.backends.ortqnn import OrtQnnBackend
        return OrtQnnBackend().toolchain_version(), OrtQnnBackend.deployable
    raise BackendError(f"unknown backend {name!r}; choose reference, qairt or ortqnn")


def toolchain_files(name: str, root: Path) -> tuple:
    """The files describe(name) reads besides hexbundle's code and configs/ (what the no-op stamp
    must watch for the toolchain key, graph.noopstamp): the reference backend's version is its
    code, and qairt's is the pin in configs/toolchain.toml; ortqnn's is the kit's pins and its
    driver's source (backends/ortqnn_kit.kit_fingerprint)."""
    if name == "ortqnn":
        from hexbundle.backends.ortqnn_kit import DRIVER_SOURCE, PIN_FILE
        return (Path(root) / PIN_FILE, DRIVER_SOURCE)
    if name not in ("reference", "qairt"):
        raise BackendError(f"unknown backend {name!r}; choose reference, qairt or ortqnn")
    return ()


# The backends whose DLC and bin record the key they were made for (Backend.marks_outputs),
# known without importing them (graph.remote_steps asks before a step runs).
MARKING_BACKENDS = ("reference",)


def marks_outputs(name: str) -> bool:
    return name in MARKING_BACKENDS
