"""The ortqnn backend's kit: Qualcomm's x64 HTP compiler from the pinned onnxruntime-qnn wheel,
ONNX Runtime's core DLL and the MSVC runtime, extracted from the wheels requirements/ortqnn.txt
pins; the driver (ortqnn_driver.c) built with mingw-w64; both run under wine64 on Linux.

  kit = ensure_kit(root)                 # extracted DLLs + built driver, or a clear error
  kit.compile(models_and_outputs, ep_options, log, timeout)

The wheels are fetched by `doit ortqnn_kit` (toolchain/wheelhouse.fetch_ortqnn) into
build/wheelhouse/ortqnn/; extraction needs no network, so a wheelhouse brought along makes an
air-gapped build. The extracted kit lives in a cache dir named after the pin file's hash
(~/.cache/hexbundle/ortqnn-<hash>/, or HEXBUNDLE_ORTQNN_KIT), written whole or not at all.
Wine runs with a private prefix inside it, the MSVC DLLs native first (Wine 8's builtin
msvcp140 deadlocks ONNX Runtime in CreateEnv) and winedbg off (a crash would otherwise wait in
Wine's debugger for ever), under a timeout.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hexbundle.support.atomic import output_path, staged_dir
from hexbundle.support.errors import BackendError

PIN_FILE = "requirements/ortqnn.txt"
WHEELHOUSE = "build/wheelhouse/ortqnn"
DRIVER_SOURCE = Path(__file__).with_name("ortqnn_driver.c")
KIT_ENV = "HEXBUNDLE_ORTQNN_KIT"
WHEELHOUSE_ENV = "HEXBUNDLE_ORTQNN_WHEELHOUSE"   # another checkout's build/wheelhouse/ortqnn
WINE_ENV = "HEXBUNDLE_WINE64"
MINGW_GCC = "x86_64-w64-mingw32-gcc"
# Debian's wine64 package installs its loader here, not on PATH (the `wine` package adds it).
WINE_CANDIDATES = ("wine64", "/usr/lib/wine/wine64", "wine")
STAMP = "hexbundle-requirements.txt"

# wheel -> (member prefix, members): what the kit takes of each pinned wheel
MEMBERS = {
    "onnxruntime_qnn": ("onnxruntime_qnn/libs/amd64/",
                        ("onnxruntime_providers_qnn.dll", "QnnHtp.dll", "HtpPrepare.dll",
                         "QnnSystem.dll", "QnnIr.dll", "QnnHtpNetRunExtensions.dll",
                         "Genie.dll")),
    "onnxruntime": ("onnxruntime/capi/", ("onnxruntime.dll", "onnxruntime_providers_shared.dll")),
    "msvc_runtime": ("msvc_runtime-{version}.data/data/Scripts/",
                     ("msvcp140.dll", "msvcp140_1.dll", "msvcp140_2.dll",
                      "msvcp140_atomic_wait.dll", "msvcp140_codecvt_ids.dll", "concrt140.dll",
                      "vcruntime140.dll", "vcruntime140_1.dll", "vcomp140.dll")),
}
NATIVE_DLLS = ("msvcp140", "msvcp140_1", "msvcp140_2", "msvcp140_atomic_wait",
               "msvcp140_codecvt_ids", "concrt140", "vcruntime140", "vcruntime140_1", "vcomp140")


@dataclass(frozen=True)
class Pin:
    name: str       # the wheel's distribution name, normalized with underscores
    version: str
    sha256: tuple


def read_pins(root: Path) -> list:
    """The pins of requirements/ortqnn.txt (name==version --hash=sha256:...)."""
    path = Path(root) / PIN_FILE
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise BackendError(f"{path}: cannot read the ortqnn pins ({exc.strerror})") from None
    pins = []
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, hashes = line.partition(" ")
        name, _, version = spec.partition("==")
        digests = tuple(h.split(":", 1)[1] for h in hashes.split() if h.startswith("--hash=sha256:"))
        if not version or not digests:
            raise BackendError(f"{path}: line {n} is not `name==version --hash=sha256:<hex>`")
        pins.append(Pin(name.replace("-", "_").lower(), version, digests))
    return pins


def qnn_pin(root: Path) -> Pin:
    pin = next((p for p in read_pins(root) if p.name == "onnxruntime_qnn"), None)
    if pin is None:
        raise BackendError(f"{Path(root) / PIN_FILE}: no onnxruntime-qnn pin; restore the file "
                           "from the repository")
    return pin


def _pin_bytes(root: Path) -> bytes:
    path = Path(root) / PIN_FILE
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BackendError(f"{path}: cannot read the ortqnn pins ({exc.strerror}); restore the "
                           "file from the repository") from None


def kit_fingerprint(root: Path) -> str:
    """12 hex digits of the pin file and the driver's source: what the kit's outputs depend on
    beyond hexbundle's Python code."""
    digest = hashlib.sha256(_pin_bytes(root))
    digest.update(DRIVER_SOURCE.read_bytes())
    return digest.hexdigest()[:12]


