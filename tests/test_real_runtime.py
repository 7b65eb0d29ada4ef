"""The bundle step, check_bundle and run.sh against Qualcomm's REAL QAIRT runtime files (issue
49): the onnxruntime-qnn wheels pinned by hash (tests/real_runtime.py), QAIRT 2.45.40 for a
Linux aarch64 and a Windows ARM64 board, 2.51.0 for the version mixes. The bins come from the
stand-in SDK's compile, which writes the long build string a real one writes."""
import json
import shutil
from pathlib import Path

import pytest

from conftest import copy_project
from hexbundle.backends.bincheck import BinFacts
from hexbundle.backends.qairt_runtime import (RuntimePlan, SdkRuntime, check_bins,
                                              runtime_release)
from hexbundle.config.runtime_files import LINUX, MIN_GLIBCXX, WINDOWS
from hexbundle.formats.catalog import catalog_signs
from hexbundle.formats.qairt_version import parse_release, read_file_release
from hexbundle.support.errors import BackendError, InputError
from hexbundle.support.hashing import file_digest
from real_runtime import (BUILD_2_45, BUILD_2_51, GENIE_API_2_45, LINUX_2_45, SDK_2_45,
                          WIN_2_45, WIN_2_51, as_release, install_real, wheel_file, wheels_dir)
from standin_runtime import bin_sizes, build_runtime

pytestmark = pytest.mark.deploy

DEVICE = {LINUX: "iq9075", WINDOWS: "snapdragon-x-elite"}     # both Hexagon v73


@pytest.fixture(scope="module")
def wheels() -> Path:
    return wheels_dir()


@pytest.fixture(scope="module")
def built_sdk(tmp_path_factory) -> Path:
    """The stand-in SDK with its built runtime (every target; genie-t2t-run for each)."""
    tmp = tmp_path_factory.mktemp("built")
    return build_runtime(tmp / "sdk", tmp / "work")


@pytest.fixture(scope="module")
def sdk_2_45(built_sdk, wheels, tmp_path_factory) -> Path:
    """A QAIRT 2.45.40 SDK root: sdk.yaml and the Genie header of that release, the Linux and
    Windows v73 runtime files of the 2.1.0 wheels."""
    sdk = tmp_path_factory.mktemp("real") / "sdk"
    shutil.copytree(built_sdk, sdk, symlinks=True)
    as_release(sdk, SDK_2_45, GENIE_API_2_45)
    install_real(sdk, wheels, LINUX, LINUX_2_45)
    install_real(sdk, wheels, WINDOWS, WIN_2_45)
    return sdk


# --------------------------------------------------------------------------- the files' bytes

@pytest.mark.parametrize("wheel, name, expect", [
    (LINUX_2_45, "libQnnHtp.so", (BUILD_2_45, "2.45.40")),
    (LINUX_2_45, "libQnnHtpV73Skel.so", (BUILD_2_45, "2.45.40")),
    (LINUX_2_45, "libQnnHtpV73Stub.so", (BUILD_2_45, "2.45.40")),
    (LINUX_2_45, "libGenie.so", (None, "2.45.40")),
    (LINUX_2_45, "libQnnHtpNetRunExtensions.so", (None, "2.45.40")),
    (LINUX_2_45, "libQnnSystem.so", (None, None)),
    (WIN_2_45, "Genie.dll", (None, "2.45.40")),
    (WIN_2_45, "libqnnhtpv73.cat", (None, None)),
    (WIN_2_51, "QnnHtpV73Stub.dll", (BUILD_2_51, "2.51.0")),
])
def test_each_real_file_says_its_release(wheels, wheel, name, expect):
    found = read_file_release(wheel_file(wheels, wheel, name))
    assert found.problem() == ""
    assert ([b.text for b in found.builds] or [None])[0] == expect[0]
    assert ([a.dotted for a in found.aisw] or [None])[0] == expect[1]


def test_a_release_is_its_version_and_build_date():
    sdk = parse_release(SDK_2_45)
    assert parse_release(BUILD_2_45).same_as(sdk)
    assert parse_release("v2.42.0.251225135753_193295").same_as(parse_release("2.42.0.251225"))
    assert not parse_release(BUILD_2_51).same_as(sdk)
    assert not parse_release("v2.45.40.260501000000").same_as(sdk)     # another build date
    assert parse_release("2.45.40").same_as(sdk)                       # AISW_VERSION: no date


