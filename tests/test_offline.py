"""The offline kit: authentic (the archive's sha256, carried apart), safe and verified
unpacking, clear messages for malformed kits; and a real build from a kit inside a network
namespace with no network (no registry, no pip index, no DNS), giving the connected build's bytes.

The loader is run as the offline machine runs it: hexbundle/release/kit.py (copied into the kit
as load_kit.py) in a subprocess, sometimes under `python3 -S`, a Python with nothing installed.
"""
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import socketserver
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from pathlib import Path

import pytest
from conftest import Project
from test_container import engine, toolchain_image  # noqa: F401 -- session fixtures

from hexbundle.release.kit import KitError, load_kit, unpack, verify_sums, write_sums

ROOT = Path(__file__).resolve().parent.parent
LOADER = ROOT / "hexbundle" / "release" / "kit.py"
WHEEL = "wheels/host/hexbundle-0.1.0-py3-none-any.whl"


def kit_doc(**changes) -> dict:
    return {"format": 2, "host_wheel": WHEEL, "images": [], "bring": [], **changes}


def small_kit(tmp_path: Path, doc=None, files=None) -> Path:
    """A kit of a few files (its wheel is never installed by the tests that use it)."""
    kit = tmp_path / "offline-kit"
    (kit / "source").mkdir(parents=True)
    (kit / "source" / "dodo.py").write_text("# project\n")
    (kit / WHEEL).parent.mkdir(parents=True)
    with zipfile.ZipFile(kit / WHEEL, "w") as wheel:   # stands for hexbundle's wheel
        wheel.writestr("hexbundle-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    for rel, data in (files or {}).items():
        (kit / rel).parent.mkdir(parents=True, exist_ok=True)
        (kit / rel).write_bytes(data)
    text = doc if isinstance(doc, str) else json.dumps(doc or kit_doc())
    (kit / "kit.json").write_text(text)
    write_sums(kit)
    return kit


def pack(kit: Path, archive: Path = None) -> Path:
    archive = archive or kit.parent / "offline-kit.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(kit, arcname="offline-kit")
    return archive


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_loader(*args, python=(sys.executable,)) -> subprocess.CompletedProcess:
    return subprocess.run([*python, str(LOADER), *map(str, args)], capture_output=True,
                          text=True, timeout=600)


def refused(proc, pattern: str) -> None:
    """Exit 1 with one `load_kit: error:` message matching pattern, and no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("load_kit: error:")]
    assert len(errors) == 1 and proc.stderr.endswith(errors[0] + "\n"), proc.stderr  # one line
    assert re.search(pattern, proc.stderr), proc.stderr


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
        unpack(archive, dest)
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


# --- authenticity ----------------------------------------------------------------------------

def test_a_kit_altered_with_its_sums_rewritten_is_refused_by_the_archives_sha256(tmp_path):
    """SHA256SUMS travels inside the archive: rewritten with the change, it still agrees. Only
    the archive's sha256, carried apart, tells this kit from the one that was made."""
    made = pack(small_kit(tmp_path / "made"))
    digest = sha256(made)
    kit = small_kit(tmp_path / "altered")
    (kit / "source" / "dodo.py").write_text("import os  # runs on the offline machine\n")
    write_sums(kit)
    altered = pack(kit)

    proc = run_loader(altered, "--expect-sha256", digest, "--dest", tmp_path / "out",
                      "--no-images")
    refused(proc, rf"offline-kit.tar: sha256 {sha256(altered)}, but --expect-sha256 says "
                  rf"{digest}: this is not the kit that was made; refused before unpacking")
    assert not (tmp_path / "out").exists()

    ok = run_loader(made, "--expect-sha256", digest.upper(), "--dest", tmp_path / "out",
                    "--no-images")
    assert ok.returncode == 0, ok.stderr
    assert f"sha256 {digest} is the expected one" in ok.stdout
    assert "WARNING" not in ok.stderr


def test_without_an_expected_sha256_the_loader_says_loudly_that_authenticity_is_unchecked(
        tmp_path):
    archive = pack(small_kit(tmp_path))
    proc = run_loader(archive, "--dest", tmp_path / "out", "--no-images")
    assert proc.returncode == 0, proc.stderr
    assert f"WARNING: authenticity NOT checked: {archive} has sha256 {sha256(archive)}" \
        in proc.stderr
    assert "pass it as --expect-sha256" in proc.stderr


def test_the_archives_sha256_file_is_checked_by_sha256sum_and_accepted_by_the_loader(tmp_path):
    from hexbundle.release.offline_kit import write_archive_sum
    archive = pack(small_kit(tmp_path))
    line = write_archive_sum(archive, tmp_path / "offline-kit.tar.sha256")
    assert line == f"{sha256(archive)}  offline-kit.tar\n"
    check = subprocess.run(["sha256sum", "-c", "offline-kit.tar.sha256"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert check.returncode == 0 and "offline-kit.tar: OK" in check.stdout, check.stderr
    proc = run_loader(archive, "--expect-sha256", line, "--dest", tmp_path / "out", "--no-images")
    assert proc.returncode == 0, proc.stderr


def test_a_malformed_expected_sha256_is_refused_before_anything_is_read(tmp_path):
    archive = pack(small_kit(tmp_path))
    refused(run_loader(archive, "--expect-sha256", "abc123", "--no-images"),
            r"--expect-sha256 'abc123': not a sha256 \(64 hex digits\)")
    refused(run_loader(tmp_path / "offline-kit", "--expect-sha256", sha256(archive),
                       "--no-images"),
            r"offline-kit: --expect-sha256 checks the archive, and this is a directory")


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_doit_load_kit_checks_the_expected_sha256_too(project, tmp_path):
    archive = pack(small_kit(tmp_path))
    wrong = project.doit("load_kit", "--expect-sha256", "0" * 64, str(archive), check=False)
    assert wrong.code != 0 and "Traceback" not in wrong.out + wrong.err
    assert f"offline-kit.tar: sha256 {sha256(archive)}, but --expect-sha256 says {'0' * 64}" \
        in wrong.out + wrong.err
    assert not (tmp_path / "offline-kit-unpacked").exists()
    right = project.doit("load_kit", "--expect-sha256", sha256(archive), str(archive))
    assert f"sha256 {sha256(archive)} is the expected one" in right.out


# --- sums as sha256sum writes them ----------------------------------------------------------

@pytest.mark.parametrize("flags,upper", [(["-b"], False), ([], True), (["-b"], True)])
def test_sums_written_by_sha256sum_binary_mode_or_in_upper_case_are_accepted(tmp_path, flags,
                                                                            upper):
    kit = small_kit(tmp_path)
    names = ["kit.json", "./source/dodo.py", WHEEL]   # `find . -type f | xargs sha256sum` style
    out = subprocess.run(["sha256sum", *flags, *names], cwd=kit, capture_output=True, text=True,
                         check=True).stdout
    if upper:
        out = "".join(line[:64].upper() + line[64:] + "\n" for line in out.splitlines())
    (kit / "SHA256SUMS").write_text(out)
    assert verify_sums(kit, log=lambda m: None) == {"kit.json", "source/dodo.py", WHEEL}
    (kit / "source" / "dodo.py").write_text("# altered\n")   # still checked, in either form
    with pytest.raises(KitError, match=r"source/dodo.py: sha256 .* but SHA256SUMS says"):
        verify_sums(kit)


# --- what kit.json names ---------------------------------------------------------------------

@pytest.mark.parametrize("doc,where", [
    (kit_doc(images=[{"file": "../../../etc/hostname", "id": "sha256:1", "tag": "a:b"}]),
     r"images\[0\]\.file: '\.\./\.\./\.\./etc/hostname'"),
    (kit_doc(images=[{"file": "/etc/hostname", "id": "sha256:1", "tag": "a:b"}]),
     r"images\[0\]\.file: '/etc/hostname'"),
    (kit_doc(images=[{"file": "images/toolchain.tar", "id": "sha256:1", "tag": "a:b"}]),
     r"images\[0\]\.file: 'images/toolchain.tar'"),   # not in the kit
    (kit_doc(host_wheel="/tmp/evil-1.0-py3-none-any.whl"), r"host_wheel: '/tmp/evil-1.0-py3"),
    (kit_doc(host_wheel="source/dodo.py"), r"host_wheel: 'source/dodo.py'"),
])
def test_kit_json_paths_must_name_verified_files_inside_the_kit(tmp_path, doc, where):
    archive = pack(small_kit(tmp_path, doc))
    proc = run_loader(archive, "--dest", tmp_path / "out")   # images on: refused before them
    refused(proc, rf"kit.json: {where}[^ ]* is not a file of the kit listed in SHA256SUMS"
                  rf"({' under wheels/host/' if 'host_wheel' in where else ''}): refused")
    assert not (tmp_path / "out").exists(), "a refused kit was left unpacked"


# --- unpacking: size cap, clean-up -----------------------------------------------------------

def gzip_bomb(tmp_path: Path, size: int) -> Path:
    """A real kit plus one file of zeros: compressed, the archive is a thousandth of its content."""
    kit = small_kit(tmp_path, files={"bring/zeros.bin": bytes(size)})
    archive = tmp_path / "offline-kit.tar.gz"
    archive.write_bytes(gzip.compress(pack(kit).read_bytes()))
    return archive


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_an_archive_that_would_unpack_beyond_the_cap_is_refused_before_writing(tmp_path):
    archive = gzip_bomb(tmp_path, 64 << 20)
    assert archive.stat().st_size < (1 << 20)
    proc = run_loader(archive, "--dest", tmp_path / "out", "--no-images")
    cap = 10 * archive.stat().st_size / (1 << 20)
    refused(proc, rf"offline-kit.tar.gz: unpacks to more than 64.0 MiB, more than the cap of "
                  rf"{cap:.1f} MiB \(10x the archive's size\): refused before writing anything")
    assert not (tmp_path / "out").exists()
    small = pack(small_kit(tmp_path / "small"))
    refused(run_loader(small, "--max-gib", "1e-7", "--dest", tmp_path / "out2"),
            r"more than the cap of 0.0 MiB \(--max-gib\)")
    ok = run_loader(archive, "--max-gib", "1", "--dest", tmp_path / "out", "--no-images")
    assert ok.returncode == 0, ok.stderr   # the cap is the user's to raise


def test_an_archive_larger_than_the_free_space_at_dest_is_refused_before_writing(tmp_path):
    """A real 1 MiB file system (tmpfs, in a mount namespace of its own) as the destination."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private mount")
    archive = pack(small_kit(tmp_path, files={"bring/inputs.bin": bytes(3 << 20)}))
    small = tmp_path / "small"
    small.mkdir()
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {small} && "
         f"{sys.executable} {LOADER} {archive} --dest {small / 'out'} --no-images; "
         f"status=$?; ls -A {small}; exit $status"], capture_output=True, text=True, timeout=120)
    refused(proc, r"offline-kit.tar: unpacking needs 3.0 MiB, only 1.0 MiB is free at .*/small: "
                  r"refused before writing anything")
    assert proc.stdout.strip() == "", f"written on the small file system: {proc.stdout}"


def test_a_refused_kit_leaves_nothing_unpacked(tmp_path):
    kit = small_kit(tmp_path)
    (kit / "source" / "dodo.py").write_text("# swapped after the checksums\n")
    archive = pack(kit)
    out = tmp_path / "out"
    refused(run_loader(archive, "--dest", out, "--no-images"),
            r"offline-kit.tar:offline-kit/source/dodo.py: sha256 .* but SHA256SUMS says")
    assert not out.exists()
    out.mkdir()   # a destination that was there stays, empty as it was
    refused(run_loader(archive, "--dest", out, "--no-images"), "source/dodo.py: sha256")
    assert list(out.iterdir()) == []


def test_an_unpacked_kit_is_never_overwritten(tmp_path):
    archive = pack(small_kit(tmp_path))
    out = tmp_path / "out"
    assert run_loader(archive, "--dest", out, "--no-images").returncode == 0
    (out / "offline-kit" / "source" / "build").mkdir()   # a build made in the unpacked kit
    refused(run_loader(archive, "--dest", out, "--no-images"),
            r"out/offline-kit: already there \(an earlier unpack\?\): remove it")
    assert (out / "offline-kit" / "source" / "build").is_dir()


def test_the_unpack_temp_name_is_one_the_clean_up_after_a_kill_removes(tmp_path):
    """kit.py cannot import support.atomic (it runs before hexbundle is installed): its temp
    directory spells the same scheme, so graph.recovery sweeps it from a build root."""
    from hexbundle.release.kit import temp_sibling
    from hexbundle.support.atomic import is_temp_name
    assert is_temp_name(temp_sibling(tmp_path / "offline-kit").name)


# --- malformed kits: a message, never a traceback --------------------------------------------

def dot_archive(tmp_path: Path) -> Path:
    """`tar -C offline-kit -cf x.tar .`: members ./kit.json, ./source/..., no top directory."""
    kit = small_kit(tmp_path)
    archive = tmp_path / "dot.tar"
    subprocess.run(["tar", "-C", str(kit), "-cf", str(archive), "."], check=True)
    return archive


def clashing_archive(tmp_path: Path) -> Path:
    archive = tmp_path / "clash.tar"
    with tarfile.open(archive, "w") as tar:
        for name in ("offline-kit/source", "offline-kit/source/dodo.py"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    return archive


def broken_sums(tmp_path: Path) -> Path:
    kit = small_kit(tmp_path)
    (kit / "SHA256SUMS").write_bytes(b"\xff\xfe" + (kit / "SHA256SUMS").read_bytes())
    return pack(kit)


def written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def a_file(tmp_path: Path) -> Path:
    (tmp_path / "a-file").write_text("x")
    return tmp_path / "a-file"


MALFORMED = {   # case: (archive maker, extra arguments, what the message must say)
    "tar -C kit .": (dot_archive, [], r"dot.tar: a kit archive holds one top-level directory "
                                      r"\(offline-kit/\), this one has \['SHA256SUMS', "),
    "a file and a directory of one name": (
        clashing_archive, [], r"member 'offline-kit/source/dodo.py' clashes with "
                              r"'offline-kit/source'"),
    "SHA256SUMS not UTF-8": (broken_sums, [], r"offline-kit/SHA256SUMS: not UTF-8 text"),
    "kit.json not an object": (lambda t: pack(small_kit(t, "[1]")), [],
                               r"offline-kit/kit.json: not a JSON object"),
    "kit.json not JSON": (lambda t: pack(small_kit(t, "{")), [], r"kit.json: unreadable"),
    "kit.json without images": (
        lambda t: pack(small_kit(t, {k: v for k, v in kit_doc().items() if k != "images"})), [],
        r"kit.json: images: expected list, found null"),
    "kit.json bring of the wrong type": (lambda t: pack(small_kit(t, kit_doc(bring=[1]))), [],
                                         r"kit.json: bring\[0\]\.path: expected str"),
    "an image without its tag": (
        lambda t: pack(small_kit(t, kit_doc(images=[{"file": WHEEL, "id": "sha256:1"}]))), [],
        r"kit.json: images\[0\]\.tag: expected str, found null"),
    "a kit of format 1": (lambda t: pack(small_kit(t, kit_doc(format=1))), [],
                          r"kit.json: kit format 1, this loader reads 2: make the kit again"),
    "not a tar": (lambda t: written(t / "x.tar", b"hello" * 99), [],
                  r"x.tar: not a readable kit archive"),
    "truncated gzip": (lambda t: written(t / "x.tgz", gzip.compress(pack(small_kit(t))
                                                                    .read_bytes())[:-600]), [],
                       r"x.tgz: not a readable kit archive"),
    "dest is a file": (lambda t: pack(small_kit(t)), ["--dest", a_file],
                       r"a-file: cannot unpack the kit there \(File exists\)"),
    "dest under a file": (lambda t: pack(small_kit(t)), ["--dest", lambda t: a_file(t) / "d"],
                          r"a-file/d: cannot unpack the kit there \(Not a directory\)"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_kit_gets_a_message_naming_what_is_wrong_and_nothing_is_left(tmp_path, case):
    make, extra, message = MALFORMED[case]
    work = tmp_path / "work"
    work.mkdir()
    archive = make(work)
    args = [a(tmp_path) if callable(a) else a for a in extra]
    dest = [] if "--dest" in args else ["--dest", tmp_path / "out"]
    refused(run_loader(archive, *dest, *args, "--no-images"), message)
    assert not (tmp_path / "out").exists(), "a refused kit was left unpacked"


def test_a_venv_that_cannot_be_made_is_named_and_the_verified_kit_is_kept(tmp_path):
    archive = pack(small_kit(tmp_path))
    proc = run_loader(archive, "--dest", tmp_path / "out", "--venv", a_file(tmp_path),
                      "--no-images")
    refused(proc, r"a-file: cannot create a venv there \(.* -m venv: .*\); choose another --venv")
    assert (tmp_path / "out" / "offline-kit" / "kit.json").is_file()   # authentic, intact: kept


def test_without_the_docker_package_the_loader_says_how_to_get_it(tmp_path):
    """`python3 -S`: a Python with no site-packages, as on a bare offline machine."""
    image = {"file": WHEEL, "id": "sha256:" + "0" * 64, "tag": "hexbundle/x:y"}
    archive = pack(small_kit(tmp_path, kit_doc(images=[image])))
    proc = run_loader(archive, "--dest", tmp_path / "out", python=(sys.executable, "-S"))
    refused(proc, r"the docker Python package is not installed for .*: pass --venv DIR")


@pytest.mark.heavy   # a Docker engine: the full suite (`pytest --full`)
def test_an_image_the_engine_cannot_load_is_named(tmp_path, engine):  # noqa: F811
    image = {"file": "images/toolchain.tar", "id": "sha256:" + "0" * 64, "tag": "hexbundle/x:y"}
    kit = small_kit(tmp_path, kit_doc(images=[image]),
                    files={"images/toolchain.tar": b"not a docker save"})
    proc = run_loader(kit)
    refused(proc, r"offline-kit/images/toolchain.tar: the Docker engine could not load it")


class EngineThatDrops(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A Docker engine's socket that answers the SDK's version and ping, then drops the
    connection on the image load (as an engine killed mid-load does): the SDK lets requests'
    ConnectionError through, not a DockerException."""
    daemon_threads = True

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            while True:
                line = self.rfile.readline().decode("latin-1")
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass   # the headers
                if line.startswith("GET ") and "/version" in line:
                    body = b'{"ApiVersion": "1.43", "Version": "24.0.0"}'
                elif line.startswith(("GET ", "HEAD ")) and "/_ping" in line:
                    body = b"OK"
                else:
                    return   # the load: the connection drops, its body unread
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(body) + body)


def test_an_engine_that_drops_mid_load_is_named_without_a_traceback(tmp_path, monkeypatch):
    image = {"file": "images/toolchain.tar", "id": "sha256:" + "0" * 64, "tag": "hexbundle/x:y"}
    kit = small_kit(tmp_path, kit_doc(images=[image]),
                    files={"images/toolchain.tar": b"\0" * (4 << 20)})
    sock = Path(tempfile.mkdtemp(dir="/tmp")) / "docker.sock"   # AF_UNIX: a short path
    server = EngineThatDrops(str(sock), EngineThatDrops.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    try:
        proc = run_loader(kit)
    finally:
        server.shutdown()
        shutil.rmtree(sock.parent, ignore_errors=True)
    refused(proc, rf"offline-kit/images/toolchain.tar: the Docker engine at unix://{sock} went "
                  r"away or stopped answering while loading it \(ConnectionError: .*run load_kit "
                  r"again on the unpacked kit")
    assert (kit / "kit.json").is_file()   # the verified kit is untouched


def files(directory: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


@pytest.fixture(scope="module")
def connected(toolchain_image):  # noqa: F811
    """The connected machine: `doit bundle` in the toolchain image (the reference bytes: the
    manifest names the image that built it, the one the kit carries), then `doit offline_kit`.
    Returns (project, image record, bundle digests, offline_kit's run)."""
    proj, record = toolchain_image
    for name in ("pyproject.toml", "README.md"):   # what hexbundle's wheel is built from
        shutil.copy2(ROOT / name, proj.root / name)
    assert proj.doit("bundle", "executor=docker").code == 0
    return proj, record, files(proj.bundle()), proj.doit("offline_kit")


def installed_hexbundle(python: Path, cwd: Path) -> dict:
    """Where the venv's hexbundle comes from, as pip recorded it (direct_url.json, PEP 610)."""
    code = ("import importlib.metadata as m, json; d = m.distribution('hexbundle'); "
            "print(json.dumps({'files': [str(f) for f in d.files], "
            "'direct_url': json.loads(d.read_text('direct_url.json'))}))")
    proc = subprocess.run([str(python), "-c", code], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.heavy   # a Docker engine: the full suite (`pytest --full`)
def test_build_from_a_kit_with_no_network_gives_the_connected_bytes(connected, tmp_path):
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a network namespace")
    proj, record, bundle, made = connected
    build = proj.root / "build"
    line = (build / "offline-kit.tar.sha256").read_text()
    digest = sha256(build / "offline-kit.tar")
    assert line == f"{digest}  offline-kit.tar\n"
    assert line.rstrip("\n") in made.out.splitlines()   # printed as sha256sum writes it
    assert f"--expect-sha256 {digest} " in made.out
    check = subprocess.run(["sha256sum", "-c", "offline-kit.tar.sha256"], cwd=build,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    out = tmp_path / "offline"
    script = (
        # prove there is no network in here
        f"{sys.executable} -c \"import socket,sys\n"
        "try: socket.create_connection(('pypi.org', 443), 3)\n"
        "except OSError: sys.exit(0)\n"
        "sys.exit('network reachable')\" && "
        # -S: a Python with nothing installed, as on a bare offline machine (docker-py too comes
        # from the kit's wheels)
        f"{sys.executable} -S {build / 'load_kit.py'} {build / 'offline-kit.tar'} "
        f"--expect-sha256 {digest} --dest {out} --venv {out / 'venv'} && "
        f"cd {out / 'offline-kit' / 'source'} && "
        f"{out / 'venv' / 'bin' / 'python'} -m doit bundle executor=docker")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HEXBUNDLE_"))}
    proc = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True,
                          text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"sha256 {digest} is the expected one" in proc.stdout
    assert "WARNING" not in proc.stderr
    assert "files verified against SHA256SUMS" in proc.stdout
    assert f"image {record['tag']} = {record['id'][:19]} loaded" in proc.stdout
    offline_bundle = Project(out / "offline-kit" / "source").bundle()
    assert files(offline_bundle) == bundle
    # hexbundle came from the wheel listed in the kit's sums, not from building its source
    kit_json = json.loads((out / "offline-kit" / "kit.json").read_text())
    wheel = kit_json["host_wheel"]
    assert f"  {wheel}\n" in (out / "offline-kit" / "SHA256SUMS").read_text()
    origin = installed_hexbundle(out / "venv" / "bin" / "python", tmp_path)
    assert origin["direct_url"]["url"].endswith("/offline-kit/" + wheel)
    assert "archive_info" in origin["direct_url"], origin   # a wheel, not an editable dir
    assert "hexbundle/release/kit.py" in origin["files"]


@pytest.mark.heavy   # a Docker engine: the full suite (`pytest --full`)
def test_loading_a_kit_never_runs_a_build_backend_its_source_names(connected, tmp_path):
    """A kit (altered, sums rewritten, loaded without --expect-sha256) whose pyproject.toml names
    an in-tree build backend: pip used to build the kit's source with it, running that code as
    whoever ran load_kit.py (root). hexbundle now comes from its wheel: the backend never runs."""
    proj, _, _, _ = connected
    made = proj.root / "build" / "offline-kit"
    kit = tmp_path / "offline-kit"
    for part in ("source", "wheels/host"):   # not the images: --no-images
        shutil.copytree(made / part, kit / part)
    doc = json.loads((made / "kit.json").read_text())
    (kit / "kit.json").write_text(json.dumps({**doc, "images": []}))
    marker = tmp_path / "backend-ran"
    (kit / "source" / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "evil_backend"\nbackend-path = ["."]\n'
        '[project]\nname = "hexbundle"\nversion = "0.1.0"\n')
    (kit / "source" / "evil_backend.py").write_text(
        f"import os, pathlib\npathlib.Path({str(marker)!r}).write_text(str(os.getuid()))\n")
    write_sums(kit)
    archive = pack(kit)
    venv = tmp_path / "venv"
    proc = run_loader(archive, "--dest", tmp_path / "out", "--venv", venv, "--no-images")
    assert not marker.exists(), "the kit's build backend ran during load_kit --venv"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "authenticity NOT checked" in proc.stderr
    assert "archive_info" in installed_hexbundle(venv / "bin" / "python", tmp_path)["direct_url"]


def test_kit_source_keeps_packages_named_like_excluded_top_level_dirs(tmp_path):
    """Outside git, the walk drops build/, exports/, toolchain/ (the staged SDK) at the top only:
    hexbundle/toolchain/ is source and must reach the kit (a kit without it cannot build)."""
    from hexbundle.release.offline_kit import source_files
    for rel in ("dodo.py", "hexbundle/toolchain/image.py", "toolchain/qairt.zip",
                "build/x.bin", "exports/m/a.onnx", "hexbundle/__pycache__/a.pyc"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert source_files(tmp_path) == ["dodo.py", "hexbundle/toolchain/image.py"]


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_hexbundles_wheel_is_built_from_the_kits_source_and_its_bytes_depend_on_nothing_else(
        tmp_path):
    """The wheel the offline side installs is made here, from the source the kit carries. Its
    bytes do not depend on file times (so the kit archive stays a function of its files), and the
    tree it is built from is left as it was (setuptools writes build/ and *.egg-info/ into it)."""
    from hexbundle import __version__
    from hexbundle.release.offline_kit import build_host_wheel, source_files
    wheels = []
    for name, mtime in (("a", 1_600_000_000), ("b", 1_700_000_000)):
        source = tmp_path / name / "source"
        for rel in source_files(ROOT):
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, source / rel)
            os.utime(source / rel, (mtime, mtime))
        before = sorted(p.relative_to(source) for p in source.rglob("*"))
        wheels.append(build_host_wheel(source, tmp_path / name / "wheels", tmp_path / name))
        assert sorted(p.relative_to(source) for p in source.rglob("*")) == before
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["source", "wheels"]
    assert wheels[0].name == wheels[1].name == f"hexbundle-{__version__}-py3-none-any.whl"
    assert wheels[0].read_bytes() == wheels[1].read_bytes()



def test_a_gzip_bomb_is_refused_by_the_running_ratio_not_after_decompressing_it(tmp_path):
    """Issue 26, item 5: the cap was checked only after the whole stream had been decompressed
    (35 s for the attack's bomb). A member declaring 4 GiB is refused at its header: what the
    loader decompressed before refusing is a few KiB, not the 4 GiB."""
    import io
    kit = small_kit(tmp_path)
    buffer = io.BytesIO()
    tar = tarfile.open(fileobj=buffer, mode="w")
    tar.add(kit, arcname="offline-kit")
    members = buffer.getvalue()[:tar.offset]   # the kit's members, no end-of-archive blocks
    big = tarfile.TarInfo("offline-kit/bring/zeros.bin")
    big.size = 4 << 30
    with gzip.open(tmp_path / "offline-kit.tar.gz", "wb") as out:
        out.write(members)
        out.write(big.tobuf())
        zeros = bytes(1 << 20)
        for _ in range(8):                   # only 8 MiB of the declared 4 GiB follow
            out.write(zeros)
    proc = run_loader(tmp_path / "offline-kit.tar.gz", "--dest", tmp_path / "out", "--no-images")
    refused(proc, r"unpacks to more than 4.00 GiB, more than the cap of .* refused before "
                  r"writing anything")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["evil-1.0.tar.gz", "evil-1.0.zip"])
def test_a_host_wheel_that_is_not_a_wheel_is_refused(tmp_path, name):
    """Issue 26, item 5: pip builds a source archive given by path even with
    --only-binary=:all:, running its setup.py: only .whl files are installed."""
    kit = small_kit(tmp_path, doc=kit_doc(host_wheel=f"wheels/host/{name}"),
                    files={f"wheels/host/{name}": b"import os  # setup.py would run"})
    proc = run_loader(pack(kit), "--dest", tmp_path / "out", "--no-images")
    refused(proc, rf"wheels/host/{re.escape(name)}: not a wheel \(\.whl\) among the host "
                  "wheels: refused")


def test_an_sdist_named_whl_is_refused_and_leaves_nothing_in_dest(tmp_path, project):
    """Issue 36, item 5: a .whl that is really an sdist got past the name check; pip refused it
    under --venv, after the kit had been unpacked into --dest, where it stayed (and the same
    command run again refused to unpack over it). It is refused before the kit is named, as a
    wheel must be a zip archive with a .dist-info/WHEEL, and --dest is left as it was."""
    import io
    sdist = io.BytesIO()
    with tarfile.open(fileobj=sdist, mode="w:gz") as tar:
        info = tarfile.TarInfo("hexbundle-0.1.0/setup.py")
        body = b"import os  # would run under pip\n"
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    kit = small_kit(tmp_path, files={"wheels/host/extra-1.0-py3-none-any.whl": sdist.getvalue()})
    dest = tmp_path / "out"
    proc = run_loader(pack(kit), "--dest", dest, "--venv", tmp_path / "venv", "--no-images")
    refused(proc, r"wheels/host/extra-1.0-py3-none-any.whl: named .whl but not a wheel")
    assert not dest.exists() and not (tmp_path / "venv").exists()
    run = project.doit("load_kit", str(pack(kit)), check=False)   # the same, through doit
    assert run.code != 0 and "named .whl but not a wheel" in run.out + run.err, run.out + run.err
    assert "Traceback" not in run.out + run.err
    assert not (tmp_path / "offline-kit-unpacked").exists()   # doit's default --dest


def test_a_source_archive_beside_the_wheels_is_refused(tmp_path):
    kit = small_kit(tmp_path, files={"wheels/host/other-1.0.tar.gz": b"an sdist"})
    proc = run_loader(pack(kit), "--dest", tmp_path / "out", "--no-images")
    refused(proc, r"wheels/host/other-1.0.tar.gz: not a wheel")


def test_the_staging_directory_of_a_killed_unpack_is_removed_by_the_next(tmp_path):
    """Issue 26, item 8: a load_kit killed while unpacking left a kit-sized .tmp in --dest that
    no rerun removed. One of a process that is gone is removed; a live loader's is left."""
    dest = tmp_path / "out"
    dead = dest / ".offline-kit.4194000.0123456789ab.tmp"     # above any pid_max in use here
    live = dest / f".offline-kit.{os.getpid()}.0123456789ab.tmp"
    for stale in (dead, live):
        (stale / "images").mkdir(parents=True)
        (stale / "images" / "toolchain.tar").write_bytes(bytes(1 << 16))
    proc = run_loader(pack(small_kit(tmp_path)), "--dest", dest, "--no-images")
    assert proc.returncode == 0, proc.stderr
    assert not dead.exists() and f"removed {dead}, left by an unpack that was killed" in proc.stdout
    assert live.exists() and (dest / "offline-kit" / "kit.json").is_file()


# ---------------------------------------------------------------------------------------------
# issue 26, item 5: the machine's pip configuration has no say in what the kit installs

BOGUS_INDEX = "http://127.0.0.1:9/simple"   # nothing listens there: no network either way


def test_the_pip_command_ignores_the_machines_pip_configuration(tmp_path):
    """--isolated (no PIP_* variable, no user pip.conf), no PIP_* variable passed on, and
    PIP_CONFIG_FILE=os.devnull (no pip.conf read at all): dropping any one fails here."""
    from hexbundle.release.kit import pip_install_command
    hostile = {"PIP_INDEX_URL": BOGUS_INDEX, "PIP_FIND_LINKS": str(tmp_path),
               "PIP_CONFIG_FILE": str(tmp_path / "pip.conf"), "PIP_NO_INDEX": "0",
               "PIP_ISOLATED": "0", "HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    cmd, env = pip_install_command(tmp_path / "venv/bin/python", tmp_path / "kit",
                                   kit_doc(), environ=hostile)
    assert cmd[1:4] == ["-m", "pip", "install"] and "--isolated" in cmd
    assert {"--no-index", "--only-binary=:all:"} <= set(cmd)
    assert cmd[cmd.index("--find-links") + 1] == str(tmp_path / "kit" / "wheels" / "host")
    assert {k: v for k, v in env.items() if k.startswith("PIP_")} == \
        {"PIP_CONFIG_FILE": os.devnull}
    assert env["HOME"] == str(tmp_path) and env["PATH"] == hostile["PATH"]   # the rest is kept


def wheel(directory: Path, name: str, version: str, where: str, requires=()) -> Path:
    """A pure-Python wheel of `name` whose module `<name>_where` says `where` it came from."""
    import base64
    import zipfile
    dist = f"{name}-{version}.dist-info"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    "Provides-Extra: test\n", *(f"Requires-Dist: {r}\n" for r in requires)])
    files = {f"{name}_where.py": f"WHERE = {where!r}\n", f"{dist}/METADATA": meta,
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: hexbundle-tests\n"
                              "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = ""
    for rel, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record += f"{rel},sha256={digest.decode()},{len(text.encode())}\n"
    files[f"{dist}/RECORD"] = record + f"{dist}/RECORD,,\n"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in files.items():
            zf.writestr(rel, text)
    return path


def installed_where(python: Path, cwd: Path) -> dict:
    code = ("import importlib.metadata as m, hexbundle_where, kitdep_where; "
            "print(m.version('hexbundle'), hexbundle_where.WHERE, m.version('kitdep'), "
            "kitdep_where.WHERE)")
    proc = subprocess.run([str(python), "-I", "-c", code], cwd=cwd, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    return dict(zip(("hexbundle", "hexbundle from", "kitdep", "kitdep from"),
                    proc.stdout.split()))


def test_loading_a_kit_takes_its_wheels_whatever_pip_is_configured_to_find(tmp_path):
    """A real `load_kit.py --venv` with every kind of pip configuration pointing at decoys: a
    same-named hexbundle and dependency of higher versions, one pair per way of configuring pip
    (PIP_FIND_LINKS, the PIP_CONFIG_FILE file, the user's and the global pip.conf, the venv's
    own pip.conf). Each decoy is shown to win a plain pip run first; the kit's wheels win the
    loader's."""
    kit_wheels = {f"wheels/host/{w.name}": w.read_bytes() for w in (
        wheel(tmp_path / "made", "hexbundle", "0.1.0", "kit", ["kitdep"]),
        wheel(tmp_path / "made", "kitdep", "1.0", "kit"))}
    kit = small_kit(tmp_path / "k", files=kit_wheels)
    archive = pack(kit)
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True,
                          text=True)
    assert made.returncode == 0, made.stderr
    decoys = {}
    for n, how in enumerate(("PIP_FIND_LINKS", "PIP_CONFIG_FILE", "user", "global", "venv")):
        decoys[how] = tmp_path / "decoys" / how
        wheel(decoys[how], "hexbundle", f"9.{n}", how, ["kitdep"])
        wheel(decoys[how], "kitdep", f"9.{n}", how)
    conf = "[global]\nfind-links = {}\nindex-url = " + BOGUS_INDEX + "\n"
    (tmp_path / "env-pip.conf").write_text(conf.format(decoys["PIP_CONFIG_FILE"]))
    for user_conf in (home / ".config" / "pip" / "pip.conf", home / ".pip" / "pip.conf"):
        user_conf.parent.mkdir(parents=True)
        user_conf.write_text(conf.format(decoys["user"]))
    (xdg / "pip").mkdir(parents=True)
    (xdg / "pip" / "pip.conf").write_text(conf.format(decoys["global"]))
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PIP_", "XDG_CONFIG", "PYTHON", "VIRTUAL_ENV"))}
    ways = {"PIP_FIND_LINKS": {"PIP_FIND_LINKS": str(decoys["PIP_FIND_LINKS"])},
            "PIP_CONFIG_FILE": {"PIP_CONFIG_FILE": str(tmp_path / "env-pip.conf")},
            "user": {"HOME": str(home)}, "global": {"XDG_CONFIG_DIRS": str(xdg)}, "venv": {}}
    python = venv / "bin" / "python"
    for how, env in ways.items():   # each decoy wins where pip's configuration has its say
        if how == "venv":
            (venv / "pip.conf").write_text(conf.format(decoys["venv"]))
        plain = subprocess.run(
            [str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
             "--no-index", "--only-binary=:all:", "--find-links", str(kit / "wheels/host"),
             "kitdep"], capture_output=True, text=True, cwd=tmp_path,
            env={**base, "HOME": str(tmp_path), **env, "PIP_INDEX_URL": BOGUS_INDEX})
        assert plain.returncode == 0, plain.stderr
        chosen = [i["metadata"]["version"] for i in json.loads(plain.stdout)["install"]]
        assert chosen == [f"9.{list(ways).index(how)}"], (how, chosen)
    hostile = {**base, "PIP_INDEX_URL": BOGUS_INDEX, "PIP_EXTRA_INDEX_URL": BOGUS_INDEX,
               **{k: v for env in ways.values() for k, v in env.items()}}
    proc = subprocess.run([sys.executable, str(LOADER), str(archive), "--dest",
                           str(tmp_path / "out"), "--venv", str(venv), "--no-images"],
                          capture_output=True, text=True, cwd=tmp_path, env=hostile, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert installed_where(python, tmp_path) == {"hexbundle": "0.1.0", "hexbundle from": "kit",
                                                 "kitdep": "1.0", "kitdep from": "kit"}
