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

from conftest import copy_project, step_descriptions, steps_run

pytestmark = pytest.mark.heavy   # a Docker engine and the toolchain image: the full suite (`pytest --full`)

ROOT = Path(__file__).resolve().parent.parent
STANDIN_SDK = Path(__file__).resolve().parent / "standin_qairt"
LOCAL_BASE = "hexbundle/base:bookworm-py3.10"      # what scripts/make_base_image.sh makes
STANDIN_TAG = f"hexbundle/toolchain:test-standin-{os.getpid()}"   # concurrent runs apart
SDK_VERSION = "2.42.0.251225"
HOLD_WAIT_S = 120


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


def expected_step_user() -> str:
    """Who the steps run as: the host user, or [container] user's default when that is root."""
    return "65534:65534" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"


def lock_run_id(proj) -> str:
    """The run id the build lock records beside the holder's pid."""
    return (proj.root / "build" / ".hexbundle" / "lock").read_text().split()[1]


def container_records(proj) -> list:
    records = proj.root / "build" / ".hexbundle" / "containers"
    return sorted(p.name for p in records.iterdir()) if records.is_dir() else []


def temp_leftovers(build: Path) -> list:
    from hexbundle.support.atomic import is_temp_name
    return [p for p in build.rglob("*") if is_temp_name(p.name)]


def set_container_settings(proj, **values) -> None:
    """Replace keys of [container] in the project copy's configs/build.toml."""
    build = proj.root / "configs" / "build.toml"
    lines = [ln for ln in build.read_text().splitlines()
             if not any(ln.startswith(f"{k} ") for k in values)]
    lines += [] if "[container]" in lines else ["[container]"]
    at = lines.index("[container]") + 1
    lines[at:at] = [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    build.write_text("\n".join(lines) + "\n")


class HeldRun:
    """`doit` in the background, in a session of its own (a test can kill -9 its whole process
    group, as a terminal would, without touching pytest), held in a step by the test hook
    (hexbundle/support/testhooks.py; the docker executor passes it into the container)."""

    def __init__(self, proj, args, pause_at: str, tmp: Path):
        self.dir = tmp
        self.dir.mkdir(parents=True)
        os.chmod(self.dir, 0o777)   # the step writes `paused` here as its own uid
        env = {**os.environ, "HEXBUNDLE_TEST_PAUSE_AT": pause_at,
               "HEXBUNDLE_TEST_PAUSE_DIR": str(self.dir)}
        self.out, self.err = self.dir / "out.txt", self.dir / "err.txt"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "doit", *args], cwd=proj.root,
                                         stdout=out, stderr=err, env=env, start_new_session=True)

    def text(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def wait_paused(self) -> None:
        deadline = time.monotonic() + HOLD_WAIT_S   # a safety net, not a timing
        while not (self.dir / "paused").exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended (exit {self.proc.returncode}) before its "
                                     f"step reached the pause point:\n{self.text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no pause after {HOLD_WAIT_S}s:\n{self.text()}")
            time.sleep(0.05)

    def release(self) -> int:
        (self.dir / "release").touch()
        return self.proc.wait(timeout=HOLD_WAIT_S)

    def kill_group(self) -> int:
        os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=HOLD_WAIT_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + HOLD_WAIT_S   # a safety net, not a timing
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {HOLD_WAIT_S}s")
        time.sleep(0.1)


def docker_bundle(tmp_path, name):
    proj = copy_project(tmp_path / name)
    proj.run = proj.doit("bundle", "executor=docker")
    return proj


