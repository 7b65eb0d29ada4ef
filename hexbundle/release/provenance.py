"""What a release records about how it was built: the toolchain image, the SDK pin, the lock, and
which steps' outputs came from a remote cache (server and instance; build-info.json)."""
from __future__ import annotations

from pathlib import Path

from hexbundle import __version__
from hexbundle.backends import describe
from hexbundle.config.layout import Layout
from hexbundle.config.schema import table_of
from hexbundle.config.toolchain import load_toolchain
from hexbundle.formats.manifest import read_build_info
from hexbundle.support import hashing
from hexbundle.support.errors import HexbundleError
from hexbundle.support.hashing import sha256_file


def image_used(layout: Layout) -> dict:
    """The toolchain image a docker build ran in: the ID its build-info.json records (else the
    image now under the tag) and, when the engine answers, that image's labels."""
    tc = load_toolchain(layout.root)
    image_id = read_build_info(layout).get("image", "")
    labels = {}
    try:
        from docker.errors import DockerException
    except ImportError:
        return {"tag": tc.image_tag, "id": image_id, "labels": labels}
    from hexbundle.toolchain.docker import docker_client  # the docker SDK is optional here
    try:
        image = docker_client().images.get(image_id or tc.image_tag)
        image_id, labels = image.id, dict(image.labels or {})
    except (HexbundleError, DockerException):
        labels = {}   # no engine here (e.g. verifying elsewhere): the recorded ID alone
    return {"tag": tc.image_tag, "id": image_id, "labels": labels}


def provenance_materials(layout: Layout) -> list:
    """Materials for a release's provenance: the image a docker build ran in (with its labels:
    base, SDK, lock), the SDK pin of a qairt build, the lock file."""
    cfg = layout.cfg
    tc = load_toolchain(cfg.root)
    out = []
    if cfg.executor == "docker":
        used = image_used(layout)
        out.append({"name": f"docker-image:{used['tag']}",
                    "digest": {"sha256": used["id"].removeprefix("sha256:")} if used["id"] else {},
                    "annotations": {k: v for k, v in sorted(used["labels"].items())
                                    if k.startswith("hexbundle.")}})
        out.append({"name": layout.rel(tc.lock), "digest": {"sha256": sha256_file(tc.lock)}})
    if cfg.backend == "qairt":
        out.append({"name": f"qairt-sdk:{tc.sdk_version}",
                    "digest": {"sha256": tc.sdk_sha256} if tc.sdk_sha256 else {},
                    "annotations": {"archive": layout.rel(tc.sdk_archive)}})
    return out


STATEMENT_TYPE = "https://in-toto.io/Statement/v1"


PREDICATE_TYPE = "https://slsa.dev/provenance/v1"


BUILD_TYPE = "urn:hexbundle:release:v1"


BUILDER_ID = "urn:hexbundle:builder"

# Settings whose value may be a credential: the provenance says they were given, not what.
SECRET_KEYS = ("remote_header",)
SECRET = "(set; not recorded)"


def _file_material(layout: Layout, path: Path) -> dict:
    return {"name": layout.logical(path),
            "digest": {"sha256": sha256_file(path), "xxh3_128": hashing.digest(path)}}


def provenance(layout: Layout, overrides: dict, source: dict, epoch: int,
               subjects: list, inputs: list) -> dict:
    cfg = layout.cfg
    toolchain, deployable = describe(cfg.backend)
    deps = [{"name": "source", "digest": {"gitCommit": source["commit"]} if source["commit"]
             else {}, "annotations": {"dirty": source["dirty"]}}]
    deps += [_file_material(layout, p) for p in cfg.config_files]
    deps += [_file_material(layout, p) for p in inputs]
    deps += provenance_materials(layout)
    info = read_build_info(layout)   # which steps came from a remote cache, and from where
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "model": cfg.model.name, "device": cfg.device.name, "plan": cfg.plan.name,
                    "backend": cfg.backend, "executor": cfg.executor, "compile": table_of(cfg.compile),
                    "overrides": {k: SECRET if k in SECRET_KEYS else v
                                  for k, v in sorted(overrides.items())},
                    "source_date_epoch": epoch},
                "internalParameters": {"toolchain": toolchain, "deployable": deployable,
                                       "steps": info.get("steps", {}),
                                       "remote_cache": info.get("remote_cache", {})},
                "resolvedDependencies": deps,
            },
            "runDetails": {"builder": {"id": BUILDER_ID, "version": {"hexbundle": __version__}}},
        },
    }
