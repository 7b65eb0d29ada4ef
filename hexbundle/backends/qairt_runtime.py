"""The QAIRT runtime in a qairt bundle: taken from the SDK root that compiled the bins, for the
board's OS (config/runtime_files.py: the table), with its versions checked at build time.

  - The runtime's QAIRT release is read from the SDK's own runtime files for the board (their
    build strings and AISW_VERSION: formats/qairt_version.py) and must be one release with
    sdk.yaml's version: a stub of one release and a skel of another is err 1008 on a board, and
    an SDK whose files are not what its sdk.yaml says would label the bundle wrong.
  - Every context binary is read with the SDK's qnn-context-binary-utility (the qairt backend's
    bin_facts); one whose buildId is not of that release (its version and build date: the
    utility prints the long form, v2.42.0.251225135753_193295), or whose socModel / dspArch is
    not the device's, stops the bundle step naming the bin: a runtime of another QAIRT than the
    compile fails on the board with 5000 / 5004 / 5005, and it is this step that pairs them.
  - The runtime files are copied from the SDK root (required ones missing: an error naming the
    SDK path); their digests go into the manifest with the rest of the bundle's files, and what
    each says of its release into the runtime section's "versions" (check_bundle rereads them).
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
from hexbundle.formats.qairt_version import (Release, mixed_releases, parse_release,
                                             read_file_release)
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


@dataclass(frozen=True)
class SdkRuntime:
    """What the bundle step reads of an SDK: its root (messages name it), sdk.yaml (the release
    it claims), the Genie header and the table's runtime files it holds ({sdk_path: Path})."""
    root: Path
    release_file: Path
    genie_header: Path
    files: dict

    @classmethod
    def at(cls, root: Path, target: str, dsp_arch: str) -> "SdkRuntime":
        """The table's files for the board that are in the SDK at `root`."""
        present = {f.sdk_path: root / f.sdk_path for f in runtime_files(target, dsp_arch)
                   if (root / f.sdk_path).is_file()}
        return cls(root, root / SDK_RELEASE, root / GENIE_HEADER, present)

    @classmethod
    def declared(cls, release_file: Path, genie_header: Path, files: list) -> "SdkRuntime":
        """From the bundle step's declared inputs (inputs(): sdk.yaml at the root)."""
        root = release_file.parent
        return cls(root, release_file, genie_header,
                   {p.relative_to(root).as_posix(): p for p in files})

    def inputs(self) -> list:
        """The bundle step's declared inputs by role: the runtime files ("runtime"), sdk.yaml
        ("runtime-release"), the Genie header ("runtime-genie"); their digests are its key."""
        return ([("runtime", p) for p in self.files.values()]
                + [("runtime-release", self.release_file), ("runtime-genie", self.genie_header)])


SDK_RELEASE = "sdk.yaml"


def genie_version(header: Path) -> str:
    """M.m.p from the SDK's GenieCommon.h."""
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


@dataclass(frozen=True)
class RuntimeRelease:
    """The runtime's QAIRT release, as the SDK's files and sdk.yaml state it."""
    release: Release         # the most precise statement: a build string's, else sdk.yaml's
    versions: dict           # {bundle path: what the file says (FileRelease.record())}
    aisw_files: tuple        # bundle paths whose bytes state AISW_VERSION (run.sh checks them)


