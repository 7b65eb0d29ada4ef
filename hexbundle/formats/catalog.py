"""A Windows signing catalog (.cat): which files it signs.

Windows loads a Hexagon skel only with its catalog beside it (Qualcomm's "HTP Library Loading"
tutorial: without it, `transportStatus: 9`), and the catalog vouches for the skel by its digest:
a PKCS#7 certificate trust list whose members carry the file's SHA-1 and SHA-256 (read from the
onnxruntime-qnn win_arm64 wheels: each libqnnhtpvNN.cat holds both digests of the
libQnnHtpVNNSkel.so of its own release, and no other release's). So a catalog of another
release beside the skel is as good as none. This reader looks for the digests as bytes in the
catalog: 20 and 32 bytes of a hash occur in a few-KiB catalog only when it lists that file.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

CATALOG_MAX_BYTES = 1 << 20     # Qualcomm's are 12 KiB


def catalog_signs(catalog: Path, member: Path) -> bool:
    """`catalog` lists `member` (its SHA-256 or SHA-1). OSError if either is unreadable."""
    with open(catalog, "rb") as fh:
        cat = fh.read(CATALOG_MAX_BYTES)
    sha256, sha1 = hashlib.sha256(), hashlib.sha1()
    with open(member, "rb") as fh:
        for piece in iter(lambda: fh.read(1 << 20), b""):
            sha256.update(piece)
            sha1.update(piece)
    return sha256.digest() in cat or sha1.digest() in cat
