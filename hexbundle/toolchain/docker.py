"""The docker client: an engine that answers within a bound, and the toolchain image in it, pinned
by the ID `doit image` recorded (never pulled, never taken on a tag's word alone).

Every call to the engine is bounded: the client's socket timeout ends any single wait, and
engine_call runs a call in a worker thread, prints a line while it waits, and gives up after
HEXBUNDLE_ENGINE_TIMEOUT seconds (default 120) with a message naming the engine's address. An
engine that accepts connections and never answers (a frozen dockerd, DOCKER_HOST at a socket that
never replies) then fails the build in bounded time; one that died gives a message, not a
`requests` traceback. Only the streams of a step's output and of an image build wait longer (a
compile can be silent for many minutes): the step's container is watched meanwhile with bounded
calls (steps/docker_executor.py).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from hexbundle.config.toolchain import Toolchain, recorded_image_id
from hexbundle.support.errors import ToolchainError

ENGINE_TIMEOUT_ENV = "HEXBUNDLE_ENGINE_TIMEOUT"
DEFAULT_ENGINE_TIMEOUT_S = 120.0
MAX_ENGINE_TIMEOUT_S = 24 * 3600.0
FIRST_NOTICE_S = 5.0       # a healthy engine answers well within this: only then say we wait
NOTICE_EVERY_S = 15.0
LONG_TIMEOUT_S = 24 * 3600  # the output streams of a step and of an image build
DEFAULT_HOST = "unix:///var/run/docker.sock"
# The toolchain image's interpreter (Dockerfile: python3.10, on the image's PATH): what a step
# container runs, and what a remote worker runs an executor = docker step with in that image.
IMAGE_PYTHON = "python3.10"
# Engines that did not answer a connection within the bound in this process, by address: a run
# waits once, not once per step (a build is one process; the next run asks again).
_UNANSWERED: dict = {}
# Labels `doit image` gives the toolchain image (toolchain/image.py: labels): an image without
# them was not made by it.
TOOLCHAIN_LABELS = ("hexbundle.lock.sha256", "hexbundle.python", "hexbundle.context.sha256")


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def engine_timeout() -> float:
    """HEXBUNDLE_ENGINE_TIMEOUT: how long one call may wait for the engine (seconds)."""
    text = os.environ.get(ENGINE_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_ENGINE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_ENGINE_TIMEOUT_S:
        raise ToolchainError(f"{ENGINE_TIMEOUT_ENV}={text!r}: give the seconds a call to the "
                             f"Docker engine may wait, more than 0 and at most "
                             f"{MAX_ENGINE_TIMEOUT_S:.0f} (default {DEFAULT_ENGINE_TIMEOUT_S:.0f})")
    return value


def what_to_do() -> str:
    return ("Check it (docker info), restart it (as root: systemctl restart docker, or "
            "scripts/docker_engine.sh), or point DOCKER_HOST at an engine that answers; "
            f"{ENGINE_TIMEOUT_ENV}=SECONDS waits longer; or build without containers: "
            "executor = \"local\" (configs/build.toml, or `doit bundle executor=local`). Then "
            "run the build again: what was built stays")


def unanswered(what: str, waited: float) -> ToolchainError:
    return ToolchainError(
        f"the Docker engine at {engine_address()} did not answer within {waited:.0f}s "
        f"({what}): it takes the connection but does not reply (a frozen or overloaded "
        f"dockerd?). {what_to_do()}")


def engine_gone(what: str, exc: BaseException) -> ToolchainError:
    why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return ToolchainError(
        f"the Docker engine at {engine_address()} went away ({what}: {why}): it was stopped, "
        f"crashed or restarted. {what_to_do()}")


def translate(exc: BaseException, what: str) -> BaseException:
    """A transport failure as a message; anything else (an API error the caller handles, e.g.
    NotFound) unchanged."""
    try:
        import requests.exceptions as rx
        from urllib3.exceptions import HTTPError as Urllib3Error
    except ImportError:
        return exc
    if isinstance(exc, (rx.Timeout, TimeoutError)):
        return unanswered(what, engine_timeout())
    if isinstance(exc, (rx.ConnectionError, rx.ChunkedEncodingError, Urllib3Error,
                        ConnectionError)):
        return engine_gone(what, exc)
    return exc


def _notice(msg: str) -> None:
    try:
        print(msg, file=sys.stderr, flush=True)
    except (OSError, ValueError):   # a closed or full stderr: the wait stays bounded anyway
        pass


def engine_call(what: str, fn, *args, **kwargs):
    """fn(*args, **kwargs), a call to the engine, waited for at most engine_timeout() seconds,
    with a line on stderr while it waits; a transport failure becomes a ToolchainError."""
    bound = engine_timeout()
    box: dict = {}

    def work():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:   # noqa: BLE001 -- handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=work, name=f"docker: {what}", daemon=True)
    started = time.monotonic()
    worker.start()
    pause = FIRST_NOTICE_S
    while True:
        waited = time.monotonic() - started
        worker.join(max(0.0, min(pause, bound - waited)))
        if not worker.is_alive():
            break
        waited = time.monotonic() - started
        if waited >= bound:   # the worker is a daemon: its socket's own timeout ends it
            raise unanswered(what, waited)
        _notice(f"hexbundle: waiting for the Docker engine at {engine_address()} ({what}): "
                f"{waited:.0f}s of {bound:.0f}s")
        pause = NOTICE_EVERY_S
    if "error" in box:
        raise translate(box["error"], what) from None
    return box["value"]


def docker_client(timeout: float = 0):
    """A client of an engine that answers, or an error saying how to get one. Its socket timeout
    (`timeout`, default the engine bound) ends any one wait of any call made through it."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        raise ToolchainError("the docker Python package is missing (pip install 'docker>=7.1'); "
                             "or build with executor = \"local\"") from None
    bound = engine_timeout()
    where = engine_address()
    if where in _UNANSWERED:
        raise _UNANSWERED[where]

    def connect():
        client = docker.from_env(timeout=timeout or bound + 1)
        client.ping()
        return client
    try:
        return engine_call("connecting", connect)
    except ToolchainError as exc:
        _UNANSWERED[where] = exc
        raise
    except DockerException as exc:
        ssh = ("; an ssh:// DOCKER_HOST needs the paramiko package (pip install paramiko)"
               if "paramiko" in str(exc) else "")
        raise ToolchainError(
            f"no Docker engine answers at {where} ({str(exc)[:300]}){ssh}. Start one (as root: "
            "dockerd, scripts/docker_engine.sh, or systemctl start docker), or point DOCKER_HOST "
            "at an engine you can reach (tcp://HOST:2376 with TLS; ssh://USER@HOST once the "
            "paramiko package is installed); or build without containers: executor = "
            "\"local\" in configs/build.toml, or `doit bundle executor=local`") from None