def same_but_the_image(in_docker: Path, local: Path, image_id: str) -> None:
    """A docker bundle and a local one: the same files, byte for byte, but for the manifest's
    "image" (the image the steps ran in; null for the local build)."""
    names = sorted(p.name for p in local.iterdir())
    assert sorted(p.name for p in in_docker.iterdir()) == names
    for name in names:
        if name == "manifest.json":
            docker_doc, local_doc = (json.loads((d / name).read_text()) for d in (in_docker, local))
            assert (docker_doc.pop("image"), local_doc.pop("image")) == (image_id, None)
            assert docker_doc == local_doc
            continue
        assert (in_docker / name).read_bytes() == (local / name).read_bytes(), name


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
    assert again.executed == set(), again.out  # up to date: nothing to do
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
    same_but_the_image(docker_proj.bundle(), local_proj.bundle(), record["id"])
    info = json.loads((docker_proj.build_dir() / "build-info.json").read_text())
    assert (info["executor"], info["image"]) == ("docker", record["id"])
    assert {o["origin"] for o in info["steps"].values()} == {"local"}   # no remote cache
    assert info["remote_cache"] == {"steps_from_cache": [], "servers": []}
    # every step ran in a container, as the host's user (never root: as 65534 when the host
    # user is root), and none is left behind
    user = expected_step_user()
    logs = docker_proj.build_dir() / "logs"
    assert len(list(logs.glob("*.log"))) >= 18
    for log in logs.glob("*.log"):
        assert log.read_text().startswith(f"# container: image hexbundle/toolchain:local "
                                          f"{record['id']}, user {user}")
    uid, gid = (int(n) for n in user.split(":"))
    build_info = docker_proj.build_dir() / "build-info.json"
    for path in (docker_proj.root / "build" / "qwen2-tiny").rglob("*"):   # the model's tree:
        if path != build_info:                                           # steps' outputs
            assert (path.lstat().st_uid, path.lstat().st_gid) == (uid, gid), path
    state = docker_proj.root / "build" / ".hexbundle"
    # the doit process's own files stay the host user's: the lock, the variant's and model's DBs,
    # and build-info.json, which the doit run writes after the bundle step (graph.targets)
    for path in (state / "lock", docker_proj.doit_db(), docker_proj.model_db(), build_info):
        assert path.stat().st_uid == os.getuid(), path
    assert not step_containers(engine, docker_proj)
    assert not list((state / "containers").iterdir())   # each container's record went with it
    # switching the executor reruns the steps (the image is part of their up-to-date key)
    status = local_proj.doit("list", "--all", "--status", "executor=docker").out
    assert "R convert:part_1_of_4_prompt" in status and "R bundle" in status
    assert "U convert:part_1_of_4_prompt" in local_proj.doit("list", "--all", "--status").out


def test_ctrl_c_removes_the_running_step_container(engine, toolchain_image, tmp_path):
    proj = copy_project(tmp_path / "proj")
    doit = subprocess.Popen([sys.executable, "-m", "doit", "bundle", "executor=docker"],
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
    """The executor's run options (run_options), on a probe command: read-only sources,
    writable build root, no network, no capabilities, the given uid, an environment of our own."""
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
        **container.run_options(layout, "4321:4321"))
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
    from hexbundle.graph.targets import record_build_info
    from hexbundle.steps.executor import described_spec
    proj = copy_project(tmp_path / "proj")
    shutil.copytree(built.root / "build", proj.root / "build", symlinks=True)
    subprocess.run(["chown", "-R", "4321:4321", str(proj.root / "build")], check=True)
    layout = Layout(load_build(proj.root, {"executor": "docker"}))
    log = tmp_path / "bundle.log"
    spec = described_spec(layout, step_descriptions(proj.root, ("bundle",))["bundle"])
    code = container.run_in_container(layout, spec, log, user="4321:4321")
    assert code == 0, log.read_text()
    record_build_info(layout)   # the doit run writes it after the step
    manifest = proj.bundle() / "manifest.json"
    assert manifest.stat().st_uid == 4321
    info = proj.build_dir() / "build-info.json"
    assert json.loads(info.read_text())["image"] == toolchain_image[1]["id"]
    digests = proj.root / "build" / ".hexbundle" / "digests.json"
    assert digests.stat().st_uid == 4321
    assert str(proj.root / "configs" / "devices.toml") in json.loads(digests.read_text())


# --- confinement: limits, an unprivileged uid, and what a kill -9 leaves ------------------------

