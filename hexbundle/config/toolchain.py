"""The pinned toolchain: the QAIRT SDK version and archive, the container image, its Python lock.

All of it comes from configs/toolchain.toml (validated like every config). This module answers
three questions without docker or the SDK installed:
  - which SDK version the qairt backend needs (`pinned_sdk_version`, used by every doit run);
  - whether a staged SDK archive is the pinned one (`staged_sdk`): missing -> the image is built
    without it; present with another digest -> an error naming both digests and where it goes;
  - which SDK this process actually sees (`installed_sdk`, `require_pinned_sdk`): the SDK root's
    sdk.yaml `version`, from QAIRT_SDK_ROOT or QNN_SDK_ROOT.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from hexbundle.config.layout import ProjectLayout
from hexbundle.config.schema import Field, read_toml
from hexbundle.support.atomic import write_atomic
from hexbundle.support.errors import ToolchainError
from hexbundle.support.hashing import sha256_file
from hexbundle.support.jsondoc import read_state_json

SHA256 = r"(|[0-9a-f]{64})"
SDK_ROOT_VARS = ("QAIRT_SDK_ROOT", "QNN_SDK_ROOT")   # newer qairt reads the first, QNN the second

SCHEMA = {
    "sdk": Field({
        "version": Field(str, pattern=r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+",
                         doc="the QAIRT version the qairt backend requires"),
        "archive": Field(str, doc="where the SDK archive is staged, relative to the project"),
        "sha256": Field(str, "", pattern=SHA256, doc="the archive's sha256 (64 hex digits)",
                        example="0" * 64),
        "install_dir": Field(str, pattern=r"/[A-Za-z0-9._/-]+", doc="the SDK root in the image"),
    }),
    "image": Field({
        "tag": Field(str, pattern=r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?"),
        "base": Field(str, doc="the base image reference, pinned by digest"),
        "dockerfile": Field(str),
        "user": Field(str, "hexbundle", pattern=r"[a-z_][a-z0-9_-]*"),
    }),
    "python": Field({
        "version": Field(str, "3.10", pattern=r"3\.[0-9]+"),
        "requirements": Field(str),
        "lock": Field(str),
        "wheelhouse": Field(str),
        "platforms": Field(list, item=str),
    }),
}


@dataclass(frozen=True)
class Toolchain:
    root: Path
    path: Path                     # configs/toolchain.toml
    sdk_version: str
    sdk_archive: Path
    sdk_sha256: str                # "" = not pinned yet
    sdk_install_dir: str
    image_tag: str
    base: str
    dockerfile: Path
    image_user: str
    python_version: str
    requirements: Path
    lock: Path
    wheelhouse: Path
    platforms: tuple


def project_root() -> Path:
    """The source tree this package belongs to (the project is used from its tree)."""
    return Path(__file__).resolve().parents[2]


def load_toolchain(root: Path | None = None) -> Toolchain:
    project = ProjectLayout(root or project_root())
    root, path = project.root, project.toolchain_config
    d = read_toml(path, SCHEMA)
    s, i, p = d["sdk"], d["image"], d["python"]
    inside = lambda key, value: _inside(root, path, key, value)
    return Toolchain(root, path, s["version"], inside("sdk.archive", s["archive"]), s["sha256"],
                     s["install_dir"], i["tag"], i["base"],
                     inside("image.dockerfile", i["dockerfile"]), i["user"], p["version"],
                     inside("python.requirements", p["requirements"]),
                     inside("python.lock", p["lock"]),
                     inside("python.wheelhouse", p["wheelhouse"]), tuple(p["platforms"]))


def _inside(root: Path, where: Path, key: str, value: str) -> Path:
    path = (root / value).resolve()
    if root not in (path, *path.parents):
        raise ToolchainError(f"{where}: key '{key}' = {value!r} points outside the project "
                             f"({root}); give a path relative to it")
    return path


def read_image_record(root: Path) -> dict | None:
    """build/image/image.json, the image `doit image` built (toolchain/image.py); None if there is
    none or it is not a JSON object."""
    try:
        record = read_state_json(ProjectLayout(root).image_record)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_image_record(root: Path, record: dict) -> None:
    """image.json, and image-id.txt with the ID alone (for scripts)."""
    project = ProjectLayout(root)
    write_atomic(project.image_record,
                 (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    write_atomic(project.image_id_file, (record["id"] + "\n").encode())


def recorded_image_id(root: Path, tag: str) -> str:
    """The image ID `doit image` recorded for `tag`; "" if none (or recorded for another tag)."""
    record = read_image_record(root) or {}
    image_id = record.get("id")
    if record.get("tag") != tag or not isinstance(image_id, str):
        return ""
    return image_id


def pinned_sdk_version(root: Path | None = None) -> str:
    return load_toolchain(root).sdk_version


# ---------------------------------------------------------------------------------------------
# the staged SDK archive

def staged_sdk(tc: Toolchain) -> str | None:
    """The staged archive's sha256 when it is the pinned one; None when nothing is staged (the
    image is then built without the SDK). Anything else is an error saying what to do."""
    archive = tc.sdk_archive
    if not archive.exists():
        return None
    if not archive.is_file():
        raise ToolchainError(f"{archive}: expected the QAIRT SDK archive (a file), found a "
                             "directory or something else; put Qualcomm's archive there")
    actual = sha256_file(archive)
    if not tc.sdk_sha256:
        raise ToolchainError(
            f"{archive}: the QAIRT {tc.sdk_version} archive is staged but {tc.path} pins no "
            f"sha256 for it (key 'sdk.sha256' is empty). Its sha256 is {actual}: check it against "
            "the digest Qualcomm publishes for this release, then write it into sdk.sha256")
    if actual != tc.sdk_sha256:
        raise ToolchainError(
            f"{archive}: sha256 is {actual}, but {tc.path} pins {tc.sdk_sha256} (sdk.sha256) "
            f"for QAIRT {tc.sdk_version}. This is not the pinned SDK archive: put the archive of "
            f"QAIRT {tc.sdk_version} at {archive} (or remove it to build the image without the "
            "SDK, for the reference backend only)")
    return actual


# ---------------------------------------------------------------------------------------------
# the SDK this process sees

@dataclass(frozen=True)
class InstalledSdk:
    root: Path
    version: str
    variable: str                  # which environment variable named the root


def read_sdk_version(sdk_yaml: Path) -> str:
    """The top-level `version:` of the SDK's sdk.yaml (a plain key; no YAML library needed)."""
    try:
        text = sdk_yaml.read_text(errors="replace")
    except OSError as exc:
        raise ToolchainError(f"{sdk_yaml}: cannot read the SDK's version file ({exc.strerror}); "
                             "is this the root of a QAIRT SDK?") from None
    m = re.search(r"^version:\s*['\"]?([0-9][0-9A-Za-z.\-]*)['\"]?\s*$", text, re.MULTILINE)
    if not m:
        raise ToolchainError(f"{sdk_yaml}: no top-level 'version:' line; is this the sdk.yaml of "
                             "a QAIRT SDK?")
    return m.group(1)


def installed_sdk(env=None) -> InstalledSdk:
    env = os.environ if env is None else env
    for var in SDK_ROOT_VARS:
        if env.get(var):
            root = Path(env[var])
            return InstalledSdk(root, read_sdk_version(root / "sdk.yaml"), var)
    raise ToolchainError("no QAIRT SDK: neither QAIRT_SDK_ROOT nor QNN_SDK_ROOT is set. The "
                         "qairt backend runs in the toolchain image built with the SDK (stage the "
                         "archive, run `doit image`, build with executor=docker), or set "
                         "QAIRT_SDK_ROOT to an SDK install")


def require_pinned_sdk(tc: Toolchain, env=None) -> InstalledSdk:
    """Refuse any SDK but the pinned one, before anything else is done with it."""
    sdk = installed_sdk(env)
    if sdk.version != tc.sdk_version:
        raise ToolchainError(f"{sdk.root / 'sdk.yaml'} (from {sdk.variable}): QAIRT version is "
                             f"{sdk.version}, but {tc.path} pins {tc.sdk_version} (sdk.version). "
                             f"Use the QAIRT {tc.sdk_version} SDK, or change the pin deliberately")
    return sdk

