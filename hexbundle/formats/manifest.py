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

from hexbundle.config.layout import MANIFEST, Layout
from hexbundle.config.schema import table_of
from hexbundle.formats.origins import read_origins, remote_summary
from hexbundle.support import hashing
from hexbundle.support.atomic import write_json
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import read_state
from hexbundle.support.hashing import file_digest

MANIFEST_FORMAT = 1
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")


def bundle_files(bundle_dir: Path) -> list:
    """Every file of a bundle but the manifest, as sorted relative POSIX paths (the runtime's
    lib/, dsp/, bin/ are folders)."""
    return sorted(p.relative_to(bundle_dir).as_posix() for p in bundle_dir.rglob("*")
                  if p.is_file() and p != bundle_dir / MANIFEST)


def bundle_manifest(layout: Layout, bundle_dir: Path, backend_version: str,
                    sizes_expected: dict, unencoded: dict = None, runtime: dict = None,
                    image: str = "") -> dict:
    """What the bundle holds, and the toolchain image its steps ran in (`image`, "" for none:
    the local executor). Nothing else of HOW it was built (host, times, remote cache): that
    goes to build-info.json and a release's provenance."""
    cfg = layout.cfg
    files = {}
    for name in bundle_files(bundle_dir):
        path = bundle_dir / name
        files[name] = {"size": path.stat().st_size, "xxh3_128": hashing.digest(path)}
    bins = [n for n in files if n.endswith(".bin")]
    return {
        "format": MANIFEST_FORMAT,
        "model": cfg.model.name,
        "device": cfg.device.name,
        "plan": cfg.plan.name,
        "backend": cfg.backend,
        "deployable": cfg.backend == "qairt",
        "toolchain": backend_version,
        "image": image or None,
        "compile": table_of(cfg.compile),
        "files": files,
        "total_bytes": sum(f["size"] for f in files.values()),
        "bins_total_bytes": sum(files[n]["size"] for n in bins),
        "expected_bins_bytes": sizes_expected,
        "expected_bins_total_bytes": sum(sizes_expected.values()),
        "inputs": {layout.logical(p): hashing.digest(p) for p in layout.source_inputs()},
        "graphs": graph_sources(layout),
        # layer weights the encodings say nothing about, and how the policy stored them
        "unencoded_weights": {"policy": cfg.model.quantization.unencoded_weights,
                              "tensors": dict(sorted((unencoded or {}).items()))},
        "configs": {layout.logical(p): hashing.digest(p) for p in cfg.config_files},
        # qairt: the QAIRT runtime (backends/qairt_runtime.py): mode, board OS, versions, the
        # runtime files (their digests are in "files"), what each bin says of itself
        **({"runtime": runtime} if runtime else {}),
    }


def graph_sources(layout: Layout) -> dict:
    """Which files each graph was built from: the export's own file names (a qai-hub-models tree
    is used in place), or the local split's parts and the unsplit graphs they were cut from."""
    cfg = layout.cfg
    out = {}
    for part in cfg.plan.parts():
        for graph in cfg.model.graphs(part):
            files = layout.graph_files(graph)
            entry = {"onnx": layout.logical(files.onnx),
                     "data": [layout.logical(d) for d in files.data],
                     "encodings": layout.logical(files.encodings)}
            if layout.splits_locally:
                entry["split_from"] = layout.logical(layout.unsplit_files(graph.slot).onnx)
            out[graph.name] = entry
    return out


class BundleIntegrityError(HexbundleError):
    """A bundle file differs from what its manifest.json records."""


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
    manifest_path = bundle / MANIFEST
    rebuild = "run `doit bundle` to rebuild it"
    try:
        doc = json.loads(manifest_path.read_bytes())
        files = doc["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
    except FileNotFoundError:
        raise BundleIntegrityError(f"{where(manifest_path)}: missing, so the bundle cannot be "
                                   f"verified; {rebuild}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BundleIntegrityError(f"{where(manifest_path)}: unreadable ({exc}); {rebuild}") \
            from None
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


def write_build_info(layout: Layout, executor: str, image: str) -> None:
    """How the bundle was built: the executor, the toolchain image, and where each step's
    outputs came from (built here or fetched from a remote cache: formats.origins)."""
    steps = read_origins(layout)
    write_json(layout.build_info, {"executor": executor, "image": image, "steps": steps,
                                   "remote_cache": remote_summary(steps)})


def read_build_info(layout: Layout) -> dict:
    """{"executor", "image", "steps", "remote_cache"} of the last bundle build; {} when there is none or it is unreadable
    (then the image now under the tag is what a caller can name)."""
    try:
        doc = json.loads(read_state(layout.build_info))   # never through a link
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
