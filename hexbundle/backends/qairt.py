"""The qairt backend: QAIRT 2.42's Python API, called exactly as the seeds call it.

Why the Python API and never the CLI: `qnn-context-binary-generator` in multi-graph mode does not
pack 4-bit weights and its JSON parser drops `weights_packing`, `O` and `weight_sharing_enabled`
with an "Unknown Key" line and exit code 0 (a 2x binary). The Python API hands the same options
to the QNN C API as objects, and they are honoured.

Per graph (the `convert` step):
    model = qairt.convert(onnx, encodings=encodings, float_bitwidth=16)
    model.save(<graph>.dlc)
Per part (the `compile` step):
    models = [qairt.load(<prompt>.dlc), qairt.load(<token>.dlc)]
    config = CompileConfig(backend="HTP",
        graph_custom_configs=[HtpGraphConfig(name=g, optimization_type=3, weights_packing=True,
                                             vtcm_size_in_mb=8) for g in (prompt, token)],
        context_custom_configs=[HtpContextConfig(weight_sharing_enabled=True)],
        device_custom_configs=[HtpDeviceConfig(soc_model=77, dsp_arch="v73",
            cores=[HtpDeviceCoreConfig(perf_profile=PerfProfile.BURST, rpc_control_latency=100)])])
    qairt.compile(models, config=config).save(<part>.bin)
(values from the device config and [compile]; the ones shown are Qwen2.5-7B on IQ-9075).

convert returns an in-memory Model, but convert and compile are separate doit steps (a DLC per
graph is the unit of caching), so the DLC goes to disk with Model.save and comes back with
qairt.load; qairt.compile then hands the loaded DLCs' paths to the context-binary generator,
which is what it does with any saved Model. One list of models gives one context binary holding
both graphs with shared weights.

Before anything else the SDK found at run time (sdk.yaml of $QAIRT_SDK_ROOT or $QNN_SDK_ROOT)
must be the pinned version. While an SDK call runs, everything it says -- Python logging, Python
prints, and what its C++ libraries and child processes write to file descriptors 1 and 2 -- is
copied line by line into the step's log, and any "Unknown Key" or "[ ERROR ]" line fails the
step even though the call returned normally (the seeds' silent-ignore trap). The output is then
not kept. The capture is process-wide: run qairt steps in the container (each its own process),
or with `-n 1` under the local executor.
"""
from __future__ import annotations

import ctypes
import importlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from hexbundle.backends import CompileOptions, ConvertOptions
from hexbundle.config.toolchain import load_toolchain, require_pinned_sdk
from hexbundle.support.atomic import output_path, temp_dir
from hexbundle.support.errors import BackendError

MARKERS = ("Unknown Key", "[ ERROR ]")   # a line with either fails the step
SHOWN_FLAGGED = 10


class QairtBackend:
    name = "qairt"
    deployable = True

    def __init__(self):
        self.tc = load_toolchain()
        self.sdk = require_pinned_sdk(self.tc)      # before the SDK is even imported
        self.api = import_sdk(self.sdk.root)

    def toolchain_version(self) -> str:
        return f"QAIRT {self.sdk.version}"

    # -----------------------------------------------------------------------------------------
    def convert(self, onnx_path: Path, encodings_path: Path, dlc_path: Path, graph_name: str,
                options: ConvertOptions, log: Callable[[str], None]) -> None:
        log(f"qairt.convert({onnx_path.name}, encodings={encodings_path.name}, "
            f"float_bitwidth={options.float_bitwidth}) -> {dlc_path.name}")
        with output_file(dlc_path) as tmp, scratch_dir(dlc_path.parent):
            with sdk_output(log, f"qairt convert of {graph_name}"):
                model = self.api.qairt.convert(str(onnx_path), encodings=str(encodings_path),
                                               float_bitwidth=options.float_bitwidth)
                saved = model.save(str(tmp))
            _settle(saved, tmp)

    def compile(self, dlc_paths: list, bin_path: Path, options: CompileOptions,
                log: Callable[[str], None]) -> None:
        config = self.compile_config(options)
        log(f"qairt.compile([{', '.join(p.name for p in dlc_paths)}], config={config!r}) -> "
            f"{bin_path.name}")
        with output_file(bin_path) as tmp, scratch_dir(bin_path.parent):
            with sdk_output(log, f"qairt compile of {bin_path.name}"):
                models = [self.api.qairt.load(str(p)) for p in dlc_paths]
                check_graph_names(models, dlc_paths, options.graph_names)
                compiled = self.api.qairt.compile(models, config=config)
                saved = compiled.save(str(tmp))
            _settle(saved, tmp)

    def compile_config(self, o: CompileOptions):
        """The seeds' CompileConfig, every value from the device file and [compile]."""
        a, d = self.api, o.device
        graphs = [a.HtpGraphConfig(name=name, optimization_type=o.optimization_type,
                                   weights_packing=o.weights_packing,
                                   vtcm_size_in_mb=d.vtcm_mb) for name in o.graph_names]
        core = a.HtpDeviceCoreConfig(perf_profile=perf_profile(a.PerfProfile, d.perf_profile),
                                     rpc_control_latency=d.rpc_control_latency)
        return a.CompileConfig(
            backend="HTP",
            graph_custom_configs=graphs,
            context_custom_configs=[a.HtpContextConfig(weight_sharing_enabled=o.weight_sharing)],
            device_custom_configs=[a.HtpDeviceConfig(soc_model=d.soc_model, dsp_arch=d.dsp_arch,
                                                     cores=[core])])


