"""Which QAIRT release a file comes from, as the file itself says in plain bytes: the one reader.

Qualcomm's binaries state their release in two forms (read from the onnxruntime-qnn wheels'
QAIRT 2.42.0 to 2.51.0 files; docs/formats.md "QAIRT versions in the files"):
  - the build string, `v2.42.0.251225135753_193295` or `v2.45.40.260406130939`: "v", the
    version X.Y.Z, then the build's date and time (YYMMDDhhmmss) and, in some releases, "_"
    and a build number. In QnnHtp, HtpPrepare, the stubs and the skels; a context binary's
    metadata and payload carry the one of the QnnHtp that made it (read_bin_release reads the
    metadata), and qnn-context-binary-utility prints it as `buildId`.
  - `AISW_VERSION: X.Y.Z`: in those files and in libGenie and NetRunExtensions (which carry
    no build string). QnnSystem and the catalogs carry neither.
What identifies a release: the version X.Y.Z and, when the form has one, the build date
(YYMMDD): the SDK's own folder and sdk.yaml name it `2.42.0.251225`, and a reader of the
utility's JSON matches a buildId to that folder by prefix. The time and build number are not
part of it. `Release.same_as` compares two forms by what both state.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hexbundle.formats.qnn_context import HEADER_SIZE, is_qnn_context, parse_header
from hexbundle.support.errors import FormatError

# v2.42.0.251225135753_193295 ; the SDK's own spelling, 2.42.0.251225, also parses
_BUILD = rb"v?(\d{1,3})\.(\d{1,3})\.(\d{1,4})\.(\d{6})(\d{0,8})(?:_(\d{1,12}))?"
# (in a skel also as "hexnn_ver_v2.45.40.260406130939.": only digits may not touch it)
BUILD_STRING = re.compile(rb"(?<![\d.])v(\d{1,3})\.(\d{1,3})\.(\d{1,4})\.(\d{6})(\d{6,8})"
                          rb"(?:_(\d{1,12}))?(?!\d)")
AISW_VERSION = re.compile(rb"AISW_VERSION: ?(\d{1,3})\.(\d{1,3})\.(\d{1,4})(?![\d.])")
CHUNK = 4 << 20          # read in pieces: HtpPrepare is 90 MB
OVERLAP = 64             # longer than any match, so one split across two pieces is found


@dataclass(frozen=True)
class Release:
    """A QAIRT release as one form states it; `date` is "" when the form has none."""
    version: tuple          # (2, 45, 40)
    date: str = ""          # "260406" (YYMMDD)
    text: str = ""          # as written: "v2.45.40.260406130939", "AISW_VERSION: 2.45.40"

    @property
    def dotted(self) -> str:
        return ".".join(map(str, self.version))

    def __str__(self) -> str:
        return f"{self.dotted}.{self.date}" if self.date else self.dotted

    def same_as(self, other: "Release") -> bool:
        """One release: the same X.Y.Z and, where both state a build date, the same date."""
        return self.version == other.version and (
            not self.date or not other.date or self.date == other.date)


def parse_release(text: str) -> Optional[Release]:
    """A buildId (`v2.42.0.251225135753_193295`, `v2.42.0.251225`), an SDK version
    (`2.42.0.251225`) or `X.Y.Z`; None if it is none of these."""
    if not isinstance(text, str):
        return None
    raw = text.strip().encode("ascii", "replace")
    m = re.fullmatch(_BUILD, raw)
    if m:
        return Release(tuple(int(g) for g in m.groups()[:3]), m.group(4).decode(), text.strip())
    m = re.fullmatch(rb"v?(\d{1,3})\.(\d{1,3})\.(\d{1,4})", raw)
    return Release(tuple(int(g) for g in m.groups()), "", text.strip()) if m else None


@dataclass(frozen=True)
class FileRelease:
    """What one file says of its release: every distinct build string and AISW_VERSION in it."""
    builds: tuple = ()      # Release, sorted by text
    aisw: tuple = ()        # Release (no date), sorted by text

    @property
    def stated(self) -> tuple:
        return self.builds + self.aisw

    @property
    def release(self) -> Optional[Release]:
        """The file's release: its build string if it has one, else its AISW_VERSION; None when
        it states none, or several that are not one release (`problem` says which)."""
        if not self.stated or self.problem():
            return None
        return self.builds[0] if self.builds else self.aisw[0]

    def problem(self) -> str:
        """"" or why the file's own statements are not one release."""
        forms = self.stated
        if any(not a.same_as(b) for a in forms for b in forms):
            return "states more than one QAIRT release: " + ", ".join(f.text for f in forms)
        return ""

    def describe(self) -> str:
        return ", ".join(f.text for f in self.stated) or "no QAIRT version stated"

    def record(self) -> dict:
        """What the bundle manifest records of a file (checks compare it with the bytes)."""
        return {"build": [b.text for b in self.builds],
                "aisw_version": [a.dotted for a in self.aisw]}


