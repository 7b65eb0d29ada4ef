"""The offline kit: everything an air-gapped machine needs to build bundles.

Connected side (`doit offline_kit`) writes build/offline-kit/, build/offline-kit.tar and
build/offline-kit.tar.sha256 (the archive's sha256, `sha256sum` format, also printed):

    kit.json            what the kit holds: image IDs, source commit, Python of the host wheels,
                        hexbundle's wheel, the files still to bring (SDK archive, model inputs)
    SHA256SUMS          sha256 of every other file in the kit (sorted, `sha256sum -c` format)
    source/             the project (tracked files)
    images/toolchain.tar, images/base.tar    `docker save` of the toolchain image and its base
    wheels/host/        hexbundle's wheel (built on the connected side) and the wheels of its
                        dependencies and test tools, to install on the offline host
    wheels/container/   the locked wheels of the toolchain image (to rebuild it offline)
    bring/              the SDK archive and model inputs, when asked to include them

Offline side: `python3 load_kit.py offline-kit.tar --expect-sha256 HEX` (this file, copied beside
the archive as build/load_kit.py; standard library only until the wheels are installed).

Integrity is not authenticity: SHA256SUMS travels inside the archive it protects, so whoever
changes a file can rewrite it too. Only the archive's sha256, carried by another channel (read
off the connected machine's screen, or offline-kit.tar.sha256 sent separately), says the kit is
the one that was made. So the loader checks --expect-sha256 before unpacking anything, and
without it says loudly that authenticity is unchecked.

Then it unpacks safely into a temp directory beside the destination (no absolute paths, no `..`,
no links, no devices, no sparse files, at most --max-gib or 10x the archive's size, and no more
than the free disk space), verifies EVERY checksum and kit.json (every path it names must be a
file listed in SHA256SUMS) before renaming it into place; a refused kit leaves nothing behind.
It installs hexbundle from its wheel with pip --no-index and --only-binary (the kit's source is
never built: a build backend is code, and this may run as root), and loads the images, checking
their IDs. With hexbundle installed, `doit load_kit KIT` does the same.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

KIT_FORMAT = 2   # 2: hexbundle comes as a wheel (format 1 kits had pip build their source)
SUMS = "SHA256SUMS"
KIT_JSON = "kit.json"
HOST_WHEELS = "wheels/host"
CHUNK = 1 << 20
GIB = 1 << 30
# Without --max-gib, an archive may unpack to at most this many times its own size: a plain tar
# unpacks to about 1x, a compressed kit (images, wheels) to ~2-3x; a decompression bomb to 1000x.
MAX_EXPANSION = 10
SUM_LINE = re.compile(r"(?P<digest>[0-9a-fA-F]{64}) [ *](?P<name>.+)")
HEX64 = re.compile(r"[0-9a-fA-F]{64}")


class KitError(Exception):
    """The kit is incomplete, altered, unsafe or cannot be loaded here; the message names the
    file (or kit.json key) and what to do."""


def sha256_file(path: Path) -> str:
    # Not hexbundle.support.hashing's: this file must run alone (standard library only) on a machine
    # where nothing is installed yet.
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# sha256sum lines: SHA256SUMS and the archive's offline-kit.tar.sha256

def sum_line(digest: str, name: str) -> str:
    """One `sha256sum` line (text mode), as `sha256sum -c` reads it."""
    return f"{digest}  {name}\n"


def parse_sum_line(line: str):
    """(lower-case digest, name) of a `sha256sum` line, text (`  `) or binary (` *`) mode, either
    case of hex digits; None if it is not one. Escaped names (a leading `\\`) are not read."""
    m = SUM_LINE.fullmatch(line)
    return (m["digest"].lower(), m["name"]) if m else None


def kit_relpath(name) -> str:
    """A path inside the kit as the kit lists it ("source/dodo.py"), or None if `name` is not a
    relative path that stays inside the kit."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return None
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        return None
    return path.as_posix()


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
    lines = [sum_line(sha256_file(kit / rel), rel) for rel in kit_files(kit)]
    (kit / SUMS).write_text("".join(lines))


