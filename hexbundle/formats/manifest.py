"""The bundle's records. manifest.json, its table of contents: writer (`bundle_manifest`) and
reader (`verify_bundle_files`, `manifest_image`). It names the toolchain image the steps ran in
(`"image"`: its ID under executor = "docker", null with the local executor): the one thing in a
bundle that depends on the executor, since what an image holds decides what the bundle holds.
build-info.json, beside the bundle: how it was built (executor, toolchain image, which steps came
from a remote cache): `write_build_info`, `read_build_info`."""
from __future__ import annotations

import json
import re
from pathlib import Path

from hexbundle.config.layout import MANIFEST
from hexbundle.config.runtime_files import TARGETS
from hexbundle.config.schema import ANY, U32, U64, Field, check_json, table_of
from hexbundle.config.step_options import BundleOptions
from hexbundle.formats.origins import remote_summary
from hexbundle.support import hashing
from hexbundle.support.atomic import write_json
from hexbundle.support.errors import ConfigError, HexbundleError
from hexbundle.support.files import JSON_CONFIG_MAX_BYTES, read_named_file
from hexbundle.support.hashing import file_digest
from hexbundle.support.jsondoc import JsonDocError, parse_json, read_state_json

MANIFEST_FORMAT = 1
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")


def bundle_files(bundle_dir: Path) -> list:
    """Every file of a bundle but the manifest, as sorted relative POSIX paths (the runtime's
    lib/, dsp/, bin/ are folders)."""
    return sorted(p.relative_to(bundle_dir).as_posix() for p in bundle_dir.rglob("*")
                  if p.is_file() and p != bundle_dir / MANIFEST)


def bundle_manifest(bundle_dir: Path, o: BundleOptions, backend_version: str,
                    sizes_expected: dict, unencoded: dict = None, runtime: dict = None,
                    image: str = "", sources: list = (), configs: list = ()) -> dict:
    """What the bundle holds, and the toolchain image its steps ran in (`image`, "" for none:
    the local executor). Nothing else of HOW it was built (host, times, remote cache): that
    goes to build-info.json and a release's provenance. `sources` and `configs`: the files
    digested, in the order o.manifest names them."""
    record = o.manifest
    files = {}
    for name in bundle_files(bundle_dir):
        path = bundle_dir / name
        files[name] = {"size": path.stat().st_size, "xxh3_128": hashing.digest(path)}
    bins = [n for n in files if n.endswith(".bin")]
    return {
        "format": MANIFEST_FORMAT,
        "model": record.model,
        "device": record.device,
        "plan": record.plan,
        "backend": o.backend,
        "deployable": o.backend == "qairt",
        "toolchain": backend_version,
        "image": image or None,
        "compile": table_of(record.compile),
        "files": files,
        "total_bytes": sum(f["size"] for f in files.values()),
        "bins_total_bytes": sum(files[n]["size"] for n in bins),
        "expected_bins_bytes": sizes_expected,
        "expected_bins_total_bytes": sum(sizes_expected.values()),
        "inputs": digests(record.sources, sources),
        "graphs": {name: {k: list(v) if isinstance(v, tuple) else v for k, v in entry.items()}
                   for name, entry in record.graphs.items()},
        # layer weights the encodings say nothing about, and how the policy stored them
        "unencoded_weights": {"policy": o.convert.unencoded_weights,
                              "tensors": dict(sorted((unencoded or {}).items()))},
        "configs": digests(record.configs, configs),
        # qairt: the QAIRT runtime (backends/qairt_runtime.py): mode, board OS, versions, the
        # runtime files (their digests are in "files"), what each bin says of itself
        **({"runtime": runtime} if runtime else {}),
    }


def digests(names: tuple, paths: list) -> dict:
    """Project-relative name -> the file's digest (the names and the files in one order)."""
    if len(names) != len(paths):
        raise HexbundleError(f"manifest: {len(names)} names for {len(paths)} files (a bundle "
                             "step description from another hexbundle?)")
    return {name: hashing.digest(Path(p)) for name, p in zip(names, paths)}


class BundleIntegrityError(HexbundleError):
    """A bundle file differs from what its manifest.json records."""


# ---------------------------------------------------------------------------------------------
# the reader: every key a reader of manifest.json takes, of its type and range (the rest of the
# document is a record for people, taken as it is)

_ANY = Field(ANY, default=None)
FILE_ENTRY = {"size": Field(int, min=0, max=U64), "xxh3_128": Field(str, pattern=r"[0-9a-f]{32}"),
              "*": _ANY}
