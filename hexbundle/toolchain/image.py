"""`doit image`: the toolchain image, built through the docker SDK.

The build context is assembled here, as one deterministic tar (sorted entries, fixed times and
owners), from exactly these files and nothing else -- build/ and the sources never enter it:
    Dockerfile                     configs/toolchain.toml [image] dockerfile
    requirements/container.lock    the hashed lock
    wheelhouse/<wheel>             each locked wheel, verified against the lock
    sdk/install_sdk.py             unpacks the SDK inside the build
    sdk/<archive>                  the QAIRT SDK archive, only when staged and its sha256 is the pin
The same inputs give the same context bytes, so Docker's layer cache hits and an unchanged
rebuild gives the same image ID.

The build runs with no network by default, streams its log to build/logs/image.log (a progress
line per Dockerfile step on the console), and records the image in build/image/: image-id.txt
(the ID alone) and image.json (ID, tag, labels, size, base). The labels say what is inside: base
reference and ID, SDK version and sha256 (or "none": reference backend only), lock sha256.
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hexbundle.config.layout import ProjectLayout
from hexbundle.config.toolchain import Toolchain, load_toolchain, project_root, staged_sdk
from hexbundle.config.toolchain import read_image_record as read_record
from hexbundle.config.toolchain import write_image_record as write_record
from hexbundle.support.errors import HexbundleError, ToolchainError
from hexbundle.support.files import open_in_place
from hexbundle.support.hashing import sha256_file

CONTEXT_MTIME = 315532800          # 1980-01-01: fixed entry times in the context tar
# The installer of the source tree this package runs from (a project root may hold configs only).
INSTALLER = ProjectLayout(project_root()).script("install_sdk.py")
TAIL_LINES = 30


# ---------------------------------------------------------------------------------------------
# the build context

@dataclass(frozen=True)
class Context:
    files: list                    # [(name in the context, source path)], sorted by name
    sdk_sha256: str | None      # None: no SDK in this image
    lock_sha256: str


def check_sources(tc: Toolchain) -> str | None:
    """The build's own files are there and a staged SDK archive is the pinned one (returns its
    sha256; None: no SDK staged). Local checks, made before docker or PyPI is asked anything."""
    for path, what in ((tc.dockerfile, "the Dockerfile"), (tc.lock, "the lock file"),
                       (INSTALLER, "the SDK installer")):
        if not path.is_file():
            raise ToolchainError(f"{path}: {what} is missing")
    return staged_sdk(tc)


def plan_context(tc: Toolchain, sdk_sha256: str | None, wheels: dict) -> Context:
    """What goes into the context: the sources check_sources passed, the SDK archive whose
    sha256 it returned (if any), the locked wheels as the wheelhouse verified them
    ({entry: path}, wheelhouse.verify or .download)."""
    files = [("Dockerfile", tc.dockerfile), ("requirements/container.lock", tc.lock),
             ("sdk/install_sdk.py", INSTALLER)]
    files += [(f"wheelhouse/{wheel.name}", wheel) for wheel in wheels.values()]
    if sdk_sha256:
        files.append((f"sdk/{tc.sdk_archive.name}", tc.sdk_archive))
    return Context(sorted(files), sdk_sha256, sha256_file(tc.lock))


class _HashingWriter(io.RawIOBase):
    def __init__(self, fh):
        self.fh, self.sha = fh, hashlib.sha256()

    def writable(self):
        return True

    def write(self, data):
        self.sha.update(data)
        return self.fh.write(data)


def write_context(ctx: Context, fh) -> str:
    """The context as an uncompressed tar into `fh`; returns its sha256."""
    import tarfile   # here, not at the top: dodo.py imports this module (~10 ms)
    out = _HashingWriter(fh)
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(n).parent) for n, _ in ctx.files} - {"."})
        for name in dirs:
            tar.addfile(_info(name, tarfile.DIRTYPE, 0o755, 0))
        for name, src in ctx.files:
            size = src.stat().st_size
            with open(src, "rb") as data:
                tar.addfile(_info(name, tarfile.REGTYPE, 0o644, size), data)
    return out.sha.hexdigest()


def _info(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    import tarfile
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, CONTEXT_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


# ---------------------------------------------------------------------------------------------
# the build

def base_facts(client, base: str) -> dict:
    """The base image, from the local engine only: its ID and, where known, its digest."""
    from docker.errors import ImageNotFound

    from hexbundle.toolchain.docker import engine_call
    try:
        image = engine_call(f"looking up {base}", client.images.get, base)
    except ImageNotFound:
        raise ToolchainError(
            f"the base image {base} is not in the local Docker engine, and `doit image` does not "
            f"pull. On a connected machine: docker pull {base}; with no registry: make a local "
            "base with scripts/make_base_image.sh and run `doit image --base "
            "hexbundle/base:bookworm-py3.10`") from None
    pinned = base.split("@", 1)[1] if "@" in base else ""
    repo = next(iter(image.attrs.get("RepoDigests") or []), "")
    digest = pinned or (repo.split("@", 1)[1] if "@" in repo else "")
    return {"id": image.id,
            "digest": digest or "none (a local image, not from a registry: see hexbundle.base.id)"}


def build_args(tc: Toolchain, ctx: Context, base: str) -> dict:
    args = {"BASE": base, "IMAGE_USER": tc.image_user}
    if ctx.sdk_sha256:
        root = tc.sdk_install_dir
        args.update(SDK_VERSION=tc.sdk_version, SDK_SHA256=ctx.sdk_sha256,
                    SDK_ARCHIVE=tc.sdk_archive.name, SDK_INSTALL_DIR=root, SDK_ROOT=root,
                    SDK_PYTHONPATH=f"{root}/lib/python",
                    SDK_LIBRARY_PATH=f"{root}/lib/x86_64-linux-clang",
                    SDK_PATH_PREFIX=f"{root}/bin/x86_64-linux-clang:")
    return args


def labels(tc: Toolchain, ctx: Context, base: str, facts: dict, context_sha256: str) -> dict:
    """What the image carries. (Not hexbundle's version: the sources are mounted, not built in,
    so a new hexbundle does not need a new image.)"""
    sdk = ctx.sdk_sha256
    return {
        "hexbundle.sdk": tc.sdk_version if sdk else "none",
        "hexbundle.sdk.sha256": sdk or "none",
        "hexbundle.sdk.archive": tc.sdk_archive.name if sdk else
        "none: no SDK archive was staged; this image runs the reference backend only",
        "hexbundle.base": base,
        "hexbundle.base.id": facts["id"],
        "hexbundle.base.digest": facts["digest"],
        "hexbundle.lock.sha256": ctx.lock_sha256,
        "hexbundle.python": tc.python_version,
        "hexbundle.context.sha256": context_sha256,
    }


def stream_build(client, fh, tag: str, args: dict, image_labels: dict, network: str,
                 log, progress) -> str:
    """Run the build, streaming its log; return the image ID or raise with the log's tail."""
    tail, image_id = [], None
    for chunk in client.api.build(fileobj=fh, custom_context=True, tag=tag, buildargs=args,
                                  labels=image_labels, network_mode=network, rm=True,
                                  forcerm=True, pull=False, decode=True):
        text = chunk.get("stream") or chunk.get("status") or ""
        if "error" in chunk:
            text = f"ERROR: {chunk['error']}\n"
        if text:
            log.write(text)
            log.flush()
            tail = (tail + text.splitlines())[-TAIL_LINES:]
            step = re.match(r"Step (\d+/\d+) : (.*)", text)
            if step:
                progress(f"step {step.group(1)}: {step.group(2)[:90]}")
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        if "error" in chunk:
            raise ToolchainError(f"the image build failed (full log: {log.name}):\n"
                                 + "\n".join(tail))
    if not image_id:
        raise ToolchainError(f"the image build ended without an image ID (full log: "
                             f"{log.name}):\n" + "\n".join(tail))
    return image_id


