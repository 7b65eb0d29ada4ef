"""The docker executor's faults on a real Docker engine (issue 40, kinds 3 to 5): the toolchain
image's tag moved to another image, an image that is not the toolchain image, an engine that
never answers or is frozen mid-step, a step's container killed from outside, hard links planted
in the build root of a build run as root. After each, the next run gives the known-good bundle,
byte for byte.

One project, one known-good docker bundle (module fixture), under a tag of its own (the engine's
hexbundle/toolchain:local is shared: it is never moved here). Each test puts things back.
"""
import io
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, copy_project, snapshot
from test_container import (HeldRun, docker_errors, engine, step_containers,  # noqa: F401
                            toolchain_image, wait_until)

# A Docker engine and the toolchain image: `pytest --full`. .ci/run runs this module alone,
# before the suite (two of its tests freeze and restart the engine), then sets
# HEXBUNDLE_TEST_ENGINE_FAULTS_RAN for the suite, which skips it.
pytestmark = [pytest.mark.heavy, pytest.mark.skipif(
    bool(os.environ.get("HEXBUNDLE_TEST_ENGINE_FAULTS_RAN")),
    reason="run alone by .ci/run before the suite (it freezes and restarts the engine)")]

TAG = f"hexbundle/toolchain:test-faults-{os.getpid()}"
# .ci/run: the file with the pid of the dockerd it started, which these tests may freeze, or kill
# and start again (scripts/docker_engine.sh writes the new pid there)
ENGINE_PID_FILE_ENV = "HEXBUNDLE_TEST_ENGINE_PID_FILE"
own_engine = pytest.mark.skipif(
    not os.environ.get(ENGINE_PID_FILE_ENV),
    reason=f"{ENGINE_PID_FILE_ENV} names no dockerd this test may freeze or kill (.ci/run sets it "
           "to the engine it started)")


def engine_pid() -> int:
    return int(Path(os.environ[ENGINE_PID_FILE_ENV]).read_text().split()[0])


def set_tag(proj, tag: str) -> None:
    cfg = proj.root / "configs" / "toolchain.toml"
    cfg.write_text(cfg.read_text().replace('tag = "hexbundle/toolchain:local"', f'tag = "{tag}"'))


def retag(engine, image_id: str) -> None:
    repo, tag = TAG.rsplit(":", 1)
    engine.images.get(image_id).tag(repo, tag)


@pytest.fixture(scope="module")
def known_good(engine, toolchain_image, tmp_path_factory):   # noqa: F811
    """(project, the recorded image ID, the bundle's files) after a docker build, with the image
    recorded under TAG as `doit image` would have."""
    from hexbundle.config.toolchain import write_image_record
    _, record = toolchain_image
    proj = copy_project(tmp_path_factory.mktemp("faults") / "proj")
    set_tag(proj, TAG)
    retag(engine, record["id"])
    write_image_record(proj.root, {**record, "tag": TAG})
    proj.doit("bundle", "executor=docker")
    good = snapshot(proj.bundle())
    yield proj, record["id"], good
    try:
        engine.images.remove(TAG, noprune=True)
    except docker_errors().DockerException:
        pass


def rerun_gives_the_known_good_bundle(proj, good) -> None:
    run = proj.doit("bundle", "executor=docker")
    assert snapshot(proj.bundle()) == good, run.out + run.err
    assert proj.doit("check_sizes", "executor=docker").code == 0


def test_the_manifest_names_the_image_the_steps_ran_in(known_good):
    import json
    proj, image_id, good = known_good
    assert json.loads(good["manifest.json"])["image"] == image_id
    for log in (proj.build_dir() / "logs").glob("*.log"):   # every step, inputs too, by ID
        assert log.read_text().startswith(f"# container: image {TAG} {image_id}"), log


