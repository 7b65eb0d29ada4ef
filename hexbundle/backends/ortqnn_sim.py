"""`doit verify` of an ortqnn bundle on Qualcomm's simulator: the x64 HTP simulator inside
QAIRT's QnnHtp.dll (docs/backends.md "The simulator", docs/verify.md).

A bundle's bin holds a part's prompt and token graphs with their weights stored once, and a
bin with shared weights does not run on the simulator ("Shared weights buffer isn't
supported"). So verify
  - recompiles each part's bin from the QDQ models convert wrote, with the compile step's
    options, and requires the bundle's bin to be the same bytes (`recompiled`: the compile is
    deterministic; this is also how a bin is told to be which part, since ONNX Runtime names
    the graphs inside by a hash);
  - compiles each graph's QDQ model ALONE into its own unshared bin (`own_bins`), the same
    compiler, options and graph, and runs that on the simulator (`SimulatedGraph`), one driver
    process per graph kept for the whole sequence (the driver's `serve` mode: a Wine start and
    a session per graph, not per step).
The own bins are verify-time artifacts under the verify directory, each in a directory named
after what it is made from (the QDQ model's digest, the toolchain version, the EP options), so
a rerun of verify reuses them and anything they depend on makes new ones. They are not
deployed and not made by compile: a bundle build does not pay for them.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from hexbundle.config.backend_options import CompileOptions
from hexbundle.backends.ortqnn import OrtQnnBackend, _timeout, ep_options, link_or_copy
from hexbundle.backends.ortqnn_kit import Kit, _worth_logging, ensure_kit, windows_path
from hexbundle.config.toolchain import project_root
from hexbundle.formats.driver_tensors import read_outputs, write_inputs
from hexbundle.formats.qairt_version import read_file_release
from hexbundle.formats.qnn_context import read_qnn_context
from hexbundle.runtime.sessions import IoInfo
from hexbundle.support import hashing
from hexbundle.support.atomic import staged_dir
from hexbundle.support.errors import BackendError, VerifyError

SIMULATOR_DIR = "simulator"     # under the verify directory: the graphs' own bins


@dataclass(frozen=True)
class OwnBin:
    """A graph's own (unshared) context binary and the EPContext model that points at it."""
    graph: str
    model: Path                  # the EPContext ONNX the simulator session loads
    bin: Path


def _own_key(dlc: Path, options: CompileOptions) -> str:
    """What a graph's own bin is made from: its QDQ model's bytes, the toolchain (pins and
    driver) and the EP options."""
    text = json.dumps({"qdq": hashing.file_digest(dlc),
                       "toolchain": OrtQnnBackend().toolchain_version(),
                       "ep": ep_options(options)}, sort_keys=True)
    return hashing.bytes_digest(text.encode())[:16]


# the file names inside an own bin's directory: the same for every graph, so the same QDQ model
# (a graph's and the reference rebuilt from the export's files, when they are the same bytes)
# compiles to the same bytes once (ONNX Runtime hashes the model's file name into the bin)
OWN_MODEL = "graph"


def own_bins(dlcs: dict, options: CompileOptions, directory: Path,
             log: Callable[[str], None]) -> dict:
    """{graph name: OwnBin}: each graph's QDQ model (dlcs: name -> path) compiled alone for the
    part's device, into directory/<key>/ (made whole or not at all; reused when there)."""
    kit = ensure_kit(project_root())
    made = {}
    for name, dlc in dlcs.items():
        final = directory / _own_key(dlc, options)
        own = OwnBin(name, final / f"{OWN_MODEL}.onnx", final / f"{OWN_MODEL}_qnn.bin")
        if not (own.model.is_file() and own.bin.is_file()):
            started = time.monotonic()
            with staged_dir(final, 0o755) as staging:
                model = staging / f"{OWN_MODEL}.model.onnx"
                link_or_copy(dlc, model)
                kit.compile([(model, staging / own.model.name)], ep_options(options), log,
                            _timeout())
                model.unlink()
                if not (staging / own.bin.name).is_file():
                    raise BackendError(f"the QNN EP wrote no context binary of {name} alone")
            log(f"{name}: its own bin compiled in {time.monotonic() - started:.1f} s")
        made[name] = own
    return made


