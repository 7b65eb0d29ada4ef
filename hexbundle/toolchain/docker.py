"""The docker client: an engine that answers, and the toolchain image in it (never pulled)."""
from __future__ import annotations

import os

from hexbundle.config.toolchain import Toolchain
from hexbundle.support.errors import ToolchainError

# The client's socket timeout also bounds each wait for output: a real compile can be silent
# for many minutes, so steps and image builds wait long (a dead engine fails at connect).
QUERY_TIMEOUT_S = 120
LONG_TIMEOUT_S = 24 * 3600


def docker_client(timeout: int = QUERY_TIMEOUT_S):
    """A client of an engine that answers, or an error saying how to get one."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        raise ToolchainError("the docker Python package is missing (pip install 'docker>=7.1'); "
                             "or build with executor = \"local\"") from None
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except DockerException as exc:
        raise ToolchainError(
            f"no Docker engine answers at {where} ({exc}). Start one (as root: dockerd, or "
            "systemctl start docker), or point DOCKER_HOST at an engine you can reach (e.g. "
            "DOCKER_HOST=ssh://user@buildhost); or build without containers: executor = "
            "\"local\" in configs/build.toml, or `doit bundle executor=local`") from None
    return client


def find_image(client, tc: Toolchain):
    """The toolchain image, from the local engine only."""
    from docker.errors import ImageNotFound
    try:
        return client.images.get(tc.image_tag)
    except ImageNotFound:
        raise ToolchainError(f"the toolchain image {tc.image_tag} is not in the local Docker "
                             "engine (hexbundle never pulls it): run `doit image` to build it, "
                             "or `doit load_kit` / `docker load` it on an offline machine") from None


def require_sdk_image(image, tc: Toolchain) -> None:
    """The qairt backend needs the image that carries the pinned SDK."""
    sdk = (image.labels or {}).get("hexbundle.sdk", "none")
    if sdk != tc.sdk_version:
        raise ToolchainError(
            f"the toolchain image {tc.image_tag} ({image.id[:19]}) carries QAIRT SDK {sdk!r} "
            f"(label hexbundle.sdk), but the qairt backend needs {tc.sdk_version}: stage the SDK "
            f"archive at {tc.sdk_archive} and run `doit image` again")


