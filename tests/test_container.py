"""The toolchain image and the docker executor, on a real Docker engine.

Skipped, with the reason, only when no engine answers AND the environment variable CI is not
set; under CI a missing engine fails these tests (.ci/run provisions one and builds the image).

The image is built here with `doit image` in a copy of the project: with the engine's layer
cache warm (after .ci/run or any earlier build of the same inputs) that takes seconds and gives
the same image ID, which is itself checked.
"""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from conftest import copy_project, default_sigint

ROOT = Path(__file__).resolve().parent.parent
STANDIN_SDK = Path(__file__).resolve().parent / "standin_qairt"
LOCAL_BASE = "hexbundle/base:bookworm-py3.10"      # what scripts/make_base_image.sh makes
STANDIN_TAG = f"hexbundle/toolchain:test-standin-{os.getpid()}"   # concurrent runs apart
SDK_VERSION = "2.42.0.251225"


def unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so the container tests must run, but: {reason}")
    pytest.skip(f"{reason} (these tests run under CI=true, where .ci/run provides it)")


@pytest.fixture(scope="session")
def engine():
    try:
        import docker
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # noqa: BLE001 -- no package, socket or daemon: "no engine"
        unavailable(f"no Docker engine answers ({exc}); start dockerd or set DOCKER_HOST")
    return client


def docker_errors():
    import docker.errors
    return docker.errors


def base_image(engine) -> str:
    """The base to build on: the pinned one if this engine has it, else the local one."""
    from hexbundle.config.toolchain import load_toolchain
    for ref in (os.environ.get("HEXBUNDLE_TEST_BASE"), load_toolchain(ROOT).base, LOCAL_BASE):
        if ref:
            try:
                engine.images.get(ref)
            except docker_errors().ImageNotFound:
                continue
            return ref
    unavailable(f"no base image: neither the pinned base nor {LOCAL_BASE} is in the engine; "
                "run scripts/make_base_image.sh")


def toolchain_copy(dest: Path):
    """A project copy that can build the image: sources plus the Dockerfile, requirements/ and
    the wheelhouse (hard links to build/wheelhouse)."""
    proj = copy_project(dest)
    shutil.copy2(ROOT / "Dockerfile", proj.root / "Dockerfile")
    shutil.copytree(ROOT / "requirements", proj.root / "requirements")
    wheels = proj.root / "build" / "wheelhouse"
    wheels.mkdir(parents=True)
    for wheel in (ROOT / "build" / "wheelhouse").glob("*.whl"):
        try:
            os.link(wheel, wheels / wheel.name)
        except OSError:   # another filesystem
            shutil.copy2(wheel, wheels / wheel.name)
    return proj


@pytest.fixture(scope="session")
def toolchain_image(engine, tmp_path_factory):
    """`doit image` (no SDK staged) in a project copy; returns (project, record)."""
    proj = toolchain_copy(tmp_path_factory.mktemp("image") / "proj")
    base = base_image(engine)
    proj.image_run = proj.doit("image", "--base", base)
    record = json.loads((proj.root / "build" / "image" / "image.json").read_text())
    return proj, record


def step_containers(engine, proj):
    # sparse: one list call, no inspect per container (a step container removed between the
    # list and its inspect would raise NotFound: seen once in CI)
    return engine.containers.list(all=True, sparse=True,
                                  filters={"label": f"org.hexbundle.root={proj.root}"})


def docker_bundle(tmp_path, name):
    proj = copy_project(tmp_path / name)
    proj.run = proj.doit("bundle", "executor=docker")
    return proj


# --- the image -------------------------------------------------------------------------------

