"""What a release records about how it was built: the toolchain image, the SDK pin, the lock, and
which steps' outputs came from a remote cache (server and instance; build-info.json)."""
from __future__ import annotations

import re
from pathlib import Path

from hexbundle import __version__
from hexbundle.backends import describe
from hexbundle.config.layout import Layout
from hexbundle.config.schema import table_of
from hexbundle.config.toolchain import load_toolchain
from hexbundle.formats.manifest import read_build_info
from hexbundle.support import hashing
from hexbundle.support.errors import FormatError, HexbundleError
from hexbundle.support.files import JSON_CONFIG_MAX_BYTES, read_named_text
from hexbundle.support.hashing import sha256_file
from hexbundle.support.jsondoc import parse_json


def image_used(layout: Layout) -> dict:
    """The toolchain image a docker build ran in: the ID its build-info.json records (else the
    image now under the tag) and, when the engine answers, that image's labels."""
    tc = load_toolchain(layout.root)
    image_id = read_build_info(layout.build_info).get("image", "")
    labels = {}
    try:
        from docker.errors import DockerException
    except ImportError:
        return {"tag": tc.image_tag, "id": image_id, "labels": labels}
    from hexbundle.toolchain.docker import docker_client, engine_call   # the SDK is optional here
    try:   # bounded, a lost engine a ToolchainError (issue 40 kind 5), as every engine call
        image = engine_call("reading the toolchain image", docker_client().images.get,
                            image_id or tc.image_tag)
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
    info = read_build_info(layout.build_info)   # which steps came from a remote cache, and from where
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


# ---------------------------------------------------------------------------------------------
# The reader: a provenance comes with a release, from anywhere; every value `verify_release`
# uses is checked to its exact shape before it is used (a commit reaches `git`, a material's name
# is a path that is hashed, the epoch goes into tar headers).

GIT_COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# The release's file times: from 1980 (what zip and some tar tools can hold at least) to the
# largest a ustar header holds (11 octal digits: 2242), so every tar tool reads them back.
MIN_EPOCH, MAX_EPOCH = 315532800, 8 ** 11 - 1
PARAMETERS = ("model", "device", "plan", "backend", "executor")


def _at(doc, path: str, kind: type, where: str):
    """doc's value at the dotted `path`, which must be a `kind`: FormatError naming the key."""
    value = doc
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise FormatError(f"{where}: missing key '{path}'; not a hexbundle provenance "
                              "statement (keep the release's files as `doit release` wrote them)")
        value = value[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise FormatError(f"{where}: key '{path}' is {type(value).__name__}, expected "
                          f"{kind.__name__}")
    return value


def read_provenance(path: Path) -> dict:
    """The provenance statement at `path`, checked (check_provenance): FormatError naming the
    file and the key otherwise."""
    try:   # only a regular file, and never past a config's size (support.files)
        doc = parse_json(read_named_text(path, "provenance statement", JSON_CONFIG_MAX_BYTES),
                         "", max_bytes=JSON_CONFIG_MAX_BYTES)   # named below
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:   # support.jsondoc's JsonDocError: not JSON, or out of bounds
        raise FormatError(f"{path}: not JSON ({str(exc)[2:202]})") from None
    return check_provenance(doc, str(path))


def check_provenance(doc, where: str) -> dict:
    """What verify_release reads of a statement, each value of its exact type and shape."""
    for subject in _at(doc, "subject", list, where):
        _at(subject, "name", str, f"{where}: subject")
        if not SHA256.fullmatch(_at(subject, "digest.sha256", str, f"{where}: subject")):
            raise FormatError(f"{where}: a subject's digest.sha256 is not 64 hex digits")
    build = _at(doc, "predicate.buildDefinition", dict, where)
    params = _at(build, "externalParameters", dict, where)
    for key in PARAMETERS:
        _at(params, key, str, f"{where}: externalParameters")
    for key, value in _at(params, "compile", dict, f"{where}: externalParameters").items():
        # each becomes `key=value` on the rebuild's command line: a setting's name, never an
        # option (load_build then refuses a name it does not know)
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", key):
            raise FormatError(f"{where}: externalParameters.compile has key {key[:80]!r}; "
                              "expected a [compile] setting's name")
        if not isinstance(value, (str, int, float, bool)):
            raise FormatError(f"{where}: externalParameters.compile.{key} is "
                              f"{type(value).__name__}; expected a value")
    epoch = _at(params, "source_date_epoch", int, f"{where}: externalParameters")
    if not MIN_EPOCH <= epoch <= MAX_EPOCH:
        raise FormatError(f"{where}: externalParameters.source_date_epoch is {epoch}; expected "
                          f"seconds in [{MIN_EPOCH}, {MAX_EPOCH}] (1980 to 2242)")
    for dep in _at(build, "resolvedDependencies", list, where):
        _check_dependency(dep, where)
    return doc


def _check_dependency(dep, where: str) -> None:
    name = _at(dep, "name", str, f"{where}: resolvedDependencies")
    here = f"{where}: resolvedDependencies {name[:80]!r}"
    digest = _at(dep, "digest", dict, here)
    if not all(isinstance(v, str) for v in digest.values()):
        raise FormatError(f"{here}: every digest must be a string")
    if "annotations" in dep:
        _at(dep, "annotations", dict, here)
    if name == "source" and "gitCommit" in digest \
            and not GIT_COMMIT.fullmatch(digest["gitCommit"]):
        raise FormatError(f"{here}: digest.gitCommit is {digest['gitCommit'][:80]!r}; expected "
                          "a commit: 40 lower-case hex digits")
    if "sha256" in digest and not SHA256.fullmatch(digest["sha256"]):
        raise FormatError(f"{here}: digest.sha256 is not 64 hex digits")
