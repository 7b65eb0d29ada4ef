"""Re-verify a built bundle against its manifest: every file there, nothing extra, same bytes.

`doit check_sizes` runs it. It hashes every file again (XXH3-128, no digest cache, no stat
shortcut): it is the check that trusts nothing, for a bundle that is about to be shipped or has
been copied around. The bins are hard links to bin/, so this also catches a bin edited there.
"""
from __future__ import annotations

from hexbundle.config.layout import MANIFEST, Layout
from hexbundle.formats.manifest import BundleIntegrityError, verify_bundle_files
from hexbundle.support.errors import HexbundleError


def check_bundle_integrity(layout: Layout) -> None:
    """Verify the current bundle, if there is one; BundleIntegrityError naming the file."""
    bundle = layout.bundle_dir
    if not bundle.is_dir():
        print(f"bundle check: no bundle yet in {layout.rel(bundle)}", flush=True)
        return
    try:
        count = verify_bundle_files(bundle, where=layout.rel)
    except HexbundleError as exc:
        raise BundleIntegrityError(f"bundle check: {exc}") from None
    print(f"bundle check: {count} files of {layout.rel(bundle)} match {MANIFEST}", flush=True)
