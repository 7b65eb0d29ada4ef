"""The docker client's bounded waits and messages, in-process and with no engine: an engine
that accepts connections and never answers is a unix socket this test listens on and never
answers from; how a step's container ended is judged from the engine's own State record."""
import importlib.util
import json
import re
import socket
import subprocess
import sys
import threading

import pytest

from conftest import ROOT
from hexbundle.config.build import default_container_settings
from hexbundle.formats.manifest import BundleIntegrityError, manifest_image
from hexbundle.steps.docker_executor import how_it_ended
from hexbundle.support.errors import ToolchainError
from hexbundle.toolchain import docker as engine


class SilentEngine:
    """A unix socket that accepts every connection, reads what it is sent and never replies
    (a frozen dockerd as its clients see it); or, with close=True, closes each at once."""

    def __init__(self, path, close=False):
        self.path, self.close, self.accepted = str(path), close, []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)
            if self.close:
                conn.close()

    def stop(self):
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent_engine(tmp_path, monkeypatch):
    server = SilentEngine(tmp_path / "docker.sock")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{server.path}")
    monkeypatch.setenv(engine.ENGINE_TIMEOUT_ENV, "1.5")
    monkeypatch.setattr(engine, "FIRST_NOTICE_S", 0.5)
    monkeypatch.setattr(engine, "NOTICE_EVERY_S", 0.5)
    yield server
    server.stop()


def test_an_engine_that_never_answers_fails_in_bounded_time_saying_so(silent_engine, capsys):
    with pytest.raises(ToolchainError) as err:
        engine.docker_client()
    message = str(err.value)
    assert silent_engine.accepted, "the client never connected"
    assert f"the Docker engine at unix://{silent_engine.path} did not answer within" in message
    assert "HEXBUNDLE_ENGINE_TIMEOUT" in message and "executor = \"local\"" in message
    assert "waiting for the Docker engine at unix://" in capsys.readouterr().err   # progress
    # the run waits once: its next steps fail at once, with the same message
    with pytest.raises(ToolchainError) as again:
        engine.docker_client()
    assert str(again.value) == message and "waiting" not in capsys.readouterr().err


def test_an_engine_that_stops_answering_mid_call_fails_in_bounded_time(silent_engine):
    """engine_call bounds any call, whatever the client's own socket timeout."""
    gate = threading.Event()
    with pytest.raises(ToolchainError, match="did not answer within .* \\(watching the step"):
        engine.engine_call("watching the step's container", gate.wait)
    gate.set()


def test_an_engine_that_hangs_up_is_no_traceback(tmp_path, monkeypatch):
    server = SilentEngine(tmp_path / "docker.sock", close=True)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{server.path}")
    try:
        with pytest.raises(ToolchainError, match=f"no Docker engine answers at unix://{server.path}"):
            engine.docker_client()
    finally:
        server.stop()


def test_a_connection_lost_mid_call_says_the_engine_went_away(monkeypatch):
    """(requests' ConnectionError, what the docker SDK raises then, is in the heavy test of a
    killed engine: tests/test_container_faults.py)"""
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/hexbundle-test.sock")

    def dies():
        raise ConnectionResetError(104, "Connection reset by peer")
    with pytest.raises(ToolchainError) as err:
        engine.engine_call("reading the step's output", dies)
    assert "the Docker engine at unix:///run/hexbundle-test.sock went away (reading the " \
           "step's output: [Errno 104] Connection reset by peer)" in str(err.value)
    assert "run the build again" in str(err.value)


def test_api_errors_pass_through_to_their_caller():
    from docker.errors import NotFound

    def missing():
        raise NotFound("no such container")
    with pytest.raises(NotFound):
        engine.engine_call("looking up", missing)


@pytest.mark.parametrize("value", ["0", "-3", "soon", "1e300", "nan"])
def test_a_bad_engine_timeout_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(engine.ENGINE_TIMEOUT_ENV, value)
    with pytest.raises(ToolchainError, match=f"HEXBUNDLE_ENGINE_TIMEOUT={value!r}"):
        engine.engine_timeout()


def test_an_ssh_docker_host_says_paramiko_is_needed_when_it_is_missing(monkeypatch):
    if importlib.util.find_spec("paramiko") is not None:
        pytest.skip("paramiko is installed here: ssh:// would try to connect")
    monkeypatch.setenv("DOCKER_HOST", "ssh://nobody@127.0.0.1")
    with pytest.raises(ToolchainError) as err:
        engine.docker_client()
    assert "an ssh:// DOCKER_HOST needs the paramiko package (pip install paramiko)" in \
        str(err.value)