def find_image(client, tc: Toolchain):
    """The image the tag names now, from the local engine only (None: no such image)."""
    from docker.errors import ImageNotFound
    try:
        return engine_call(f"looking up {tc.image_tag}", client.images.get, tc.image_tag)
    except ImageNotFound:
        return None


def not_in_engine(tc: Toolchain) -> ToolchainError:
    return ToolchainError(f"the toolchain image {tc.image_tag} is not in the local Docker "
                          "engine (hexbundle never pulls it): run `doit image` to build it, "
                          "or `doit load_kit` / `docker load` it on an offline machine")


def pinned_image(client, tc: Toolchain, root: Path):
    """The toolchain image every step runs in, by ID: the one `doit image` recorded, refused if
    its tag now names another image (a rebuild or a retag outside hexbundle). With no record (a
    checkout where `doit image` never ran: a loaded kit, an image built by hand) the image the
    tag names now, if it is a toolchain image; the run pins its ID from then on."""
    from docker.errors import ImageNotFound
    tagged = find_image(client, tc)
    want = recorded_image_id(root, tc.image_tag)
    if not want:
        if tagged is None:
            raise not_in_engine(tc)
        require_toolchain_image(tagged, tc)
        return tagged
    if tagged is not None and tagged.id != want:
        raise moved_tag(tc, want, tagged.id)
    try:
        image = engine_call(f"looking up {want[:19]}", client.images.get, want)
    except ImageNotFound:
        raise ToolchainError(
            f"the toolchain image `doit image` recorded, {want} (build/image/image-id.txt), is no "
            f"longer in the local Docker engine, and {tc.image_tag} names no image: run `doit "
            "image` to build it again (hexbundle never pulls it)") from None
    require_toolchain_image(image, tc)
    return image


def moved_tag(tc: Toolchain, want: str, now: str) -> ToolchainError:
    return ToolchainError(
        f"the toolchain image's tag {tc.image_tag} now names {now}, but `doit image` recorded "
        f"{want} (build/image/image-id.txt): the image was rebuilt or retagged outside "
        "hexbundle, and nothing is built with an image hexbundle did not make. If that image is "
        f"meant, run `doit image` (it rebuilds from the pinned inputs and records what it "
        f"built); to go back to the recorded one: docker tag {want} {tc.image_tag}")


def require_toolchain_image(image, tc: Toolchain) -> None:
    """An image `doit image` made carries its labels; one without them is another image."""
    found = image.labels or {}
    missing = [k for k in TOOLCHAIN_LABELS if k not in found]
    if missing:
        raise ToolchainError(
            f"{tc.image_tag} ({image.id[:19]}) is not the toolchain image: it lacks the labels "
            f"`doit image` gives it ({', '.join(missing)}); run `doit image` to build the "
            "toolchain image under that tag (configs/toolchain.toml [image] tag)")


def require_sdk_image(image, tc: Toolchain) -> None:
    """The qairt backend needs the image that carries the pinned SDK."""
    sdk = (image.labels or {}).get("hexbundle.sdk", "none")
    if sdk != tc.sdk_version:
        raise ToolchainError(
            f"the toolchain image {tc.image_tag} ({image.id[:19]}) carries QAIRT SDK {sdk!r} "
            f"(label hexbundle.sdk), but the qairt backend needs {tc.sdk_version}: stage the SDK "
            f"archive at {tc.sdk_archive} and run `doit image` again")