CONFINED_PROBE = r"""
import json, os, subprocess, sys, threading
r = {}
status = {l.split(':')[0]: l.split()[1:] for l in open('/proc/1/status') if ':' in l}
r['step_uid'] = ':'.join([status['Uid'][0], status['Gid'][0]])   # pid 1: the step itself
r['exec_uid'] = '%d:%d' % (os.getuid(), os.getgid())
r['cap'], r['nnp'] = status['CapEff'][0], status['NoNewPrivs'][0]
r['net'] = sorted(os.listdir('/sys/class/net'))
for key, path in (('memory', '/sys/fs/cgroup/memory.max'),
                  ('memory', '/sys/fs/cgroup/memory/memory.limit_in_bytes'),
                  ('pids', '/sys/fs/cgroup/pids.max'), ('pids', '/sys/fs/cgroup/pids/pids.max')):
    if os.path.exists(path):
        r[key] = open(path).read().strip()
try:
    with open('/tmp/big', 'wb') as fh:
        fh.write(b'x' * (16 << 20))
    r['tmp_16m'] = 'written'
except OSError as e:
    r['tmp_16m'] = e.strerror
if os.path.exists('/tmp/big'):
    os.remove('/tmp/big')
with open('/tmp/run.sh', 'w') as fh:
    fh.write('#!/bin/sh\necho ran\n')
os.chmod('/tmp/run.sh', 0o755)
try:
    r['tmp_exec'] = subprocess.run(['/tmp/run.sh'], capture_output=True, text=True).stdout
except OSError as e:
    r['tmp_exec'] = e.strerror
stop, threads = threading.Event(), []
try:
    for _ in range(200):
        t = threading.Thread(target=stop.wait)
        t.start()
        threads.append(t)
    r['threads'] = 'all 200'
except RuntimeError:
    r['threads'] = len(threads)
stop.set()
for t in threads:
    t.join()
for where in ('/', sys.argv[1]):
    try:
        open(os.path.join(where, 'probe.txt'), 'w')
        r[where] = 'writable'
    except OSError as e:
        r[where] = e.strerror
print(json.dumps(r))
"""


def test_a_step_container_runs_confined_as_configured(engine, toolchain_image, tmp_path):
    """A real step, held in its container by the test hook: the container's settings through the
    Docker API, and what they do, from inside it."""
    proj = copy_project(tmp_path / "proj")
    cpus = 1.5 if engine.info()["NCPU"] >= 2 else 0.5
    set_container_settings(proj, pids_limit=64, memory="1g", cpus=cpus, tmp_size="8m",
                           user="4242:4343")
    user = "4242:4343" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"
    proj.doit("inputs")   # locally: the held run starts one container, the convert's
    held = HeldRun(proj, ["convert:part_1_of_4_prompt", "executor=docker"], "convert",
                   tmp_path / "held")
    try:
        held.wait_paused()
        (entry,) = step_containers(engine, proj)
        container = engine.containers.get(entry.id)
        attrs, host = container.attrs, container.attrs["HostConfig"]
        run = lock_run_id(proj)
        assert attrs["Name"] == f"/hexbundle-{run}-convert.part_1_of_4_prompt"
        assert container.labels["org.hexbundle.run"] == run
        assert container.labels["org.hexbundle.build-root"] == str(proj.root / "build")
        assert container_records(proj) == [attrs["Name"][1:]]
        assert attrs["Config"]["User"] == user
        assert host["PidsLimit"] == 64
        assert host["Memory"] == 1 << 30
        assert host["NanoCpus"] == round(cpus * 1e9)
        assert host["Tmpfs"] == {"/tmp": "rw,noexec,nosuid,nodev,size=8388608"}
        # what held before
        assert host["ReadonlyRootfs"] is True and host["NetworkMode"] == "none"
        assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]

        code, out = container.exec_run(["python3.10", "-c", CONFINED_PROBE, str(proj.root)])
        assert code == 0, out.decode()
        probe = json.loads(out.decode().strip().splitlines()[-1])
        assert probe["step_uid"] == user and probe["exec_uid"] == user
        assert probe["memory"] == str(1 << 30) and probe["pids"] == "64"
        assert probe["tmp_16m"] == "No space left on device"   # /tmp is 8m
        assert probe["tmp_exec"] == "Permission denied"        # noexec
        assert isinstance(probe["threads"], int) and probe["threads"] < 64, probe["threads"]
        assert probe["cap"] == "0000000000000000" and probe["nnp"] == "1"
        assert probe["net"] == ["lo"]
        assert probe["/"] == "Read-only file system"
        assert probe[str(proj.root)] == "Read-only file system"

        assert held.release() == 0, held.text()
    finally:
        held.stop()
    dlc = proj.build_dir() / "dlc" / "prompt_ar128_cl256_1_of_4.dlc"
    assert f"{dlc.stat().st_uid}:{dlc.stat().st_gid}" == user   # the step wrote it, as `user`
    assert not step_containers(engine, proj) and container_records(proj) == []