def build(root: Path, base: str | None = None, network: str = "none") -> dict:
    """Build and tag the toolchain image; record and return what was built.

    Preconditions first, before anything is downloaded: the sources and the SDK archive's pin
    (local), an engine that answers, the base image in it. Only then are the locked wheels the
    wheelhouse lacks fetched (none when it is complete, e.g. brought offline) and all verified."""
    from hexbundle.toolchain.docker import (LONG_TIMEOUT_S, docker_client, engine_call,
                                           translate)
    from hexbundle.toolchain.wheelhouse import download
    tc = load_toolchain(root)
    base = base or tc.base
    started = time.monotonic()
    say = lambda msg: print(f"  image: {msg} ({time.monotonic() - started:.0f}s)",
                            flush=True)
    sdk_sha256 = check_sources(tc)   # first: a wrong SDK archive is the likelier surprise
    client = docker_client()   # bounded calls; the build's own stream waits longer
    facts = base_facts(client, base)
    ctx = plan_context(tc, sdk_sha256, download(tc))
    say(f"base {base} ({facts['id'][:19]}), QAIRT SDK "
        f"{tc.sdk_version + ' from ' + tc.sdk_archive.name if ctx.sdk_sha256 else 'none'}, "
        f"{sum(1 for n, _ in ctx.files if n.startswith('wheelhouse/'))} wheels, network "
        f"{network}")
    project = ProjectLayout(root)
    project.image_dir.mkdir(parents=True, exist_ok=True)
    project.image_log.parent.mkdir(parents=True, exist_ok=True)
    with (tempfile.TemporaryFile(dir=project.image_dir) as fh,
          open_in_place(project.image_log) as log):   # never through a symbolic link
        context_sha256 = write_context(ctx, fh)
        fh.seek(0)
        say(f"context {fh.seek(0, os.SEEK_END) / (1 << 20):.1f} MiB, sha256 "
            f"{context_sha256[:16]}")
        fh.seek(0)
        image_labels = labels(tc, ctx, base, facts, context_sha256)
        try:
            image_id = stream_build(docker_client(LONG_TIMEOUT_S), fh, tc.image_tag,
                                    build_args(tc, ctx, base), image_labels, network, log, say)
        except Exception as exc:   # noqa: BLE001 -- the engine gone mid-build: a message
            plain = translate(exc, "building the image")
            if plain is exc:
                raise
            raise plain from None
    image = engine_call(f"looking up {tc.image_tag}", client.images.get, tc.image_tag)
    if image.id != image_id and not image.id.endswith(image_id):
        raise ToolchainError(f"{tc.image_tag} is {image.id} after building {image_id}: "
                             "another build retagged it meanwhile; run `doit image` again")
    record = {"id": image.id, "tag": tc.image_tag, "base": base, "network": network,
              "size": image.attrs.get("Size"), "labels": image.labels,
              "seconds": round(time.monotonic() - started, 1)}
    write_record(root, record)
    say(f"built {tc.image_tag} = {image.id} ({record['size'] / 1e6:.0f} MB); recorded in "
        "build/image/")
    return record


# ---------------------------------------------------------------------------------------------
# is the recorded image the one a build would make now?

def build_inputs(root: Path) -> list:
    """What the image is built from: the Dockerfile, installer, lock, toolchain config, the base
    script, and the SDK archive when one is staged."""
    tc = load_toolchain(root)
    deps = [tc.dockerfile, INSTALLER, tc.lock, tc.path,
            ProjectLayout(root).script("make_base_image.sh")]
    if tc.sdk_archive.is_file():
        deps.append(tc.sdk_archive)
    return deps


def is_current(root: Path, base: str = "") -> bool:
    """The recorded image still exists under its tag, built from `base` (default: the pinned
    base) as it is now in the engine."""
    record = read_record(root)
    wanted = base or load_toolchain(root).base
    if not record or record.get("base") != wanted:
        return False
    from docker.errors import DockerException

    from hexbundle.toolchain.docker import docker_client, engine_call
    try:
        client = docker_client()
        image = engine_call("looking up the image", client.images.get, record["tag"])
        base_id = engine_call("looking up the base", client.images.get, record["base"]).id
    except (HexbundleError, DockerException):   # no engine, image or base: the build says why
        return False
    return image.id == record["id"] and base_id == record["labels"].get("hexbundle.base.id")


