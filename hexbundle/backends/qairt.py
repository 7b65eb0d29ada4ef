"""The qairt backend: QAIRT 2.42's Python API, called exactly as the seeds call it.

Why the Python API and never the CLI: `qnn-context-binary-generator` in multi-graph mode does not
pack 4-bit weights and its JSON parser drops `weights_packing`, `O` and `weight_sharing_enabled`
with an "Unknown Key" line and exit code 0 (a 2x binary). The Python API hands the same options
to the QNN C API as objects, and they are honoured.

Per graph (the `convert` step):
    model = qairt.convert(onnx, encodings=encodings, float_precision=16, truncate_64bit_io=True)
    model.save(<scratch>/<graph>.dlc)      # only the .dlc moves to dlc/
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
copied line by line into the step's log, and any ERROR record, SDK-format ERROR line, "Unknown
Key" or "[ ERROR ]" line fails the step even though the call returned normally (the seeds'
silent-ignore trap; see the capture section below for the SDK's own loggers and stdout mute).
The output is then not kept. After compile, the bin's own metadata is checked (bincheck). The capture is process-wide: run qairt steps in the container (each its own process),
or with `-n 1` under the local executor.
"""
from __future__ import annotations

import ctypes
import importlib
import logging
import os
import re
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hexbundle.backends import CompileOptions, ConvertOptions
from hexbundle.backends.bincheck import BinFacts, check_bin_facts, facts_from_utility_json
from hexbundle.config.toolchain import load_toolchain, require_pinned_sdk
from hexbundle.support.atomic import output_path, temp_dir
from hexbundle.support.errors import BackendError, InputError
from hexbundle.support.files import JSON_CONFIG_MAX_BYTES
from hexbundle.support.jsondoc import read_json

MARKERS = ("Unknown Key", "[ ERROR ]")   # a line with either fails the step
SHOWN_FLAGGED = 10


