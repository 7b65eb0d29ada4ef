"""The QAIRT runtime in an ortqnn bundle: taken from the onnxruntime-qnn wheel of the SAME QAIRT
release as the compiler (requirements/ortqnn-runtime.txt: 2.7.0 = QAIRT 2.51.0, manylinux
aarch64 for a Linux board, win_arm64 for a Windows one), pinned by sha256 and found in the
ortqnn wheelhouse (`doit ortqnn_kit` fetches it; nothing here touches the network).

  - Which files: the one table (config/runtime_files.py), each at its wheel member
    (`wheel_member`). genie-t2t-run is in no wheel: the bundle records `runner: "board"` and its
    run.sh takes the board's (formats/runscript.py).
  - Versions, from the bytes: every runtime file's build string / AISW_VERSION
    (formats/qairt_version.py) and every bin's build string must be one QAIRT release, which is
    the compiler's (backends/ortqnn.py QAIRT_RELEASE); the Genie API version is read from the
    library's own code (formats/genie_api.py). The manifest records them; check_bundle rereads
    them (checks/runtime_check.py).
  - No wheel carries an Android runtime: an Android board is refused, naming what to do.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from pathlib import Path
from typing import Callable

from hexbundle.backends.ortqnn_kit import WHEELHOUSE, WHEELHOUSE_ENV
from hexbundle.config.runtime_files import (RUNNER, WHEEL_PLATFORMS, runtime_files, script_name,
                                            wheel_member)
from hexbundle.formats.genie_api import genie_api_version_of
from hexbundle.formats.qairt_version import mixed_releases, parse_release, read_file_release
from hexbundle.formats.runscript import RunScript, render
from hexbundle.support.atomic import write_atomic
from hexbundle.support.errors import BackendError, HexbundleError, InputError

PIN_FILE = "requirements/ortqnn-runtime.txt"

# For which boards an ortqnn bundle is deployable: none yet, and why (the manifest's
# runtime.deployment; docs/backends.md). Each reason read from the real files, not guessed.
DEPLOYABLE_ON = ()
NOT_DEPLOYABLE_BECAUSE = (
    "graph names: ONNX Runtime names the bins' graphs QNN_QNN_<hash>_1_0 (read from the bins) "
    "and the QNN EP offers no way to name them. Genie 2.51.0 takes a graph's context length "
    "from its name when the tensors do not give it, and orders a model's splits by "
    "'<prefix>_<split_num>_of_<total_num>' names; its config schema "
    "(urn:genie:schema:htpBackend, embedded in libGenie) can only select graphs by name "
    "(execute-select-graphs, graph-retention-order), not rename or order them. Measured with "
    "the x64 Genie.dll of the same release on QAIRT's simulator: GenieDialog_create fails on "
    "these bins after 'Couldn't determine context length from tensors. Attempting to parse "
    "context length from graph name.' with 'stoi argument out of range' (docs/backends.md)",
    "genie-t2t-run: in no onnxruntime-qnn wheel; run.sh needs the board's, of QAIRT 2.51.0",
    "never run on a board: no device here; the bins run only on QAIRT's x64 HTP simulator, one "
    "graph's own bin at a time (a shared bin does not simulate)",
)


def wheelhouse(root: Path) -> Path:
    return Path(os.environ.get(WHEELHOUSE_ENV) or Path(root) / WHEELHOUSE)


def runtime_inputs(root: Path, target: str) -> list:
    """The bundle step's declared runtime inputs (steps/options.bundle_inputs), by role: the pin
    file ("runtime-pins") and the wheelhouse's wheels named as the board OS's pin
    ("runtime"). Found by name, not hashed: this runs on every doit run, no-op ones too; the
    step checks the sha256 (runtime_wheel). None found (no kit yet, an Android board): none
    declared, and the step says what to do."""
    pins = Path(root) / PIN_FILE
    found = []
    try:
        pin = platform_pin(pins, target)
        stem = pin.name.replace("-", "_")
        found = sorted(wheelhouse(root).glob(
            f"{stem}-{pin.version}-*{WHEEL_PLATFORMS[target]}.whl"))
    except BackendError:
        pass   # the step, given the pin file, raises the same error
    return [("runtime-pins", pins)] + [("runtime", w) for w in found]


def platform_pin(pins: Path, target: str):
    """The pin (formats.pinfile's Locked) of the board OS's runtime wheel in the pin file."""
    from hexbundle.formats.pinfile import read_platform_pins
    if target not in WHEEL_PLATFORMS:
        raise BackendError(f"backend ortqnn: no onnxruntime-qnn wheel carries the QAIRT runtime "
                           f"for {target} (only {', '.join(WHEEL_PLATFORMS)}): build for a Linux "
                           "or Windows board (a board file's [device] os), or with "
                           "runtime=board and the board's own QAIRT install")
    try:
        wanted = [e for e, platform in read_platform_pins(pins)
                  if platform == WHEEL_PLATFORMS[target]]
    except (HexbundleError, OSError) as exc:
        raise BackendError(str(exc) if isinstance(exc, HexbundleError) else
                           f"{pins}: cannot read it ({exc.strerror})") from None
    if len(wanted) != 1:
        raise BackendError(f"{pins}: {len(wanted)} wheel(s) pinned for platform "
                           f"{WHEEL_PLATFORMS[target]} (the runtime for {target}); pin one")
    return wanted[0]


def runtime_wheel(pins: Path, wheels: list, target: str) -> tuple:
    """(wheel path, sha256) of the pinned runtime wheel for the board OS among `wheels` (the
    step's declared ones): the one whose sha256 the pin file lists."""
    pin = platform_pin(pins, target)
    for wheel in wheels:
        try:
            digest = _sha256(wheel)
        except FileNotFoundError:
            continue
        if digest in pin.hashes:
            return wheel, digest
    name = f"{pin.name.replace('-', '_')}-{pin.version}"
    tried = ", ".join(str(w) for w in wheels) or \
        f"none in the wheelhouse ({WHEELHOUSE} or ${WHEELHOUSE_ENV})"
    raise BackendError(f"no {name} {WHEEL_PLATFORMS[target]} wheel with the sha256 {PIN_FILE} "
                       f"pins (the QAIRT runtime for {target}; tried: {tried}); run "
                       "`python3 -m doit ortqnn_kit` where PyPI is reachable and bring the "
                       "directory along")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def extract_runtime(wheel: Path, target: str, dsp_arch: str, staging: Path,
                    log: Callable[[str], None]) -> list:
    """The table's files for the board out of the wheel into staging (bundle paths); a
    required one missing from the wheel is an error naming it. Returns the bundle paths."""
    copied = []
    with zipfile.ZipFile(wheel) as whl:
        members = set(whl.namelist())
        for f in runtime_files(target, dsp_arch):
            if f.role == RUNNER:
                log(f"{RUNNER}: in no onnxruntime-qnn wheel; run.sh takes the board's")
                continue
            member = wheel_member(f)
            if member not in members:
                if f.required:
                    raise BackendError(f"{wheel.name}: no {member} ({f.role} for {target} "
                                       f"{dsp_arch}): this wheel does not carry the runtime for "
                                       "that Hexagon version")
                log(f"{member}: not in {wheel.name} (optional, {f.role}): not bundled")
                continue
            dst = staging / f.bundle_path
            dst.parent.mkdir(exist_ok=True)
            with whl.open(member) as src, open(dst, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            dst.chmod(0o644)
            copied.append(f.bundle_path)
    return copied


def read_versions(staging: Path, copied: list, bins: list, compiler: str) -> tuple:
    """({bundle path: record}, the dated release, [paths stating AISW_VERSION]) of the runtime
    files and bins, after checking they and the compiler (`compiler`, "2.51.0") are one
    QAIRT release; an error naming which file says which otherwise."""
    versions, stated, aisw = {}, {}, []
    for rel in copied:
        found = read_file_release(staging / rel)
        if found.problem():
            raise BackendError(f"{rel}: {found.problem()}: is the wheel intact?")
        versions[rel] = found.record()
        if found.release:
            stated[rel] = found.release
        if found.aisw:
            aisw.append(rel)
    for b in bins:
        found = read_file_release(b)
        if found.release is None:
            raise InputError(f"{b}: states no QAIRT build string ({found.describe()}): not a "
                             "bin of the ortqnn compiler; rebuild it (`doit bundle`)")
        stated[b.name] = found.release
    stated["the compiler (backends/ortqnn.py)"] = parse_release(compiler)
    mixed = mixed_releases(stated)
    if mixed:
        raise BackendError(f"the bins, the runtime wheel's files and the compiler are not one "
                           f"QAIRT release ({mixed}): a board loads them together (err 1008 / "
                           "5000); pin the runtime wheel of the compiler's release in "
                           f"{PIN_FILE}")
    dated = [r for r in stated.values() if r.date]
    return versions, dated[0], aisw


def bundle_runtime(pins: Path, wheels: list, plan, bins: list, staging: Path, compiler: str,
                   log: Callable[[str], None]) -> dict:
    """The runtime of the compiler's release for the board (`plan`: backends/qairt_runtime's
    RuntimePlan) into staging, run.sh written; returns the manifest's "runtime" section. The
    wheel is the one of `wheels` (the step's declared inputs) that `pins` pins."""
    wheel, digest = runtime_wheel(pins, wheels, plan.target)
    genie_lib = wheel_member(next(f for f in runtime_files(plan.target, plan.dsp_arch)
                                  if f.role == "libGenie"))
    with zipfile.ZipFile(wheel) as whl:
        genie = genie_api_version_of(whl.read(genie_lib), f"{wheel.name}:{genie_lib}")
    copied = extract_runtime(wheel, plan.target, plan.dsp_arch, staging, log) \
        if plan.mode == "bundled" else []
    versions, release, aisw = read_versions(staging, copied, bins, compiler)
    log(f"runtime: QAIRT {release} ({release.text}), libGenie API {genie}, for {plan.target} "
        f"{plan.dsp_arch}: {len(copied)} file(s) from {wheel.name} (sha256 {digest[:16]}...)")
    script = staging / script_name(plan.target)
    write_atomic(script, render(RunScript(plan.target, plan.mode, str(release), genie,
                                          plan.htp_device_id, release.dotted, tuple(aisw),
                                          runner="board")).encode())
    script.chmod(0o755)
    return {"mode": plan.mode, "target": plan.target, "dsp_arch": plan.dsp_arch,
            "qairt_version": str(release), "qairt_build": release.text, "genie_version": genie,
            "htp_device_id": plan.htp_device_id, "script": script.name, "files": copied,
            "runner": "board",
            "source": {"wheel": wheel.name, "sha256": digest, "pins": PIN_FILE},
            "versions": versions,
            "deployment": {"deployable_on": list(DEPLOYABLE_ON),
                           "not_deployable_because": list(NOT_DEPLOYABLE_BECAUSE)},
            "bins": {b.name: {"buildId": read_file_release(b).release.text} for b in bins}}