# ---------------------------------------------------------------------------------------------
# the SDK's modules

class _Api:
    """The SDK modules and classes the backend uses, by the paths the seeds import them from."""

    def __init__(self, qairt, compiler_config, htp_config):
        self.qairt = qairt
        self.CompileConfig = compiler_config.CompileConfig
        self.HtpGraphConfig = htp_config.HtpGraphConfig
        self.HtpContextConfig = htp_config.HtpContextConfig
        self.HtpDeviceConfig = htp_config.HtpDeviceConfig
        self.HtpDeviceCoreConfig = htp_config.HtpDeviceCoreConfig
        self.PerfProfile = htp_config.PerfProfile


def import_sdk(sdk_root: Path) -> _Api:
    """Import the SDK's Python API from <root>/lib/python (the image already has it on
    PYTHONPATH; a local SDK install may not)."""
    lib = str(sdk_root / "lib" / "python")
    if lib not in sys.path:
        sys.path.insert(0, lib)
    try:
        return _Api(importlib.import_module("qairt"),
                    importlib.import_module("qairt.api.compiler.config"),
                    importlib.import_module("qairt.api.common.backends.htp.config"))
    except ImportError as exc:
        raise BackendError(f"{sdk_root}: cannot import the QAIRT Python API from {lib} "
                           f"({exc}); is the SDK complete, and are its Python dependencies "
                           "installed (requirements/container.in)?") from None


def perf_profile(enum, name: str):
    try:
        return enum[name.upper()]
    except KeyError:
        raise BackendError(f"perf_profile {name!r} (device config [htp]) is not one of the "
                           f"SDK's PerfProfile members: {', '.join(m.name for m in enum)}") from None


def check_graph_names(models: list, dlc_paths: list, expected: tuple) -> None:
    """The HtpGraphConfigs are matched to graphs by name: a DLC whose graph is named otherwise
    would silently get none of them."""
    for model, path, want in zip(models, dlc_paths, expected):
        names = getattr(getattr(model, "module", None), "graph_names", None)
        found = list(names()) if callable(names) else None
        if found is not None and found != [want]:
            raise BackendError(f"{path}: holds graph(s) {found}, but the compile config is for "
                               f"{want!r}: the graph options would not apply; reconvert it")


# ---------------------------------------------------------------------------------------------
# outputs: a temp path beside the target (support.atomic), renamed into place only on success

def output_file(final: Path):
    """The path the SDK saves to: `final`'s own name (the .dlc / .bin suffix) inside a temp
    directory beside it; moved over `final` only when the step succeeds. Not fsynced, as
    before."""
    return output_path(final, sync=False, same_name=True)


def _settle(saved, tmp: Path) -> None:
    """save() returns where it wrote; put that at the temp name if it chose another path."""
    if saved and Path(saved) != tmp and Path(saved).is_file():
        os.replace(saved, tmp)
    if not tmp.is_file():
        raise BackendError(f"the SDK reported saving to {saved!r} but {tmp} does not exist")


@contextmanager
def scratch_dir(near: Path):
    """QAIRT_TMP_DIR (and TMPDIR, which qairt.convert sets from it) on the build disk: the SDK
    writes whole DLCs and binaries there, too big for a container's /tmp in memory."""
    saved = {k: os.environ.get(k) for k in ("QAIRT_TMP_DIR", "TMPDIR")}
    with temp_dir(near, "qairt-scratch") as path:
        os.environ["QAIRT_TMP_DIR"] = os.environ["TMPDIR"] = str(path)
        try:
            yield path
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# ---------------------------------------------------------------------------------------------
# everything the SDK says, into the step's log, scanned

