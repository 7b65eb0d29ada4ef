"""Unpack the staged QAIRT SDK archive during the image build (standard library only).

    install_sdk.py --version V --sha256 H --archive NAME --install-dir DIR --dest /sdk

With --archive none (nothing staged), it makes an empty /sdk: the image has no SDK and its
labels say so. Otherwise the archive (next to this script in the build context) is checked
again against the pinned sha256 -- hexbundle checked it on the host, this guards the context
itself -- and unpacked to /sdk/<install-dir>, keeping Unix modes (the SDK's tools must stay
executable; Python's zipfile drops them) and refusing members that would land outside it. The
SDK root is the directory holding sdk.yaml, whose `version` must be the pinned one.
"""
import argparse
import hashlib
import os
import re
import shutil
import stat
import sys
import zipfile
from pathlib import Path, PurePosixPath


def fail(msg: str) -> None:
    print(f"install_sdk: ERROR: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)


def sdk_prefix(names: list) -> str:
    """The archive directory that holds sdk.yaml (the shallowest one): the SDK root."""
    roots = sorted((n for n in names if PurePosixPath(n).name == "sdk.yaml"),
                   key=lambda n: n.count("/"))
    if not roots:
        fail("the archive has no sdk.yaml: it is not a QAIRT SDK archive")
    parent = str(PurePosixPath(roots[0]).parent)
    return "" if parent == "." else parent + "/"


def safe_target(dest: Path, relative: str) -> Path:
    target = (dest / relative).resolve()
    if dest.resolve() not in (target, *target.parents):
        fail(f"archive member {relative!r} would be written outside the SDK directory")
    return target


def unpack(archive: Path, dest: Path) -> str:
    """Unpack the SDK root of `archive` into `dest`; return the prefix that was stripped."""
    with zipfile.ZipFile(archive) as zf:
        members = zf.infolist()
        prefix = sdk_prefix([m.filename for m in members])
        for m in members:
            if not m.filename.startswith(prefix) or m.filename == prefix:
                continue
            target = safe_target(dest, m.filename[len(prefix):])
            mode = (m.external_attr >> 16) & 0xFFFF
            if m.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if stat.S_ISLNK(mode):
                link = zf.read(m).decode()
                if os.path.isabs(link):
                    fail(f"archive member {m.filename!r} is a link to an absolute path")
                safe_target(dest, str(PurePosixPath(m.filename[len(prefix):]).parent / link))
                os.symlink(link, target)
                continue
            with zf.open(m) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(target, (stat.S_IMODE(mode) or 0o644) & 0o755)
    return prefix


def main() -> None:
    ap = argparse.ArgumentParser()
    for opt in ("--version", "--sha256", "--archive", "--install-dir", "--dest"):
        ap.add_argument(opt, required=True)
    a = ap.parse_args()
    dest = Path(a.dest)
    dest.mkdir(parents=True, exist_ok=True)
    if a.archive == "none":
        print("install_sdk: no SDK archive staged: this image has no QAIRT SDK "
              "(reference backend only)", flush=True)
        return
    archive = Path(__file__).resolve().parent / a.archive
    if not archive.is_file():
        fail(f"{a.archive} is not in the build context")
    actual = sha256_file(archive)
    if actual != a.sha256:
        fail(f"{a.archive}: sha256 {actual} is not the pinned {a.sha256}")
    root = dest / a.install_dir.lstrip("/")
    root.mkdir(parents=True)
    prefix = unpack(archive, root)
    text = (root / "sdk.yaml").read_text(errors="replace")
    m = re.search(r"^version:\s*['\"]?([0-9][0-9A-Za-z.\-]*)", text, re.MULTILINE)
    if not m or m.group(1) != a.version:
        fail(f"{a.archive}: its sdk.yaml says version {m.group(1) if m else '(none)'}, "
             f"not the pinned {a.version}")
    print(f"install_sdk: QAIRT {a.version} from {a.archive} ({prefix or '/'}) -> "
          f"{a.install_dir}", flush=True)


if __name__ == "__main__":
    main()