def test_each_catalog_signs_its_own_releases_skel_only(wheels):
    cat_45, cat_51 = (wheel_file(wheels, w, "libqnnhtpv73.cat") for w in (WIN_2_45, WIN_2_51))
    skel_45, skel_51 = (wheel_file(wheels, w, "libQnnHtpV73Skel.so") for w in (WIN_2_45, WIN_2_51))
    assert catalog_signs(cat_45, skel_45) and catalog_signs(cat_51, skel_51)
    assert not catalog_signs(cat_45, skel_51) and not catalog_signs(cat_51, skel_45)
    # the skel of one release is the same bytes in its Linux and Windows wheels
    assert wheel_file(wheels, LINUX_2_45, skel_45.name).read_bytes() == skel_45.read_bytes()


def test_run_shs_glibcxx_is_what_the_real_libraries_need(wheels):
    """MIN_GLIBCXX (what run.sh checks on the board) is the highest libstdc++ symbol version
    the real aarch64 libraries name."""
    import re
    needed = set()
    for name in ("libGenie.so", "libQnnHtp.so", "libQnnSystem.so", "libQnnHtpV73Stub.so"):
        data = wheel_file(wheels, LINUX_2_45, name).read_bytes()
        needed |= {tuple(map(int, m.split(b".")))
                   for m in re.findall(rb"GLIBCXX_(3\.4\.\d+)\0", data)}
    assert MIN_GLIBCXX == "GLIBCXX_" + ".".join(map(str, max(needed)))


# --------------------------------------------------------------------------- release, unit level

def plan_for(target: str, version: str = SDK_2_45) -> RuntimePlan:
    return RuntimePlan("bundled", target, "v73", 60, version, 0)


def facts(build_id: str) -> dict:
    return {"m_part_1_of_1.bin": BinFacts("qnn-context-binary-utility", ("g",), 60, "v73", 1,
                                          (("buildId", build_id),))}


@pytest.mark.parametrize("target", [LINUX, WINDOWS])
def test_a_real_runtime_is_one_release_and_takes_bins_of_it(sdk_2_45, target):
    release = runtime_release(SdkRuntime.at(sdk_2_45, target, "v73"), plan_for(target))
    assert release.release.text == BUILD_2_45 and str(release.release) == SDK_2_45
    assert check_bins(facts(BUILD_2_45), plan_for(target), release)      # the long form
    with pytest.raises(InputError, match=f"made by QAIRT build {BUILD_2_51}, the runtime is "
                                         f"QAIRT {SDK_2_45} \\({BUILD_2_45}\\)"):
        check_bins(facts(BUILD_2_51), plan_for(target), release)


def test_the_real_files_under_another_sdk_yaml_version_are_refused(sdk_2_45):
    """The issue's case: 2.45.40 files in an SDK whose sdk.yaml says 2.42.0.251225."""
    with pytest.raises(BackendError, match=r"not one QAIRT release \(QAIRT 2\.42\.0\.251225: "
                                           r"sdk\.yaml; QAIRT 2\.45\.40\.260406: lib/"):
        runtime_release(SdkRuntime.at(sdk_2_45, LINUX, "v73"), plan_for(LINUX, "2.42.0.251225"))


# --------------------------------------------------------------------------- end to end (doit)

@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    """A project pinned to QAIRT 2.45.40.260406 (its configs/toolchain.toml)."""
    project = copy_project(tmp_path_factory.mktemp("real-runtime") / "proj")
    pin = project.root / "configs" / "toolchain.toml"
    pin.write_text(pin.read_text().replace('version = "2.42.0.251225"',
                                           f'version = "{SDK_2_45}"'))
    project.doit("inputs")
    return project


def qairt(project, sdk: Path, *args, target=LINUX, check=True):
    device = DEVICE[target]
    env = {"QAIRT_SDK_ROOT": str(sdk), "STANDIN_QAIRT_BIN_BYTES": json.dumps(bin_sizes(project,
                                                                                      device))}
    return project.doit(*args, "backend=qairt", f"device={device}", env=env, check=check)


def refused(run, *needles):
    text = run.out + run.err
    assert run.code != 0, text
    for needle in needles:
        assert needle in text, text
    assert "Traceback" not in text


def check_bundle(project, bundle: Path, check=False):
    return project.doit("check_bundle", "--path", str(bundle), check=check)