def kit_dir(root: Path) -> Path:
    """Where the extracted kit is: HEXBUNDLE_ORTQNN_KIT, or a cache dir named after the pins."""
    if os.environ.get(KIT_ENV):
        return Path(os.environ[KIT_ENV])
    digest = hashlib.sha256(_pin_bytes(root)).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "hexbundle" / f"ortqnn-{qnn_pin(root).version}-{digest}"


def _wheel_for(pin: Pin, wheelhouse: Path) -> Path:
    # the kit is the Windows x64 wheels; the same version's board runtimes (aarch64, win_arm64:
    # backends/ortqnn_runtime.py) share the wheelhouse and are not hashed here
    for wheel in sorted(wheelhouse.glob(f"{pin.name}-{pin.version}-*win_amd64.whl")):
        digest = hashlib.sha256()
        with open(wheel, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() in pin.sha256:
            return wheel
    raise BackendError(f"{wheelhouse}: no {pin.name}-{pin.version} wheel with the sha256 "
                       f"{PIN_FILE} pins; run `python3 -m doit ortqnn_kit` where PyPI is "
                       "reachable (it fetches the pinned wheels) and bring the directory along")


def extract_kit(root: Path, wheelhouse: Path, dest: Path) -> Path:
    """The pinned wheels' DLLs into dest, written whole (a temp dir renamed) and stamped with
    the pin file; a kit already stamped with the same pins is left alone."""
    pin_text = _pin_bytes(root).decode("utf-8", "replace")
    if (dest / STAMP).is_file() and (dest / STAMP).read_text() == pin_text:
        return dest
    wheels = [(pin, _wheel_for(pin, wheelhouse)) for pin in read_pins(root)]
    with staged_dir(dest, 0o755) as staging:
        (staging / "bin").mkdir()
        for pin, wheel in wheels:
            prefix, names = MEMBERS[pin.name]
            prefix = prefix.format(version=pin.version)
            with zipfile.ZipFile(wheel) as whl:
                for name in names:
                    with whl.open(prefix + name) as src, \
                            open(staging / "bin" / name, "wb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
        (staging / STAMP).write_text(pin_text)
    return dest


def find_wine() -> str:
    if os.environ.get(WINE_ENV):
        given = os.environ[WINE_ENV]
        if not os.access(given, os.X_OK):
            raise BackendError(f"{WINE_ENV}={given}: not an executable wine64; install wine64 "
                               "(apt-get install wine64) or point it at one")
        return given
    for candidate in WINE_CANDIDATES:
        found = shutil.which(candidate) or (candidate if os.access(candidate, os.X_OK) else None)
        if found:
            return found
    raise BackendError("backend ortqnn runs Qualcomm's Windows x64 compiler under Wine: wine64 "
                       "not found (apt-get install wine64; or set HEXBUNDLE_WINE64)")


def build_driver(kit: Path) -> Path:
    """ortqnn_driver.c compiled with mingw-w64 into the kit, named after the source's hash (an
    edit of the source builds a new one; never a committed binary)."""
    source = DRIVER_SOURCE.read_bytes()
    exe = kit / "bin" / f"ortqnn_driver-{hashlib.sha256(source).hexdigest()[:12]}.exe"
    if exe.is_file():
        return exe
    gcc = shutil.which(MINGW_GCC)
    if not gcc:
        raise BackendError(f"backend ortqnn builds its driver with {MINGW_GCC}: not found "
                           "(apt-get install gcc-mingw-w64-x86-64)")
    with output_path(exe, same_name=True) as tmp:
        proc = subprocess.run([gcc, "-O2", "-Wall", "-Werror", "-o", str(tmp), str(DRIVER_SOURCE)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BackendError(f"{DRIVER_SOURCE}: {MINGW_GCC} failed:\n"
                               f"{proc.stderr.strip()[-2000:]}")
    return exe


def windows_path(path: Path) -> str:
    """A Linux path as Wine's Z: drive sees it (native Windows: the path itself)."""
    return str(path) if sys.platform == "win32" else "Z:" + str(Path(path).resolve()).replace("/", "\\")


@dataclass(frozen=True)
class Kit:
    root: Path        # the extracted kit
    driver: Path
    wine: str         # "" on Windows

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def environment(self) -> dict:
        env = dict(os.environ)
        if self.wine:
            env["WINEPREFIX"] = str(self.root / "wineprefix")
            env["WINEDEBUG"] = "-all"
            env["WINEDLLOVERRIDES"] = ",".join(NATIVE_DLLS) + "=n,b;winedbg.exe=d"
            env["WINEPATH"] = windows_path(self.bin)
        return env

    def run(self, args: list, log: Callable[[str], None], timeout: float,
            cwd: Path = None) -> str:
        """The driver with args, in `cwd` (default the kit's bin dir); its output lines logged;
        a failure or a timeout a BackendError with its last lines."""
        cmd = ([self.wine] if self.wine else []) + [str(self.driver), *args]
        try:
            proc = subprocess.run(cmd, cwd=cwd or self.bin, env=self.environment(), timeout=timeout,
                                  capture_output=True, text=True, errors="replace", check=False)
        except subprocess.TimeoutExpired:
            raise BackendError(f"the ortqnn driver did not finish in {timeout:.0f} s "
                               f"({' '.join(cmd[:3])} ...); raise HEXBUNDLE_ORTQNN_TIMEOUT") from None
        except OSError as exc:
            raise BackendError(f"cannot run {cmd[0]}: {exc.strerror}") from None
        lines = [line for line in (proc.stdout + proc.stderr).splitlines() if _worth_logging(line)]
        for line in lines:
            log(line)
        if proc.returncode != 0:
            raise BackendError(f"the ortqnn driver failed (exit {proc.returncode}):\n  "
                               + "\n  ".join(lines[-12:]))
        return proc.stdout

    def _ep_args(self, ep_options: dict) -> list:
        """--ep options; a library the kit holds (backend_path=QnnHtp.dll) by its full path, so
        the driver may run in another directory."""
        args = []
        for key, value in ep_options.items():
            value = windows_path(self.bin / value) if (self.bin / str(value)).is_file() else value
            args += ["--ep", f"{key}={value}"]
        return args

    def compile(self, pairs: list, ep_options: dict, log: Callable[[str], None],
                timeout: float) -> None:
        """(model, EPContext output) pairs into one context binary (ortqnn_driver.c), run in
        the models' directory with their names alone: the graph names ONNX Runtime puts in the
        bin hash the model's path as given, so a full path would make the bin's bytes depend
        on where the build is. Every model and output must be in one directory."""
        where = {Path(p).parent for pair in pairs for p in pair if p is not None}
        if len(where) != 1:
            raise BackendError("ortqnn compile: the models and outputs must share one directory")
        args = ["compile", windows_path(self.bin / "onnxruntime.dll"),
                windows_path(self.bin / "onnxruntime_providers_qnn.dll"),
                *self._ep_args(ep_options), "--"]
        for model, out in pairs:
            args += [Path(model).name, "-" if out is None else Path(out).name]
        self.run(args, log, timeout, cwd=where.pop())

    def dump_dlc(self, model: Path, out_dir: Path, ep_options: dict,
                 log: Callable[[str], None], timeout: float) -> list:
        """The model's real DLC(s), written by QnnIr.dll (the EP's dump_qnn_ir_dlc) into
        out_dir: one per graph the EP takes."""
        out_dir.mkdir(parents=True, exist_ok=True)
        options = {**ep_options, "dump_qnn_ir_dlc": "1", "qnn_ir_backend_path": "QnnIr.dll",
                   "dump_qnn_ir_dlc_dir": windows_path(out_dir)}
        self.compile([(model, None)], options, log, timeout)
        return sorted(out_dir.glob("*.dlc"))


    def simulate(self, model: Path, inputs: list, scratch: Path, log: Callable[[str], None],
                 timeout: float) -> list:
        """An EPContext model run on QnnHtp's x64 HTP simulator: `inputs` (numpy arrays, in the
        model's input order) in, its outputs (numpy arrays) back. A bin with shared weights does
        not run there (QnnHtp: "Shared weights buffer isn't supported"): give a graph's own."""
        from hexbundle.formats.driver_tensors import read_outputs, write_inputs
        in_dir, out_dir = scratch / "in", scratch / "out"
        write_inputs(in_dir, inputs)
        out_dir.mkdir(parents=True, exist_ok=True)
        stdout = self.run(["run", windows_path(self.bin / "onnxruntime.dll"),
                           windows_path(self.bin / "onnxruntime_providers_qnn.dll"),
                           *self._ep_args({"backend_path": "QnnHtp.dll"}), "--",
                           windows_path(model), windows_path(in_dir), windows_path(out_dir)],
                          log, timeout)
        return read_outputs(stdout, out_dir)


# ONNX Runtime's warnings that say nothing about the build (a Linux host has no DirectX, no
# arm64 file mapping, no EPContext encryption), kept out of the step's log.
_NOISE = ("Failed to create DXGI factory", "File mapped weights feature",
          "EPContext encryption config unavailable", "that is not owned by an OrtGraph")


def _worth_logging(line: str) -> bool:
    return bool(line.strip()) and not any(n in line for n in _NOISE)


def ensure_kit(root: Path) -> Kit:
    wine = "" if sys.platform == "win32" else find_wine()
    wheelhouse = Path(os.environ.get(WHEELHOUSE_ENV) or Path(root) / WHEELHOUSE)
    kit = extract_kit(root, wheelhouse, kit_dir(root))
    return Kit(kit, build_driver(kit), wine)
