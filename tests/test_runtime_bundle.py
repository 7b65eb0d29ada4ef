"""A qairt bundle carries the compiling SDK's runtime for the board's OS, and check_bundle judges
it (issue 41, items 1-3). Real doit runs with the stand-in SDK, whose runtime files are REAL
binaries built here (tests/standin_runtime.py): aarch64 ELF, arm64 PE, Hexagon ELF."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import copy_project
from hexbundle.config.runtime_files import ANDROID, LINUX, WINDOWS, runtime_files
from hexbundle.formats.binimage import read_image
from hexbundle.formats.catalog import catalog_signs
from hexbundle.formats.qairt_version import read_file_release
from standin_runtime import bin_sizes, build_runtime, set_hexagon_arch, x86_so

# long end-to-end builds: in the full suite (CI), not the fast tier
pytestmark = [pytest.mark.deploy, pytest.mark.heavy]

# device -> the board OS its runtime is for: a board naming its OS (IQ-9075: Qualcomm Linux), a
# Mobile chipset (Android), a Compute one (Windows on Snapdragon); all Hexagon v73
DEVICES = {"iq9075": LINUX, "snapdragon-8gen2": ANDROID, "snapdragon-x-elite": WINDOWS}


@pytest.fixture(scope="module")
def sdk(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("sdk")
    return build_runtime(tmp / "sdk", tmp / "work")


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("runtime") / "proj")
    project.doit("inputs")
    return project


@pytest.fixture
def built(proj, sdk) -> Path:
    """The IQ-9075 qairt bundle, as the stand-in SDK makes it (up to date: nothing reruns)."""
    qairt(proj, sdk, "bundle")
    return proj.bundle(backend="qairt")


def qairt_env(project, sdk: Path, device="iq9075", mode="ok") -> dict:
    return {"QAIRT_SDK_ROOT": str(sdk), "STANDIN_QAIRT_MODE": mode,
            "STANDIN_QAIRT_BIN_BYTES": json.dumps(bin_sizes(project, device))}


def qairt(project, sdk: Path, *args, device="iq9075", mode="ok", check=True):
    return project.doit(*args, "backend=qairt", f"device={device}",
                        env=qairt_env(project, sdk, device, mode), check=check)


def sdk_copy(sdk: Path, dest: Path) -> Path:
    shutil.copytree(sdk, dest, symlinks=True)
    return dest


def check_bundle(project, bundle: Path, check=False):
    return project.doit("check_bundle", "--path", str(bundle), check=check)


# --------------------------------------------------------------------------- a complete bundle

@pytest.mark.parametrize("device", list(DEVICES))
def test_the_bundle_carries_the_runtime_of_the_boards_os(proj, sdk, device):
    target = DEVICES[device]
    qairt(proj, sdk, "bundle", device=device)
    bundle = proj.bundle(device=device, backend="qairt")
    man = json.loads((bundle / "manifest.json").read_text())
    runtime = man["runtime"]
    assert runtime["target"] == target and runtime["mode"] == "bundled"
    assert runtime["qairt_version"] == "2.42.0.251225"
    assert runtime["qairt_build"] == "v2.42.0.251225135753_193295"   # read from the files
    assert runtime["genie_version"] == "1.14.0"          # the SDK's GenieCommon.h
    table = runtime_files(target, "v73")
    assert runtime["files"] == [f.bundle_path for f in table]   # the optional one is there too
    for f in table:
        path = bundle / f.bundle_path
        assert (sdk / f.sdk_path).read_bytes() == path.read_bytes(), f.bundle_path
        assert man["files"][f.bundle_path]["size"] == path.stat().st_size
        assert runtime["versions"][f.bundle_path] == read_file_release(path).record()
        if f.kind == "catalog":    # Windows: beside the skel, signing it
            assert target == WINDOWS and catalog_signs(path, bundle / "dsp/libQnnHtpV73Skel.so")
            continue
        image = read_image(path)
        if f.kind == "hexagon":
            assert (image.format, image.machine, image.hexagon_arch) == ("ELF", "hexagon", "v73")
        elif target == WINDOWS:
            assert (image.format, image.machine) == ("PE", "arm64")
        else:
            assert (image.format, image.machine) == ("ELF", "aarch64")
    script = "run.cmd" if target == WINDOWS else "run.sh"
    assert runtime["script"] == script and script in man["files"]
    # what each bin says of itself, recorded
    for name, info in runtime["bins"].items():
        assert info["buildId"] == "v2.42.0.251225135753_193295" and info["dspArch"] == "v73"
        assert {"contextBlobVersion", "coreApiVersion", "backendApiVersion", "socModel",
                "graphs"} <= set(info)
    run = check_bundle(proj, bundle, check=True)
    assert f"runtime: QAIRT 2.42.0.251225 for {target} v73 (libGenie 1.14.0)" in run.out


def test_a_second_run_is_up_to_date_and_a_changed_sdk_file_rebuilds_the_bundle(proj, sdk,
                                                                             tmp_path):
    qairt(proj, sdk, "bundle")
    again = qairt(proj, sdk, "bundle")
    assert "bundle" not in again.executed
    other = sdk_copy(sdk, tmp_path / "sdk")
    lib = other / "lib" / LINUX / "libQnnSystem.so"
    lib.write_bytes(lib.read_bytes() + b"\0")
    run = qairt(proj, other, "bundle")
    assert "bundle" in run.executed
    assert (proj.bundle(backend="qairt") / "lib" / "libQnnSystem.so").read_bytes() == \
        lib.read_bytes()


def test_an_sdk_runtime_file_changed_in_place_reruns_the_bundle_step_alone(proj, sdk, tmp_path):
    """The SDK's runtime files are the bundle step's declared inputs (steps/options.
    runtime_inputs), keyed by their digests: the same SDK again is up to date; one file's bytes
    changed in place (same path) rerun the bundle step and nothing else, and the bundle carries
    the new bytes; so does the Genie header it reads the version from, even edited to the same
    size and mtime."""
    other = sdk_copy(sdk, tmp_path / "sdk")
    qairt(proj, other, "bundle")
    again = qairt(proj, other, "bundle")
    assert again.executed == set(), again.out
    lib = other / "lib" / LINUX / "libQnnSystem.so"
    lib.write_bytes(lib.read_bytes() + b"\0")
    run = qairt(proj, other, "bundle")
    assert run.executed == {"bundle"}, run.out
    assert (proj.bundle(backend="qairt") / "lib" / "libQnnSystem.so").read_bytes() == \
        lib.read_bytes()
    # The header edited to another Genie version of the same size, its mtime put back (as a
    # copy that keeps times does): a size-and-mtime stamp would miss it, a digest does not.
    header = other / "include" / "Genie" / "GenieCommon.h"
    stat = header.stat()
    text = header.read_text()
    assert "GENIE_API_VERSION_MINOR 14" in text
    header.write_text(text.replace("GENIE_API_VERSION_MINOR 14", "GENIE_API_VERSION_MINOR 15"))
    os.utime(header, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert header.stat().st_size == stat.st_size
    assert qairt(proj, other, "bundle").executed == {"bundle"}
    manifest = json.loads((proj.bundle(backend="qairt") / "manifest.json").read_text())
    assert manifest["runtime"]["genie_version"] == "1.15.0"
    assert qairt(proj, other, "bundle").executed == set()


def test_runtime_board_bundles_none_and_says_which_version_the_board_needs(proj, sdk):
    qairt(proj, sdk, "bundle", "runtime=board")
    bundle = proj.bundle(backend="qairt")
    assert not (bundle / "lib").exists() and not (bundle / "dsp").exists()
    assert json.loads((bundle / "manifest.json").read_text())["runtime"]["mode"] == "board"
    run = check_bundle(proj, bundle, check=True)
    assert "must have QAIRT 2.42.0.251225 installed (libGenie 1.14.0)" in run.out


def test_a_reference_bundle_is_judged_as_before_and_says_so(proj):
    proj.doit("bundle")
    run = check_bundle(proj, proj.bundle(), check=True)
    assert "'reference'-backend bundle, not deployable: no board runs it" in run.out


# --------------------------------------------------------------------------- refused, file named

def _refused(run, *needles):
    assert run.code != 0, run.out
    text = run.out + run.err
    for needle in needles:
        assert needle in text, text
    assert "Traceback" not in text


def test_a_v75_skel_is_refused(proj, sdk, built, tmp_path):
    other = sdk_copy(sdk, tmp_path / "sdk")
    set_hexagon_arch(other / "lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so", "v75")
    before = (proj.bundle(backend="qairt") / "manifest.json").read_bytes()
    run = qairt(proj, other, "bundle", check=False)
    _refused(run, "dsp/libQnnHtpV73Skel.so: a Hexagon v75 skel (its e_flags), the device is v73")
    # the previous bundle is kept
    assert (proj.bundle(backend="qairt") / "manifest.json").read_bytes() == before


def test_an_x86_64_library_is_refused(proj, sdk, tmp_path):
    other = sdk_copy(sdk, tmp_path / "sdk")
    src = tmp_path / "x.c"
    src.write_text("int x(void) { return 0; }\n")
    x86_so(src, other / "lib" / LINUX / "libQnnHtp.so")
    run = qairt(proj, other, "bundle", check=False)
    _refused(run, "lib/libQnnHtp.so: ELF x86-64, not ELF aarch64")


def test_a_missing_extensions_library_is_refused(proj, sdk, tmp_path):
    other = sdk_copy(sdk, tmp_path / "sdk")
    (other / "lib" / LINUX / "libQnnHtpNetRunExtensions.so").unlink()
    run = qairt(proj, other, "bundle", check=False)
    _refused(run, f"lib/{LINUX}/libQnnHtpNetRunExtensions.so: missing from the SDK root")


def test_check_bundle_names_a_missing_extensions_library(proj, built, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(built, bundle)
    (bundle / "lib" / "libQnnHtpNetRunExtensions.so").unlink()
    _refused(check_bundle(proj, bundle), "lib/libQnnHtpNetRunExtensions.so: missing",
             "Genie/QNN load it by name")


def test_a_bin_of_another_build_is_refused(proj, sdk, tmp_path):
    project = copy_project(tmp_path / "proj")
    project.doit("inputs")
    run = qairt(project, sdk, "bundle", mode="bin_other_build", check=False)
    _refused(run, "qwen2_tiny_part_1_of_4.bin: the context binary",
             "was made by QAIRT build v2.41.0.250101153012_190001, the runtime is QAIRT "
             "2.42.0.251225 (v2.42.0.251225135753_193295)")
    assert not project.bundle(backend="qairt").exists()


def test_a_colon_joined_adsp_path_is_refused(proj, built, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(built, bundle)
    script = bundle / "run.sh"
    script.write_text(script.read_text().replace("${ADSP_LIBRARY_PATH:+;$ADSP_LIBRARY_PATH}",
                                                 "${ADSP_LIBRARY_PATH:+:$ADSP_LIBRARY_PATH}"))
    _refused(check_bundle(proj, bundle), "run.sh: ADSP_LIBRARY_PATH=",
             "joins folders with ':', which fastrpc does not split on",
             "run.sh: its digest is not the one manifest.json records")


def test_a_qairt_bundle_without_runtime_record_is_refused(proj, built, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(built, bundle)
    man = json.loads((bundle / "manifest.json").read_text())
    del man["runtime"]
    (bundle / "manifest.json").write_text(json.dumps(man))
    _refused(check_bundle(proj, bundle), "a qairt bundle with no 'runtime' record")


# --------------------------------------------------------------------------- run.sh, run

HOST_GENIE = Path(__file__).resolve().parent / "standin_qairt" / "host" / "genie-t2t-run"


@pytest.fixture
def board(built):
    """The bundle where any user can read it (a preflight test runs as nobody), its
    genie-t2t-run the host stand-in (the bundled one is aarch64), a file standing for the
    fastrpc node, and a folder with a libcdsprpc.so."""
    top = Path(tempfile.mkdtemp(prefix="hexbundle-board-", dir="/tmp"))
    try:
        bundle = top / "bundle"
        shutil.copytree(built, bundle)
        shutil.copy(HOST_GENIE, bundle / "bin" / "genie-t2t-run")
        node = top / "fastrpc-cdsp"
        node.write_bytes(b"")
        libs = top / "libs"
        libs.mkdir()
        (libs / "libcdsprpc.so").write_bytes(b"")
        # a libstdc++ as the board's: its symbol versions as plain strings
        (libs / "libstdc++.so.6").write_bytes(b"\0GLIBCXX_3.4.28\0GLIBCXX_3.4.29\0")
        (top / "elsewhere").mkdir()
        subprocess.run(["chmod", "-R", "a+rX", str(top)], check=True)
        node.chmod(0o666)
        yield {"top": top, "bundle": bundle, "node": node, "libs": libs}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def run_sh(board, *args, env=None, as_nobody=False):
    base = {"PATH": os.environ["PATH"], "HEXBUNDLE_FASTRPC_NODE": str(board["node"]),
            "LD_LIBRARY_PATH": str(board["libs"]), "TMPDIR": "/tmp"}
    cmd = ["sh", str(board["bundle"] / "run.sh"), *(args or ("-c", "genie_config.json",
                                                               "-p", "Hello?"))]
    if as_nobody and os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd
    # from another directory: run.sh changes into the bundle itself
    return subprocess.run(cmd, cwd=board["top"] / "elsewhere", capture_output=True, text=True,
                          env={**base, **(env or {})}, timeout=60)


def test_run_sh_runs_genie_from_the_bundle_with_its_library_paths(board):
    profile = board["top"] / "elsewhere" / "profile.json"
    proc = run_sh(board, "-c", "genie_config.json", "-p", "Hello?", "--profile", str(profile),
                  env={"ADSP_LIBRARY_PATH": "/usr/lib/rfsa/adsp"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bundle = board["bundle"]
    assert "Using libGenie.so version 1.14.0" in proc.stdout
    assert f"[INFO] LD_LIBRARY_PATH={bundle}/lib:{board['libs']}" in proc.stdout
    assert f"[INFO] ADSP_LIBRARY_PATH={bundle}/dsp;/usr/lib/rfsa/adsp" in proc.stdout
    assert "[BEGIN]: Hello from the stand-in.[END]" in proc.stdout
    assert json.loads(profile.read_text())["components"][0]["name"] == "dialog0"


def test_a_second_profiled_run_works_as_the_first(board):
    """genie-t2t-run refuses an existing profile file (the stand-in as the real one is
    reported to): run.sh removes the one --profile names, so a second run is not refused."""
    profile = board["top"] / "elsewhere" / "profile.json"
    for _ in range(2):
        proc = run_sh(board, "-c", "genie_config.json", "-p", "Hi", "--profile", str(profile))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(profile.read_text())["components"][0]["name"] == "dialog0"
    # without the removal, the second run is refused (the stand-in's check is live)
    direct = subprocess.run([str(HOST_GENIE), "-c", "genie_config.json", "-p", "Hi",
                             "--profile", str(profile)], cwd=board["bundle"],
                            capture_output=True, text=True, timeout=60)
    assert direct.returncode == 1 and "already exists" in direct.stdout


def test_run_sh_passes_genies_own_failure_on(board):
    proc = run_sh(board, "-c", "no_such_config.json", "-p", "x")
    assert proc.returncode == 1
    assert "Failed to create the dialog config" in proc.stdout


@pytest.mark.parametrize("case, expect", [
    ("no node", "no such fastrpc device: this board has no NPU of htp_device_id 0"),
    ("node not readable", "not readable and writable by nobody: add the user to the fastrpc "
                          "group"),
    ("no libcdsprpc", "libcdsprpc.so: not found (LD_LIBRARY_PATH and the system library "
                      "folders)"),
    ("only libcdsprpc.so.1", "libcdsprpc.so.1 is installed; the stub loads the bare name: ln -s"),
    ("old glibc", "glibc 2.31 on this board; QAIRT 2.42.0.251225's aarch64 libraries need "
                  "glibc >= 2.34"),
    ("no libstdc++", "libstdc++.so.6: not found (LD_LIBRARY_PATH and the system library "
                     "folders); QAIRT 2.42.0.251225's aarch64 libraries need one with "
                     "GLIBCXX_3.4.29"),
    ("old libstdc++", "libstdc++.so.6 has no GLIBCXX_3.4.29; QAIRT 2.42.0.251225's aarch64 "
                      "libraries need it"),
    ("a file of another release", "lib/libGenie.so: AISW_VERSION 2.41.0, the bundle is QAIRT "
                                  "2.42.0.251225 (AISW_VERSION 2.42.0): the runtime files must "
                                  "come from one QAIRT release"),
    ("other libGenie", "genie-t2t-run used libGenie.so version 1.13.0, the bundle was compiled "
                       "with QAIRT 2.42.0.251225 (libGenie 1.14.0)"),
])
def test_each_preflight_failure_says_what_to_do(board, case, expect):
    env, as_nobody = {}, False
    if case == "no node":
        env["HEXBUNDLE_FASTRPC_NODE"] = str(board["top"] / "fastrpc-cdsp9")
    elif case == "node not readable":
        board["node"].chmod(0o600)
        as_nobody = True
    elif case == "no libcdsprpc":
        (board["libs"] / "libcdsprpc.so").unlink()
    elif case == "only libcdsprpc.so.1":
        (board["libs"] / "libcdsprpc.so").rename(board["libs"] / "libcdsprpc.so.1")
    elif case == "old glibc":
        fake = board["top"] / "fakebin"
        fake.mkdir()
        (fake / "getconf").write_text("#!/bin/sh\necho 'glibc 2.31'\n")
        (fake / "getconf").chmod(0o755)
        env["PATH"] = f"{fake}:{os.environ['PATH']}"
    elif case == "no libstdc++":
        (board["libs"] / "libstdc++.so.6").unlink()
    elif case == "old libstdc++":
        (board["libs"] / "libstdc++.so.6").write_bytes(b"\0GLIBCXX_3.4.28\0GLIBCXX_3.4.290\0")
    elif case == "a file of another release":
        lib = board["bundle"] / "lib" / "libGenie.so"
        lib.write_bytes(lib.read_bytes().replace(b"AISW_VERSION: 2.42.0", b"AISW_VERSION: 2.41.0"))
    elif case == "other libGenie":
        env["STANDIN_GENIE_VERSION"] = "1.13.0"
    proc = run_sh(board, env=env, as_nobody=as_nobody)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "run.sh: " in proc.stderr and expect in proc.stderr, proc.stderr
    # the run did not start unless the failure is found in its output
    assert ("[BEGIN]" in proc.stdout) == (case == "other libGenie")


@pytest.mark.parametrize("target", [LINUX, WINDOWS])
def test_the_declared_sdk_files_are_those_an_image_run_reads(sdk, target):
    """A local build's bundle step reads the SDK files its description declares
    (SdkRuntime.declared of SdkRuntime.inputs()); under executor=docker it reads the image's
    SDK directly (SdkRuntime.at): the same files, found the same way."""
    from hexbundle.backends.qairt_runtime import SdkRuntime
    at = SdkRuntime.at(sdk, target, "v73")
    inputs = at.inputs()
    one = {role: path for role, path in inputs if role != "runtime"}
    declared = SdkRuntime.declared(one["runtime-release"], one["runtime-genie"],
                                   [path for role, path in inputs if role == "runtime"])
    assert declared == at
    assert set(at.files) == {f.sdk_path for f in runtime_files(target, "v73")}


def test_a_no_op_qairt_run_replays_its_stamp_until_an_sdk_runtime_file_changes(proj, sdk,
                                                                                tmp_path):
    """A local qairt build gets the no-op stamp (graph.noopstamp) as a reference one does: the
    SDK runtime files its bundle copies are the bundle step's declared inputs, so the stamp
    watches them. The second no-op run replays; after one of those files changed, the run
    resolves the build again and reruns the bundle step."""
    from test_noop_stamp import run as stamped
    other = sdk_copy(sdk, tmp_path / "sdk")
    args, env = ("bundle", "backend=qairt", "device=iq9075"), qairt_env(proj, other)
    qairt(proj, other, "bundle")
    out, how = stamped(proj, *args, env=env)   # nothing to do: the stamp is written
    assert how == "RESOLVED" and " 0 built," in out, out
    out, how = stamped(proj, *args, env=env)
    assert how == "REPLAYED", out
    lib = other / "lib" / LINUX / "libQnnSystem.so"
    lib.write_bytes(lib.read_bytes() + b"\0")
    out, how = stamped(proj, *args, env=env)
    assert how == "RESOLVED" and " 1 built," in out, out