class QairtBackend:
    name = "qairt"
    deployable = True
    marks_outputs = False             # the SDK's formats have no place for the step's key
    checks_weight_values = False      # the SDK reads the weights: the convert step scans them first

    def __init__(self):
        self.tc = load_toolchain()
        self.sdk = require_pinned_sdk(self.tc)      # before the SDK is even imported
        self.api = import_sdk(self.sdk.root)

    def toolchain_version(self) -> str:
        return f"QAIRT {self.sdk.version}"

    # -----------------------------------------------------------------------------------------
    # The SDK's DLCs and context binaries have no place for the step's output key (`made_for`,
    # steps/outputkey.py): it is not recorded, and made_for() answers None (docs/remote-cache.md:
    # what a cache must be trusted with, remote_cache_trust).
    def made_for(self, path: Path) -> None:
        return None

    def convert(self, onnx_path: Path, encodings_path: Path, dlc_path: Path, graph_name: str,
                options: ConvertOptions, log: Callable[[str], None], made_for: str = "",
                part_graphs: tuple = ()) -> None:
        kwargs = convert_kwargs(options)
        log(f"qairt.convert({onnx_path.name}, encodings={encodings_path.name}, "
            + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + f") -> {dlc_path.name}")
        with output_file(dlc_path) as tmp, scratch_dir(dlc_path.parent) as scratch:
            target = scratch.save / dlc_path.name
            with sdk_output(log, f"qairt convert of {graph_name}"):
                model = self.api.qairt.convert(str(onnx_path), encodings=str(encodings_path),
                                               **kwargs)
                saved = model.save(str(target))
            _settle(saved, target, tmp, log)

    def compile(self, dlc_paths: list, bin_path: Path, options: CompileOptions,
                log: Callable[[str], None], made_for: str = "") -> None:
        config = self.compile_config(options)
        log(f"qairt.compile([{', '.join(p.name for p in dlc_paths)}], config={config!r}) -> "
            f"{bin_path.name}")
        with output_file(bin_path) as tmp, scratch_dir(bin_path.parent) as scratch:
            target = scratch.save / bin_path.name
            with sdk_output(log, f"qairt compile of {bin_path.name}"):
                models = [self.api.qairt.load(str(p)) for p in dlc_paths]
                check_graph_names(models, dlc_paths, options.graph_names)
                compiled = self.api.qairt.compile(models, config=config)
                saved = compiled.save(str(target))
            _settle(saved, target, tmp, log)
            facts = self.bin_facts(tmp, scratch.path, log)
            check_bin_facts(bin_path, facts, tuple(options.graph_names), options.device.soc_model,
                            options.device.dsp_arch, options.weight_sharing, log)

    def check_dlc(self, dlc_path: Path, graph_name: str, log: Callable[[str], None]) -> None:
        """The SDK loads it, and it holds the graph of that name (the compile's configs are
        matched to graphs by name)."""
        with sdk_output(log, f"qairt load of {dlc_path.name}"):
            model = self.api.qairt.load(str(dlc_path))
        check_graph_names([model], [dlc_path], (graph_name,))
        log(f"{dlc_path.name}: loaded by the SDK; graph {graph_name}")

    def check_bin(self, bin_path: Path, options: CompileOptions,
                  log: Callable[[str], None]) -> None:
        """What the SDK's utility says of it, checked as after a compile here."""
        with scratch_dir(bin_path.parent) as scratch:
            facts = self.bin_facts(bin_path, scratch.path, log)
        check_bin_facts(bin_path, facts, tuple(options.graph_names), options.device.soc_model,
                        options.device.dsp_arch, options.weight_sharing, log)

    def bin_info(self, bin_path: Path, log: Callable[[str], None]) -> BinFacts:
        """What the SDK's utility says of a bin, unchecked (the bundle step judges it against
        the runtime)."""
        with scratch_dir(bin_path.parent) as scratch:
            return self.bin_facts(bin_path, scratch.path, log)

    def bin_facts(self, bin_path: Path, scratch: Path, log: Callable[[str], None]) -> BinFacts:
        """`qnn-context-binary-utility --context_binary BIN --json_file OUT`, read."""
        tool = self.sdk.root / "bin" / "x86_64-linux-clang" / "qnn-context-binary-utility"
        out = scratch / "context_binary_info.json"
        cmd = [str(tool), "--context_binary", str(bin_path), "--json_file", str(out)]
        log("$ " + " ".join(cmd))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise BackendError(f"{tool}: cannot run it ({exc.strerror}); the binary cannot be "
                               "checked without it: is the SDK complete?") from None
        for line in (proc.stdout + proc.stderr).splitlines():
            log(f"[sdk] {line}")
        if proc.returncode != 0 or not out.is_file():
            raise BackendError(f"{tool} failed (exit {proc.returncode}) on the compiled "
                               f"{bin_path.name}; the output was not kept. Its output is in the "
                               "step log")
        try:
            doc = read_json(out, f"{tool.name} output", JSON_CONFIG_MAX_BYTES)
        except InputError as exc:   # not JSON, or out of support.jsondoc's bounds
            raise BackendError(f"{exc} (written by {tool.name})") from None
        return facts_from_utility_json(doc, f"{tool.name} output for {bin_path.name}")

    def compile_config(self, o: CompileOptions):
        """The seeds' CompileConfig, every value from the resolved device and [compile]."""
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


def convert_kwargs(o: ConvertOptions) -> dict:
    """qairt.convert's keyword arguments. float_precision is ConverterConfig's documented field
    (Literal[32, 16]); the undocumented float_bitwidth would pass unchecked as an extra. The LLM
    I/O options are passed only when set, under the names [compile] gives them."""
    kwargs = {"float_precision": o.float_bitwidth}
    if o.truncate_64bit_io:
        kwargs["truncate_64bit_io"] = True
    if o.quantize_io:
        kwargs["quantize_io"] = True
    if o.quantize_full_type:
        kwargs["quantize_full_type"] = o.quantize_full_type
    return kwargs


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