@pytest.fixture(scope="module")
def bundles(proj, sdk_2_45) -> dict:
    """{target: the bundle the real 2.45.40 runtime makes}, each copied out (the next build of
    the same variant replaces the project's own)."""
    out = {}
    for target in (LINUX, WINDOWS):
        qairt(proj, sdk_2_45, "bundle", target=target)
        out[target] = proj.bundle(device=DEVICE[target], backend="qairt")
    return out


@pytest.mark.parametrize("target", [LINUX, WINDOWS])
def test_a_real_runtime_makes_a_bundle_check_bundle_passes(proj, bundles, target):
    bundle = bundles[target]
    runtime = json.loads((bundle / "manifest.json").read_text())["runtime"]
    assert runtime["qairt_version"] == SDK_2_45 and runtime["qairt_build"] == BUILD_2_45
    assert runtime["genie_version"] == GENIE_API_2_45
    for name, info in runtime["bins"].items():
        assert info["buildId"] == BUILD_2_45, name                     # the long form
    lib = "lib/Genie.dll" if target == WINDOWS else "lib/libGenie.so"
    assert runtime["versions"][lib] == {"build": [], "aisw_version": ["2.45.40"]}
    if target == WINDOWS:
        assert "dsp/libqnnhtpv73.cat" in runtime["files"]
        assert catalog_signs(bundle / "dsp/libqnnhtpv73.cat", bundle / "dsp/libQnnHtpV73Skel.so")
    else:
        script = (bundle / "run.sh").read_text()
        assert 'AISW_VERSION="2.45.40"' in script and "lib/libGenie.so" in script
    run = check_bundle(proj, bundle, check=True)
    assert f"runtime: QAIRT {SDK_2_45} for {target} v73 (libGenie {GENIE_API_2_45})" in run.out


def swapped(bundle: Path, dest: Path, rel: str, source: Path) -> Path:
    """A copy of `bundle` with `rel` replaced by `source`, and the manifest's digest and size
    of it updated: only what the bytes say of their release is left to catch it."""
    shutil.copytree(bundle, dest)
    shutil.copyfile(source, dest / rel)
    doc = json.loads((dest / "manifest.json").read_text())
    doc["files"][rel] = {"size": (dest / rel).stat().st_size, "xxh3_128": file_digest(dest / rel)}
    doc["runtime"]["versions"].pop(rel, None)       # as if recorded so: the bytes must tell
    (dest / "manifest.json").write_text(json.dumps(doc))
    return dest


# the mixes: a 2.51.0 stub with the 2.45.40 skel (Windows), the 2.45.40 stub with a 2.51.0 skel
# (Linux: the skel of 2.51.0's Windows wheel, the same bytes as its Linux wheel's)
MIXES = {WINDOWS: ("lib/QnnHtpV73Stub.dll", "stub", "QnnHtpV73Stub.dll"),
         LINUX: ("dsp/libQnnHtpV73Skel.so", "skel", "libQnnHtpV73Skel.so")}


@pytest.mark.parametrize("target", [WINDOWS, LINUX])
def test_a_version_mix_fails_check_bundle(proj, bundles, wheels, tmp_path, target):
    rel, _, name = MIXES[target]
    bundle = swapped(bundles[target], tmp_path / "mix", rel, wheel_file(wheels, WIN_2_51, name))
    refused(check_bundle(proj, bundle), "not one QAIRT release",
            f"QAIRT 2.51.0.260929: {rel}", "QAIRT 2.45.40.260406: ")
    # the faithful copy passes: the swap, not the copying, is refused
    check_bundle(proj, swapped(bundles[target], tmp_path / "same", rel, bundles[target] / rel),
                 check=True)


@pytest.mark.parametrize("target", [WINDOWS, LINUX])
def test_a_version_mix_fails_the_bundle_step(proj, bundles, sdk_2_45, wheels, tmp_path, target):
    _, role, _ = MIXES[target]
    sdk = tmp_path / "sdk"
    shutil.copytree(sdk_2_45, sdk, symlinks=True)
    install_real(sdk, wheels, target, WIN_2_51, only=(role,))
    before = (proj.bundle(device=DEVICE[target], backend="qairt") / "manifest.json").read_bytes()
    refused(qairt(proj, sdk, "bundle", target=target, check=False),
            f"the runtime files for {target} v73 and sdk.yaml are not one QAIRT release",
            "QAIRT 2.51.0.260929: lib/")
    # the previous bundle is kept
    assert (proj.bundle(device=DEVICE[target], backend="qairt") / "manifest.json").read_bytes() \
        == before


