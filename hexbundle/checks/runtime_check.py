"""check_bundle's `runtime` check: what a board runs the bundle with.

From the bundle's manifest.json (hexbundle's bundles; others have none and are said to be not
judged): a reference-backend bundle runs on no board, so its runtime is not judged (said so); a
qairt or ortqnn bundle (the latter's runtime from the onnxruntime-qnn wheel of its compiler's
release, without genie-t2t-run: `runner: "board"`) either carries the runtime (runtime =
"bundled") or names the QAIRT version the board must have installed (runtime = "board",
printed). A bundled runtime is judged by the one
table (config/runtime_files.py) for the board OS the manifest names:
  - every required file there (the ones Genie or QNN load by bare name especially);
  - every file in lib/ and bin/ built for the board's CPU: ELF aarch64, or PE arm64 on Windows;
  - every skel in dsp/ a Hexagon ELF of the device's dsp_arch (htp_backend_ext_config.json),
    read from its e_flags: a v75 skel on a v73 device is refused;
  - every file in lib/ and bin/ a 64-bit ELF (a 32-bit aarch64 library is ILP32: no board's
    loader takes it);
  - every bin recorded was made by the QAIRT the manifest names (its buildId);
  - on Windows, the skel's signing catalog (dsp/libqnnhtpvNN.cat) beside it, listing that
    skel's digest (formats/catalog.py): a catalog of another release is as good as none;
  - one QAIRT release, reread from the bytes (formats/qairt_version.py): every runtime file's
    build string / AISW_VERSION and every bin's build string, against each other and the
    manifest's qairt_version; and each file's statements as the manifest's "versions" records;
  - run.sh / run.cmd sets LD_LIBRARY_PATH (PATH) to lib/ and ADSP_LIBRARY_PATH ';'-separated
    with dsp/ first (formats/runscript.py's reader), and changes into the bundle;
  - every runtime file's digest is the manifest's.
Whatever the mode, the launcher is hexbundle's own: formats/runscript.py, its one writer, writes
it again from the manifest's runtime record and it must be those bytes (a line added to it, a
CRLF copy, another QAIRT version named in it is refused even when the manifest's digest was
updated with it), executable (run.sh); and a runtime = "board" bundle holds no lib/, dsp/ or
bin/ (whose files would go unjudged).
"""
from __future__ import annotations

from pathlib import Path

from hexbundle.config.layout import HTP_EXT_CONFIG, MANIFEST
from hexbundle.config.runtime_files import BIN, DSP, LIB, TARGETS, is_windows, runtime_files
from hexbundle.formats.binimage import read_image
from hexbundle.formats.catalog import catalog_signs
from hexbundle.formats.qairt_version import (mixed_releases, parse_release, read_bin_release,
                                             read_file_release)
from hexbundle.formats.runscript import RunScript, adsp_problems, library_paths, render
from hexbundle.support.errors import InputError
from hexbundle.support.files import read_named_file
from hexbundle.support.hashing import file_digest

# the backends whose bundles name a board runtime: qairt (the SDK's), ortqnn (onnxruntime-qnn's)
RUNTIME_BACKENDS = ("qairt", "ortqnn")
# a launcher hexbundle writes is a few KiB
SCRIPT_MAX_BYTES = 256 << 10