def test_the_image_says_what_it_carries(engine, toolchain_image):
    proj, record = toolchain_image
    image = engine.images.get("hexbundle/toolchain:local")
    assert image.id == record["id"]
    assert (proj.root / "build" / "image" / "image-id.txt").read_text().strip() == image.id
    labels = image.labels
    assert labels["hexbundle.sdk"] == "none" and labels["hexbundle.sdk.sha256"] == "none"
    assert labels["hexbundle.sdk.archive"].startswith("none: no SDK archive was staged")
    lock = (ROOT / "requirements" / "container.lock").read_bytes()
    assert labels["hexbundle.lock.sha256"] == hashlib.sha256(lock).hexdigest()
    assert labels["hexbundle.base.id"] == engine.images.get(record["base"]).id
    assert labels["hexbundle.python"] == "3.10"
    if record["base"] == LOCAL_BASE:   # the base's own labels say it is Debian, not Ubuntu
        assert "NOT Ubuntu 22.04" in labels["org.hexbundle.base.os"]
        assert "CPython 3.10" in labels["org.hexbundle.base.python"]
    config = image.attrs["Config"]
    assert config["User"] == "1000:1000"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["QNN_SDK_ROOT"] == "" and env["QAIRT_SDK_ROOT"] == ""
    assert "step " in proj.image_run.out    # the progress line
    log = (proj.root / "build" / "logs" / "image.log").read_text()
    assert "Successfully built" in log and "Successfully tagged hexbundle/toolchain:local" in log


def test_an_unchanged_rebuild_is_cached_and_gives_the_same_image(toolchain_image):
    proj, record = toolchain_image
    again = proj.doit("image", "--base", record["base"])
    assert "-- image" in again.out             # up to date: nothing to do
    proj.doit("forget", "image")
    rebuilt = proj.doit("image", "--base", record["base"])
    assert "image" in rebuilt.executed
    assert json.loads((proj.root / "build" / "image" / "image.json").read_text())["id"] == \
        record["id"]


def test_a_failing_image_build_shows_the_step_and_records_nothing(toolchain_image, tmp_path):
    _, record = toolchain_image
    proj = toolchain_copy(tmp_path / "proj")
    dockerfile = proj.root / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN echo boom-deliberate && false\n")
    cfg = proj.root / "configs" / "toolchain.toml"
    cfg.write_text(cfg.read_text().replace('tag = "hexbundle/toolchain:local"',
                                           f'tag = "hexbundle/toolchain:test-fail-{os.getpid()}"'))
    run = proj.doit("image", "--base", record["base"], check=False)
    assert run.code != 0
    assert "the image build failed" in run.out and "boom-deliberate" in run.out
    assert "returned a non-zero code" in run.out
    assert not (proj.root / "build" / "image" / "image-id.txt").exists()


# --- the docker executor ----------------------------------------------------------------------

def test_a_docker_bundle_is_byte_identical_to_a_local_one(engine, toolchain_image, tmp_path):
    _, record = toolchain_image
    docker_proj = docker_bundle(tmp_path, "docker")
    local_proj = copy_project(tmp_path / "local")
    local_proj.doit("bundle")
    in_docker, local = docker_proj.bundle(), local_proj.bundle()
    names = sorted(p.name for p in local.iterdir())
    assert sorted(p.name for p in in_docker.iterdir()) == names
    for name in names:   # the manifest too: how a bundle was built is recorded beside it
        assert (in_docker / name).read_bytes() == (local / name).read_bytes(), name
    info = json.loads((docker_proj.build_dir() / "build-info.json").read_text())
    assert info == {"executor": "docker", "image": record["id"]}
    # every step ran in a container, as the host's user, and none is left behind
    logs = docker_proj.build_dir() / "logs"
    assert len(list(logs.glob("*.log"))) >= 18
    for log in logs.glob("*.log"):
        assert log.read_text().startswith(f"# container: image hexbundle/toolchain:local "
                                          f"{record['id']}, user {os.getuid()}:{os.getgid()}")
    for path in (docker_proj.root / "build").rglob("*"):
        assert path.stat().st_uid == os.getuid(), path
    assert not step_containers(engine, docker_proj)
    # switching the executor reruns the steps (the image is part of their up-to-date key)
    status = local_proj.doit("list", "--all", "--status", "executor=docker").out
    assert "R convert:part_1_of_4_prompt" in status and "R bundle" in status
    assert "U convert:part_1_of_4_prompt" in local_proj.doit("list", "--all", "--status").out