def test_a_tag_moved_to_a_rebuilt_image_is_refused_before_any_step_runs(engine, known_good):  # noqa: F811
    from hexbundle.config.toolchain import read_image_record, write_image_record
    proj, image_id, good = known_good
    record = read_image_record(proj.root)
    status = proj.doit("list", "--all", "--status", "executor=docker").out
    assert "U inputs:tokenizer" in status and "U convert:part_1_of_4_prompt" in status
    # rebuilt under the tag: the toolchain image with one more file, as an injected
    # sitecustomize.py would be (labels and all inherited)
    dockerfile = f"FROM {TAG}\nRUN echo 'import os' > /tmp/sitecustomize.py\n".encode()
    other, _ = engine.images.build(fileobj=io.BytesIO(dockerfile), tag=TAG, pull=False, rm=True,
                                   network_mode="none")
    try:
        run = proj.doit("bundle", "executor=docker", check=False)
        assert run.code != 0
        text = run.out + run.err
        assert (f"the toolchain image's tag {TAG} now names {other.id}, but `doit image` "
                f"recorded {image_id}") in text, text
        assert "run `doit image`" in text and f"docker tag {image_id} {TAG}" in text
        assert "Traceback" not in text
        assert not step_containers(engine, proj)
        assert snapshot(proj.bundle()) == good
        # had `doit image` recorded that image, every step would rerun: the input steps too
        write_image_record(proj.root, {**record, "id": other.id})
        status = proj.doit("list", "--all", "--status", "executor=docker").out
        assert "R inputs:tokenizer" in status and "R convert:part_1_of_4_prompt" in status
    finally:
        write_image_record(proj.root, record)
        retag(engine, image_id)
        engine.images.remove(other.id, force=True, noprune=False)
    rerun_gives_the_known_good_bundle(proj, good)


def test_an_image_that_is_not_the_toolchain_image_is_named_so(engine, known_good):  # noqa: F811
    """No record (a checkout where `doit image` never ran) and the tag on another image: the
    base, which has none of the toolchain image's labels (nor tomli)."""
    from hexbundle.config.toolchain import read_image_record, write_image_record
    proj, image_id, good = known_good
    record = read_image_record(proj.root)
    (proj.root / "build" / "image" / "image.json").unlink()
    retag(engine, record["labels"]["hexbundle.base.id"])
    try:
        run = proj.doit("bundle", "executor=docker", check=False)
        text = run.out + run.err
        assert run.code != 0 and f"{TAG} (sha256:" in text
        assert "is not the toolchain image: it lacks the labels `doit image` gives it" in text
        assert "Traceback" not in text and snapshot(proj.bundle()) == good
    finally:
        retag(engine, image_id)
        write_image_record(proj.root, record)
    rerun_gives_the_known_good_bundle(proj, good)


def test_an_engine_that_never_answers_fails_in_bounded_time(known_good, tmp_path):
    from test_engine_faults import SilentEngine
    proj, _, good = known_good
    proj.doit("forget", "bundle")
    silent = SilentEngine(tmp_path / "docker.sock")
    try:
        run = proj.doit("bundle", "executor=docker", check=False,
                        env={"DOCKER_HOST": f"unix://{silent.path}",
                             "HEXBUNDLE_ENGINE_TIMEOUT": "2"})
    finally:
        silent.stop()
    text = run.out + run.err
    assert run.code != 0
    assert f"the Docker engine at unix://{silent.path} did not answer within 2s" in text, text
    assert "Traceback" not in text and snapshot(proj.bundle()) == good
    rerun_gives_the_known_good_bundle(proj, good)


def test_a_step_container_killed_from_outside_is_reported_as_killed(engine, known_good,  # noqa: F811
                                                                    tmp_path):
    proj, _, good = known_good
    proj.doit("forget", "bundle")
    held = HeldRun(proj, ["bundle", "executor=docker"], "bundle", tmp_path / "held")
    try:
        held.wait_paused()
        (entry,) = step_containers(engine, proj)
        engine.api.kill(entry.id)   # docker kill: SIGKILL
        code = held.proc.wait(timeout=120)
    finally:
        held.stop()
    text = held.text()
    assert code != 0
    assert "failed (exit 137)" in text and "was killed by SIGKILL (exit 137) from outside this " \
        "run: `docker kill` or `docker stop`" in text, text
    assert "Traceback" not in text
    assert snapshot(proj.bundle()) == good   # the swap never happened
    rerun_gives_the_known_good_bundle(proj, good)


