"""`doit offline_kit`: write the kit an air-gapped machine needs (see hexbundle/release/kit.py for its
layout and the offline side). Runs on a connected machine that has built the image."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from hexbundle import __version__
from hexbundle.config.layout import Layout
from hexbundle.config.toolchain import load_toolchain
from hexbundle.release.kit import (HOST_WHEELS, KitError, load_kit, sum_line, write_kit_json,
                                   write_sums)
from hexbundle.support.atomic import output_path, staged_dir, temp_dir, write_atomic
from hexbundle.support.console import say
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import require_named_path
from hexbundle.support.hashing import sha256_file
from hexbundle.toolchain.docker import docker_client, engine_call, translate
from hexbundle.toolchain.image import read_record

# Not carried into the kit's source/: outputs, exports and the staged SDK (top-level directories
# only: hexbundle/toolchain/ is source), and caches wherever they are.
SOURCE_EXCLUDE_TOP = {"build", "exports", "toolchain"}
SOURCE_EXCLUDE = {".git", "__pycache__", ".pytest_cache", ".hypothesis", ".doit.db",
                  "hexbundle.egg-info"}


def source_files(root: Path) -> list:
    """The project's files: git's tracked files where git knows them, else a filtered walk."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True)
    if out.returncode == 0 and out.stdout:
        names = [n for n in out.stdout.decode().split("\0") if n]
        return sorted(n for n in names if (root / n).is_file())
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.is_file() and rel.parts[0] not in SOURCE_EXCLUDE_TOP \
                and not set(rel.parts) & SOURCE_EXCLUDE:
            found.append(rel.as_posix())
    return sorted(found)


# The wheel's zip entries get this time, not the files' mtimes: its bytes depend on the source only.
WHEEL_EPOCH = "315532800"