def _settle(saved, target: Path, tmp: Path, log: Callable[[str], None]) -> None:
    """Move the artifact the SDK saved (at `target` in the private scratch directory, or where
    save() says it wrote, which must be inside it) to the output's temp name. Nothing else that
    save() put beside it (Model.save copies the working directory's *.safetensors /
    *.encodings, CompiledModel.save its other *.bin files) goes into dlc/ or bin/: it is named
    in the log and discarded with the scratch directory."""
    path = Path(saved) if saved else target
    if path.parent != target.parent:
        raise BackendError(f"the SDK reported saving to {saved!r}, outside the directory it was "
                           f"given ({target.parent}); the output was not kept")
    if not path.is_file():
        raise BackendError(f"the SDK reported saving to {saved!r} but {path} does not exist")
    os.replace(path, tmp)
    strays = sorted(p.name for p in target.parent.iterdir())
    if strays:
        log(f"save() also wrote {', '.join(strays)} beside {target.name}: not part of the "
            "output, discarded")


@dataclass(frozen=True)
class _Scratch:
    path: Path          # the step's private scratch directory
    tmp: Path           # QAIRT_TMP_DIR / TMPDIR: the SDK's working directories
    save: Path          # save() targets: only the artifact leaves it


@contextmanager
def scratch_dir(near: Path):
    """A private scratch directory on the build disk, beside the outputs (a rename away), for
    the step: QAIRT_TMP_DIR (and TMPDIR, which qairt.convert sets from it) -- the SDK writes
    whole DLCs and binaries there, too big for a container's /tmp in memory -- and the
    directory save() writes into. Removed afterwards, with whatever the SDK left."""
    saved = {k: os.environ.get(k) for k in ("QAIRT_TMP_DIR", "TMPDIR")}
    with temp_dir(near, "qairt-scratch") as path:
        scratch = _Scratch(path, path / "tmp", path / "save")
        scratch.tmp.mkdir()
        scratch.save.mkdir()
        os.environ["QAIRT_TMP_DIR"] = os.environ["TMPDIR"] = str(scratch.tmp)
        try:
            yield scratch
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# ---------------------------------------------------------------------------------------------
# everything the SDK says, into the step's log, scanned
#
# Where the real SDK's messages go (qairt-dev 0.6.0, qairt/logging_config.yaml and
# qairt/utils/loggers.py): each area logger (qairt.convert, qairt.compile, qairt.model, ...,
# GenAIBuilder.HTP, LoraModule, ...) has propagate = False and its own StreamHandler bound to the
# sys.stdout of import time; its lines read `qairt.convert: <time> | ERROR | <func> | <file>:<line>
# - <message>`. A handler on the root alone sees none of them, and replacing sys.stdout does not
# reach a handler that holds the old stream object. qairt.compile moreover points fd 1 at
# /dev/null while the context binary is generated (maybe_suppress_stdout) unless its logger is at
# DEBUG. Hence: a handler on the root, on the `qairt` and `qti` trees and on every logger that
# does not propagate; fd 1 and 2 into a pipe; and qairt.compile at DEBUG for the duration.

SDK_TREES = ("qairt", "qti")
UNMUTE = ("qairt.compile",)          # loggers whose level decides whether fd 1 is muted
# the SDK's own log format at ERROR or above (any of its formatters)
_SDK_ERROR = re.compile(r"^\S+: .*\| (ERROR|CRITICAL|FATAL) \|")

_capture_lock = threading.Lock()      # one capture at a time: they redirect process-wide fds
_forwarding = threading.local()