def runtime_release(sdk: SdkRuntime, plan: RuntimePlan) -> RuntimeRelease:
    """Every runtime file of the board in the SDK, read for its release; all of them and
    sdk.yaml's version must be one QAIRT release, else an error naming which file says which."""
    versions, stated, aisw = {}, {}, []
    for f in runtime_files(plan.target, plan.dsp_arch):
        src = sdk.files.get(f.sdk_path)
        if src is None:
            continue   # bundle_runtime says what is missing
        try:
            found = read_file_release(src)
        except OSError as exc:
            raise BackendError(f"{src}: cannot read it ({exc.strerror})") from None
        if found.problem():
            raise BackendError(f"{src}: {found.problem()}: is the SDK file intact?")
        versions[f.bundle_path] = found.record()
        if found.release:
            stated[f.sdk_path] = found.release
        if found.aisw:
            aisw.append(f.bundle_path)
    claimed = parse_release(plan.qairt_version)
    if claimed is None:
        raise BackendError(f"{sdk.release_file}: version {plan.qairt_version!r} is not a "
                           "QAIRT version (X.Y.Z.YYMMDD)")
    mixed = mixed_releases({**stated, "sdk.yaml": claimed})
    if mixed:
        raise BackendError(f"{sdk.root}: the runtime files for {plan.target} {plan.dsp_arch} "
                           f"and sdk.yaml are not one QAIRT release ({mixed}): a board loads "
                           "them together (a stub and a skel of two releases: err 1008), and "
                           "the bundle would be labelled with a release it does not hold. "
                           "Use one QAIRT release whole, as Qualcomm ships it (sdk.yaml and "
                           "every file)")
    dated = [r for r in stated.values() if r.date]
    return RuntimeRelease(dated[0] if dated else claimed, versions, tuple(aisw))


def check_bins(facts: dict, plan: RuntimePlan, runtime: RuntimeRelease) -> dict:
    """{bin name: what the utility says} after checking each against the runtime's release
    (by what identifies a release: version and build date) and the device."""
    out = {}
    for name, f in sorted(facts.items()):
        problems = []
        made_by = parse_release(f.build_id or "")
        if made_by is None or not made_by.same_as(runtime.release):
            problems.append(f"was made by QAIRT build {f.build_id or '(not stated)'}, the "
                            f"runtime is QAIRT {runtime.release} ({runtime.release.text}): the "
                            "board would refuse it (err 5000/5004/5005); rebuild the bins with "
                            "this SDK (`doit bundle backend=qairt`)")
        if f.soc_model != plan.soc_model or (f.dsp_arch or "").lower() != plan.dsp_arch.lower():
            problems.append(f"is for soc_model {f.soc_model} {f.dsp_arch}, the device is "
                            f"soc_model {plan.soc_model} {plan.dsp_arch} (err 1008 on the board)")
        if problems:
            raise InputError(f"{name}: the context binary, as qnn-context-binary-utility reads "
                             "it, " + "; ".join(problems))
        out[name] = bin_record(f)
    return out


def bundle_runtime(sdk: SdkRuntime, plan: RuntimePlan, runtime: RuntimeRelease, staging: Path,
                   log: Callable[[str], None]) -> dict:
    """Copy the runtime into `staging` and write the launcher; returns the manifest's
    "runtime" section (the bin records are added by the caller)."""
    gv = genie_version(sdk.genie_header)
    copied = []
    if plan.mode == "bundled":
        for f in runtime_files(plan.target, plan.dsp_arch):
            src = sdk.files.get(f.sdk_path)
            if src is None:
                src = sdk.root / f.sdk_path   # named in the messages
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
        log(f"runtime for {plan.target} {plan.dsp_arch}: {len(copied)} file(s) from {sdk.root}")
    else:
        log(f"runtime = \"board\": no runtime bundled; the board needs QAIRT {plan.qairt_version}"
            f" (libGenie {gv}) for {plan.target}")
    script = staging / script_name(plan.target)
    checked = tuple(p for p in runtime.aisw_files if p in copied)
    sizes = tuple((p, (staging / p).stat().st_size) for p in checked)   # run.cmd checks them
    write_atomic(script, render(RunScript(plan.target, plan.mode, plan.qairt_version, gv,
                                          plan.htp_device_id, runtime.release.dotted,
                                          checked, sizes)).encode())
    script.chmod(0o755)
    return {"mode": plan.mode, "target": plan.target, "dsp_arch": plan.dsp_arch,
            "qairt_version": plan.qairt_version, "qairt_build": runtime.release.text,
            "genie_version": gv, "htp_device_id": plan.htp_device_id, "script": script.name,
            "files": copied,
            # what each runtime file says of its release (check_bundle rereads the bytes)
            "versions": {p: v for p, v in runtime.versions.items() if p in copied}}