def build_host_wheel(source: Path, dest: Path, scratch_near: Path) -> Path:
    """hexbundle's wheel, built here from the kit's source: the offline side installs it and never
    runs a build backend (code that would come with the kit, possibly as root)."""
    dest.mkdir(parents=True, exist_ok=True)
    # Built from a scratch copy: setuptools writes build/ and *.egg-info/ into the tree it builds.
    with temp_dir(scratch_near, "hexbundle-wheel") as scratch:
        tree = scratch / "source"
        shutil.copytree(source, tree)
        cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
               "--no-deps", "--wheel-dir", str(scratch / "out"), str(tree)]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, "SOURCE_DATE_EPOCH": WHEEL_EPOCH})
        wheels = sorted((scratch / "out").glob("hexbundle-*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise KitError(f"pip wheel could not build hexbundle's wheel from {source} (it "
                           f"needs setuptools from an index):\n{proc.stderr[-2000:]}")
        shutil.copy2(wheels[0], dest / wheels[0].name)
    return dest / wheels[0].name


def download_host_wheels(wheel: Path, dest: Path) -> None:
    """The wheels of everything the hexbundle wheel needs, with its test tools (its own metadata
    says which), for this host's Python."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
           "--only-binary=:all:", "--dest", str(dest), f"{wheel}[test]"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KitError(f"pip download of the host wheels failed (a connected machine is needed "
                       f"for `doit offline_kit`):\n{proc.stderr[-2000:]}")


def save_image(client, ref: str, out: Path) -> str:
    """The image saved as a tar at `out`. Each engine call is bounded (engine_call; each read of
    the stream by the client's socket timeout) and an engine lost mid-stream is named as such,
    not a requests traceback (issue 40 kind 5)."""
    image = engine_call(f"reading image {ref}", client.images.get, ref)
    out.parent.mkdir(parents=True, exist_ok=True)
    what = f"saving image {ref}"
    try:
        with open(out, "wb") as fh:
            for chunk in engine_call(what, image.save, named=True):
                fh.write(chunk)
    except Exception as exc:   # noqa: BLE001 -- a transport failure becomes its message
        raise translate(exc, what) from None
    return image.id


def write_tar(directory: Path, out: Path) -> None:
    """A plain tar of the kit directory: sorted, fixed times and owners (its bytes depend only on
    the files)."""
    with (output_path(out, sync=False) as tmp,   # tarfile wants a path; not fsynced, as before
          tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar):
        paths = sorted(directory.rglob("*"), key=lambda p: p.relative_to(directory).as_posix())
        for path in [directory, *paths]:
            info = tar.gettarinfo(str(path), arcname=(Path(directory.name) / path.relative_to(
                directory)).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 315532800, 0, 0, "", ""
            info.mode = 0o755 if path.is_dir() else 0o644
            if path.is_file():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)


def make_kit(layout: Layout, include_sdk: bool, include_inputs: bool) -> Path:
    cfg = layout.cfg
    tc = load_toolchain(cfg.root)
    record = read_record(cfg.root)
    if not record:
        raise KitError("no toolchain image recorded: run `doit image` first")
    out = layout.offline_kit_dir
    # Filled beside `out` under a temp name, swapped in whole; removed if anything fails.
    with staged_dir(out, mode=0o777) as staging:
        files = source_files(cfg.root)
        for rel in files:
            (staging / "source" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(cfg.root / rel, staging / "source" / rel)
        say(f"offline_kit: source: {len(files)} files")

        client = docker_client()
        images = []
        for name, ref, tag in (("toolchain", record["id"], record["tag"]),
                               ("base", record["base"], record["base"])):
            image_id = save_image(client, ref, staging / "images" / f"{name}.tar")
            images.append({"file": f"images/{name}.tar", "id": image_id, "tag": tag})
            say(f"offline_kit: image {tag} ({image_id[:19]}) saved")

        container_wheels = staging / "wheels" / "container"
        container_wheels.mkdir(parents=True)
        for wheel in sorted(tc.wheelhouse.glob("*.whl")):
            shutil.copy2(wheel, container_wheels / wheel.name)
        shutil.copy2(tc.lock, container_wheels / tc.lock.name)
        wheel = build_host_wheel(staging / "source", staging / HOST_WHEELS, layout.build_root)
        download_host_wheels(wheel, staging / HOST_WHEELS)
        say(f"offline_kit: wheels for the image and for Python "
            f"{sys.version_info.major}.{sys.version_info.minor} on the host")

        bring = bring_list(layout, tc, staging, include_sdk, include_inputs)
        from hexbundle.release.reproducible import source_state
        write_kit_json(staging, {"hexbundle": __version__, "images": images,
                                 "host_wheel": wheel.relative_to(staging).as_posix(),
                                 "source": source_state(cfg.root), "host_python":
                                 f"{sys.version_info.major}.{sys.version_info.minor}",
                                 "bring": bring, "model": cfg.model.name})
        write_sums(staging)
    write_tar(out, layout.offline_kit_tar)
    write_archive_sum(layout.offline_kit_tar, layout.offline_kit_sha256)
    with output_path(layout.load_kit_script) as tmp:
        shutil.copy2(Path(__file__).with_name("kit.py"), tmp)
    return out


def write_archive_sum(archive: Path, out: Path) -> str:
    """`<archive>.sha256`: the archive's sha256 as a `sha256sum -c` line. It is what makes the kit
    authentic on the other side: carried (or read out) apart from the archive, never inside it."""
    line = sum_line(sha256_file(archive), archive.name)
    write_atomic(out, line.encode())
    return line


def bring_list(layout: Layout, tc, staging: Path, include_sdk: bool, include_inputs: bool) -> list:
    """Big or licensed files: included on request, else listed with their digest to bring."""
    cfg = layout.cfg
    bring = []
    (staging / "bring").mkdir(exist_ok=True)
    if tc.sdk_archive.is_file():
        if include_sdk:
            shutil.copy2(tc.sdk_archive, staging / "bring" / tc.sdk_archive.name)
        else:
            bring.append({"path": layout.rel(tc.sdk_archive), "what": "QAIRT SDK archive",
                          "sha256": sha256_file(tc.sdk_archive)})
    if cfg.inputs.source != "generated":
        for path in layout.source_inputs():   # the user's files (an export outside the project
            if include_inputs and path.is_file():   # goes under bring/ by its absolute path)
                dest = staging / "bring" / layout.rel(path).lstrip("/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)
            else:
                bring.append({"path": layout.rel(path), "what": "model input",
                              "sha256": sha256_file(path) if path.is_file() else None})
    return bring


def offline_kit_command(layout: Layout) -> None:
    """`doit offline_kit`."""
    include_sdk = os.environ.get("HEXBUNDLE_KIT_INCLUDE_SDK") == "1"
    include_inputs = os.environ.get("HEXBUNDLE_KIT_INCLUDE_INPUTS") == "1"
    try:
        kit = make_kit(layout, include_sdk, include_inputs)
    except KitError as exc:   # kit.py runs alone, without hexbundle: its own error class
        raise HexbundleError(str(exc)) from None
    size = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    line = layout.offline_kit_sha256.read_text().rstrip("\n")
    say(f"offline_kit: {layout.rel(kit)} ({size / 1e6:.0f} MB), "
        f"{layout.rel(layout.offline_kit_tar)}, and {layout.rel(layout.load_kit_script)}"
        " to unpack it: carry both to the offline machine")
    say(f"offline_kit: the archive's sha256 (also in {layout.rel(layout.offline_kit_sha256)}; "
        "carry it apart from the archive, e.g. write it down):")
    say(line)
    say(f"offline_kit: on the offline machine: python3 load_kit.py offline-kit.tar "
        f"--expect-sha256 {line.split()[0]} --venv kit-venv")


def load_kit_command(kit: list, expect_sha256: str = "") -> None:
    """`doit load_kit [--expect-sha256 HEX] KIT`."""
    if len(kit) != 1:
        raise HexbundleError("usage: doit load_kit [--expect-sha256 HEX] build/offline-kit.tar "
                             "(or an unpacked kit dir)")
    require_named_path(Path(kit[0]), "kit (its .tar or the unpacked directory)", "KIT")
    try:
        load_kit(Path(kit[0]), log=say, expect_sha256=expect_sha256 or None)
    except KitError as exc:
        shown = str(exc) if str(exc).startswith(kit[0]) else f"KIT {kit[0]}: {exc}"
        raise HexbundleError(shown) from None