@pytest.mark.parametrize("next_executor", ["docker", "local"])
def test_a_killed_runs_step_container_is_removed_by_the_next_run_before_anything_else(
        engine, toolchain_image, tmp_path, next_executor):
    """kill -9 of the whole doit process group in the middle of a step: its container is not in
    that group and lives on. It stops by itself (its lifeline, stdin, closed with the run) and the
    next run, docker or local, removes it under the lock before its clean-up and its tasks."""
    proj = copy_project(tmp_path / "proj")
    proj.doit("inputs")
    held = HeldRun(proj, ["bundle", "executor=docker"], "convert", tmp_path / "held")
    try:
        held.wait_paused()
        (entry,) = step_containers(engine, proj)
        assert held.kill_group() == -signal.SIGKILL
    finally:
        held.stop()
    container = engine.containers.get(entry.id)   # still there: the engine runs it, not doit
    name, task = container.name, container.labels["org.hexbundle.task"]
    assert task.startswith("convert:") and name.endswith(task.replace(":", "."))
    assert container.labels["org.hexbundle.run"] == lock_run_id(proj)
    assert container_records(proj) == [name]
    wait_until(lambda: container.reload() or container.status == "exited",
               "stopped by its lifeline")
    assert container.attrs["State"]["ExitCode"] == 4
    assert container.logs().decode().rstrip().endswith(
        "hexbundle: the run that started this step has ended (its doit process is gone): the "
        "step stops here")
    assert temp_leftovers(proj.root / "build")   # the convert was killed mid-write

    rerun = proj.doit("bundle", f"executor={next_executor}")
    lines = rerun.err.splitlines()
    removing = [i for i, line in enumerate(lines) if line.startswith(
        f"hexbundle: removing the step container {name} (exited) of an interrupted run (run "
        f"{container.labels['org.hexbundle.run']}, task {task})")]
    swept = [i for i, line in enumerate(lines) if "left by an interrupted run" in line]
    assert len(removing) == 1 and swept and removing[0] < swept[0], rerun.err
    with pytest.raises(docker_errors().NotFound):
        engine.containers.get(entry.id)
    assert not step_containers(engine, proj) and container_records(proj) == []
    assert task in rerun.executed
    assert temp_leftovers(proj.root / "build") == []
    assert proj.doit("check_sizes").code == 0


def test_the_next_run_removes_a_running_leftover_of_its_own_build_root_only(engine,
                                                                            toolchain_image,
                                                                            tmp_path):
    """A container of a gone run that still runs (no lifeline: one made as a step's would be,
    here a sleep): removed and waited for; another build root's container is left alone."""
    proj = copy_project(tmp_path / "proj")

    def leftover(build_root: Path, tag: str):
        return engine.containers.run(
            toolchain_image[1]["id"], ["sleep", "600"], detach=True, network_mode="none",
            name=f"hexbundle-test-{tag}-{os.getpid()}",
            labels={"org.hexbundle.build-root": str(build_root),
                    "org.hexbundle.run": "0123456789ab", "org.hexbundle.task": "compile:x"})

    ours = leftover(proj.root / "build", "ours")
    theirs = leftover(tmp_path / "another-build-root", "theirs")
    try:
        run = proj.doit("inputs:tokenizer", "executor=docker")
        assert (f"hexbundle: removing the step container {ours.name} (running) of an interrupted "
                "run (run 0123456789ab, task compile:x) before this run starts: it could still "
                "write into the build root") in run.err
        with pytest.raises(docker_errors().NotFound):
            engine.containers.get(ours.id)
        theirs.reload()
        assert theirs.status == "running" and theirs.name not in run.err
    finally:
        for container in (ours, theirs):
            try:
                container.remove(force=True)
            except docker_errors().NotFound:
                pass