def test_another_releases_catalog_beside_the_skel_is_refused(proj, bundles, wheels, tmp_path):
    bundle = swapped(bundles[WINDOWS], tmp_path / "cat", "dsp/libqnnhtpv73.cat",
                     wheel_file(wheels, WIN_2_51, "libqnnhtpv73.cat"))
    refused(check_bundle(proj, bundle), "dsp/libqnnhtpv73.cat: does not sign "
                                        "dsp/libQnnHtpV73Skel.so", "transportStatus 9")


def test_a_windows_bundle_without_its_catalog_is_refused(proj, bundles, tmp_path):
    bundle = tmp_path / "nocat"
    shutil.copytree(bundles[WINDOWS], bundle)
    (bundle / "dsp/libqnnhtpv73.cat").unlink()
    refused(check_bundle(proj, bundle), "dsp/libqnnhtpv73.cat: missing (skel's signing catalog")


# --------------------------------------------------------------------------- reading, once

def bytes_read(call) -> int:
    """The bytes this process read while call() ran, the kernel's count (/proc/self/io)."""
    io = Path("/proc/self/io")
    before = io.read_text()
    call()
    after = io.read_text()
    rchar = [int(dict(line.split(": ") for line in text.splitlines())["rchar"])
             for text in (before, after)]
    return rchar[1] - rchar[0] - len(before.encode())   # less the first reading's own bytes


def test_check_bundle_reads_each_runtime_file_twice_not_three_times(bundles):
    """The runtime check reads each runtime file whole twice: once for its release (which the
    launcher's check and the release check share) and once for its digest; the bins only their
    metadata (tests/test_bin_release.py). A third whole read (the release read again for the
    launcher) would pass 3x the files' bytes."""
    from hexbundle.checks.genie_bundle import BundleReport
    from hexbundle.checks.runtime_check import check_runtime
    from hexbundle.formats.genie import bundle_entries
    from hexbundle.formats.manifest import read_manifest
    bundle = bundles[LINUX]
    manifest = read_manifest(bundle)
    htp = json.loads((bundle / "htp_backend_ext_config.json").read_text())
    report = BundleReport(bundle, entries=bundle_entries(bundle))
    read = bytes_read(lambda: check_runtime(report, htp, manifest))
    assert report.problems == []
    files = sum((bundle / p).stat().st_size for p in manifest["runtime"]["files"])
    assert 2 * files <= read < 3 * files, (read, files)


# --------------------------------------------------------------------------- run.cmd, run by cmd

RUNNER_C = r"""#include <stdio.h>
int main(int argc, char **argv) {
    printf("genie-t2t-run ran:");
    for (int i = 1; i < argc; i++) printf(" [%s]", argv[i]);
    printf("\n");
    return 7;
}
"""


@pytest.fixture(scope="module")
def cmd_exe(tmp_path_factory):
    """A cmd interpreter to run run.cmd with: Wine's cmd.exe (Wine's own implementation of
    Windows' cmd, in a prefix of this module's), and an x64 runner built by mingw-w64 to stand
    where the board's arm64 genie-t2t-run.exe is (which no x64 host runs). .ci/run installs
    both; without them the tests skip, except under CI=true, where they fail."""
    import os
    import subprocess
    from hexbundle.backends.ortqnn_kit import MINGW_GCC, find_wine
    from hexbundle.support.errors import BackendError
    try:
        wine = find_wine()
    except BackendError as exc:
        missing = str(exc)
    else:
        missing = "" if shutil.which(MINGW_GCC) else f"{MINGW_GCC} not found"
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so run.cmd must be run, but: {missing}")
        pytest.skip(missing)
    tmp = tmp_path_factory.mktemp("cmd")
    (tmp / "runner.c").write_text(RUNNER_C)
    subprocess.run([shutil.which(MINGW_GCC), "-o", str(tmp / "runner.exe"), str(tmp / "runner.c")],
                   check=True)
    env = dict(os.environ, WINEPREFIX=str(tmp / "prefix"), WINEDEBUG="-all",
               WINEDLLOVERRIDES="winedbg.exe=d")

    def run(bundle: Path, *args):
        shutil.copyfile(tmp / "runner.exe", bundle / "bin" / "genie-t2t-run.exe")
        script = "Z:" + str((bundle / "run.cmd").resolve()).replace("/", "\\")
        return subprocess.run([wine, "cmd", "/c", script, *args], env=env, cwd=tmp,
                              capture_output=True, text=True, errors="replace", timeout=600)
    return run


