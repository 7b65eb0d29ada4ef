"""Other Genie clients use a qairt bundle through its clients/ (issue 49, item 5), judged by the
clients' own code, pinned in the test extras: open-genie-server 1.8.0 (genie_server.config,
genie_server.slots, genie_server.templates) and chipwright 0.2.10 (chipwright.modalities.llm,
chipwright.device_adb). Real doit builds with the stand-in SDK, whose runtime files are real
binaries built here (tests/standin_runtime.py); the bundle is laid out as `doit deploy` leaves it
on a board (DIR a symlink to .DIR.hexbundle/<id>/). Each test shows the other direction: the
bundle without clients/ (or with it edited) fails the same check."""
import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from chipwright.device_adb import AdbDevice
from chipwright.modalities import llm as chipwright_llm
from genie_server.config import load_config
from genie_server.slots import load_dialog_config
from genie_server.templates import detect_template

from conftest import copy_project
from hexbundle.config.build import load_build
from hexbundle.formats.genie_clients import chat_template
from standin_runtime import build_runtime

# long end-to-end builds: in the full suite (CI), not the fast tier
pytestmark = [pytest.mark.deploy, pytest.mark.heavy]

HOST_GENIE = Path(__file__).resolve().parent / "standin_qairt" / "host" / "genie-t2t-run"
SKEL = "libQnnHtpV73Skel.so"
ANDROID_DEVICE = "snapdragon-8gen2"     # a Mobile chipset: an Android board, Hexagon v73
PROCESS_ENV = ("ADSP_LIBRARY_PATH", "QAIRT_SDK_ROOT", "QNN_SDK_ROOT", "LD_LIBRARY_PATH")


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clients")
    project = copy_project(tmp / "proj")
    sdk = build_runtime(tmp / "sdk", tmp / "work")
    for model in ("qwen2-tiny", "llama3-tiny"):
        project.doit("inputs", f"model={model}")
        qairt(project, sdk, model, "bundle")
    qairt(project, sdk, "qwen2-tiny", "bundle", device=ANDROID_DEVICE)
    project.sdk = sdk
    return project


def qairt(project, sdk: Path, model: str, *args, device="iq9075", check=True):
    env = {"QAIRT_SDK_ROOT": str(sdk), "STANDIN_QAIRT_MODE": "ok",
           "STANDIN_QAIRT_BIN_BYTES": json.dumps(bin_sizes(project, model, device))}
    return project.doit(*args, "backend=qairt", f"device={device}", f"model={model}", env=env,
                        check=check)


def bin_sizes(project, model: str, device: str) -> dict:
    """The bytes the size model expects of each bin (the stand-in compile pads to them)."""
    from hexbundle.checks import sizes
    from hexbundle.config.layout import Layout
    from hexbundle.steps.options import bundle_options
    layout = Layout(load_build(project.root, {"backend": "qairt", "device": device,
                                              "model": model}))
    o = bundle_options(layout)
    return {layout.bin_name(e.part): e.packed
            for e in sizes.expect_from_inputs(layout, o.convert, o.compile)}


def deployed(bundle: Path, top: Path, name="model") -> Path:
    """The bundle as `doit deploy` leaves it: DIR -> .DIR.hexbundle/<id>/ (a copy, links kept)."""
    state = top / f".{name}.hexbundle"
    state.mkdir(parents=True)
    real = state / "0123456789abcdef"
    shutil.copytree(bundle, real, symlinks=True)
    (top / name).symlink_to(real.relative_to(top))
    return top / name


def without_clients(bundle: Path, dest: Path) -> Path:
    shutil.copytree(bundle, dest, symlinks=True)
    shutil.rmtree(dest / "clients")
    return dest


@contextlib.contextmanager
def server_process(cwd: Path):
    """Where open-genie-server's code runs: its working directory, and the process environment
    it sets (apply_process_env), both restored afterwards."""
    saved_cwd, saved = os.getcwd(), {k: os.environ.get(k) for k in PROCESS_ENV}
    try:
        os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def server_view(config: Path, cache: Path) -> dict:
    """What open-genie-server 1.8.0 makes of `config`, by its own code, started as its
    documentation says (`genie-server` in the config's folder): the libGenie it loads, the
    skel folder the DSP searches first, the slot's model id and chat template, the dialog with
    its files resolved."""
    with server_process(config.parent):
        cfg = load_config(config.name)
        lib = Path(cfg.resolved_genie_lib_path())
        cfg.apply_process_env()
        first = Path(os.environ["ADSP_LIBRARY_PATH"].split(";")[0])
        spec = cfg.text_slots[0]
        _, dialog = load_dialog_config(spec.model_root, None, spec.name, cache, spec.poll,
                                       spec.config_file)
        return {"lib": lib.resolve(), "skel_dir": first.resolve(),
                "model": spec.model_root.name, "slot": spec.name,
                "template": detect_template(cfg.chat_template_override or spec.model_root.name),
                "dialog": dialog}