@pytest.mark.parametrize("code, state, says", [
    (137, {"OOMKilled": False, "ExitCode": 137}, "was killed by SIGKILL (exit 137) from outside"),
    (143, {"OOMKilled": False, "ExitCode": 143}, "was killed by SIGTERM (exit 143)"),
    (137, {"OOMKilled": True, "ExitCode": 137}, "was killed by the OOM killer (exit 137): the "
                                                "step needed more memory than container.memory"),
    (1, {"OOMKilled": False, "ExitCode": 1}, ""),      # the step's own failure: its log says why
    (4, {"OOMKilled": False, "ExitCode": 4}, ""),      # the lifeline's exit (support.run)
])
def test_how_a_step_container_ended(code, state, says):
    why = how_it_ended(code, state, default_container_settings(), "hexbundle-r-bundle")
    assert (says in why) if says else why == ""
    if says:
        assert "hexbundle-r-bundle" in why and "run the build again" in why


@pytest.mark.parametrize("image, ok", [
    (None, True), ("sha256:" + "ab" * 32, True), ("sha256:" + "AB" * 32, False),
    ("hexbundle/toolchain:local", False), (7, False), ("sha256:" + "ab" * 31, False)])
def test_the_manifest_image_is_an_image_id_or_null(image, ok):
    doc = {"image": image}
    if ok:
        assert manifest_image(doc, "manifest.json") == image
    else:
        with pytest.raises(BundleIntegrityError, match="not an image ID"):
            manifest_image(doc, "manifest.json")


def test_a_python_without_the_toolchain_says_this_is_not_the_toolchain_image():
    """scripts/step.py under a Python that lacks the image's packages (-S: no site-packages),
    as a container of another image runs it."""
    run = subprocess.run([sys.executable, "-I", "-S", str(ROOT / "scripts" / "step.py"),
                          json.dumps({"step": "inputs"})], capture_output=True, text=True)
    assert run.returncode == 3
    assert run.stderr.startswith("error: this is not the toolchain image: hexbundle's step "
                                 "runner cannot import ")   # stderr: a remote action's tail
    assert "set remote_python" in run.stderr
    assert "Traceback" not in run.stdout + run.stderr


@pytest.mark.parametrize("executor, image, problem", [
    ("local", None, ""),
    ("local", "sha256:" + "11" * 32, ""),               # the recorded image: a docker bundle
    ("docker", "sha256:" + "11" * 32, ""),
    ("docker", None, "'image' is null (a build without containers)"),
    ("docker", "sha256:" + "22" * 32, "the bundle was built in another image"),
    ("local", "sha256:" + "22" * 32, "the bundle was built in another image"),
    ("docker", "hexbundle/toolchain:local", "not an image ID"),
])
def test_check_sizes_judges_the_manifest_image_by_the_recorded_one(tmp_path, executor, image,
                                                                   problem):
    from conftest import copy_project
    from hexbundle.checks.integrity import check_image
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import Layout
    from hexbundle.config.toolchain import load_toolchain, write_image_record
    root = copy_project(tmp_path / "p", ("configs",)).root
    write_image_record(root, {"id": "sha256:" + "11" * 32, "tag": load_toolchain(root).image_tag})
    layout = Layout(load_build(root, {"executor": executor}))
    if not problem:
        check_image(layout, {"image": image}, "manifest.json")
        return
    with pytest.raises(BundleIntegrityError, match=re.escape(problem)):
        check_image(layout, {"image": image}, "manifest.json")


def test_an_engine_lost_while_an_image_is_saved_is_named_not_a_traceback(tmp_path, monkeypatch):
    """doit offline_kit's image save: the stream's reads end in the client's transport error
    when the engine goes; that is named, not a traceback (make_kit stages the kit: nothing kept)."""
    from hexbundle.release.offline_kit import save_image
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/hexbundle-test.sock")

    class Image:
        id = "sha256:" + "0" * 64

        def save(self, named):
            yield b"x" * 10

            raise ConnectionResetError(104, "Connection reset by peer")

    class Images:
        def get(self, ref):
            return Image()

    class Client:
        images = Images()

    with pytest.raises(ToolchainError, match="went away \\(saving image hexbundle/t:1: "):
        save_image(Client(), "hexbundle/t:1", tmp_path / "images" / "toolchain.tar")