class _Capture:
    def __init__(self, log: Callable[[str], None], saved_stdout: int):
        self.log, self.saved_stdout = log, saved_stdout
        self.stream_flagged = []      # lines from fds / sys.stdout / sys.stderr
        self.record_flagged = []      # (line, message) from logging records
        self.lock = threading.Lock()

    def _emit(self, text: str) -> None:
        if getattr(_forwarding, "active", False):
            # log() itself printed (the container's step runner logs to stdout): bypass the
            # capture, to the real stdout, or each line would come round again
            os.write(self.saved_stdout, (text + "\n").encode(errors="replace"))
            return
        _forwarding.active = True
        try:
            self.log(text)
        finally:
            _forwarding.active = False

    def line(self, text: str) -> None:
        """A line written to fd 1/2 or to sys.stdout/sys.stderr."""
        text = text.rstrip("\r\n")
        if getattr(_forwarding, "active", False):
            self._emit(text)
            return
        if flagged_line(text):
            with self.lock:
                self.stream_flagged.append(text)
        self._emit(f"[sdk] {text}")

    def record(self, record: logging.LogRecord) -> None:
        """A logging record, caught by a handler on the SDK's logger trees."""
        message = record.getMessage()
        text = f"{record.name}: | {record.levelname} | {message}"
        if record.levelno >= logging.ERROR or flagged_line(message):
            with self.lock:
                self.record_flagged.append((text, message))
        self._emit(f"[sdk log] {text}")

    @property
    def flagged(self) -> list:
        """Each flagged thing once: a record that the SDK's own handler also printed to a
        captured stream is quoted from the record."""
        with self.lock:
            messages = [m for _, m in self.record_flagged if m.strip()]
            out = [t for t, _ in self.record_flagged]
            out += [t for t in self.stream_flagged if not any(m in t for m in messages)]
        return out


def flagged_line(text: str) -> bool:
    low = text.lower()
    return any(m.lower() in low for m in MARKERS) or bool(_SDK_ERROR.match(text))


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
    """Attached to several loggers of one tree: a record that propagates through two of them is
    taken once."""

    def __init__(self, capture: _Capture):
        super().__init__(logging.INFO)
        self.capture = capture

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "_hexbundle_capture", None) is self.capture:
            return
        record._hexbundle_capture = self.capture
        self.capture.record(record)


def sdk_loggers() -> list:
    """The loggers the capture's handler goes on: the root, the `qairt` and `qti` trees' tops,
    and every existing logger that does not propagate (the SDK's area loggers, its own
    handler each)."""
    out = [logging.getLogger()] + [logging.getLogger(name) for name in SDK_TREES]
    for name, logger in sorted(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and not logger.propagate and logger not in out:
            out.append(logger)
    return out


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
        handler = _LogHandler(capture)
        loggers = sdk_loggers()
        for logger in loggers:
            logger.addHandler(handler)
        root = logging.getLogger()
        levels = {logger: logger.level for logger in [root] + [logging.getLogger(n) for n in UNMUTE]}
        root.setLevel(logging.INFO)
        for name in UNMUTE:     # at DEBUG, qairt.compile leaves fd 1 alone
            logging.getLogger(name).setLevel(logging.DEBUG)
        failure = None
        try:
            yield capture
        except Exception as exc:  # noqa: BLE001 -- any SDK exception: traceback to the log
            for text in traceback.format_exc().splitlines():
                capture.line(text)
            failure = exc
        finally:
            for logger in loggers:
                logger.removeHandler(handler)
            for logger, level in levels.items():
                logger.setLevel(level)
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
    flagged = capture.flagged
    if flagged:
        raise BackendError(
            f"{what}: the SDK logged {len(flagged)} error line(s) although the call returned "
            "normally -- an option the SDK does not apply (e.g. weights_packing dropped as an "
            "unknown key) silently doubles a 4-bit binary, so the output was not kept; the "
            "line(s):" + _flagged_text(capture))


def _flagged_text(capture: _Capture) -> str:
    flagged = capture.flagged
    if not flagged:
        return ""
    shown = "\n  ".join(flagged[:SHOWN_FLAGGED])
    more = len(flagged) - SHOWN_FLAGGED
    return f"\n  {shown}" + (f"\n  ... and {more} more (see the log)" if more > 0 else "")


def _pump(fd: int, capture: _Capture) -> None:
    with os.fdopen(fd, "rb") as pipe:
        for raw in pipe:
            capture.line(raw.decode(errors="replace"))