def users_own_config(folder: Path, bundle_dir: Path) -> Path:
    """The env_config.json open-genie-server's README has a user write for a model folder: the
    bundle as the SDK root and the model root."""
    folder.mkdir()
    config = folder / "env_config.json"
    config.write_text(json.dumps({"QAIRT_SDK_ROOT": str(bundle_dir), "HEXAGON_VERSION": "v73",
                                  "TEXT_SLOTS": [{"model_root": str(bundle_dir)}]}))
    return config


# ------------------------------------------------------------------------------ open-genie-server

@pytest.mark.parametrize("model, template", [("qwen2-tiny", "chatml"),
                                             ("llama3-tiny", "llama3")])
def test_open_genie_server_finds_libgenie_the_skel_the_model_and_its_template(
        proj, tmp_path, model, template):
    bundle = proj.bundle(model=model, backend="qairt")
    board = deployed(bundle, tmp_path / "board")
    real = board.resolve()
    view = server_view(board / "clients" / "open-genie-server" / "env_config.json",
                       tmp_path / "cache")
    assert view["lib"] == real / "lib" / "libGenie.so" and view["lib"].is_file()
    # the DSP searches the bundle's own skel first (a board's stale one comes after it)
    assert (view["skel_dir"] / SKEL).read_bytes() == (real / "dsp" / SKEL).read_bytes()
    assert view["model"] == view["slot"] == model
    assert view["template"] == template == chat_template(bundle / "tokenizer.json")
    # every file the dialog names is the bundle's own
    engine = view["dialog"]["engine"]
    named = [view["dialog"]["tokenizer"]["path"], engine["backend"]["extensions"],
             *engine["model"]["binary"]["ctx-bins"]]
    assert [Path(p).parent for p in named] == [real] * len(named)
    assert all(Path(p).is_file() for p in named)


def test_on_android_open_genie_server_searches_the_bundles_skel_after_the_vendors(proj,
                                                                                  tmp_path):
    """Android: open-genie-server's own order puts /vendor/lib/rfsa/adsp first (its choice
    for that OS, docs/deploy.md); the bundle's skel folder is the next."""
    bundle = proj.bundle(device=ANDROID_DEVICE, backend="qairt")
    config = bundle / "clients" / "open-genie-server" / "env_config.json"
    assert json.loads(config.read_text())["TARGET_PLATFORM"] == "android"
    with server_process(config.parent):
        cfg = load_config(config.name)
        assert cfg.platform == "android"
        lib = Path(cfg.resolved_genie_lib_path()).resolve()
        cfg.apply_process_env()
        search = os.environ["ADSP_LIBRARY_PATH"].split(";")
        skel_dir = Path(search[1]).resolve()
    assert search[0] == "/vendor/lib/rfsa/adsp"
    assert (skel_dir / SKEL).read_bytes() == (bundle / "dsp" / SKEL).read_bytes()
    assert lib == bundle.resolve() / "lib" / "libGenie.so"


def test_without_clients_open_genie_server_misses_libgenie_the_skel_the_name_and_template(
        proj, tmp_path):
    """The other direction: the bundle as it was, served as open-genie-server's README says."""
    bundle = without_clients(proj.bundle(model="llama3-tiny", backend="qairt"), tmp_path / "b")
    board = deployed(bundle, tmp_path / "board")
    config = users_own_config(tmp_path / "server", board)
    with server_process(config.parent):
        cfg = load_config(config.name)
        assert not Path(cfg.resolved_genie_lib_path()).exists()     # lib/<abi>/libGenie.so
        cfg.apply_process_env()
        assert not Path(os.environ["ADSP_LIBRARY_PATH"].split(";")[0]).exists()
        spec = cfg.text_slots[0]
    assert spec.model_root.name == "0123456789abcdef"               # the deployed bundle's id
    assert detect_template(spec.model_root.name) == "chatml"        # not Llama 3's


# ------------------------------------------------------------------------------ chipwright

class LocalAdb(AdbDevice):
    """chipwright's own adb device (push one regular file, refuse a folder, make the parent,
    test -e), its adb verbs done on this machine: the board is a local folder. One try each:
    a failed `test -e` is an answer here, not a dropped connection."""

    def __init__(self, env: dict):
        self.serial, self.env = None, env

    def _run(self, verb, *args, timeout=600):
        if verb == "shell":
            return subprocess.run(["sh", "-c", args[0]], capture_output=True, text=True,
                                  timeout=timeout, env=self.env)
        if verb in ("push", "pull"):
            return subprocess.run(["cp", args[0], args[1]], capture_output=True, text=True,
                                  timeout=timeout)
        raise AssertionError(f"chipwright asked adb for {verb!r}")

    def _retry(self, fn, tries=1, wait=0):
        return super()._retry(fn, tries=1, wait=0)


