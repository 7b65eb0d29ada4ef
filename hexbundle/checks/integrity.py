"""Re-verify a built bundle against its manifest and the build: every file there, nothing extra,
same bytes, and a manifest that says what this build is.

`doit check_sizes` runs it. It hashes every file again (XXH3-128, no digest cache, no stat
shortcut): it is the check that trusts nothing, for a bundle that is about to be shipped or has
been copied around. The bins are hard links to bin/, so this also catches a bin edited there.

The manifest itself is no witness (it can be edited along with a file, its digest rewritten to
match), so it is checked against the build: its model, device, plan, backend, `deployable`
(only the qairt backend makes deployable bins) and compile options against the configuration;
each bin against bin/ (re-hashed) and, for bins in hexbundle's container format, against the
XXH3-128 every blob carries inside the bin.
"""
from __future__ import annotations

import json
import os

from hexbundle.config.layout import MANIFEST, Layout
from hexbundle.config.schema import table_of
from hexbundle.formats.manifest import (BundleIntegrityError, manifest_image, read_manifest,
                                        verify_bundle_files)
from hexbundle.support.errors import HexbundleError
from hexbundle.support.hashing import file_digest

REBUILD = "run `doit bundle` to rebuild it"


def check_bundle_integrity(layout: Layout) -> None:
    """Verify the current bundle, if there is one; BundleIntegrityError naming the file."""
    bundle = layout.bundle_dir
    if not bundle.is_dir():
        print(f"bundle check: no bundle yet in {layout.rel(bundle)}", flush=True)
        return
    try:
        count = verify_bundle_files(bundle, where=layout.rel)
        doc = read_manifest(bundle, layout.rel)
        check_manifest_fields(layout, doc)
        check_bins(layout, doc)
    except HexbundleError as exc:
        raise BundleIntegrityError(f"bundle check: {exc}") from None
    print(f"bundle check: {count} files of {layout.rel(bundle)} match {MANIFEST}, which matches "
          f"the build", flush=True)


def expected_manifest_fields(layout: Layout) -> dict:
    """The manifest fields the configuration decides (as bundle_manifest writes them)."""
    cfg = layout.cfg
    return {"model": cfg.model.name, "device": cfg.device.name, "plan": cfg.plan.name,
            "backend": cfg.backend, "deployable": cfg.backend == "qairt",
            "compile": table_of(cfg.compile)}


def check_manifest_fields(layout: Layout, doc: dict) -> None:
    where = layout.rel(layout.manifest)
    for key, want in expected_manifest_fields(layout).items():
        got = doc.get(key)
        if got != want or type(got) is not type(want):
            raise BundleIntegrityError(
                f"{where}: {key!r} is {json.dumps(got)}, but this build makes {json.dumps(want)} "
                f"(backend {layout.cfg.backend}): the manifest was changed or is from another "
                f"build; {REBUILD}")
    if doc["deployable"] != (doc["backend"] == "qairt"):   # also holds for the fields themselves
        raise BundleIntegrityError(f"{where}: 'deployable' disagrees with 'backend'; {REBUILD}")
    check_image(layout, doc, where)


def check_image(layout: Layout, doc: dict, where: str) -> None:
    """The manifest's `image` against the build: an image ID is the one `doit image` recorded
    (when there is a record: no engine is asked); null (a local build) is no bundle of
    executor=docker."""
    image = manifest_image(doc, where)
    if image is None:
        if layout.cfg.executor == "docker":
            raise BundleIntegrityError(f"{where}: 'image' is null (a build without containers), "
                                       f"but this build runs its steps in the toolchain image; "
                                       f"{REBUILD} with executor=docker")
        return
    from hexbundle.config.toolchain import load_toolchain, recorded_image_id
    want = recorded_image_id(layout.root, load_toolchain(layout.root).image_tag)
    if want and image != want:
        raise BundleIntegrityError(
            f"{where}: 'image' is {image}, but the toolchain image `doit image` recorded is "
            f"{want} (build/image/image-id.txt): the bundle was built in another image; "
            f"{REBUILD} with executor=docker")


def check_bins(layout: Layout, doc: dict) -> None:
    """Each part's bin: listed, the same bytes as bin/ (re-hashed), and (container bins) every
    blob's own digest intact, so a bin whose manifest digest was rewritten to match is caught."""
    files = doc.get("files") or {}
    for part in layout.cfg.plan.parts():
        name = layout.bin_name(part)
        shipped, built = layout.bundle_dir / name, layout.bin(part)
        if name not in files:
            raise BundleIntegrityError(f"{layout.rel(layout.manifest)}: does not list {name}, "
                                       f"part {part.index}'s context binary; {REBUILD}")
        if built.is_file() and not _same_file(shipped, built):
            if file_digest(built) != files[name].get("xxh3_128"):
                raise BundleIntegrityError(
                    f"{layout.rel(shipped)}: differs from {layout.rel(built)}, which compile "
                    f"wrote; {REBUILD}")
        _check_container_bin(layout, shipped)


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_container_bin(layout: Layout, path) -> None:
    from hexbundle.formats.ctxbin import is_ctxbin, read_ctxbin
    if not is_ctxbin(path):
        return   # a QAIRT context binary: its bytes are checked against bin/ and the manifest
    with read_ctxbin(path) as reader:
        reader.verify_digests()
        if reader.deployable != (layout.cfg.backend == "qairt"):
            raise BundleIntegrityError(f"{layout.rel(path)}: its header says deployable "
                                       f"{reader.deployable}; {REBUILD}")