def read_sums(sums: Path, shown: Path = None) -> dict:
    """{relative path: lower-case sha256} from a SHA256SUMS file (named `shown` in messages)."""
    path, sums = sums, shown or sums
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KitError(f"{sums}: not UTF-8 text (byte {exc.start}); copy the kit again") from None
    listed = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parsed = parse_sum_line(line)
        rel = parsed and kit_relpath(parsed[1])
        if not rel:
            raise KitError(f"{sums}:{n}: not a `sha256  path` line with a path inside the kit: "
                           f"{line[:80]!r}")
        if listed.get(rel, parsed[0]) != parsed[0]:
            raise KitError(f"{sums}:{n}: {rel} is listed twice with different digests")
        listed[rel] = parsed[0]
    return listed


def verify_sums(kit: Path, log=print, shown: Path = None) -> set:
    """Every listed file present with its sha256, and no file that is not listed. Returns the
    listed paths. shown: the kit's name in messages (the kit is unpacked under a temp name)."""
    shown = shown or kit
    if not (kit / SUMS).is_file():
        raise KitError(f"{shown / SUMS}: missing; this is not a complete hexbundle offline kit")
    listed = read_sums(kit / SUMS, shown / SUMS)
    present = set(kit_files(kit))
    for rel in sorted(set(listed) - present):
        raise KitError(f"{shown / rel}: listed in {SUMS} but missing from the kit; copy the kit "
                       "again from the connected machine")
    for rel in sorted(present - set(listed)):
        raise KitError(f"{shown / rel}: in the kit but not in {SUMS}: refusing an altered kit")
    for rel, want in sorted(listed.items()):
        got = sha256_file(kit / rel)
        if got != want:
            raise KitError(f"{shown / rel}: sha256 {got} but {SUMS} says {want}; the file is "
                           "damaged or altered: copy the kit again")
    log(f"load_kit: {len(listed)} files verified against {SUMS}")
    return set(listed)


# ---------------------------------------------------------------------------------------------
# authenticity: the archive's sha256, from another channel

def expected_sha256(text: str) -> str:
    """The digest given to --expect-sha256: 64 hex digits, either case, alone or as the line of
    offline-kit.tar.sha256."""
    parsed = parse_sum_line(text.strip())
    digest = parsed[0] if parsed else text.strip().lower()
    if not HEX64.fullmatch(digest):
        raise KitError(f"--expect-sha256 {text[:80]!r}: not a sha256 (64 hex digits); give the "
                       "one `doit offline_kit` printed on the connected machine")
    return digest


def check_authentic(archive: Path, expect, log=print) -> None:
    """Refuse an archive whose sha256 is not `expect` (from expected_sha256), before anything is
    unpacked; without an expected digest, say loudly that authenticity is unchecked."""
    got = sha256_file(archive)
    if expect is None:
        warn(f"load_kit: WARNING: authenticity NOT checked: {archive} has sha256 {got}.\n"
             f"load_kit: WARNING: {SUMS} travels inside the archive: it shows the kit is intact, "
             "not that it is the kit you made (whoever changes a file can rewrite it too).\n"
             "load_kit: WARNING: compare that sha256 with the one `doit offline_kit` printed on "
             "the connected machine, and pass it as --expect-sha256 to have it checked.")
        return
    if got != expect:
        raise KitError(f"{archive}: sha256 {got}, but --expect-sha256 says {expect}: this is "
                       "not the kit that was made; refused before unpacking anything. Copy "
                       "offline-kit.tar again")
    log(f"load_kit: {archive.name}: sha256 {got} is the expected one: the kit is authentic")


# ---------------------------------------------------------------------------------------------
# safe unpacking

def check_member(member: tarfile.TarInfo, dest: Path) -> None:
    name = member.name
    if name.startswith("/") or ".." in Path(name).parts:
        raise KitError(f"archive member {name!r} would be written outside the kit: refused")
    if not (member.isfile() or member.isdir()) or member.issparse():
        raise KitError(f"archive member {name!r} is a link, sparse or special file: refused (a "
                       "kit holds only regular files and directories)")
    target = (dest / name).resolve()
    if dest.resolve() not in (target, *target.parents):
        raise KitError(f"archive member {name!r} resolves outside {dest}: refused")