_capture_lock = threading.Lock()      # one capture at a time: they redirect process-wide fds
_forwarding = threading.local()


class _Capture:
    def __init__(self, log: Callable[[str], None], saved_stdout: int):
        self.log, self.saved_stdout = log, saved_stdout
        self.flagged = []
        self.lock = threading.Lock()

    def line(self, text: str) -> None:
        text = text.rstrip("\r\n")
        if getattr(_forwarding, "active", False):
            # log() itself printed (the container's step runner logs to stdout): bypass the
            # capture, to the real stdout, or each line would come round again
            os.write(self.saved_stdout, (text + "\n").encode(errors="replace"))
            return
        if any(m.lower() in text.lower() for m in MARKERS):
            with self.lock:
                self.flagged.append(text)
        _forwarding.active = True
        try:
            self.log(f"[sdk] {text}")
        finally:
            _forwarding.active = False


class _LineStream:
    """sys.stdout / sys.stderr while the SDK runs: whole lines to the capture (a partial line
    is kept per thread, so two threads' prints do not splice)."""

    def __init__(self, capture: _Capture):
        self.capture, self.local = capture, threading.local()

    def write(self, s: str) -> int:
        buf = getattr(self.local, "buf", "") + s
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            self.capture.line(line)
        self.local.buf = buf
        return len(s)

    def flush(self) -> None:
        pass

    def close_line(self) -> None:
        if getattr(self.local, "buf", ""):
            self.capture.line(self.local.buf)
            self.local.buf = ""

    def isatty(self) -> bool:
        return False


class _LogHandler(logging.Handler):
    def __init__(self, capture: _Capture):
        super().__init__(logging.INFO)
        self.capture = capture

    def emit(self, record: logging.LogRecord) -> None:
        # The QNN log format, so a Python-level error is flagged like a C++ one.
        self.capture.line(f"[ {record.levelname} ] {record.name}: {record.getMessage()}")


def _fflush_c() -> None:
    try:
        ctypes.CDLL(None).fflush(None)   # C stdio buffers of the SDK's libraries
    except (OSError, AttributeError):
        pass


@contextmanager
def sdk_output(log: Callable[[str], None], what: str):
    """Capture everything said during the block into `log`; fail on a flagged line."""
    with _capture_lock:
        sys.stdout.flush()
        sys.stderr.flush()
        _fflush_c()
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        capture = _Capture(log, saved[1])
        read_end, write_end = os.pipe()
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        os.close(write_end)
        reader = threading.Thread(target=_pump, args=(read_end, capture), daemon=True)
        reader.start()
        streams = sys.stdout, sys.stderr
        out, err = _LineStream(capture), _LineStream(capture)
        sys.stdout, sys.stderr = out, err
        handler, root = _LogHandler(capture), logging.getLogger()
        root_level = root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        failure = None
        try:
            yield capture
        except Exception as exc:  # noqa: BLE001 -- any SDK exception: traceback to the log
            for text in traceback.format_exc().splitlines():
                capture.line(text)
            failure = exc
        finally:
            root.removeHandler(handler)
            root.setLevel(root_level)
            out.close_line()
            err.close_line()
            sys.stdout, sys.stderr = streams
            _fflush_c()
            os.dup2(saved[1], 1)
            os.dup2(saved[2], 2)
            reader.join(timeout=10)   # EOF once no fd 1/2 points at the pipe any more
            for fd in saved.values():
                os.close(fd)
    if failure is not None:
        if isinstance(failure, BackendError):
            raise failure
        raise BackendError(f"{what} failed: {type(failure).__name__}: {failure}"
                           + _flagged_text(capture)) from None
    if capture.flagged:
        raise BackendError(
            f"{what}: the SDK logged {len(capture.flagged)} error line(s) although the call "
            "returned normally -- an option the SDK does not apply (e.g. weights_packing dropped "
            "as an unknown key) silently doubles a 4-bit binary, so the output was not kept:" + _flagged_text(capture))


def _flagged_text(capture: _Capture) -> str:
    if not capture.flagged:
        return ""
    shown = "\n  ".join(capture.flagged[:SHOWN_FLAGGED])
    more = len(capture.flagged) - SHOWN_FLAGGED
    return f"\n  {shown}" + (f"\n  ... and {more} more (see the log)" if more > 0 else "")


def _pump(fd: int, capture: _Capture) -> None:
    with os.fdopen(fd, "rb") as pipe:
        for raw in pipe:
            capture.line(raw.decode(errors="replace"))
