"""Pip's hash-checking requirements files, as this project pins wheels with them
(requirements/*.lock, requirements/ortqnn*.txt): `name==version --hash=sha256:H ...` entries,
with continuation lines and comments; a platform pin file also names each wheel's platform in a
comment. The one reader of the format (toolchain/wheelhouse writes the locks)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hexbundle.support.errors import ToolchainError


@dataclass(frozen=True)
class Locked:
    name: str              # normalized (PEP 503)
    version: str
    hashes: tuple          # sha256 hex digests accepted for this requirement

    def line(self) -> str:
        return f"{self.name}=={self.version} " + " ".join(f"--hash=sha256:{h}"
                                                        for h in self.hashes)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(filename: str) -> str:
    """The distribution name of a wheel file (the part before the first '-')."""
    return normalize(filename.split("-", 1)[0])


def read_lock(path: Path) -> list:
    """Parse a pip hash-checking requirements file: `name==version --hash=sha256:...` entries,
    continuation lines and comments allowed; anything else is refused."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ToolchainError(f"{path}: cannot read the lock file ({exc.strerror}); create it "
                             "with `python3 -m hexbundle.toolchain.wheelhouse lock`") from None
    logical = re.sub(r"\\\n", " ", text)
    out = []
    for n, raw in enumerate(logical.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)((\s+--hash=sha256:"
                         r"[0-9a-f]{64})+)", line)
        if not m:
            raise ToolchainError(f"{path}: entry {n} is not `name==version --hash=sha256:<64 "
                                 f"hex>`: {line[:100]!r}; regenerate the lock")
        hashes = tuple(re.findall(r"sha256:([0-9a-f]{64})", m.group(3)))
        out.append(Locked(normalize(m.group(1)), m.group(2), hashes))
    if not out:
        raise ToolchainError(f"{path}: the lock file lists no package")
    return out


_PLATFORM = re.compile(r"#\s*platform:\s*(\S+)")


def read_platform_pins(path: Path) -> list:
    """[(Locked, platform)] of a pin file whose every entry names its wheel's platform in a
    comment (`... --hash=sha256:H  # platform: win_arm64`): one wheel per platform."""
    entries = read_lock(path)
    platforms = [m.group(1) for m in map(_PLATFORM.search, path.read_text().splitlines())
                 if m]
    if len(platforms) != len(entries):
        raise ToolchainError(f"{path}: {len(entries)} pinned wheel(s) but {len(platforms)} "
                             "`# platform: P` comment(s): each line names its wheel's platform")
    return list(zip(entries, platforms))