def test_run_cmd_runs_the_bundles_genie_when_its_runtime_files_are_the_bundled_ones(
        cmd_exe, bundles, tmp_path):
    bundle = tmp_path / "board"
    shutil.copytree(bundles[WINDOWS], bundle)
    run = cmd_exe(bundle, "-c", "genie_config.json", "-p", "What is 2+2?")
    assert run.returncode == 7, run.stdout + run.stderr          # the runner's own status
    assert "genie-t2t-run ran: [-c] [genie_config.json] [-p] [What is 2+2?]" in run.stdout
    assert "run.cmd:" not in run.stdout + run.stderr


@pytest.mark.parametrize("rel", ["lib/QnnHtpV73Stub.dll", "lib/Genie.dll",
                                 "dsp/libQnnHtpV73Skel.so"])
def test_run_cmd_stops_before_the_run_at_a_runtime_file_of_another_release(
        cmd_exe, bundles, wheels, tmp_path, rel):
    """A file replaced on the board by QAIRT 2.51.0's (the Genie API version alone could not
    tell some releases apart; cmd reads no AISW_VERSION, but another release's file is
    another size)."""
    bundle = tmp_path / "board"
    shutil.copytree(bundles[WINDOWS], bundle)
    shutil.copyfile(wheel_file(wheels, WIN_2_51, Path(rel).name), bundle / rel)
    run = cmd_exe(bundle, "-c", "genie_config.json", "-p", "hi")
    win = rel.replace("/", "\\")
    size = (bundle / rel).stat().st_size
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"run.cmd: {win} is {size} bytes, not the {(bundles[WINDOWS] / rel).stat().st_size} " \
           f"bytes bundled; the bundle was made with QAIRT {SDK_2_45}" in run.stderr
    assert "genie-t2t-run ran" not in run.stdout
    (bundle / rel).unlink()
    gone = cmd_exe(bundle, "-c", "genie_config.json")
    assert gone.returncode == 2 and f"run.cmd: {win} is missing" in gone.stderr


# --------------------------------------------------------------------------- run.sh, real files

HOST_GENIE = Path(__file__).resolve().parent / "standin_qairt" / "host" / "genie-t2t-run"


@pytest.mark.parametrize("swap", [None, "dsp/libQnnHtpV73Skel.so"])
def test_run_sh_reads_each_real_files_aisw_version_before_the_run(bundles, wheels, tmp_path,
                                                                 swap):
    """run.sh's own reading (tr and sed, as on the board) of Qualcomm's 2.45.40 aarch64 files:
    they pass, and 2.51.0's skel in its place (the one aarch64-loadable file of 2.51.0 fetched:
    the skel is the same bytes in every wheel) stops the run, which the Genie API version alone
    could not always do. The board's parts as tests/test_runtime_bundle.py's
    board fixture makes them; genie-t2t-run the host stand-in."""
    import subprocess
    bundle = tmp_path / "bundle"
    shutil.copytree(bundles[LINUX], bundle)
    shutil.copy(HOST_GENIE, bundle / "bin" / "genie-t2t-run")
    if swap:
        shutil.copyfile(wheel_file(wheels, WIN_2_51, Path(swap).name), bundle / swap)
    (tmp_path / "fastrpc-cdsp").write_bytes(b"")
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "libcdsprpc.so").write_bytes(b"")
    (libs / "libstdc++.so.6").write_bytes(b"\0" + MIN_GLIBCXX.encode() + b"\0")
    env = {"PATH": "/usr/bin:/bin", "HEXBUNDLE_FASTRPC_NODE": str(tmp_path / "fastrpc-cdsp"),
           "LD_LIBRARY_PATH": str(libs), "TMPDIR": str(tmp_path),
           "STANDIN_GENIE_VERSION": GENIE_API_2_45}
    run = subprocess.run(["sh", str(bundle / "run.sh"), "-c", "genie_config.json", "-p", "Hi"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    if swap is None:
        assert run.returncode == 0 and "[BEGIN]" in run.stdout, run.stdout + run.stderr
    else:
        assert run.returncode == 2, run.stdout + run.stderr
        assert f"run.sh: {bundle}/{swap}: AISW_VERSION 2.51.0, the bundle is QAIRT {SDK_2_45} " \
               f"(AISW_VERSION 2.45.40): the runtime files must come from one QAIRT release" \
               in run.stderr
        assert "[BEGIN]" not in run.stdout
