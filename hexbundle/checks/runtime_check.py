"""check_bundle's `runtime` check: what a board runs the bundle with.

From the bundle's manifest.json (hexbundle's bundles; others have none and are said to be not
judged): a reference-backend bundle runs on no board, so its runtime is not judged (said so); a
qairt bundle either carries the runtime (runtime = "bundled") or names the QAIRT version the
board must have installed (runtime = "board", printed). A bundled runtime is judged by the one
table (config/runtime_files.py) for the board OS the manifest names:
  - every required file there (the ones Genie or QNN load by bare name especially);
  - every file in lib/ and bin/ built for the board's CPU: ELF aarch64, or PE arm64 on Windows;
  - every skel in dsp/ a Hexagon ELF of the device's dsp_arch (htp_backend_ext_config.json),
    read from its e_flags: a v75 skel on a v73 device is refused;
  - on Windows, the skel's signing catalog (dsp/libqnnhtpvNN.cat) beside it, listing that
    skel's digest (formats/catalog.py): a catalog of another release is as good as none;
  - one QAIRT release, reread from the bytes (formats/qairt_version.py): every runtime file's
    build string / AISW_VERSION and every bin's build string, against each other and the
    manifest's qairt_version; and each file's statements as the manifest's "versions" records;
  - run.sh / run.cmd sets LD_LIBRARY_PATH (PATH) to lib/ and ADSP_LIBRARY_PATH ';'-separated
    with dsp/ first (formats/runscript.py's reader), and changes into the bundle;
  - every runtime file's digest is the manifest's.
"""
from __future__ import annotations

import json
from pathlib import Path

from hexbundle.config.layout import HTP_EXT_CONFIG, MANIFEST
from hexbundle.config.runtime_files import BIN, DSP, LIB, TARGETS, is_windows, runtime_files
from hexbundle.formats.binimage import read_image
from hexbundle.formats.catalog import catalog_signs
from hexbundle.formats.qairt_version import mixed_releases, parse_release, read_file_release
from hexbundle.formats.runscript import adsp_problems, library_paths
from hexbundle.support.hashing import file_digest


def check_runtime(report, htp) -> None:
    """Adds the `runtime` check's problems and notes to `report` (checks.genie_bundle)."""
    bundle = report.path
    try:
        manifest = json.loads((bundle / MANIFEST).read_text())
    except (OSError, ValueError):
        report.notes.append(f"runtime: no readable {MANIFEST}, so the board runtime is not "
                            "judged (a bundle hexbundle did not make?)")
        return
    if not isinstance(manifest, dict):
        return
    report.checked.append("runtime")
    if manifest.get("backend") != "qairt":
        report.notes.append(f"runtime: a {manifest.get('backend')!r}-backend bundle, not "
                            "deployable: no board runs it, so it has no runtime to judge; the "
                            "rest is judged as for any bundle")
        return
    runtime = manifest.get("runtime")
    if not isinstance(runtime, dict) or runtime.get("target") not in TARGETS:
        report.problem("runtime", f"{MANIFEST}: a qairt bundle with no 'runtime' record (board "
                                  "OS, QAIRT version): rebuild it with `doit bundle "
                                  "backend=qairt`")
        return
    target, qairt, genie = runtime["target"], runtime.get("qairt_version"), \
        runtime.get("genie_version")
    arch = _device_arch(htp) or runtime.get("dsp_arch", "")
    _check_script(report, runtime)
    _check_releases(report, manifest, runtime)
    if runtime.get("mode") == "board":
        report.notes.append(f"runtime = \"board\": no runtime in the bundle; the board "
                            f"({target}) must have QAIRT {qairt} installed (libGenie {genie}), "
                            "and run.sh checks the version it prints")
        return
    for f in runtime_files(target, arch):
        if f.required and not (bundle / f.bundle_path).is_file():
            loaded = " (Genie/QNN load it by name: the run fails or silently loses features " \
                     "without it)" if f.by_name else ""
            report.problem("runtime", f"{f.bundle_path}: missing ({f.role} for {target} "
                                      f"{arch}){loaded}; take it from the SDK's {f.sdk_path}")
    _check_images(report, target, arch)
    _check_catalogs(report, target, arch)
    _check_digests(report, manifest, runtime)
    report.notes.append(f"runtime: QAIRT {qairt} for {target} {arch} (libGenie {genie}), "
                        f"{len(runtime.get('files', []))} file(s)")


def _device_arch(htp) -> str:
    devices = htp.get("devices") if isinstance(htp, dict) else None
    if isinstance(devices, list) and devices and isinstance(devices[0], dict):
        arch = devices[0].get("dsp_arch")
        return arch if isinstance(arch, str) else ""
    return ""


def _files_in(folder: Path) -> list:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def _check_images(report, target: str, arch: str) -> None:
    bundle = report.path
    want = ("PE", "arm64") if is_windows(target) else ("ELF", "aarch64")
    for path in _files_in(bundle / LIB) + _files_in(bundle / BIN):
        rel = path.relative_to(bundle).as_posix()
        image = read_image(path)
        if (image.format, image.machine) != want:
            report.problem("runtime", f"{rel}: {image.describe()}, not {' '.join(want)}: the "
                                      f"board ({target}) cannot load it; take the SDK's "
                                      f"lib/{target} file")
    for path in _files_in(bundle / DSP):
        rel = path.relative_to(bundle).as_posix()
        if path.suffix == ".cat":
            continue   # a signing catalog: _check_catalogs
        image = read_image(path)
        if image.machine != "hexagon":
            report.problem("runtime", f"{rel}: {image.describe()}, not a Hexagon ELF: the NPU "
                                      "cannot load it")
        elif arch and image.hexagon_arch != arch.lower():
            report.problem("runtime", f"{rel}: a Hexagon {image.hexagon_arch} skel (its "
                                      f"e_flags), the device is {arch} ({HTP_EXT_CONFIG}): "
                                      f"take the SDK's lib/hexagon-{arch}/unsigned skel")