# the QAIRT runtime a qairt or ortqnn bundle carries or names (backends/qairt_runtime.py,
# backends/ortqnn_runtime.py bundle_runtime)
RUNTIME = {
    "mode": Field(str, choices=("bundled", "board")),
    "target": Field(str, choices=TARGETS),
    "dsp_arch": Field(str, pattern=r"v\d{2,3}"),
    "qairt_version": Field(str, pattern=r"\d+\.\d+\.\d+(\.\d+)?"),
    "genie_version": Field(str, pattern=r"\d+\.\d+\.\d+"),
    "htp_device_id": Field(int, min=0, max=U32),
    "script": Field(str, choices=("run.sh", "run.cmd")),
    # genie-t2t-run in bin/, or the board's (ortqnn: no onnxruntime-qnn wheel carries one)
    "runner": Field(str, "bundled", choices=("bundled", "board")),
    "files": Field(list, item=str, pattern=r"(lib|dsp|bin)/[^/\\\x00-\x1f]+"),
    "bins": Field({"*": Field({"buildId": Field(str, default=""), "*": _ANY})}, default={}),
    "*": _ANY,
}
MANIFEST_SCHEMA = {
    "format": Field(int, MANIFEST_FORMAT, min=1, max=MANIFEST_FORMAT),
    "backend": Field(str, "", pattern=r"[a-z_]*"),
    "deployable": Field(bool, default=False),
    "image": _ANY,   # manifest_image judges it (an image ID or null)
    "files": Field({"*": Field(FILE_ENTRY)}),
    "runtime": _ANY,   # RUNTIME, when there is one
    "*": _ANY,
}
REBUILD = "run `doit bundle` to rebuild it"


def read_manifest(bundle: Path, where=str) -> dict:
    """A bundle's manifest.json, the one reader: within JSON bounds (support.jsondoc), every
    key a reader takes of its type and range; BundleIntegrityError naming the file and the key
    otherwise. `where` renders a path for messages."""
    path = Path(bundle) / MANIFEST
    if not (path.exists() or path.is_symlink()):
        raise BundleIntegrityError(f"{where(path)}: missing, so the bundle cannot be verified; "
                                   f"{REBUILD}")
    try:
        data = read_named_file(path, "bundle manifest", JSON_CONFIG_MAX_BYTES)
    except HexbundleError as exc:
        raise BundleIntegrityError(str(exc).replace(str(path), where(path), 1)) from None
    try:
        doc = parse_json(data, "", max_bytes=JSON_CONFIG_MAX_BYTES)   # named below
    except JsonDocError as exc:
        raise BundleIntegrityError(f"{where(path)}: unreadable ({str(exc)[2:]}); {REBUILD}") \
            from None
    try:
        check_json(doc, MANIFEST_SCHEMA, where(path), REBUILD)
        if doc.get("runtime") is not None:
            check_json(doc["runtime"], RUNTIME, f"{where(path)} (runtime)", REBUILD)
    except (HexbundleError, ConfigError) as exc:
        raise BundleIntegrityError(str(exc).replace(str(path), where(path), 1)) from None
    return doc


def manifest_image(doc: dict, where: str):
    """The manifest's `image`: an image ID (sha256:<64 hex>) or None (local executor)."""
    image = doc.get("image")
    if image is None or (isinstance(image, str) and IMAGE_ID.fullmatch(image)):
        return image
    raise BundleIntegrityError(f"{where}: 'image' is {json.dumps(image)[:100]}, not an image ID "
                               "(sha256: and 64 hex digits) or null; run `doit bundle` to "
                               "rebuild it")


def verify_bundle_files(bundle: Path, where=str) -> int:
    """Check `bundle` against its manifest.json; returns the number of files checked.

    `where` renders a path for messages (e.g. project-relative).
    """
    rebuild = REBUILD
    files = read_manifest(bundle, where)["files"]
    present = bundle_files(bundle)
    extra = sorted(set(present) - set(files))
    if extra:
        raise BundleIntegrityError(f"{where(bundle / extra[0])}: not listed in {MANIFEST} "
                                   f"({len(extra)} such file(s)); {rebuild}")
    for name, entry in sorted(files.items()):
        path = bundle / name
        if not path.is_file():
            raise BundleIntegrityError(f"{where(path)}: listed in {MANIFEST} but missing; {rebuild}")
        recorded = entry.get("xxh3_128") if isinstance(entry, dict) else None
        size = path.stat().st_size
        if isinstance(entry, dict) and entry.get("size") != size:
            raise BundleIntegrityError(f"{where(path)}: {size} bytes, {MANIFEST} records "
                                       f"{entry.get('size')}: changed since it was built; {rebuild}")
        actual = file_digest(path)
        if actual != recorded:
            raise BundleIntegrityError(f"{where(path)}: XXH3-128 {actual}, {MANIFEST} records "
                                       f"{recorded}: changed since it was built; {rebuild}")
    return len(files)


def write_build_info(path: Path, executor: str, image: str, steps: dict) -> None:
    """How the bundle was built: the executor, the toolchain image, and where each step's
    outputs came from (`steps`: built here or fetched from a remote cache, formats.origins)."""
    write_json(path, {"executor": executor, "image": image, "steps": steps,
                      "remote_cache": remote_summary(steps)})


def read_build_info(path: Path) -> dict:
    """{"executor", "image", "steps", "remote_cache"} of the last bundle build (build-info.json
    at `path`); {} when there is none or it is unreadable (then the image now under the tag is
    what a caller can name)."""
    try:
        doc = read_state_json(path)   # never through a link
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
