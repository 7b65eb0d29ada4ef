"""The ortqnn bundle's board runtime (backends/ortqnn_runtime.py, docs/backends.md): the
onnxruntime-qnn wheel of the compiler's own QAIRT release (2.7.0 = 2.51.0), pinned by sha256 in
requirements/ortqnn-runtime.txt, its versions read from the bytes; and the Genie API version
read from a Genie library's own code (formats/genie_api.py). Real files only: Qualcomm's wheels
(`doit ortqnn_kit`, scripts/fetch_qairt_runtime.py); a wheel that another release's real files
are put in stands for a wrong pin.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import PROJECT_FILES, ROOT, copy_project
from real_runtime import LINUX_2_45, WIN_2_45, WIN_2_51, wheel_file, wheels_dir
from hexbundle.config.runtime_files import ANDROID, LINUX, WINDOWS, runtime_files, wheel_member
from hexbundle.formats.genie_api import FUNCTIONS, _elf_functions, read_genie_api_version
from hexbundle.support.errors import BackendError, FormatError

WHEELHOUSE = ROOT / "build" / "wheelhouse" / "ortqnn"
LINUX_WHEEL = "onnxruntime_qnn-2.7.0-cp312-cp312-manylinux_2_34_aarch64.whl"
WIN_WHEEL = "onnxruntime_qnn-2.7.0-cp312-cp312-win_arm64.whl"
PINS = ROOT / "requirements" / "ortqnn-runtime.txt"


# --------------------------------------------------------------------- the Genie API version

def test_genie_api_version_is_read_from_the_libraries_code():
    """1.17.0 for QAIRT 2.45.40 (onnxruntime-qnn 2.1.0), 1.21.0 for 2.51.0 (2.7.0): the ELF
    (a `bti c` before the mov) and the PE build (`mov w0, wzr` for the patch 0)."""
    wheels = wheels_dir()
    assert read_genie_api_version(wheel_file(wheels, LINUX_2_45, "libGenie.so")) == "1.17.0"
    assert read_genie_api_version(wheel_file(wheels, WIN_2_45, "Genie.dll")) == "1.17.0"
    assert read_genie_api_version(wheel_file(wheels, WIN_2_51, "Genie.dll")) == "1.21.0"


def test_a_library_that_is_not_genie_or_is_damaged_is_refused(tmp_path):
    wheels = wheels_dir()
    with pytest.raises(FormatError, match="exports no Genie_getApiMajorVersion"):
        read_genie_api_version(wheel_file(wheels, LINUX_2_45, "libQnnHtp.so"))
    with pytest.raises(FormatError, match="exports no Genie_getApiMajorVersion"):
        read_genie_api_version(wheel_file(wheels, WIN_2_51, "QnnHtp.dll"))
    real = wheel_file(wheels, LINUX_2_45, "libGenie.so").read_bytes()
    offset = _elf_functions(real, "x")[FUNCTIONS[1]]
    changed = bytearray(real)
    changed[offset:offset + 12] = b"\x1f\x20\x03\xd5" * 3     # nop nop nop: no `mov w0, #N`
    path = tmp_path / "libGenie.so"
    path.write_bytes(bytes(changed))
    with pytest.raises(FormatError, match=r"libGenie.so: Genie_getApiMinorVersion is not"):
        read_genie_api_version(path)
    path.write_bytes(real[:4096])
    with pytest.raises(FormatError, match="libGenie.so: its headers point outside the file"):
        read_genie_api_version(path)


# ------------------------------------------------------------------ the pinned runtime wheels

def _runtime_wheels_missing() -> str:
    missing = [w for w in (LINUX_WHEEL, WIN_WHEEL) if not (WHEELHOUSE / w).is_file()]
    return f"{WHEELHOUSE}: {', '.join(missing)} missing (python3 -m doit ortqnn_kit)" \
        if missing else ""


def _need_runtime_wheels():
    missing = _runtime_wheels_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)


def test_the_pins_are_the_wheels_that_doit_ortqnn_kit_fetched(monkeypatch):
    """Each board OS's wheel is declared (runtime_inputs, by name) and found by its pinned
    sha256; Android has none (a clear error); an empty wheelhouse names the command that
    fills it."""
    from hexbundle.backends.ortqnn_runtime import runtime_inputs, runtime_wheel
    _need_runtime_wheels()
    monkeypatch.setenv("HEXBUNDLE_ORTQNN_WHEELHOUSE", str(WHEELHOUSE))
    for target, name in ((LINUX, LINUX_WHEEL), (WINDOWS, WIN_WHEEL)):
        declared = runtime_inputs(ROOT, target)
        assert declared == [("runtime-pins", PINS), ("runtime", WHEELHOUSE / name)]
        wheel, digest = runtime_wheel(PINS, [WHEELHOUSE / name], target)
        assert wheel.name == name
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == digest
    assert runtime_inputs(ROOT, ANDROID) == [("runtime-pins", PINS)]
    with pytest.raises(BackendError, match="no onnxruntime-qnn wheel carries the QAIRT runtime "
                                           f"for {ANDROID}"):
        runtime_wheel(PINS, [], ANDROID)


def test_a_missing_or_other_runtime_wheel_is_refused(tmp_path, monkeypatch):
    """No wheel declared (an empty wheelhouse), a declared one gone, one of the pinned name with
    other bytes: each an error naming the wheel and `doit ortqnn_kit`."""
    from hexbundle.backends.ortqnn_runtime import runtime_inputs, runtime_wheel
    monkeypatch.setenv("HEXBUNDLE_ORTQNN_WHEELHOUSE", str(tmp_path))
    assert runtime_inputs(ROOT, LINUX) == [("runtime-pins", PINS)]
    wanted = (r"no onnxruntime_qnn-2.7.0 manylinux_2_34_aarch64 wheel with the sha256 .*"
              r"doit ortqnn_kit")
    with pytest.raises(BackendError, match=wanted) as none:
        runtime_wheel(PINS, [], LINUX)
    assert "tried: none in the wheelhouse" in str(none.value)
    with pytest.raises(BackendError, match=wanted):
        runtime_wheel(PINS, [tmp_path / LINUX_WHEEL], LINUX)
    (tmp_path / LINUX_WHEEL).write_bytes(b"PK\x05\x06" + bytes(18))   # same name, other bytes
    assert runtime_inputs(ROOT, LINUX)[1:] == [("runtime", tmp_path / LINUX_WHEEL)]
    with pytest.raises(BackendError, match=wanted):
        runtime_wheel(PINS, [tmp_path / LINUX_WHEEL], LINUX)


def test_every_runtime_file_is_in_the_wheel_of_its_board_os():
    """The table's files (but genie-t2t-run, which no wheel has) are in the pinned wheels,
    under wheel_member's names, for v73, the boards' dsp_arch."""
    _need_runtime_wheels()
    for target, name in ((LINUX, LINUX_WHEEL), (WINDOWS, WIN_WHEEL)):
        members = set(zipfile.ZipFile(WHEELHOUSE / name).namelist())
        for f in runtime_files(target, "v73"):
            assert (wheel_member(f) in members) == (f.role != "genie-t2t-run"), (name, f)


def test_windows_runtime_from_the_win_arm64_wheel(tmp_path):
    """For a Windows board: the DLLs, the skel and its signing catalog from the win_arm64 wheel,
    Genie 1.21.0, run.cmd calling the board's genie-t2t-run.exe; versions one release with the
    bins (a real 2.51.0 bin of the fixtures)."""
    from hexbundle.backends.ortqnn_runtime import bundle_runtime
    from hexbundle.backends.qairt_runtime import RuntimePlan
    from hexbundle.formats.catalog import catalog_signs
    _need_runtime_wheels()
    staging = tmp_path / "bundle"
    staging.mkdir()
    bins = [ROOT / "tests" / "data" / "qualcomm" / "mlp_int8_shared_qnn.bin"]
    record = bundle_runtime(PINS, [WHEELHOUSE / WIN_WHEEL],
                            RuntimePlan("bundled", WINDOWS, "v73", 60, "2.51.0", 0), bins,
                            staging, "2.51.0", lambda line: None)
    assert record["genie_version"] == "1.21.0" and record["qairt_version"] == "2.51.0.260929"
    assert "lib/Genie.dll" in record["files"] and "dsp/libqnnhtpv73.cat" in record["files"]
    assert catalog_signs(staging / "dsp" / "libqnnhtpv73.cat",
                         staging / "dsp" / "libQnnHtpV73Skel.so")
    assert record["runner"] == "board" and record["script"] == "run.cmd"
    assert "genie-t2t-run.exe %*" in (staging / "run.cmd").read_text()
    with zipfile.ZipFile(WHEELHOUSE / WIN_WHEEL) as whl:
        assert (staging / "lib" / "QnnHtp.dll").read_bytes() == \
            whl.read("onnxruntime_qnn/QnnHtp.dll")


def test_runtime_board_names_the_release_and_bundles_nothing(tmp_path):
    """runtime = "board": no file copied, the release and the Genie API version still read from
    the pinned wheel's bytes, run.sh using the board's install."""
    from hexbundle.backends.ortqnn_runtime import bundle_runtime
    from hexbundle.backends.qairt_runtime import RuntimePlan
    _need_runtime_wheels()
    staging = tmp_path / "bundle"
    staging.mkdir()
    bins = [ROOT / "tests" / "data" / "qualcomm" / "mlp_int8_shared_qnn.bin"]
    record = bundle_runtime(PINS, [WHEELHOUSE / LINUX_WHEEL],
                            RuntimePlan("board", LINUX, "v73", 77, "2.51.0", 0), bins,
                            staging, "2.51.0", lambda line: None)
    assert record["files"] == [] and record["genie_version"] == "1.21.0"
    assert sorted(p.name for p in staging.iterdir()) == ["run.sh"]
    text = (staging / "run.sh").read_text()
    assert 'QAIRT_VERSION="2.51.0.260929"' in text and "LD_LIBRARY_PATH=\"$HERE/lib" not in text


def test_run_sh_with_the_boards_runner_passes_shellcheck(tmp_path):
    from hexbundle.formats.runscript import RunScript, render
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed: apt-get install shellcheck (.ci/run does)"
    script = tmp_path / "run.sh"
    text = render(RunScript(LINUX, "bundled", "2.51.0.260929", "1.21.0", 0, "2.51.0",
                            ("lib/libGenie.so", "dsp/libQnnHtpV73Skel.so"), runner="board"))
    script.write_text(text)
    proc = subprocess.run([shellcheck, "--shell=sh", str(script)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout
    assert 'RUNNER=$(command -v genie-t2t-run || true)' in text
    assert "bin/genie-t2t-run" not in text.replace("bin/<target>/genie-t2t-run", "")


# ------------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def ortqnn_bundle(tmp_path_factory):
    from test_ortqnn import require_kit
    env = require_kit(_runtime_wheels_missing())
    project = copy_project(tmp_path_factory.mktemp("ortqnn-rt"), (*PROJECT_FILES, "requirements"))
    run = project.doit("bundle", "backend=ortqnn", env=env, check=False)
    assert run.code == 0, run.out + run.err
    return project, env, run


@pytest.mark.heavy
def test_the_bundle_carries_the_wheels_runtime_and_check_bundle_passes(ortqnn_bundle):
    from hexbundle.checks.genie_bundle import check_bundle
    project, _, run = ortqnn_bundle
    assert "[ortqnn backend: NOT deployable yet" in run.out, run.out
    assert "ortqnn backend, NOT deployable" in run.out, run.out
    bundle = project.bundle(backend="ortqnn")
    manifest = json.loads((bundle / "manifest.json").read_text())
    runtime = manifest["runtime"]
    assert runtime["qairt_version"] == "2.51.0.260929" and runtime["genie_version"] == "1.21.0"
    assert runtime["source"]["wheel"] == LINUX_WHEEL
    assert runtime["source"]["sha256"] == \
        "40f6f8ab76a877b36c875122caf46189f810e52a1e7c2f75e431dfb7714168b8"
    assert set(runtime["bins"]) == {p.name for p in bundle.glob("*.bin")}
    assert manifest["deployable"] is False and runtime["deployment"]["deployable_on"] == []
    with zipfile.ZipFile(WHEELHOUSE / LINUX_WHEEL) as whl:
        for rel in runtime["files"]:
            assert (bundle / rel).read_bytes() == \
                whl.read("onnxruntime_qnn/" + rel.split("/")[-1]), rel
    assert "lib/libGenie.so" in runtime["files"] and "dsp/libQnnHtpV73Skel.so" in runtime["files"]
    report = check_bundle(bundle, {77: "v73"})
    assert not report.problems, report.problems
    assert "runtime" in report.checked
    from hexbundle.deploy.push import _check_deployable
    from hexbundle.support.errors import HexbundleError
    with pytest.raises(HexbundleError, match=r"'ortqnn'-backend bundle is not deployable .*"
                                             r"\(runtime.deployment: graph names\)"):
        _check_deployable(bundle)


@pytest.mark.heavy
def test_check_bundle_refuses_a_stub_of_another_release(ortqnn_bundle, tmp_path):
    """The bundle's 2.51.0 stub replaced by 2.45.40's real one, its digest and recorded versions
    updated to match: the release reread from the bytes still differs."""
    from hexbundle.checks.genie_bundle import check_bundle
    from hexbundle.formats.qairt_version import read_file_release
    from hexbundle.support.hashing import file_digest
    project, _, _ = ortqnn_bundle
    bundle = tmp_path / "bundle"
    shutil.copytree(project.bundle(backend="ortqnn"), bundle)
    stub = bundle / "lib" / "libQnnHtpV73Stub.so"
    stub.unlink()
    shutil.copyfile(wheel_file(wheels_dir(), LINUX_2_45, stub.name), stub)
    doc = json.loads((bundle / "manifest.json").read_text())
    doc["files"]["lib/libQnnHtpV73Stub.so"].update(size=stub.stat().st_size,
                                                   xxh3_128=file_digest(stub))
    doc["runtime"]["versions"]["lib/libQnnHtpV73Stub.so"] = read_file_release(stub).record()
    (bundle / "manifest.json").write_text(json.dumps(doc))
    problems = check_bundle(bundle, {77: "v73"}).problems
    assert any("not one QAIRT release" in p and "QAIRT 2.45.40.260406: lib/libQnnHtpV73Stub.so"
               in p for p in problems), problems


@pytest.mark.heavy
def test_a_runtime_wheel_of_another_release_stops_the_bundle_step(ortqnn_bundle, tmp_path):
    """requirements/ortqnn-runtime.txt pinning a wheel of QAIRT 2.45.40's real Linux files (the
    2.1.0 wheel's, repacked): the bundle step refuses, naming the files of each release, and
    the previous bundle stays."""
    project, env, _ = ortqnn_bundle
    house = tmp_path / "wheelhouse"
    house.mkdir()
    for wheel in WHEELHOUSE.glob("*win_amd64.whl"):   # the compiler's kit, unchanged
        os.symlink(wheel, house / wheel.name)
    other = house / "onnxruntime_qnn-2.1.0-cp312-cp312-manylinux_2_34_aarch64.whl"
    source = wheels_dir() / LINUX_2_45
    with zipfile.ZipFile(other, "w") as whl:
        for path in sorted(source.iterdir()):
            whl.write(path, "onnxruntime_qnn/" + path.name)
    digest = hashlib.sha256(other.read_bytes()).hexdigest()
    pins = project.root / "requirements" / "ortqnn-runtime.txt"
    before = pins.read_text()
    bundle = project.bundle(backend="ortqnn")
    kept = (bundle / "manifest.json").read_bytes()
    try:
        pins.write_text(f"onnxruntime-qnn==2.1.0 --hash=sha256:{digest}  "
                        "# platform: manylinux_2_34_aarch64\n")
        run = project.doit("bundle", "backend=ortqnn",
                           env={**env, "HEXBUNDLE_ORTQNN_WHEELHOUSE": str(house)}, check=False)
    finally:
        pins.write_text(before)
    text = run.out + run.err
    assert run.code != 0, text
    assert "not one QAIRT release" in text and "QAIRT 2.45.40" in text, text
    assert "lib/libQnnHtp.so" in text and "Traceback" not in text, text
    assert (bundle / "manifest.json").read_bytes() == kept


# ----------------------------------------------------------- the size check's metadata reader

def _context_binary(path: Path, payload_size: int, words: list) -> Path:
    """A file laid out as a QNN context binary's header and metadata (formats/qnn_context.py):
    the four magic words, the sizes, `words` as the metadata, a zero payload at 4096."""
    import struct
    meta = struct.pack(f"<{len(words)}I", *words)
    head = struct.pack(">4I", 2, 3, 0, 1) + struct.pack("<3Q", len(meta), 4096, payload_size)
    path.write_bytes((head + meta).ljust(4096, b"\0") + bytes(payload_size))
    return path


def test_the_weights_buffer_is_not_the_payload_size(tmp_path):
    """The metadata repeat the payload's size, which shrinks by the weights plus the programs'
    page-rounded difference (qwen2.5-7b-shape part 2: 16,384 B more than the weights); the
    weights' buffer is the largest drop among the other words."""
    from hexbundle.formats.qnn_context import weights_shrink
    larger = _context_binary(tmp_path / "probe.bin", 86016, [7, 86016, 65536, 900])
    smaller = _context_binary(tmp_path / "bin.bin", 49152, [7, 49152, 32768, 880])
    assert weights_shrink(larger, smaller) == 32768          # not the payload's 36864
    same = _context_binary(tmp_path / "same.bin", 86016, [7, 86016, 65536, 900])
    assert weights_shrink(larger, same) == 0