def check_runtime(report, htp, manifest) -> None:
    """Adds the `runtime` check's problems and notes to `report` (checks.genie_bundle).
    `manifest`: the bundle's manifest.json as formats.manifest.read_manifest read it (its
    runtime record of its types), or None when there is none (or it was refused: reported)."""
    bundle = report.path
    if manifest is None:
        report.notes.append(f"runtime: no readable {MANIFEST}, so the board runtime is not "
                            "judged (a bundle hexbundle did not make?)")
        return
    report.checked.append("runtime")
    if manifest.get("backend") not in RUNTIME_BACKENDS:
        report.notes.append(f"runtime: a {manifest.get('backend')!r}-backend bundle, not "
                            "deployable: no board runs it, so it has no runtime to judge; the "
                            "rest is judged as for any bundle")
        return
    runtime = manifest.get("runtime")
    if not isinstance(runtime, dict) or runtime.get("target") not in TARGETS:
        backend = manifest.get("backend")
        report.problem("runtime", f"{MANIFEST}: a {backend} bundle with no 'runtime' record "
                                  "(board OS, QAIRT version): rebuild it with `doit bundle "
                                  f"backend={backend}`")
        return
    target, qairt, genie = runtime["target"], runtime.get("qairt_version"), \
        runtime.get("genie_version")
    arch = _device_arch(htp) or runtime.get("dsp_arch", "")
    # each runtime file and bin read once for its release: the launcher and the release checks
    # both take it from here
    found = _stated_releases(report, runtime)
    _check_script(report, manifest, runtime, found)
    _check_bins_qairt(report, runtime)
    _check_releases(report, runtime, found)
    if runtime.get("mode") == "board":
        present = [d for d in (LIB, DSP, BIN) if (bundle / d).exists()]
        if present:
            report.problem("runtime", f"{MANIFEST}: 'runtime.mode' is \"board\" (no runtime in "
                                      f"the bundle), yet it holds {', '.join(d + '/' for d in present)}: files "
                                      "a board would load, which no check would judge; rebuild "
                                      "the bundle (`doit bundle`)")
            _check_images(report, target, arch)
        report.notes.append(f"runtime = \"board\": no runtime in the bundle; the board "
                            f"({target}) must have QAIRT {qairt} installed (libGenie {genie}), "
                            "and run.sh checks the version it prints")
        return
    if runtime.get("runner") == "board" and manifest.get("backend") == "qairt":
        report.problem("runtime", f"{MANIFEST}: 'runtime.runner' is \"board\" in a qairt "
                                  "bundle, whose SDK has genie-t2t-run: its bin/ runner would "
                                  "go unjudged; rebuild the bundle (`doit bundle`)")
    for f in runtime_files(target, arch):
        if f.role == "genie-t2t-run" and runtime.get("runner") == "board":
            continue   # not bundled: run.sh takes the board's (an ortqnn bundle: no wheel has it)
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
        elif image.format == "ELF" and image.bits != 64:
            report.problem("runtime", f"{rel}: a {image.bits}-bit ELF (its class), not a 64-bit "
                                      f"{image.machine} one: the board's loader ({target}) "
                                      f"refuses it; take the SDK's lib/{target} file")
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


def _bin_names(report) -> list:
    return sorted(n for n in report.entries if n.endswith(".bin") and report.has_file(n))


def _stated_releases(report, runtime: dict) -> dict:
    """{bundle path: FileRelease} of the runtime files and bins that exist, read from their
    bytes, each once: a runtime file whole, a bin as formats/qairt_version.read_bin_release
    reads it (a QNN context binary's metadata)."""
    found = {}
    files = [n for n in runtime.get("files") or [] if isinstance(n, str)]
    for rel in files + _bin_names(report):
        path = report.path / rel
        if not path.is_file():
            continue   # the required-files and ctx-bins checks say so
        try:
            found[rel] = read_bin_release(path) if rel not in files else read_file_release(path)
        except OSError as exc:
            report.problem("runtime", f"{rel}: cannot read it ({exc.strerror})")
    return found


def _check_releases(report, runtime: dict, found: dict) -> None:
    """One QAIRT release in the bundle, from the bytes (`found`: _stated_releases): the runtime
    files', the bins', and the manifest's qairt_version; and each runtime file's statements as
    recorded."""
    recorded = runtime.get("versions") if isinstance(runtime.get("versions"), dict) else {}
    bins = _bin_names(report)
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


def _check_script(report, manifest: dict, runtime: dict, found: dict) -> None:
    name = runtime["script"]
    path = report.path / name
    if not path.is_file():
        report.problem("runtime", f"{name}: missing: the board has no launcher that sets the "
                                  "library paths; rebuild the bundle")
        return
    try:
        data = read_named_file(path, "bundle's launcher", SCRIPT_MAX_BYTES)
    except InputError as exc:
        report.problem("runtime", str(exc))
        return
    _check_script_bytes(report, _script_of(manifest, runtime, found), runtime, name, data)
    windows = is_windows(runtime["target"])
    if not windows and not path.stat().st_mode & 0o111:
        report.problem("runtime", f"{name}: not executable (mode {path.stat().st_mode & 0o777:o})"
                                  ": `./run.sh` fails on the board with 'permission denied'; "
                                  "chmod +x it, or rebuild the bundle")
    text = data.decode("utf-8", errors="replace")
    found = library_paths(text)
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