def _check_catalogs(report, target: str, arch: str) -> None:
    """Windows loads the skel only beside a catalog that signs it: the table's catalog must
    list the table's skel (its absence is the required-files check's)."""
    if not is_windows(target):
        return
    table = runtime_files(target, arch)
    skels = [report.path / f.bundle_path for f in table if f.kind == "hexagon"]
    for f in (f for f in table if f.kind == "catalog"):
        cat = report.path / f.bundle_path
        for skel in (s for s in skels if s.is_file() and cat.is_file()):
            if not catalog_signs(cat, skel):
                report.problem("runtime", f"{f.bundle_path}: does not sign "
                                          f"{skel.relative_to(report.path).as_posix()} (its "
                                          "digest is not in the catalog): Windows refuses to "
                                          "load the skel (transportStatus 9); take the skel and "
                                          "its catalog from one QAIRT release")


def _stated_releases(report, names: list) -> dict:
    """{bundle path: FileRelease} of the files that exist, read from their bytes (a bin is read
    whole: where a real one keeps its build string in its payload is not fixed)."""
    found = {}
    for rel in (n for n in names if isinstance(n, str)):
        path = report.path / rel
        if not path.is_file():
            continue   # the required-files and ctx-bins checks say so
        try:
            found[rel] = read_file_release(path)
        except OSError as exc:
            report.problem("runtime", f"{rel}: cannot read it ({exc.strerror})")
    return found


def _check_releases(report, manifest: dict, runtime: dict) -> None:
    """One QAIRT release in the bundle, from the bytes: the runtime files', the bins', and the
    manifest's qairt_version; and each runtime file's statements as recorded."""
    recorded = runtime.get("versions") if isinstance(runtime.get("versions"), dict) else {}
    bins = sorted(n for n in report.entries if n.endswith(".bin") and report.has_file(n))
    found = _stated_releases(report, list(runtime.get("files") or []) + bins)
    stated = {}
    for rel, release in found.items():
        if release.problem():
            report.problem("runtime", f"{rel}: {release.problem()}")
        elif release.release:
            stated[rel] = release.release
        if rel in recorded and recorded[rel] != release.record():
            report.problem("runtime", f"{rel}: says {release.describe()}, {MANIFEST} records "
                                      f"{recorded[rel]}: changed since it was bundled")
    label = parse_release(str(runtime.get("qairt_version")))
    if label is not None:
        stated[f"{MANIFEST} qairt_version"] = label
    mixed = mixed_releases(stated)
    if mixed:
        report.problem("runtime", f"not one QAIRT release ({mixed}): the board loads them "
                                  "together (a stub and a skel of two releases: err 1008; bins "
                                  "of another release: err 5000/5004/5005); rebuild the bundle "
                                  "from one SDK")
    silent = [n for n in bins if n in found and not found[n].stated]
    if silent:
        report.notes.append(f"runtime: {len(silent)} bin(s) state no QAIRT build string in "
                            "their bytes: their release is not checked here")


def _check_script(report, runtime: dict) -> None:
    name = runtime.get("script", "run.sh")
    path = report.path / name
    if not path.is_file():
        report.problem("runtime", f"{name}: missing: the board has no launcher that sets the "
                                  "library paths; rebuild the bundle")
        return
    text = path.read_text(errors="replace")
    found = library_paths(text)
    windows = is_windows(runtime["target"])
    libvar = "PATH" if windows else "LD_LIBRARY_PATH"
    if runtime.get("mode") == "board":
        return
    if not any(f"{LIB}" in v.replace("\\", "/").split("/") or v.endswith(LIB) or
               f"/{LIB}$" in v or f"{LIB};" in v for v in found.get(libvar, [])):
        report.problem("runtime", f"{name}: does not put the bundle's {LIB}/ on {libvar}: "
                                  "QNN loads its libraries by bare name")
    adsp = found.get("ADSP_LIBRARY_PATH", [])
    if not adsp:
        report.problem("runtime", f"{name}: does not set ADSP_LIBRARY_PATH: the NPU would load "
                                  "whatever skel the board has (err 1008 when it is stale)")
    for value in adsp:
        for problem in adsp_problems(value):
            report.problem("runtime", f"{name}: {problem}")
    if not windows and 'cd "$HERE"' not in text:
        report.problem("runtime", f"{name}: does not change into the bundle: "
                                  "genie_config.json's relative paths follow the working "
                                  "directory")


def _check_digests(report, manifest: dict, runtime: dict) -> None:
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    for rel in list(runtime.get("files", [])) + [runtime.get("script", "run.sh")]:
        entry = files.get(rel)
        path = report.path / rel
        if not isinstance(entry, dict):
            report.problem("runtime", f"{rel}: not in {MANIFEST}'s files")
        elif path.is_file() and file_digest(path) != entry.get("xxh3_128"):
            report.problem("runtime", f"{rel}: its digest is not the one {MANIFEST} records: "
                                      "changed since it was bundled; rebuild the bundle")