def scan_bytes(data: bytes, before: int = -1) -> FileRelease:
    """The statements in `data` that start before offset `before` (-1: anywhere)."""
    builds, aisw = {}, {}
    limit = len(data) if before < 0 else before
    for m in BUILD_STRING.finditer(data, 0, len(data)):
        if m.start() < limit:
            text = m.group(0).decode()
            builds[text] = Release(tuple(int(g) for g in m.groups()[:3]), m.group(4).decode(),
                                   text)
    for m in AISW_VERSION.finditer(data):
        if m.start() < limit:
            version = tuple(int(g) for g in m.groups())
            aisw[version] = Release(version, "", m.group(0).decode())
    return FileRelease(tuple(builds[k] for k in sorted(builds)),
                       tuple(aisw[k] for k in sorted(aisw)))


def read_file_release(path: Path, limit: int = -1) -> FileRelease:
    """Every release statement in `path` (in its first `limit` bytes; -1: all of it), read in
    pieces of CHUNK bytes, so memory stays bounded whatever the file's size (OSError if
    unreadable). A statement that starts in a piece's last OVERLAP bytes is read whole from the
    next piece, which begins with them."""
    found = []
    with open(path, "rb") as fh:
        pieces = _pieces(fh, limit)
        data = next(pieces, b"")
        while data:
            more = next(pieces, b"")
            found.append(scan_bytes(data, len(data) - OVERLAP if more else -1))
            data = data[-OVERLAP:] + more if more else b""
    builds = {b.text: b for f in found for b in f.builds}
    aisw = {a.version: a for f in found for a in f.aisw}
    return FileRelease(tuple(builds[k] for k in sorted(builds)),
                       tuple(aisw[k] for k in sorted(aisw)))


def _pieces(fh, limit: int):
    """The file's bytes in pieces of at most CHUNK, up to `limit` bytes (-1: to its end)."""
    left = limit
    while left != 0:
        piece = fh.read(CHUNK if left < 0 else min(CHUNK, left))
        if not piece:
            return
        left = left - len(piece) if left > 0 else left
        yield piece


def read_bin_release(path: Path) -> FileRelease:
    """A context binary's release. A QNN context binary (formats/qnn_context.py) states the
    build string of the QnnHtp that made it in its metadata, before the payload (and again per
    graph in the payload: the same QnnHtp serialized them all; QAIRT 2.51.0's bins in
    tests/data/qualcomm), so its header and metadata are read first: a multi-GB bin costs
    kilobytes. Only when they state nothing, and for any other file (a damaged header,
    another format), is the file read whole, in pieces."""
    end = _qnn_metadata_end(path)
    if end >= 0:
        found = read_file_release(path, end)
        if found.stated:
            return found
    return read_file_release(path)


def _qnn_metadata_end(path: Path) -> int:
    """Where a QNN context binary's metadata ends, or -1 when `path` is not a readable one."""
    if not is_qnn_context(path):
        return -1
    with open(path, "rb") as fh:
        head = fh.read(HEADER_SIZE)
    try:
        header = parse_header(head, Path(path).stat().st_size, str(path))
    except FormatError:
        return -1
    return HEADER_SIZE + header.metadata_size


def mixed_releases(stated: dict) -> str:
    """"" when every file's release is one release; else which files say which, grouped (a
    file that states no build date goes with the dated release of its version, if any).
    `stated`: {name: Release}."""
    names = sorted(stated)
    if all(stated[a].same_as(stated[b]) for a in names for b in names):
        return ""
    dated = {r.version: str(r) for r in stated.values() if r.date}
    groups = {}
    for name in names:
        release = stated[name]
        groups.setdefault(dated.get(release.version, str(release)), []).append(name)
    return "; ".join(f"QAIRT {rel}: {', '.join(files)}" for rel, files in sorted(groups.items()))