@own_engine
def test_an_engine_frozen_mid_step_fails_in_bounded_time(engine, known_good, tmp_path,  # noqa: F811
                                                          monkeypatch):
    proj, _, good = known_good
    proj.doit("forget", "bundle")
    pid = engine_pid()
    monkeypatch.setenv("HEXBUNDLE_ENGINE_TIMEOUT", "5")
    held = HeldRun(proj, ["bundle", "executor=docker"], "bundle", tmp_path / "held")
    try:
        held.wait_paused()
        os.kill(pid, signal.SIGSTOP)
        try:
            code = held.proc.wait(timeout=120)
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        held.stop()
    text = held.text()
    assert code != 0
    assert "did not answer within" in text and "(watching the step's container)" in text, text
    assert "Traceback" not in text and snapshot(proj.bundle()) == good
    monkeypatch.delenv("HEXBUNDLE_ENGINE_TIMEOUT")
    wait_until(lambda: engine.ping(), "the engine answering again")
    rerun_gives_the_known_good_bundle(proj, good)


@pytest.mark.skipif(os.geteuid() != 0, reason="the hand-over to the step user happens as root")
def test_hard_links_planted_in_the_build_root_are_not_followed_as_root(known_good, tmp_path):
    """kind 3 with the engine: a hard link in the model's tree (chown), at a step's log (write)
    and at the build lock, each to a setuid-root file outside the build root."""
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    proj, _, good = known_good
    layout = Layout(load_build(proj.root, {"executor": "docker"}))
    victim = tmp_path / "outside" / "setuid-tool"
    victim.parent.mkdir()
    victim.write_bytes(b"the user's file\n")
    os.chmod(victim, 0o4755)
    before = victim.stat()

    def untouched():
        now = victim.stat()
        assert (now.st_uid, now.st_gid, stat.S_IMODE(now.st_mode)) == \
            (before.st_uid, before.st_gid, 0o4755)
        assert victim.read_bytes() == b"the user's file\n"

    planted = layout.model_dir / "planted"
    os.link(victim, planted)
    proj.doit("forget", "bundle")
    run = proj.doit("bundle", "executor=docker", check=False)
    assert run.code != 0 and "a hard link to a file elsewhere" in run.out + run.err
    untouched()
    planted.unlink()

    log = layout.log("bundle")
    log.unlink()
    os.link(victim, log)
    proj.doit("forget", "bundle")
    proj.doit("bundle", "executor=docker")
    untouched()
    assert log.stat().st_nlink == 1 and log.read_text().startswith("# container: image")
    assert snapshot(proj.bundle()) == good

    lock = layout.lock
    lock.unlink()
    os.link(victim, lock)
    run = proj.doit("bundle", "executor=docker", check=False)
    assert run.code != 0 and "Traceback" not in run.out + run.err
    untouched()
    lock.unlink()
    rerun_gives_the_known_good_bundle(proj, good)


@own_engine
def test_an_engine_killed_mid_step_is_said_so_and_a_rerun_recovers(engine, known_good,  # noqa: F811
                                                                     tmp_path):
    proj, _, good = known_good
    proj.doit("forget", "bundle")
    held = HeldRun(proj, ["bundle", "executor=docker"], "bundle", tmp_path / "held")
    try:
        held.wait_paused()
        pid = engine_pid()
        os.kill(pid, signal.SIGKILL)
        code = held.proc.wait(timeout=120)
    finally:
        held.stop()
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), "dockerd gone")
        subprocess.run(["bash", str(ROOT / "scripts" / "docker_engine.sh"), "--pid-file",
                        os.environ[ENGINE_PID_FILE_ENV]], check=True, timeout=300)
    text = held.text()
    assert code != 0
    assert "the Docker engine at" in text and "went away (" in text, text
    assert "Traceback" not in text and snapshot(proj.bundle()) == good
    rerun_gives_the_known_good_bundle(proj, good)