def prune_own_bins(directory: Path, used: set) -> None:
    """Remove the own bins' directories this verify did not use (made of other QDQ models,
    another toolchain or other options)."""
    if directory.is_dir():
        for stale in directory.iterdir():
            if stale not in used:
                shutil.rmtree(stale, ignore_errors=True)


def recompiled(dlcs: list, options: CompileOptions, scratch: Path,
               log: Callable[[str], None]) -> Path:
    """The part's bin compiled again from its QDQ models with the compile step's options (the
    bundle's bin must be these bytes)."""
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / "recompiled.bin"
    OrtQnnBackend().compile(dlcs, out, options, log)
    return out


def describe_executor(kit: Kit, own: OwnBin, ort_version: str) -> str:
    """What produced the outputs, from the bytes: the bin's QAIRT build string and targets, the
    release QnnHtp.dll states, ONNX Runtime's version as its DLL reports it."""
    built = read_file_release(own.bin)
    dll = read_file_release(kit.bin / "QnnHtp.dll")
    targets = ", ".join(f"{s} v{a}" for s, a in read_qnn_context(own.bin).targets)
    release = built.release.dotted if built.release else "unknown"
    return (f"ortqnn simulator, QAIRT {release} (bin build "
            f"{built.release.text if built.release else built.describe()}; QnnHtp.dll "
            f"{dll.release.text if dll.release else dll.describe()}): the x64 HTP simulator "
            f"for {targets}, through ONNX Runtime {ort_version or 'unknown'} under "
            f"{'Wine' if kit.wine else 'Windows'}")


def _dtype_name(elem_type: int) -> str:
    from onnx import helper
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name


def _zero_point_bits(elem_type: int) -> int:
    """The bitwidth of a QuantizeLinear/DequantizeLinear zero point's ONNX type."""
    from onnx import TensorProto as T
    return {T.INT4: 4, T.UINT4: 4, T.INT8: 8, T.UINT8: 8, T.INT16: 16, T.UINT16: 16,
            T.INT32: 32}[elem_type]


class _Encodings:
    """`info.activations` as verify reads it (output_scale, kv_entry_scales): each graph
    output's encoding from the DequantizeLinear that makes it in the QDQ model the bin was
    compiled from."""

    def __init__(self, activations: dict):
        self.activations = activations


def output_encodings(qdq_model: Path) -> dict:
    """{graph output: {"dtype": "int", "scale": [s], "bitwidth": b}} for every output a
    per-tensor DequantizeLinear makes (its scale initializer; the bitwidth its zero point's
    type has, uint8 where it has none, as ONNX defines)."""
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(qdq_model), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    found = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] in outputs \
                and node.input[1] in inits:
            scale = numpy_helper.to_array(inits[node.input[1]])
            if scale.size == 1:
                zero = inits.get(node.input[2]) if len(node.input) > 2 else None
                bits = _zero_point_bits(zero.data_type) if zero else 8
                found[node.output[0]] = {"dtype": "int", "scale": [float(scale.reshape(-1)[0])],
                                         "bitwidth": bits}
    return found