def test_ctrl_c_removes_the_running_step_container(engine, toolchain_image, tmp_path):
    proj = copy_project(tmp_path / "proj")
    doit = subprocess.Popen([sys.executable, "-m", "doit", "bundle", "executor=docker"],
                            preexec_fn=default_sigint,
                            cwd=proj.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not step_containers(engine, proj) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert step_containers(engine, proj), "no step container appeared within 60 s"
        doit.send_signal(signal.SIGINT)
        doit.wait(timeout=60)
    finally:
        if doit.poll() is None:
            doit.kill()
    assert not step_containers(engine, proj)
    assert doit.returncode != 0


def test_a_missing_image_says_to_run_doit_image(engine, project):
    cfg = project.root / "configs" / "toolchain.toml"
    cfg.write_text(cfg.read_text().replace('tag = "hexbundle/toolchain:local"',
                                           'tag = "hexbundle/toolchain:no-such-image"'))
    run = project.doit("inputs:tokenizer", "executor=docker", check=False)
    assert run.code != 0
    assert "hexbundle/toolchain:no-such-image is not in the local Docker engine" in run.out
    assert "never pulls" in run.out and "run `doit image`" in run.out


def test_a_step_container_is_isolated(engine, toolchain_image, tmp_path):
    """The run options of a step, on a probe command: read-only sources, writable build root,
    no network, no capabilities, the given uid, an environment of our own."""
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.steps import docker_executor as container
    proj = copy_project(tmp_path / "proj")
    layout = Layout(load_build(proj.root))
    (proj.root / "build").mkdir()
    os.chmod(proj.root / "build", 0o777)   # the probe runs as uid 4321: only the mount
    (proj.root / "open.txt").write_text("")   # modes would let it write either place
    os.chmod(proj.root / "open.txt", 0o666)
    probe = r"""
import json, os, sys
r = {}
try:
    open(sys.argv[1] + '/open.txt', 'a'); r['src'] = 'writable'
except OSError as e:
    r['src'] = e.strerror
open(sys.argv[1] + '/build/probe.txt', 'w').write('x'); r['build'] = 'writable'
r['net'] = sorted(os.listdir('/sys/class/net'))
r['cap'] = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0]
r['uid'] = '%d:%d' % (os.getuid(), os.getgid())
r['env'] = sorted(os.environ)
print(json.dumps(r))
"""
    out = engine.containers.run(
        toolchain_image[1]["id"], ["python3.10", "-c", probe, str(proj.root)], remove=True,
        working_dir=str(proj.root), volumes=container.mounts(layout),
        environment=container.environment(layout), user="4321:4321", network_mode="none",
        cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True,
        tmpfs={"/tmp": "rw,exec"})
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["src"] == "Read-only file system"
    assert result["build"] == "writable"
    assert (proj.root / "build" / "probe.txt").stat().st_uid == 4321
    assert result["net"] == ["lo"]                 # network none: loopback only
    assert result["cap"] == "0000000000000000"
    assert result["uid"] == "4321:4321"
    ours = set(container.environment(layout))
    image_env = {"PATH", "QNN_SDK_ROOT", "QAIRT_SDK_ROOT", "PYTHONPATH", "LD_LIBRARY_PATH",
                 "LANG", "PYTHONDONTWRITEBYTECODE", "HOSTNAME"}
    assert set(result["env"]) <= ours | image_env, set(result["env"]) - ours - image_env


def test_a_non_root_uid_can_write_outputs_and_the_digest_cache(engine, toolchain_image, built,
                                                              tmp_path):
    """A user's build dir owned by that user: the step writes as them (here uid 4321)."""
    if os.getuid() != 0:
        pytest.skip("needs root to hand a build directory to another uid")
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.steps import docker_executor as container
    from hexbundle.steps.executor import step_spec
    proj = copy_project(tmp_path / "proj")
    shutil.copytree(built.root / "build", proj.root / "build", symlinks=True)
    subprocess.run(["chown", "-R", "4321:4321", str(proj.root / "build")], check=True)
    layout = Layout(load_build(proj.root))
    log = tmp_path / "bundle.log"
    code = container.run_in_container(layout, step_spec(layout, {}, "bundle"), log,
                                      user="4321:4321")
    assert code == 0, log.read_text()
    manifest = proj.bundle() / "manifest.json"
    assert manifest.stat().st_uid == 4321
    info = proj.build_dir() / "build-info.json"
    assert json.loads(info.read_text())["image"] == toolchain_image[1]["id"]
    digests = proj.root / "build" / ".hexbundle" / "digests.json"
    assert digests.stat().st_uid == 4321
    assert str(proj.root / "configs" / "socs.toml") in json.loads(digests.read_text())


# --- the qairt backend in an image that carries the (stand-in) SDK -------------------------------

def standin_archive(path: Path) -> str:
    """The stand-in SDK zipped as Qualcomm ships QAIRT: qairt/<version>/ at the top."""
    with zipfile.ZipFile(path, "w") as zf:
        for f in sorted(STANDIN_SDK.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                zf.write(f, f"qairt/{SDK_VERSION}/{f.relative_to(STANDIN_SDK)}")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_qairt_backend_runs_in_an_image_with_the_sdk(engine, toolchain_image, tmp_path):
    _, record = toolchain_image
    proj = toolchain_copy(tmp_path / "proj")
    archive = proj.root / "toolchain" / f"v{SDK_VERSION}.zip"
    archive.parent.mkdir()
    digest = standin_archive(archive)
    cfg = proj.root / "configs" / "toolchain.toml"
    cfg.write_text(cfg.read_text().replace('sha256 = ""', f'sha256 = "{digest}"')
                   .replace('tag = "hexbundle/toolchain:local"', f'tag = "{STANDIN_TAG}"'))
    try:
        proj.doit("image", "--base", record["base"])
        labels = engine.images.get(STANDIN_TAG).labels
        assert labels["hexbundle.sdk"] == SDK_VERSION and labels["hexbundle.sdk.sha256"] == digest
        assert labels["hexbundle.sdk.archive"] == archive.name
        proj.doit("compile:part_1_of_4", "backend=qairt", "executor=docker")
        qairt_dir = proj.build_dir(backend="qairt")
        doc = json.loads((qairt_dir / "bin" / "qwen2_tiny_part_1_of_4.bin").read_text())
        assert doc["graphs"] == ["prompt_ar128_cl256_1_of_4", "token_ar1_cl256_1_of_4"]
        assert "weights_packing=True" in doc["config"]
        log = (qairt_dir / "logs" / "compile__part_1_of_4.log").read_text()
        assert f"backend qairt (QAIRT {SDK_VERSION})" in log
        assert "[sdk] [ INFO ] standin context-binary generator: composing graphs" in log
        # the SDK-less image is refused for the qairt backend, saying what to do
        proj2 = copy_project(tmp_path / "proj2")
        run = proj2.doit("inputs:tokenizer", "backend=qairt", "executor=docker", check=False)
        assert run.code != 0 and "carries QAIRT SDK 'none'" in run.out
        assert "stage the SDK archive" in run.out
    finally:
        try:
            engine.images.remove(STANDIN_TAG, force=True)
        except docker_errors().ImageNotFound:
            pass


def test_an_export_outside_the_project_is_split_and_built_in_the_container(engine, toolchain_image,
                                                                          tmp_path):
    """The Qualcomm-made export (tests/data/qaihm) used in place from outside the project: the
    step containers see it read-only at its own path; the split and the build match local ones."""
    export = tmp_path / "export"
    shutil.copytree(ROOT / "tests" / "data" / "qaihm" / "export", export)
    bundles, projects = {}, {}
    for executor in ("docker", "local"):
        proj = projects[executor] = copy_project(tmp_path / executor)
        proj.doit("import_export", "--dir", str(export), "--name", "mine", "--plan", "0,3,3,3")
        proj.doit("bundle", "model=mine", f"executor={executor}")
        bundles[executor] = proj.bundle("mine")
    names = sorted(p.name for p in bundles["local"].iterdir())
    assert sorted(p.name for p in bundles["docker"].iterdir()) == names
    for name in names:
        assert (bundles["docker"] / name).read_bytes() == (bundles["local"] / name).read_bytes(), name
    log = projects["docker"].build_dir("mine") / "logs" / "inputs__part_2_of_4.log"
    assert log.read_text().startswith("# container: image hexbundle/toolchain:local")