def _check_script_bytes(report, script: RunScript, runtime: dict, name: str,
                        data: bytes) -> None:
    """The launcher is exactly what formats/runscript.py writes for the manifest's runtime
    record: hexbundle wrote it, so any other byte is a change (a digest updated with it
    proves nothing)."""
    want = render(script).encode()
    if data == want:
        return
    if not is_windows(runtime["target"]) and b"\r\n" in data:
        report.problem("runtime", f"{name}: CRLF line ends (a copy through a Windows tool?): "
                                  "the board's /bin/sh reads each '\\r' as part of a command and "
                                  "fails; rebuild the bundle, or copy it as binary")
        return
    got, wanted = data.decode("utf-8", errors="replace").splitlines(), \
        want.decode().splitlines()
    line = next((i for i, (a, b) in enumerate(zip(got, wanted)) if a != b),
                min(len(got), len(wanted)))
    shown = repr(got[line][:100]) if line < len(got) else "the end of the file"
    report.problem("runtime", f"{name}: line {line + 1} is {shown}, but hexbundle writes "
                              + (repr(wanted[line][:100]) if line < len(wanted) else
                                 "nothing more")
                              + f" there for {MANIFEST}'s runtime record ({runtime['mode']}, "
                              f"{runtime['target']}, QAIRT {runtime['qairt_version']}): the "
                              "launcher was changed after the build, and the board would run "
                              "it; rebuild the bundle (`doit bundle`)")


def _script_of(manifest: dict, runtime: dict, found: dict) -> RunScript:
    """The launcher the bundle step writes for this runtime record (backends/qairt_runtime.py):
    run.sh checks AISW_VERSION in each bundled file whose bytes state one (`found`, read from
    the bundle's files; in the record's file order), against the release's X.Y.Z; run.cmd
    checks those files' sizes, as manifest.json records them."""
    release = parse_release(str(runtime.get("qairt_build", ""))) or \
        parse_release(runtime["qairt_version"])
    aisw = tuple(p for p in runtime["files"] if p in found and found[p].aisw)
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    sizes = tuple((p, files[p]["size"]) for p in aisw
                  if isinstance(files.get(p), dict) and "size" in files[p])
    return RunScript(runtime["target"], runtime["mode"], runtime["qairt_version"],
                     runtime["genie_version"], runtime["htp_device_id"],
                     release.dotted if release else "", aisw, sizes,
                     runner=runtime.get("runner") or "bundled")


def _check_bins_qairt(report, runtime: dict) -> None:
    """Each bin's record (what qnn-context-binary-utility said at bundle time) names the
    manifest's QAIRT, by what identifies a release (version and build date: the bundle step's
    rule, formats/qairt_version.py): a bin of another QAIRT than the runtime fails on the
    board."""
    want = parse_release(str(runtime["qairt_version"]))
    for name, record in sorted(runtime.get("bins", {}).items()):
        build = record.get("buildId", "")
        made_by = parse_release(build) if build else None
        if build and (made_by is None or want is None or not made_by.same_as(want)):
            report.problem("runtime", f"{MANIFEST}: 'runtime.bins.{name}.buildId' is {build!r}, "
                                      f"but 'runtime.qairt_version' names QAIRT "
                                      f"{runtime['qairt_version']}: a bin of another QAIRT than "
                                      "the runtime fails on the board (err 5000/5004/5005); "
                                      "rebuild the bundle with one SDK")


def _check_digests(report, manifest: dict, runtime: dict) -> None:
    files = manifest["files"]
    for rel in list(runtime["files"]) + [runtime["script"]]:
        entry = files.get(rel)
        path = report.path / rel
        if not isinstance(entry, dict):
            report.problem("runtime", f"{rel}: not in {MANIFEST}'s files")
        elif path.is_file() and file_digest(path) != entry.get("xxh3_128"):
            report.problem("runtime", f"{rel}: its digest is not the one {MANIFEST} records: "
                                      "changed since it was bundled; rebuild the bundle")