class SimulatedGraph:
    """A GraphExecutor (runtime.sessions) over a graph's own bin on the simulator: the driver
    serves the EPContext model's session from the first run() until close()."""

    def __init__(self, kit: Kit, own: OwnBin, qdq_model: Path, scratch: Path,
                 log: Callable[[str], None] = lambda line: None):
        import onnx
        self.kit, self.own, self.scratch, self.log = kit, own, scratch, log
        self.name = own.graph
        model = onnx.load(str(own.model), load_external_data=False)
        self.inputs = [self._io(v) for v in model.graph.input]
        self.outputs = [self._io(v) for v in model.graph.output]
        self.info = _Encodings(output_encodings(qdq_model))
        self.ort_version = ""
        self.runs, self.run_seconds, self.start_seconds = 0, 0.0, 0.0
        self._proc: Optional[subprocess.Popen] = None
        self._buffer = b""

    @staticmethod
    def _io(value) -> IoInfo:
        t = value.type.tensor_type
        return IoInfo(value.name, _dtype_name(t.elem_type), tuple(d.dim_value for d in t.shape.dim))

    # ------------------------------------------------------------------------- the driver

    def _start(self) -> None:
        kit = self.kit
        self.scratch.mkdir(parents=True, exist_ok=True)
        cmd = ([kit.wine] if kit.wine else []) + [
            str(kit.driver), "serve", windows_path(kit.bin / "onnxruntime.dll"),
            windows_path(kit.bin / "onnxruntime_providers_qnn.dll"),
            "--ep", "backend_path=" + windows_path(kit.bin / "QnnHtp.dll"), "--",
            windows_path(self.own.model)]
        started = time.monotonic()
        self._stderr = open(self.scratch / "driver.err", "wb")
        try:
            self._proc = subprocess.Popen(cmd, cwd=kit.bin, env=kit.environment(),
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._stderr)
        except OSError as exc:
            raise BackendError(f"cannot run {cmd[0]}: {exc.strerror}") from None
        for line in self._lines_until(lambda l: l.startswith("serving ")):
            if line.startswith("onnxruntime "):
                self.ort_version = line.split()[1]
        self.start_seconds = time.monotonic() - started

    def _readline(self, deadline: float) -> Optional[str]:
        """The driver's next stdout line, or None at its end; a BackendError past deadline."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise BackendError(f"the simulator gave no answer for {self.name} in "
                                   f"{_timeout():.0f} s; raise HEXBUNDLE_ORTQNN_TIMEOUT")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                data = os.read(fd, 1 << 16)
                if not data:
                    if not self._buffer:
                        return None
                    data = b"\n"
                self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode("utf-8", "replace").rstrip("\r")

    def _lines_until(self, last: Callable[[str], bool]) -> list:
        """The driver's lines up to and including the one `last` accepts; a BackendError with
        its stderr if it ends first."""
        deadline = time.monotonic() + _timeout()
        lines = []
        while True:
            line = self._readline(deadline)
            if line is None:
                self._fail()
            lines.append(line)
            if last(line):
                return lines

    def _fail(self) -> None:
        code = self._proc.wait()
        self._stderr.close()
        said = [l for l in (self.scratch / "driver.err").read_text(errors="replace").splitlines()
                if _worth_logging(l)]
        self._proc = None
        raise VerifyError(f"the simulator failed on {self.name} ({self.own.bin.name}, exit "
                          f"{code}):\n  " + "\n  ".join(said[-12:]))

    # ------------------------------------------------------------------------- GraphExecutor

    def run(self, feeds: dict) -> dict:
        if self._proc is None:
            self._start()
        in_dir, out_dir = self.scratch / "in", self.scratch / "out"
        write_inputs(in_dir, [np.ascontiguousarray(feeds[i.name], dtype=i.dtype)
                              for i in self.inputs])
        out_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            self._proc.stdin.write(f"{windows_path(in_dir)}\t{windows_path(out_dir)}\n".encode())
            self._proc.stdin.flush()
        except BrokenPipeError:
            self._fail()
        lines = self._lines_until(lambda l: l == "done")
        self.runs += 1
        self.run_seconds += time.monotonic() - started
        arrays = read_outputs("\n".join(lines), out_dir)
        names = [l.split()[2] for l in lines if l.startswith("output ")]
        return {name: np.array(a) for name, a in zip(names, arrays)}

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            self._stderr.close()