def plan_members(archive: Path, members: list) -> tuple:
    """(top-level directory, [(member, path below it)]) of a kit archive; refuses anything that
    is not one directory of regular files and directories, each named once."""
    files, dirs, placed = set(), set(), []
    for member in members:
        parts = PurePosixPath(member.name).parts   # "./x/y" -> ("x", "y")
        if not parts:                              # "." itself: `tar -C kit .`
            continue
        rel = "/".join(parts)
        ancestors = ["/".join(parts[:i]) for i in range(1, len(parts))]
        clash = next((a for a in ancestors if a in files), None)
        if clash or rel in files or (member.isfile() and rel in dirs):
            raise KitError(f"{archive}: member {member.name!r} clashes with "
                           f"{clash or rel!r} (a file named twice, or both a file and a "
                           "directory): refused")
        dirs.update(ancestors)
        (files if member.isfile() else dirs).add(rel)
        placed.append((member, parts))
    tops = sorted({parts[0] for _, parts in placed})
    if len(tops) != 1 or tops[0] in files:
        raise KitError(f"{archive}: a kit archive holds one top-level directory (offline-kit/), "
                       f"this one has {tops[:5] or 'nothing'}: pack it as `tar -C build -cf "
                       "offline-kit.tar offline-kit` (not `tar -C offline-kit .`), or carry "
                       "build/offline-kit.tar as `doit offline_kit` wrote it")
    return tops[0], [(m, PurePosixPath(*parts[1:])) for m, parts in placed if len(parts) > 1]


def shown_size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


