"""The docker executor: one build step = one container of the toolchain image.

The step runs `python3.10 <root>/scripts/step.py <spec>` with:
  - the source tree mounted read-only at the same absolute path as on the host (so the spec's
    paths, the digest cache's keys and every log line mean the same thing inside and outside),
  - the build root mounted read-write at its own path (outputs, logs, hexbundle's state),
  - no network, no capabilities, a read-only root filesystem, the host's uid:gid (outputs
    belong to the user, not to root), and an explicit environment (nothing of the host's leaks in),
  - its output streamed to the step's log; the exit code returned; the container removed after,
    whatever happened (Ctrl-C included).

It never pulls: the image is looked up locally first (`containers.run` would silently pull).
"""
from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

from hexbundle.config.layout import BUILD_ROOT_ENV, Layout, ProjectLayout
from hexbundle.config.toolchain import load_toolchain
from hexbundle.support.errors import HexbundleError
from hexbundle.toolchain.docker import LONG_TIMEOUT_S, docker_client, find_image, require_sdk_image

PYTHON = "python3.10"
# Passed through when set on the host: they change what a build writes, not where it runs.
PASS_THROUGH = ("SOURCE_DATE_EPOCH",)


def mounts(layout: ProjectLayout) -> dict:
    """Source tree read-only, build root read-write, each at its own absolute path; an export
    used in place from outside the project, read-only at its own path too."""
    root, build_root = layout.root, layout.build_root
    build_root.mkdir(parents=True, exist_ok=True)   # else docker would create it, root-owned
    out = {str(root): {"bind": str(root), "mode": "ro"},
           str(build_root): {"bind": str(build_root), "mode": "rw"}}
    export = getattr(getattr(layout, "cfg", None), "export_dir", None)
    if export is not None and root not in (export, *export.parents):
        out[str(export)] = {"bind": str(export), "mode": "ro"}
    return out


def environment(layout: ProjectLayout) -> dict:
    """Everything the step sees of an environment; the image adds its PATH and SDK variables."""
    env = {"HOME": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",
           BUILD_ROOT_ENV: str(layout.build_root)}
    env.update({k: os.environ[k] for k in PASS_THROUGH if k in os.environ})
    return env


def container_name(spec: dict) -> str:
    import uuid
    return f"hexbundle-{spec.get('step', 'step')}-{uuid.uuid4().hex[:12]}"


def host_user() -> str:
    return f"{os.getuid()}:{os.getgid()}"


def run_in_container(layout: Layout, spec: dict, log_path: Path, user: str = "") -> int:
    """Run one step in the toolchain image; its output goes to log_path; returns its exit code
    (3 when the container could not be started: the log says why). `user` (uid:gid) defaults to
    the host's."""
    user = user or host_user()
    with open(log_path, "w") as log:
        try:
            tc = load_toolchain(layout.root)
            client = docker_client(LONG_TIMEOUT_S)
            image = find_image(client, tc)
            if layout.cfg.backend == "qairt":
                require_sdk_image(image, tc)
        except HexbundleError as exc:
            log.write(f"error: {exc}\n")
            return 3
        spec = {**spec, "image": image.id}   # build-info.json records what ran the step
        log.write(f"# container: image {tc.image_tag} {image.id}, user {user}, network none\n")
        log.flush()
        return _run(client, image, layout, spec, log, user)


def _run(client, image, layout: ProjectLayout, spec: dict, log, user: str) -> int:
    from docker.errors import APIError, NotFound
    command = [PYTHON, str(layout.script("step.py")), json.dumps(spec, sort_keys=True)]
    name = container_name(spec)
    container = None
    try:
        container = client.containers.run(
            image.id, command, detach=True, name=name,
            working_dir=str(layout.root), volumes=mounts(layout),
            environment=environment(layout),
            user=user, network_mode="none", cap_drop=["ALL"],
            security_opt=["no-new-privileges"], read_only=True, tmpfs={"/tmp": "rw,exec"},
            labels={"org.hexbundle.step": spec.get("step", ""),
                    "org.hexbundle.root": str(layout.root)})
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")   # chunks split chars
        for chunk in container.logs(stream=True, follow=True):
            log.write(text.decode(chunk))
            log.flush()
        log.write(text.decode(b"", final=True))
        return int(container.wait().get("StatusCode", 1))
    except APIError as exc:
        log.write(f"error: the Docker engine refused to run the step: {exc.explanation or exc}\n")
        return 3
    finally:
        # Also on Ctrl-C, even one that came while the container was being created.
        try:
            (container or client.containers.get(name)).remove(force=True)
        except (NotFound, APIError):
            pass
