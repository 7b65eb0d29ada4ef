"""The offline kit: safe, verified unpacking; and a real build from a kit inside a network
namespace with no network (no registry, no pip index, no DNS), giving the connected build's bytes.
"""
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import Project
from test_container import engine, toolchain_image  # noqa: F401 -- session fixtures

from hexbundle.release.kit import KitError, load_kit, safe_extract, verify_sums, write_sums


def small_kit(tmp_path: Path) -> Path:
    kit = tmp_path / "offline-kit"
    (kit / "source").mkdir(parents=True)
    (kit / "source" / "dodo.py").write_text("# project\n")
    (kit / "kit.json").write_text('{"format": 1, "images": [], "bring": []}\n')
    write_sums(kit)
    return kit


def test_verify_accepts_an_intact_kit_and_names_a_damaged_file(tmp_path):
    kit = small_kit(tmp_path)
    verify_sums(kit, log=lambda m: None)
    (kit / "source" / "dodo.py").write_text("# altered\n")
    with pytest.raises(KitError, match=r"source/dodo.py: sha256 .* but SHA256SUMS says"):
        verify_sums(kit)


def test_verify_refuses_missing_and_unlisted_files(tmp_path):
    kit = small_kit(tmp_path)
    (kit / "extra.bin").write_bytes(b"x")
    with pytest.raises(KitError, match=r"extra.bin: in the kit but not in SHA256SUMS"):
        verify_sums(kit)
    (kit / "extra.bin").unlink()
    (kit / "kit.json").unlink()
    with pytest.raises(KitError, match=r"kit.json: listed in SHA256SUMS but missing"):
        verify_sums(kit)


def malicious_tar(path: Path, name: str, kind=tarfile.REGTYPE, linkname="") -> Path:
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("offline-kit")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, linkname
        data = b"evil"
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return path


@pytest.mark.parametrize("name,kind,link", [
    ("offline-kit/../../escaped.txt", tarfile.REGTYPE, ""),
    ("/tmp/absolute.txt", tarfile.REGTYPE, ""),
    ("offline-kit/link", tarfile.SYMTYPE, "/etc/passwd"),
    ("offline-kit/hard", tarfile.LNKTYPE, "../../outside"),
])
def test_unpacking_refuses_traversal_and_links_before_writing(tmp_path, name, kind, link):
    archive = malicious_tar(tmp_path / "kit.tar", name, kind, link)
    dest = tmp_path / "dest"
    with pytest.raises(KitError, match="refused"):
        safe_extract(archive, dest)
    assert not dest.exists(), "something was written before the archive was checked"
    assert not (tmp_path / "escaped.txt").exists()


def test_a_tampered_kit_archive_is_refused_before_loading(tmp_path):
    kit = small_kit(tmp_path)
    (kit / "source" / "dodo.py").write_text("# swapped after the checksums\n")
    archive = tmp_path / "offline-kit.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(kit, arcname="offline-kit")
    with pytest.raises(KitError, match="source/dodo.py: sha256"):
        load_kit(archive, dest=tmp_path / "out", images=False, log=lambda m: None)


def files(directory: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def test_build_from_a_kit_with_no_network_gives_the_connected_bytes(toolchain_image,  # noqa: F811
                                                                    tmp_path):
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a network namespace")
    proj, record = toolchain_image
    for name in ("pyproject.toml", "README.md"):   # what the kit needs to install hexbundle
        shutil.copy2(Path(__file__).resolve().parent.parent / name, proj.root / name)
    connected = proj.doit("bundle")  # the reference: the connected machine's local build
    assert connected.code == 0
    bundle = files(proj.bundle())
    proj.doit("offline_kit")
    build = proj.root / "build"
    out = tmp_path / "offline"
    script = (
        # prove there is no network in here
        f"{sys.executable} -c \"import socket,sys\n"
        "try: socket.create_connection(('pypi.org', 443), 3)\n"
        "except OSError: sys.exit(0)\n"
        "sys.exit('network reachable')\" && "
        f"{sys.executable} {build / 'load_kit.py'} {build / 'offline-kit.tar'} --dest {out} "
        f"--venv {out / 'venv'} && cd {out / 'offline-kit' / 'source'} && "
        f"{out / 'venv' / 'bin' / 'python'} -m doit bundle executor=docker")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HEXBUNDLE_"))}
    proc = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True,
                          text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "files verified against SHA256SUMS" in proc.stdout
    assert f"image {record['tag']} = {record['id'][:19]} loaded" in proc.stdout
    offline_bundle = Project(out / "offline-kit" / "source").bundle()
    assert files(offline_bundle) == bundle


def test_kit_source_keeps_packages_named_like_excluded_top_level_dirs(tmp_path):
    """Outside git, the walk drops build/, exports/, toolchain/ (the staged SDK) at the top only:
    hexbundle/toolchain/ is source and must reach the kit (a kit without it cannot build)."""
    from hexbundle.release.offline_kit import source_files
    for rel in ("dodo.py", "hexbundle/toolchain/image.py", "toolchain/qairt.zip",
                "build/x.bin", "exports/m/a.onnx", "hexbundle/__pycache__/a.pyc"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert source_files(tmp_path) == ["dodo.py", "hexbundle/toolchain/image.py"]