@pytest.mark.heavy
def test_a_boards_runner_is_an_ortqnn_bundles_only(ortqnn_bundle, tmp_path):
    """`runner: "board"` skips the bundled genie-t2t-run: check_bundle takes it from an ortqnn
    bundle (no wheel has one), and refuses it in a manifest that says qairt."""
    from hexbundle.checks.genie_bundle import check_bundle
    project, _, _ = ortqnn_bundle
    bundle = tmp_path / "bundle"
    shutil.copytree(project.bundle(backend="ortqnn"), bundle)
    assert not check_bundle(bundle, {77: "v73"}).problems
    doc = json.loads((bundle / "manifest.json").read_text())
    doc["backend"] = "qairt"
    (bundle / "manifest.json").write_text(json.dumps(doc))
    problems = check_bundle(bundle, {77: "v73"}).problems
    assert any("'runtime.runner' is \"board\" in a qairt bundle" in p for p in problems), problems


@pytest.mark.heavy
def test_the_bundle_with_its_runtime_is_up_to_date_on_the_next_run(ortqnn_bundle):
    """The bundle task's outputs are the files the step makes (Layout.runtime_bundle_files):
    the runtime, run.sh and clients/ of an ortqnn bundle too, so the next `doit bundle` finds
    it in place and changes nothing (it was reassembled every run: "run.sh is not part of the
    bundle: removing it")."""
    project, env, _ = ortqnn_bundle
    # The module's other tests share this project, and one of them makes the bundle step fail
    # (a wheel of another release), which doit answers by running it again next time: settle
    # whatever ran before, then judge the run after.
    project.doit("bundle", "backend=ortqnn", env=env)
    bundle = project.bundle(backend="ortqnn")
    before = {p: p.stat().st_ino for p in bundle.rglob("*") if p.is_file()}
    run = project.doit("bundle", "backend=ortqnn", env=env)
    assert "not part of the bundle" not in run.out + run.err, run.out + run.err
    assert "0 built" in run.out, run.out
    assert {p: p.stat().st_ino for p in bundle.rglob("*") if p.is_file()} == before


@pytest.mark.heavy
def test_a_no_op_ortqnn_run_replays_its_stamp_until_the_kit_pins_are_touched(ortqnn_bundle):
    """An ortqnn build gets the no-op stamp (graph.noopstamp): its toolchain version is read from
    requirements/ortqnn.txt (backends.toolchain_files), which the stamp watches beside the
    declared inputs. The second no-op run replays; the pin file touched (same bytes), the run
    resolves the build again and, the key being the same, builds nothing."""
    from test_noop_stamp import run as stamped
    project, env, _ = ortqnn_bundle
    project.doit("bundle", "backend=ortqnn", env=env)   # settle the module's other tests
    out, how = stamped(project, "bundle", "backend=ortqnn", env=env)
    assert how == "RESOLVED" and " 0 built," in out, out
    out, how = stamped(project, "bundle", "backend=ortqnn", env=env)
    assert how == "REPLAYED", out
    os.utime(project.root / "requirements" / "ortqnn.txt")
    out, how = stamped(project, "bundle", "backend=ortqnn", env=env)
    assert how == "RESOLVED" and " 0 built," in out, out
