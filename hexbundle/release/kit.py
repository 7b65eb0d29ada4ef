"""The offline kit: everything an air-gapped machine needs to build bundles.

Connected side (`doit offline_kit`) writes build/offline-kit/ and build/offline-kit.tar:

    kit.json            what the kit holds: image IDs, source commit, Python of the host wheels,
                        the files still to bring (SDK archive, model inputs) with their digests
    SHA256SUMS          sha256 of every other file in the kit (sorted, `sha256sum -c` format)
    source/             the project (tracked files)
    images/toolchain.tar, images/base.tar    `docker save` of the toolchain image and its base
    wheels/host/        wheels to install hexbundle and its test tools on the offline host
    wheels/container/   the locked wheels of the toolchain image (to rebuild it offline)
    bring/              the SDK archive and model inputs, when asked to include them

Offline side: `python3 load_kit.py offline-kit.tar` (this file, copied beside the archive as
build/load_kit.py; standard library only until the wheels are installed) unpacks safely (no
absolute paths, no `..`, no links, no devices), verifies EVERY checksum before loading anything,
and refuses a kit with a wrong, missing or unlisted file, naming it; then installs the host
wheels with pip --no-index into a venv and loads the images, checking their IDs. With hexbundle
installed, `doit load_kit KIT` does the same.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

KIT_FORMAT = 1
SUMS = "SHA256SUMS"
KIT_JSON = "kit.json"
CHUNK = 1 << 20


class KitError(Exception):
    """The kit is incomplete, altered or unsafe; the message names the file."""


def sha256_file(path: Path) -> str:
    # Not hexbundle.support.hashing's: this file must run alone (standard library only) on a machine
    # where nothing is installed yet.
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# checksums

def kit_files(kit: Path) -> list:
    """Every regular file of the kit except SHA256SUMS, as sorted relative POSIX paths."""
    out = []
    for path in kit.rglob("*"):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise KitError(f"{path}: links and special files are not allowed in a kit")
        if path.is_file() and path != kit / SUMS:
            out.append(path.relative_to(kit).as_posix())
    return sorted(out)


def write_sums(kit: Path) -> None:
    lines = [f"{sha256_file(kit / rel)}  {rel}\n" for rel in kit_files(kit)]
    (kit / SUMS).write_text("".join(lines))


def verify_sums(kit: Path, log=print) -> None:
    """Every listed file present with its sha256, and no file that is not listed."""
    sums = kit / SUMS
    if not sums.is_file():
        raise KitError(f"{sums}: missing; this is not a complete hexbundle offline kit")
    listed = {}
    for n, line in enumerate(sums.read_text().splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel or rel.startswith("/") or ".." in rel.split("/"):
            raise KitError(f"{sums}:{n}: not a `sha256  path` line: {line[:80]!r}")
        listed[rel] = digest
    present = set(kit_files(kit))
    for rel in sorted(set(listed) - present):
        raise KitError(f"{kit / rel}: listed in {SUMS} but missing from the kit; copy the kit "
                       "again from the connected machine")
    for rel in sorted(present - set(listed)):
        raise KitError(f"{kit / rel}: in the kit but not in {SUMS}: refusing an altered kit")
    for rel, want in sorted(listed.items()):
        got = sha256_file(kit / rel)
        if got != want:
            raise KitError(f"{kit / rel}: sha256 {got} but {SUMS} says {want}; the file is "
                           "damaged or altered: copy the kit again")
    log(f"load_kit: {len(listed)} files verified against {SUMS}")


# ---------------------------------------------------------------------------------------------
# safe unpacking

def check_member(member: tarfile.TarInfo, dest: Path) -> None:
    name = member.name
    if name.startswith("/") or ".." in Path(name).parts:
        raise KitError(f"archive member {name!r} would be written outside the kit: refused")
    if not (member.isfile() or member.isdir()):
        raise KitError(f"archive member {name!r} is a link or special file: refused (a kit "
                       "holds only regular files and directories)")
    target = (dest / name).resolve()
    if dest.resolve() not in (target, *target.parents):
        raise KitError(f"archive member {name!r} resolves outside {dest}: refused")


def safe_extract(archive: Path, dest: Path) -> Path:
    """Extract a kit archive into dest; return the kit directory. Nothing is written unless
    every member is safe."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                check_member(member, dest)
            tops = {Path(m.name).parts[0] for m in members}
            if len(tops) != 1:
                raise KitError(f"{archive}: expected one top-level directory, found "
                               f"{sorted(tops)[:5]}")
            dest.mkdir(parents=True, exist_ok=True)
            for member in members:
                path = dest / member.name
                if member.isdir():
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(path, "wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
                os.chmod(path, 0o755 if member.mode & 0o100 else 0o644)
    except (tarfile.TarError, EOFError) as exc:
        raise KitError(f"{archive}: not a readable kit archive ({exc})") from None
    return dest / tops.pop()


# ---------------------------------------------------------------------------------------------
# loading

def write_kit_json(kit: Path, doc: dict) -> None:
    """kit.json: what the kit holds (images, source state, files to bring); read_kit_json reads it."""
    (kit / KIT_JSON).write_text(json.dumps({"format": KIT_FORMAT, **doc}, indent=2,
                                           sort_keys=True) + "\n")


def read_kit_json(kit: Path) -> dict:
    try:
        doc = json.loads((kit / KIT_JSON).read_text())
        if doc.get("format") != KIT_FORMAT:
            raise KitError(f"{kit / KIT_JSON}: kit format {doc.get('format')!r}, this loader "
                           f"reads {KIT_FORMAT}")
        return doc
    except (OSError, ValueError) as exc:
        raise KitError(f"{kit / KIT_JSON}: unreadable ({exc})") from None


def install_host_wheels(kit: Path, venv: Path, log=print) -> Path:
    """A venv with hexbundle (editable, from the kit's source) and its tools, no index."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
           str(kit / "wheels" / "host"), "-e", f"{kit / 'source'}[test]"]
    log("load_kit: " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KitError(f"pip could not install from {kit / 'wheels' / 'host'} with no index:\n"
                       f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return python


def load_images(kit: Path, doc: dict, log=print) -> None:
    import docker  # installed by now (host wheels), or already there under doit
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise KitError(f"no Docker engine answers ({exc}); start one (or set DOCKER_HOST), or "
                       "pass --no-images and use executor = \"local\"") from None
    for entry in doc["images"]:
        with open(kit / entry["file"], "rb") as fh:
            loaded = client.images.load(fh)
        ids = {img.id for img in loaded}
        if entry["id"] not in ids:
            raise KitError(f"{kit / entry['file']}: loaded {sorted(ids)}, but {KIT_JSON} "
                           f"records {entry['id']}")
        image = client.images.get(entry["id"])
        repo, _, tag = entry["tag"].rpartition(":")
        image.tag(repo, tag)
        log(f"load_kit: image {entry['tag']} = {entry['id'][:19]} loaded")


def load_kit(path: Path, dest: Path = None, venv: Path = None, images: bool = True,
             log=print) -> Path:
    path = Path(path).resolve()
    if path.is_dir():
        kit = path
    elif path.is_file():
        dest = Path(dest or path.parent / (path.name.split(".")[0] + "-unpacked")).resolve()
        kit = safe_extract(path, dest)
        log(f"load_kit: unpacked {path.name} into {kit}")
    else:
        raise KitError(f"{path}: no such kit (a directory or its .tar)")
    verify_sums(kit, log)          # before anything is installed or loaded
    doc = read_kit_json(kit)
    if venv is not None:
        install_host_wheels(kit, venv, log)
    if images:
        load_images(kit, doc, log)
    for item in doc.get("bring", []):
        log(f"load_kit: still to bring: {item['path']} ({item.get('what', '')})")
    log(f"load_kit: ready: cd {kit / 'source'} && python3 -m doit bundle executor=docker")
    return kit


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Unpack, verify and load a hexbundle offline kit.")
    p.add_argument("kit", help="offline-kit.tar or an unpacked kit directory")
    p.add_argument("--dest", help="where to unpack a .tar (default: beside it)")
    p.add_argument("--venv", help="create/update this venv with the host wheels (no index)")
    p.add_argument("--no-images", action="store_true", help="do not load the docker images")
    args = p.parse_args(argv)
    try:
        load_kit(Path(args.kit), args.dest and Path(args.dest), args.venv and Path(args.venv),
                 not args.no_images)
    except KitError as exc:
        print(f"load_kit: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