def test_hand_over_gives_the_step_user_the_model_tree_and_follows_no_link(tmp_path):
    """hexbundle as root, steps as another uid: the directories steps write into become that
    uid's; a symlink there is chowned itself, never what it points to; the lock stays root's."""
    if os.getuid() != 0:
        pytest.skip("hexbundle hands the build root over only when it runs as root")
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.steps import docker_executor as container
    proj = copy_project(tmp_path / "proj")
    layout = Layout(load_build(proj.root))
    outside = tmp_path / "outside.txt"
    outside.write_text("root's own")
    layout.dlc_dir.mkdir(parents=True)
    (layout.dlc_dir / "a.dlc").write_text("x")
    (layout.dlc_dir / "link.dlc").symlink_to(outside)
    (layout.build_dir / "dir-link").symlink_to(tmp_path)
    layout.state_dir.mkdir(parents=True)
    layout.lock.write_text("1 0123456789ab\n")
    layout.digest_cache.write_text("{}")
    os.chmod(layout.digest_cache, 0o600)

    container.hand_over(layout, "4242:4343")

    def owner(path: Path):
        return path.lstat().st_uid, path.lstat().st_gid

    for path in (layout.model_dir, layout.build_dir, layout.dlc_dir, layout.dlc_dir / "a.dlc",
                 layout.dlc_dir / "link.dlc", layout.build_dir / "dir-link", layout.state_dir,
                 layout.digest_cache):
        assert owner(path) == (4242, 4343), path
    assert owner(outside) == (0, 0) and owner(tmp_path) == (0, 0)
    assert owner(layout.lock) == (0, 0)


def test_docker_steps_share_a_remote_cache_keyed_by_the_toolchain_image(engine, toolchain_image,
                                                                          tmp_path):
    """executor=docker through a real BuildGrid: a second machine gets every step from the
    cache; the Action's platform names the image (container-image), so a local-executor build
    shares nothing with it."""
    import re
    from hexbundle.remote.buildgrid import BuildGrid, find_bgd
    if not find_bgd():
        unavailable("no BuildGrid `bgd`: set HEXBUNDLE_BGD")
    _, record = toolchain_image
    with BuildGrid.start(tmp_path / "bgd") as server:
        url = f"remote_cache={server.url}"
        a = copy_project(tmp_path / "a")
        a.doit("bundle", "executor=docker", url)
        b = copy_project(tmp_path / "b")
        run = b.doit("bundle", "executor=docker", url)
        hits = set(re.findall(r"^  cache hit (\S+) ", run.out, re.M))
        ran = steps_run(run.out)
        assert hits == run.executed - {"bundle"} and ran == {"bundle"}, run.out
        for name in sorted(p.name for p in a.bundle().iterdir()):
            assert (a.bundle() / name).read_bytes() == (b.bundle() / name).read_bytes(), name
        c = copy_project(tmp_path / "c")
        local = c.doit("bundle", url)   # executor local: another platform
        assert "cache hit" not in local.out, local.out
        # the Action in the server's CAS names the image as remote-execution workers expect
        from hexbundle.remote import reapi
        from hexbundle.config.build import remote_settings
        from hexbundle.remote.cas import CasClient
        origin = json.loads((b.build_dir() / "origins" / "compile__part_1_of_4.json").read_text())
        hash_, size = origin["action"].split("/")
        pieces = []
        client = CasClient(remote_settings(cache=server.url, timeout=30), tmp_path)
        client.read_blob(reapi.Digest(hash=hash_, size_bytes=int(size)), pieces.append)
        client.close()
        action = reapi.Action.FromString(b"".join(pieces))
        props = {p.name: p.value for p in action.platform.properties}
        assert props["container-image"] == f"docker://{record['id']}"
        assert props["executor"] == "docker"


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
    same_but_the_image(bundles["docker"], bundles["local"], toolchain_image[1]["id"])
    log = projects["docker"].build_dir("mine") / "logs" / "inputs__part_2_of_4.log"
    assert log.read_text().startswith("# container: image hexbundle/toolchain:local")