def check_size(archive: Path, members: list, dest: Path, max_bytes) -> None:
    """Refuse, before writing, an archive that would unpack to more than the cap or the free
    disk space at dest (tarfile writes exactly a member's declared size; sparse ones are
    refused)."""
    total = sum(m.size for m in members if m.isfile())
    cap, how = expansion_cap(archive, max_bytes)
    if total > cap:
        raise KitError(f"{archive}: would unpack to {shown_size(total)}, more than the cap of "
                       f"{shown_size(cap)} ({how}): refused before writing anything; pass "
                       "--max-gib to allow more if this really is your kit")
    existing = next(p for p in (dest, *dest.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if total > free:
        raise KitError(f"{archive}: unpacking needs {shown_size(total)}, only "
                       f"{shown_size(free)} is free at {existing}: refused before writing "
                       "anything; free disk space or choose another --dest")


def remove_stale_staging(final: Path, log=print) -> None:
    """An unpack killed before its rename leaves `.<top>.<pid>.<token>.tmp` beside the target,
    as big as the kit: remove those whose process is gone (a live one is another loader's)."""
    pattern = re.compile(rf"\.{re.escape(final.name)}\.(\d+)\.[0-9a-f]{{12}}\.tmp")
    if not final.parent.is_dir():
        return
    for path in final.parent.iterdir():
        match = pattern.fullmatch(path.name)
        if not match or path.is_symlink() or not path.is_dir() or _alive(int(match[1])):
            continue
        shutil.rmtree(path, ignore_errors=True)
        log(f"load_kit: removed {path}, left by an unpack that was killed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temp_sibling(final: Path) -> Path:
    # hexbundle.support.atomic's temp name, spelled out (this file cannot import it): under a build
    # root, the clean-up after a killed run (graph.runguard) removes it.
    return final.with_name(f".{final.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")


def extract_members(tar: tarfile.TarFile, planned: list, staging: Path) -> None:
    staging.mkdir()
    for member, rel in planned:
        path = staging / rel
        if member.isdir():
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        with tar.extractfile(member) as src, open(path, "wb") as out:
            shutil.copyfileobj(src, out, CHUNK)
        os.chmod(path, 0o755 if member.mode & 0o100 else 0o644)


# What a damaged or foreign archive raises while it is read (bz2's is an OSError with no errno).
ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)


def expansion_cap(archive: Path, max_bytes) -> tuple:
    """(the most an archive may unpack to, how that was decided)."""
    if max_bytes is not None:
        return max_bytes, "--max-gib"
    return MAX_EXPANSION * archive.stat().st_size, f"{MAX_EXPANSION}x the archive's size"


class BoundedStream:
    """An archive's decompressed tar stream that refuses to go past a limit: tarfile reads and
    seeks through it, and the first read or seek beyond the limit (a member that declares more
    than the cap, or a stream of zeros) stops it, not the end of the stream after minutes of
    decompression."""

    def __init__(self, inner, limit: int, archive: Path, cap: int, how: str):
        self.inner, self.limit, self.archive, self.cap, self.how = inner, limit, archive, cap, how

    def _refuse(self, reached: int):
        raise KitError(f"{self.archive}: unpacks to more than {shown_size(reached)}, more than "
                       f"the cap of {shown_size(self.cap)} ({self.how}): refused before writing "
                       "anything; pass --max-gib to allow more if this really is your kit")

    def read(self, size=-1):
        data = self.inner.read(size if size is not None and size >= 0 else self.limit + 1)
        if self.inner.tell() > self.limit:
            self._refuse(self.inner.tell())
        return data

    def seek(self, offset, whence=0):
        target = offset if whence == 0 else self.inner.tell() + offset if whence == 1 else None
        if target is None:
            raise KitError(f"{self.archive}: cannot seek from the end of a compressed stream")
        if target > self.limit:
            self._refuse(target)
        return self.inner.seek(target)

    def tell(self):
        return self.inner.tell()

    def close(self):
        self.inner.close()


COMPRESSED = ((b"\x1f\x8b", gzip.open), (b"BZh", None), (b"\xfd7zXZ\x00", lzma.open))


def open_bounded(archive: Path, max_bytes):
    """tarfile over the archive, its decompressed stream bounded by the cap (plus room for the
    tar headers and padding of a legitimate kit)."""
    import bz2
    cap, how = expansion_cap(archive, max_bytes)
    with open(archive, "rb") as fh:
        magic = fh.read(6)
    opener = next((o or bz2.open for m, o in COMPRESSED if magic.startswith(m)), None)
    if opener is None:   # a plain tar: no decompression to bound
        return tarfile.open(archive, "r:")
    limit = cap + cap // 20 + (1 << 20)
    return tarfile.open(fileobj=BoundedStream(opener(archive, "rb"), limit, archive, cap, how),
                        mode="r:")


def unpack(archive: Path, dest: Path, max_bytes=None) -> tuple:
    """Extract a kit archive into a temp directory beside dest/<its top directory>; returns
    (temp directory, final path). Nothing is written unless every member is safe and fits."""
    staging = None
    try:
        with open_bounded(archive, max_bytes) as tar:
            members = tar.getmembers()
            for member in members:
                check_member(member, dest)
            top, planned = plan_members(archive, members)
            final = dest / top
            if final.exists() or final.is_symlink():
                raise KitError(f"{final}: already there (an earlier unpack?): remove it, or pass "
                               "another --dest, to unpack this archive again")
            remove_stale_staging(final)
            check_size(archive, members, dest, max_bytes)
            dest.mkdir(parents=True, exist_ok=True)
            staging = temp_sibling(final)
            extract_members(tar, planned, staging)
            return staging, final
    except BaseException as exc:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, ARCHIVE_ERRORS) or (isinstance(exc, OSError) and exc.errno is None):
            # tarfile.open("r:*") lists, one line each, why every method failed
            why = "not a tar, nor a gzip, bzip2 or xz one" if "\n" in str(exc) else exc
            raise KitError(f"{archive}: not a readable kit archive ({why}); copy it again") \
                from None
        if isinstance(exc, OSError) and exc.filename == str(archive):
            raise KitError(f"{archive}: cannot read it ({exc.strerror})") from None
        if isinstance(exc, OSError):   # the destination's: not writable, a file, a full disk
            raise KitError(f"{exc.filename or dest}: cannot unpack the kit there "
                           f"({exc.strerror}); free disk space or choose another --dest") \
                from None
        raise


# ---------------------------------------------------------------------------------------------
# kit.json

def write_kit_json(kit: Path, doc: dict) -> None:
    """kit.json: what the kit holds (images, source state, files to bring); read_kit_json reads it."""
    (kit / KIT_JSON).write_text(json.dumps({"format": KIT_FORMAT, **doc}, indent=2,
                                           sort_keys=True) + "\n")


def _field(where: str, obj, key: str, kind, shown: Path):
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise KitError(f"{shown / KIT_JSON}: {where}{key}: expected {names}, found "
                       f"{json.dumps(value)[:60]}; make the kit again with `doit offline_kit`")
    return value


def _kit_file(where: str, value: str, listed: set, shown: Path, under: str = "") -> str:
    rel = kit_relpath(value)
    if rel is None or rel not in listed or not rel.startswith(under):
        raise KitError(f"{shown / KIT_JSON}: {where}: {value!r} is not a file of the kit listed "
                       f"in {SUMS}{' under ' + under if under else ''}: refused (a kit's paths "
                       "stay inside the kit)")
    return rel


def is_wheel(path: Path) -> bool:
    """A wheel is a zip archive with a <name>.dist-info/WHEEL: a tar.gz renamed .whl is not."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(PurePosixPath(n).parent.name.endswith(".dist-info")
                       and PurePosixPath(n).name == "WHEEL"
                       and len(PurePosixPath(n).parts) == 2 for n in archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def read_kit_json(kit: Path, listed: set, shown: Path = None) -> dict:
    """kit.json, checked: every key of the right type, every path a verified file of the kit."""
    shown = shown or kit
    try:
        doc = json.loads((kit / KIT_JSON).read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise KitError(f"{shown / KIT_JSON}: unreadable ({exc})") from None
    if not isinstance(doc, dict):
        raise KitError(f"{shown / KIT_JSON}: not a JSON object; make the kit again with "
                       "`doit offline_kit`")
    if doc.get("format") != KIT_FORMAT:
        raise KitError(f"{shown / KIT_JSON}: kit format {doc.get('format')!r}, this loader reads "
                       f"{KIT_FORMAT}: make the kit again with `doit offline_kit` and use the "
                       "load_kit.py written beside it")
    host_wheel = _kit_file("host_wheel", _field("", doc, "host_wheel", str, shown), listed,
                           shown, HOST_WHEELS + "/")
    not_wheels = sorted(rel for rel in listed | {host_wheel}
                        if rel.startswith(HOST_WHEELS + "/") and not rel.endswith(".whl"))
    if not_wheels:
        raise KitError(f"{shown / KIT_JSON}: {', '.join(not_wheels)}: not a wheel (.whl) among "
                       f"the host wheels: refused (pip would build a source archive, running "
                       "code that came with the kit, possibly as root)")
    fake = sorted(rel for rel in listed if rel.startswith(HOST_WHEELS + "/")
                  and not is_wheel(kit / rel))
    if fake:
        raise KitError(f"{shown}: {', '.join(fake)}: named .whl but not a wheel (no zip archive "
                       "with a .dist-info/WHEEL): refused (an sdist under a wheel's name); make "
                       "the kit again with `doit offline_kit`")
    for i, entry in enumerate(_field("", doc, "images", list, shown)):
        _kit_file(f"images[{i}].file", _field(f"images[{i}].", entry, "file", str, shown),
                  listed, shown)
        for key in ("id", "tag"):
            _field(f"images[{i}].", entry, key, str, shown)
    for i, item in enumerate(_field("", doc, "bring", list, shown)):
        _field(f"bring[{i}].", item, "path", str, shown)
        _field(f"bring[{i}].", item, "what", str, shown)
    return doc


# ---------------------------------------------------------------------------------------------
# loading

def pip_install_command(python: Path, kit: Path, doc: dict, environ=None) -> tuple:
    """(command, environment) of the pip run that installs the kit's host wheels into the venv
    of `python`. `environ`: the environment it is made from (default os.environ).

    --only-binary: wheels only. Building anything (the kit's source, an sdist) runs its build
    backend, code that came with the kit, possibly as root.
    --no-index, --isolated, no PIP_* variables and PIP_CONFIG_FILE=os.devnull: the machine's
    pip configuration (an index, other find-links: PIP_* variables, the global, user and venv
    pip.conf files) has no say; the kit's wheels are all pip sees. (--isolated ignores the
    variables and the user's pip.conf; os.devnull as PIP_CONFIG_FILE makes pip read no
    configuration file at all: each covers the other's ground, on purpose.)"""
    cmd = [str(python), "-m", "pip", "install", "--isolated", "--quiet", "--no-index",
           "--only-binary=:all:", "--find-links", str(kit / HOST_WHEELS),
           f"{kit / doc['host_wheel']}[test]"]
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if not k.startswith("PIP_")}
    return cmd, {**env, "PIP_CONFIG_FILE": os.devnull}


def install_host_wheels(kit: Path, doc: dict, venv: Path, log=print) -> Path:
    """A venv with hexbundle (from its wheel) and its tools, from the kit's wheels only."""
    python = venv / "bin" / "python"
    if not python.exists():
        proc = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise KitError(f"{venv}: cannot create a venv there ({sys.executable} -m venv: "
                           f"{(proc.stderr or proc.stdout).strip()[-300:]}); choose another "
                           "--venv, or install python3-venv")
    cmd, env = pip_install_command(python, kit, doc)
    log("load_kit: " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise KitError(f"pip could not install from {kit / HOST_WHEELS} with no index:\n"
                       f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return python


def docker_package(venv):
    """The docker Python package: this Python's, else the one the kit's wheels just put in the
    venv (made by this same interpreter, so its packages import here)."""
    try:
        import docker
        return docker
    except ImportError:
        pass
    v = sys.version_info
    site = venv and Path(venv) / "lib" / f"python{v.major}.{v.minor}" / "site-packages"
    if site and site.is_dir():
        sys.path.append(str(site))
        try:
            import docker
            return docker
        except ImportError:
            pass
    raise KitError(f"the docker Python package is not installed for {sys.executable}: pass "
                   "--venv DIR (the kit's wheels bring it), or --no-images and load the images "
                   "with `docker load -i`")


def engine_faults(docker) -> tuple:
    """What a Docker engine's failure raises through the SDK: (its own errors, the transport's).
    The transport's (requests') come when the engine drops or stops answering mid-call: the SDK
    lets them through unwrapped."""
    import requests   # the docker package's own dependency: where docker imports, it imports
    return docker.errors.DockerException, requests.exceptions.RequestException


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def load_images(kit: Path, doc: dict, venv=None, log=print) -> None:
    if not doc["images"]:
        return
    docker = docker_package(venv)
    faults = engine_faults(docker)
    try:
        client = docker.from_env()   # every socket read bounded by the SDK's 60 s timeout
        client.ping()
    except faults as exc:
        raise KitError(f"no Docker engine answers at {engine_address()} ({exc}); start one (or "
                       "set DOCKER_HOST), or pass --no-images and use executor = \"local\"") from None
    for entry in doc["images"]:
        try:
            with open(kit / entry["file"], "rb") as fh:
                loaded = client.images.load(fh)
            ids = {img.id for img in loaded}
            if entry["id"] not in ids:
                raise KitError(f"{kit / entry['file']}: loaded {sorted(ids)}, but {KIT_JSON} "
                               f"records {entry['id']}")
            repo, _, tag = entry["tag"].rpartition(":")
            client.images.get(entry["id"]).tag(repo, tag)
        except faults[1] as exc:   # the engine, not the file: the verified kit is intact
            raise KitError(f"{kit / entry['file']}: the Docker engine at {engine_address()} went "
                           f"away or stopped answering while loading it ({type(exc).__name__}: "
                           f"{str(exc)[:200]}); check it (`docker info`) and run load_kit again "
                           "on the unpacked kit") from None
        except faults[0] as exc:
            raise KitError(f"{kit / entry['file']}: the Docker engine could not load it "
                           f"({str(exc)[:300]}); copy the kit again") from None
        log(f"load_kit: image {entry['tag']} = {entry['id'][:19]} loaded")


def unpack_verified(archive: Path, dest: Path, max_bytes, log=print) -> tuple:
    """Unpack, verify every checksum and kit.json, then give the kit its name: (kit, kit.json).
    A refused kit leaves nothing behind (not even dest, if this made it)."""
    made_dest = not dest.exists()
    staging, final = unpack(archive, dest, max_bytes)
    try:
        shown = Path(f"{archive}:{final.name}")   # as the archive names it: the kit is not there
        doc = read_kit_json(staging, verify_sums(staging, log, shown), shown)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if made_dest:
            shutil.rmtree(dest, ignore_errors=True)   # only what this run made, now empty
        raise
    log(f"load_kit: unpacked {archive.name} into {final}")
    return final, doc


def load_kit(path: Path, dest: Path = None, venv: Path = None, images: bool = True,
             log=print, expect_sha256: str = None, max_bytes=None) -> Path:
    """Check, unpack, verify and load a kit (an archive or a directory); returns the kit."""
    try:
        return _load_kit(Path(path).resolve(), dest, venv, images, log, expect_sha256, max_bytes)
    except OSError as exc:   # the machine's, not the kit's: a full disk, a path not writable
        raise KitError(f"{exc.filename or path}: {exc.strerror or exc}; free disk space or "
                       "choose other paths (--dest, --venv)") from None


def _load_kit(path: Path, dest, venv, images, log, expect_sha256, max_bytes) -> Path:
    if path.is_dir():
        if expect_sha256 is not None:
            raise KitError(f"{path}: --expect-sha256 checks the archive, and this is a directory: "
                           "load the .tar that `doit offline_kit` wrote")
        warn(f"load_kit: WARNING: authenticity NOT checked: {path} is a directory, and its "
             f"{SUMS} only shows it is intact; load the archive with --expect-sha256 instead")
        kit, doc = path, read_kit_json(path, verify_sums(path, log))
    elif path.is_file():
        expect = None if expect_sha256 is None else expected_sha256(expect_sha256)
        check_authentic(path, expect, log)   # before unpacking anything
        dest = Path(dest or path.parent / (path.name.split(".")[0] + "-unpacked")).resolve()
        kit, doc = unpack_verified(path, dest, max_bytes, log)
    else:
        raise KitError(f"{path}: no such kit (a directory or its .tar)")
    if venv is not None:
        install_host_wheels(kit, doc, venv, log)
    if images:
        load_images(kit, doc, venv, log)
    for item in doc["bring"]:
        log(f"load_kit: still to bring: {item['path']} ({item['what']})")
    log(f"load_kit: ready: cd {kit / 'source'} && python3 -m doit bundle executor=docker")
    return kit


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Unpack, verify and load a hexbundle offline kit.")
    p.add_argument("kit", help="offline-kit.tar or an unpacked kit directory")
    p.add_argument("--expect-sha256", metavar="HEX",
                   help="the archive's sha256 as `doit offline_kit` printed it on the connected "
                        "machine: any other archive is refused before unpacking")
    p.add_argument("--dest", help="where to unpack a .tar (default: beside it)")
    p.add_argument("--venv", help="create/update this venv with the host wheels (no index)")
    p.add_argument("--no-images", action="store_true", help="do not load the docker images")
    p.add_argument("--max-gib", type=float, metavar="GIB",
                   help=f"refuse an archive that unpacks to more (default: {MAX_EXPANSION}x the "
                        "archive's size)")
    args = p.parse_args(argv)
    try:
        load_kit(Path(args.kit), args.dest and Path(args.dest), args.venv and Path(args.venv),
                 not args.no_images, expect_sha256=args.expect_sha256,
                 max_bytes=None if args.max_gib is None else int(args.max_gib * GIB))
    except KitError as exc:
        print(f"load_kit: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