@pytest.fixture
def board(tmp_path):
    """What run.sh checks on a board: a fastrpc node, a libcdsprpc.so, a libstdc++."""
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "libcdsprpc.so").write_bytes(b"")
    (libs / "libstdc++.so.6").write_bytes(b"\0GLIBCXX_3.4.28\0GLIBCXX_3.4.29\0")
    node = tmp_path / "fastrpc-cdsp"
    node.write_bytes(b"")
    env = {"PATH": os.environ["PATH"], "HEXBUNDLE_FASTRPC_NODE": str(node),
           "LD_LIBRARY_PATH": str(libs), "TMPDIR": "/tmp"}
    return {"device": LocalAdb(env), "remote": tmp_path / "data" / "chipwright_llm"}


def chipwright_copy(bundle: Path, dest: Path) -> Path:
    """The copy chipwright is given (it writes its prompt and greedy config into the folder),
    genie-t2t-run the host stand-in (the bundle's is aarch64)."""
    shutil.copytree(bundle, dest, symlinks=True)
    shutil.copy(HOST_GENIE, dest / "bin" / "genie-t2t-run")
    return dest


def test_chipwright_pushes_the_bundle_with_its_folders_and_runs_it(proj, tmp_path, board):
    bundle = proj.bundle(model="qwen2-tiny", backend="qairt")
    block = json.loads((bundle / "clients" / "chipwright.json").read_text())
    assert block["modality"] == "llm"
    local = chipwright_copy(bundle, tmp_path / "local")
    out = chipwright_llm.run(board["device"], str(local), block["meta"], "Hello?",
                             remote_dir=str(board["remote"]))
    remote = board["remote"]
    for name in block["meta"]["bundle_files"]:
        assert (remote / name).read_bytes() == (local / name).read_bytes(), name
    assert {"lib", "dsp", "bin"} <= {p.name for p in remote.iterdir() if p.is_dir()}
    # run through the bundle's run.sh: its library paths, the bundle's skel first
    assert f"[INFO] LD_LIBRARY_PATH={remote}/lib:" in out["generation"]
    assert f"[INFO] ADSP_LIBRARY_PATH={remote}/dsp" in out["generation"]
    assert out["text"] == "Hello from the stand-in."
    assert out["tokens"]                                   # retokenized by the bundle's tokenizer
    prompt = (remote / "prompt.txt").read_text()
    assert prompt.startswith("<|im_start|>user\nHello?<|im_end|>")     # Qwen's ChatML


def test_without_clients_chipwright_stops_at_the_bundles_folders(proj, tmp_path, board):
    """The other direction: no registry meta from the bundle, chipwright lists the folder."""
    local = chipwright_copy(without_clients(proj.bundle(model="qwen2-tiny", backend="qairt"),
                                            tmp_path / "b"), tmp_path / "local")
    with pytest.raises(ValueError, match="is a directory"):
        chipwright_llm.run(board["device"], str(local), {}, "Hello?",
                           remote_dir=str(board["remote"]))


def test_chipwright_gets_raw_for_llama(proj):
    """chipwright renders ChatML or nothing: a Llama 3 bundle says raw, never ChatML."""
    bundle = proj.bundle(model="llama3-tiny", backend="qairt")
    meta = json.loads((bundle / "clients" / "chipwright.json").read_text())["meta"]
    assert meta["template"] == "raw"
    assert not any(f.startswith("clients/") for f in meta["bundle_files"])


# ------------------------------------------------------------------------------ check_bundle

def check_bundle(project, bundle: Path):
    return project.doit("check_bundle", "--path", str(bundle), check=False)


def refused(run, needle: str) -> None:
    text = run.out + run.err
    assert run.code != 0 and needle in text and "Traceback" not in text, text


def test_check_bundle_passes_the_built_clients_and_names_an_edited_or_missing_one(proj,
                                                                                   tmp_path):
    bundle = proj.bundle(model="llama3-tiny", backend="qairt")
    ok = check_bundle(proj, bundle)
    assert ok.code == 0 and "clients" in ok.out, ok.out + ok.err
    edited = tmp_path / "edited"
    shutil.copytree(bundle, edited)
    config = edited / "clients" / "open-genie-server" / "env_config.json"
    doc = json.loads(config.read_text())
    del doc["CHAT_TEMPLATE"]
    config.write_text(json.dumps(doc))
    refused(check_bundle(proj, edited),
            "clients/open-genie-server/env_config.json: not what the bundle step writes")
    refused(check_bundle(proj, without_clients(bundle, tmp_path / "missing")),
            "clients/chipwright.json: missing")
    linked = tmp_path / "linked"
    shutil.copytree(bundle, linked)
    skel = next((linked / "clients").rglob(SKEL))
    skel.unlink()
    skel.symlink_to(linked / "dsp" / SKEL)
    refused(check_bundle(proj, linked), "a symbolic link")


def test_a_reference_bundle_has_no_clients(proj):
    proj.doit("bundle")
    assert not (proj.bundle() / "clients").exists()
