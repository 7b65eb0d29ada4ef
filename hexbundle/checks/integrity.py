"""Re-verify a built bundle against its manifest: every file there, nothing extra, same bytes.

`doit check_sizes` runs it. It hashes every file again (XXH3-128, no digest cache, no stat
shortcut): it is the check that trusts nothing, for a bundle that is about to be shipped or has
been copied around. The bins are hard links to bin/, so this also catches a bin edited there.
"""
from __future__ import annotations

import json
from pathlib import Path

from hexbundle.support.errors import HexbundleError
from hexbundle.support.hashing import file_digest
from hexbundle.config.layout import MANIFEST, Layout


class BundleIntegrityError(HexbundleError):
    """A bundle file differs from what its manifest.json records."""


def verify_bundle(bundle: Path, where=str) -> int:
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
    present = sorted(p.name for p in bundle.iterdir() if p.name != MANIFEST)
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


def check_bundle(layout: Layout):
    """Verify the current bundle, if there is one; BundleIntegrityError naming the file."""
    bundle = layout.bundle_dir
    if not bundle.is_dir():
        print(f"bundle check: no bundle yet in {layout.rel(bundle)}", flush=True)
        return
    try:
        count = verify_bundle(bundle, where=layout.rel)
    except HexbundleError as exc:
        raise BundleIntegrityError(f"bundle check: {exc}") from None
    print(f"bundle check: {count} files of {layout.rel(bundle)} match {MANIFEST}", flush=True)
