"""The QAIRT runtime in a qairt bundle: taken from the SDK root that compiled the bins, for the
board's OS (config/runtime_files.py: the table), with its versions checked at build time.

  - Every context binary is read with the SDK's qnn-context-binary-utility (the qairt backend's
    bin_facts); one whose buildId is not the runtime SDK's version, or whose socModel / dspArch
    is not the device's, stops the bundle step naming the bin: a runtime of another QAIRT than
    the compile fails on the board with 5000 / 5004 / 5005, and it is this step that pairs them.
  - The runtime files are copied from the SDK root (required ones missing: an error naming the
    SDK path); their digests go into the manifest with the rest of the bundle's files.
  - The Genie library's version (what genie-t2t-run prints, "Using libGenie.so version X") is the
    SDK's include/Genie/GenieCommon.h GENIE_API_VERSION_MAJOR/MINOR/PATCH: run.sh compares them.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hexbundle.backends.bincheck import bin_record
from hexbundle.config.runtime_files import runtime_files, script_name
from hexbundle.formats.runscript import RunScript, render
from hexbundle.support.atomic import write_atomic
from hexbundle.support.errors import BackendError, HexbundleError, InputError

GENIE_HEADER = "include/Genie/GenieCommon.h"
_GENIE_DEFINE = re.compile(r"^\s*#\s*define\s+GENIE_API_VERSION_(MAJOR|MINOR|PATCH)\s+(\d+)",
                           re.MULTILINE)


@dataclass(frozen=True)
class RuntimePlan:
    mode: str              # "bundled" | "board"
    target: str            # the board OS
    dsp_arch: str
    soc_model: int
    qairt_version: str     # "2.42.0.251225"
    htp_device_id: int


def sdk_runtime_digest(target: str, dsp_arch: str) -> str:
    """The runtime files of the SDK this process sees, by path, size and mtime (a key for the
    bundle step: cheap on every run; an SDK file replaced or edited changes it); none: ""."""
    from hexbundle.config.toolchain import installed_sdk
    try:
        root = installed_sdk().root
    except HexbundleError:
        return ""
    paths = [root / f.sdk_path for f in runtime_files(target, dsp_arch)] + [root / GENIE_HEADER]
    return ",".join(f"{p}={_stamp(p)}" for p in paths)


def _stamp(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return "-"
    return f"{st.st_size}:{st.st_mtime_ns}"


def genie_version(sdk_root: Path) -> str:
    """M.m.p from the SDK's GenieCommon.h."""
    header = sdk_root / GENIE_HEADER
    try:
        text = header.read_text(errors="replace")
    except OSError as exc:
        raise BackendError(f"{header}: cannot read it ({exc.strerror}): the Genie version the "
                           "board must load is taken from it; is the SDK complete?") from None
    found = dict(_GENIE_DEFINE.findall(text))
    if set(found) != {"MAJOR", "MINOR", "PATCH"}:
        raise BackendError(f"{header}: no GENIE_API_VERSION_MAJOR/MINOR/PATCH defines: is this "
                           "a QAIRT SDK's Genie header?")
    return f"{found['MAJOR']}.{found['MINOR']}.{found['PATCH']}"


def check_bins(facts: dict, plan: RuntimePlan) -> dict:
    """{bin name: what the utility says} after checking each against the runtime and device."""
    want = "v" + plan.qairt_version
    out = {}
    for name, f in sorted(facts.items()):
        problems = []
        if f.build_id != want:
            problems.append(f"was made by QAIRT build {f.build_id or '(not stated)'}, the "
                            f"runtime is {want}: the board would refuse it (err 5000/5004/5005); "
                            "rebuild the bins with this SDK (`doit bundle backend=qairt`)")
        if f.soc_model != plan.soc_model or (f.dsp_arch or "").lower() != plan.dsp_arch.lower():
            problems.append(f"is for soc_model {f.soc_model} {f.dsp_arch}, the device is "
                            f"soc_model {plan.soc_model} {plan.dsp_arch} (err 1008 on the board)")
        if problems:
            raise InputError(f"{name}: the context binary, as qnn-context-binary-utility reads "
                             "it, " + "; ".join(problems))
        out[name] = bin_record(f)
    return out


def bundle_runtime(sdk_root: Path, plan: RuntimePlan, staging: Path,
                   log: Callable[[str], None]) -> dict:
    """Copy the runtime into `staging` and write the launcher; returns the manifest's
    "runtime" section (the bin records are added by the caller)."""
    gv = genie_version(sdk_root)
    copied = []
    if plan.mode == "bundled":
        for f in runtime_files(plan.target, plan.dsp_arch):
            src = sdk_root / f.sdk_path
            if not src.is_file():
                if f.required:
                    raise BackendError(f"{src}: missing from the SDK root, and the bundle's "
                                       f"runtime needs it ({f.role}, for {plan.target}): is the "
                                       "SDK complete, for this board OS?")
                log(f"{f.sdk_path}: not in the SDK (optional, {f.role}): not bundled")
                continue
            dst = staging / f.bundle_path
            dst.parent.mkdir(exist_ok=True)
            shutil.copyfile(src, dst)
            dst.chmod(0o755 if f.role == "genie-t2t-run" else 0o644)
            copied.append(f.bundle_path)
        log(f"runtime for {plan.target} {plan.dsp_arch}: {len(copied)} file(s) from {sdk_root}")
    else:
        log(f"runtime = \"board\": no runtime bundled; the board needs QAIRT {plan.qairt_version}"
            f" (libGenie {gv}) for {plan.target}")
    script = staging / script_name(plan.target)
    write_atomic(script, render(RunScript(plan.target, plan.mode, plan.qairt_version, gv,
                                          plan.htp_device_id)).encode())
    script.chmod(0o755)
    return {"mode": plan.mode, "target": plan.target, "dsp_arch": plan.dsp_arch,
            "qairt_version": plan.qairt_version, "genie_version": gv,
            "htp_device_id": plan.htp_device_id, "script": script.name, "files": copied}
