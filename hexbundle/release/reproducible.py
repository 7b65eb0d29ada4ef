"""Release builds: a clean rebuild, one deterministic archive, SHA256SUMS and an in-toto / SLSA
provenance statement; and `verify_release`, which rebuilds from what the provenance records and
compares file by file.

Determinism of the archive: entries sorted, every mtime = SOURCE_DATE_EPOCH (or the source
commit's time), uid/gid 0 with empty owner names, fixed modes, and a gzip header with no name and
mtime 0. sha256 is used in SHA256SUMS and the provenance for interoperability; xxh3_128 stays the
internal key (recorded alongside).
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Optional

from hexbundle.config.build import REMOTE_ENV_PREFIX, BuildConfig, run_settings_given
from hexbundle.config.layout import BUILD_ROOT_ENV, RELEASE_PROVENANCE, Layout
from hexbundle.config.schema import table_of
from hexbundle.release.provenance import MAX_EPOCH, provenance, read_provenance
from hexbundle.support import hashing
from hexbundle.support import table as tables
from hexbundle.support.atomic import atomic_output, write_atomic
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import about_argument, require_named_file
from hexbundle.support.hashing import sha256_file

REMOTE_CACHE_ENV = REMOTE_ENV_PREFIX + "REMOTE_CACHE"
# A release archive is a bundle, tar.gz: a 7B model's is ~5 GB; a file past this is no release
RELEASE_MAX_BYTES = 64 << 30
MIN_ZIP_EPOCH = 315532800  # 1980-01-01: the earliest time zip and some tar tools can hold


class ReleaseError(HexbundleError):
    """A release could not be built or does not reproduce."""


# ---------------------------------------------------------------------------------------------
# source state and time

def _git(root: Path, *args) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_state(root: Path) -> dict:
    """The commit the build came from, whether the tree was dirty, and the commit's time."""
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "commit_time": None}
    # build/ and other ignored outputs do not make a tree dirty.
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=normal"))
    when = _git(root, "log", "-1", "--format=%ct", commit)
    return {"commit": commit, "dirty": dirty, "commit_time": int(when) if when else None}


def release_epoch(source: dict) -> int:
    text = os.environ.get("SOURCE_DATE_EPOCH")
    if text is not None:
        try:
            epoch = int(text)
        except ValueError:
            raise ReleaseError(f"SOURCE_DATE_EPOCH={text!r} is not an integer number of "
                               "seconds") from None
    elif source["commit_time"] is not None:
        epoch = source["commit_time"]
    else:
        raise ReleaseError("no time for the release's files: the project is not a git checkout "
                           "and SOURCE_DATE_EPOCH is not set; set SOURCE_DATE_EPOCH=<seconds>")
    if epoch < MIN_ZIP_EPOCH:
        raise ReleaseError(f"SOURCE_DATE_EPOCH={epoch} is before 1980-01-01, which archive "
                           f"formats cannot all hold; use a value >= {MIN_ZIP_EPOCH}")
    if epoch > MAX_EPOCH:
        raise ReleaseError(f"SOURCE_DATE_EPOCH={epoch} is past what a tar header holds "
                           f"({MAX_EPOCH}, in 2242); use the source's own time")
    return epoch


# ---------------------------------------------------------------------------------------------
# digests and the archive

def _tarinfo(name: str, epoch: int, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = epoch
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if directory:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.size, info.mode = size, 0o644
    return info


def write_archive(bundle_dir: Path, out: Path, prefix: str, epoch: int) -> None:
    """A .tar.gz whose bytes depend only on the files' names and contents, the prefix and epoch."""
    with atomic_output(out) as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
                tar.addfile(_tarinfo(prefix, epoch, directory=True))
                for path in sorted(bundle_dir.iterdir(), key=lambda p: p.name):
                    if not path.is_file():
                        raise ReleaseError(f"{path}: not a regular file in the bundle")
                    with open(path, "rb") as fh:
                        tar.addfile(_tarinfo(f"{prefix}/{path.name}", epoch,
                                             path.stat().st_size), fh)


def archive_members(archive: Path) -> dict:
    """member name (without the prefix) -> sha256, read from the archive."""
    out = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                if member.isdir():
                    continue
                if not member.isfile():
                    raise ReleaseError(f"{archive}: member {member.name!r} is not a regular file")
                h = hashlib.sha256()
                fh = tar.extractfile(member)
                while chunk := fh.read(hashing.CHUNK):
                    h.update(chunk)
                out[member.name.split("/", 1)[-1]] = h.hexdigest()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ReleaseError(f"{archive}: cannot read the archive ({exc})") from None
    return out


# ---------------------------------------------------------------------------------------------
# the clean build

def clean_build(scratch: Layout, overrides: dict, log, remote_cache: bool = True) -> Path:
    """`doit bundle` from nothing, in the scratch layout's build root; returns its bundle dir.
    remote_cache=False: every step runs here, whatever build.toml says (a verification must
    not take outputs from the cache it would vouch for)."""
    cfg, root, build_root = scratch.cfg, scratch.root, scratch.build_root
    if build_root.exists():
        shutil.rmtree(build_root)
    build_root.mkdir(parents=True)
    args = [sys.executable, "-m", "doit", "-f", str(root / "dodo.py"), "--dir", str(root),
            "bundle", *[f"{k}={v}" for k, v in sorted(overrides.items())]]
    env = {**os.environ, BUILD_ROOT_ENV: str(build_root)}
    if not remote_cache:   # the environment, not the command line: an older tree has no such key
        env[REMOTE_CACHE_ENV] = ""
    log(f"release: clean build of {cfg.model.name} for {cfg.device.name} in "
        f"{scratch.rel(build_root)}")
    proc = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
    write_atomic(scratch.clean_build_log, (proc.stdout + proc.stderr).encode())
    if proc.returncode != 0:
        raise ReleaseError(f"the clean build failed (exit {proc.returncode}); log: "
                           f"{scratch.clean_build_log}\n{proc.stdout[-3000:]}"
                           f"{proc.stderr[-3000:]}")
    return scratch.bundle_dir


def scratch_layout(cfg: BuildConfig, build_root: Path) -> Layout:
    """The same build, laid out under a scratch build root."""
    return Layout(dataclasses.replace(cfg, build_root=build_root.resolve()))


def _overrides_of(cfg: BuildConfig) -> dict:
    out = {"model": cfg.model.name, "device": cfg.device.name, "plan": cfg.plan.name,
           "backend": cfg.backend, "executor": cfg.executor}
    out.update({k: str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in table_of(cfg.compile).items()})
    return out


def clean_build_overrides(cfg: BuildConfig, overrides: dict) -> dict:
    """The clean build's command line: what the release builds (model, device, plan, backend,
    executor, [compile]) and how its steps run as the command line said (its run settings: the
    remote cache, the step containers' limits and user; build.toml's and the environment's reach
    the clean build by themselves)."""
    return {**_overrides_of(cfg), **run_settings_given(overrides)}


def make_release(layout: Layout, overrides: dict, log=print) -> Path:
    cfg = layout.cfg
    source = source_state(cfg.root)
    epoch = release_epoch(source)
    if source["dirty"]:
        log("release: WARNING: the source tree has uncommitted changes; the provenance says so")
    scratch = scratch_layout(cfg, layout.release_work_dir)
    bundle_dir = clean_build(scratch, clean_build_overrides(cfg, overrides), log)
    name, archive = layout.release_name, layout.release_archive
    write_archive(bundle_dir, archive, name, epoch)
    subjects = [{"name": archive.name, "digest": {"sha256": sha256_file(archive)}}]
    subjects += [{"name": f"{name}/{p.name}", "digest": {"sha256": sha256_file(p)}}
                 for p in sorted(bundle_dir.iterdir())]
    doc = provenance(scratch, overrides, source, epoch, subjects,
                     scratch.source_inputs())
    _write_text(layout.release_provenance, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    _write_text(layout.release_sums, f"{subjects[0]['digest']['sha256']}  {archive.name}\n")
    log(f"release: {layout.rel(archive)} ({archive.stat().st_size / (1 << 20):.2f} MiB), "
        f"sha256 {subjects[0]['digest']['sha256']}")
    log(f"release: {layout.rel(layout.release_sums)}, {layout.rel(layout.release_provenance)}")
    return archive


def _write_text(path: Path, text: str) -> None:
    write_atomic(path, text.encode())


# ---------------------------------------------------------------------------------------------
# verify_release

def load_provenance(archive: Path) -> dict:
    path = archive.parent / RELEASE_PROVENANCE
    if not os.path.lexists(path):
        raise ReleaseError(f"{path}: no provenance next to {archive.name}; keep the release "
                           "directory's files together")
    return read_provenance(path)   # a FIFO or a device there is refused, not read


def source_tree_for(root: Path, recorded: dict, workdir: Path, log) -> Path:
    """The source the release was built from: this tree if it is that commit and clean, else a
    `git archive` of the recorded commit."""
    commit = recorded.get("digest", {}).get("gitCommit")
    here = source_state(root)
    if not commit:
        log("verify_release: WARNING: the release recorded no commit; rebuilding from this tree")
        return root
    if recorded.get("annotations", {}).get("dirty"):
        log("verify_release: WARNING: the release was built from a dirty tree; rebuilding from "
            "this tree, whose uncommitted changes may differ")
        return root
    if here["commit"] == commit and not here["dirty"]:
        return root
    src = workdir / "source"
    src.mkdir(parents=True)
    # the commit was checked to be 40 hex digits (read_provenance); after "--" all the same, so
    # that no value from a file is ever read by git as an option
    archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", commit, "--"],
                             capture_output=True)
    if archive.returncode != 0:
        raise ReleaseError(f"source commit {commit} is not in {root}: fetch it, then retry")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    log(f"verify_release: source = commit {commit[:12]} (git archive)")
    return src


def check_materials(deps: list, root: Path, log) -> list:
    """Configs and exported inputs must still have the recorded bytes; returns problems."""
    problems = []
    for dep in deps:
        name, digest = dep.get("name", ""), dep.get("digest", {})
        if name == "source" or "sha256" not in digest or name.startswith("build/"):
            continue  # generated inputs are rebuilt; the rest is checked by the comparison
        path = material_path(root, name)
        if path is None:
            problems.append(f"{name[:200]!r}: recorded in the provenance, but not a file of the "
                            "source tree (an absolute path or one leading out of it); "
                            "verify_release reads only the release's own files")
            continue
        if not path.is_file():
            problems.append(f"{name}: recorded in the provenance but missing")
            continue
        got = sha256_file(path)
        if got != digest["sha256"]:
            problems.append(f"{name}: sha256 {got} differs from the recorded {digest['sha256']}")
    return problems


def material_path(root: Path, name: str) -> Optional[Path]:
    """The file a material names, if it is one of the source tree's (relative, no "..", no
    symlink leading out); None otherwise."""
    relative = Path(name)
    if not name or relative.is_absolute() or ".." in relative.parts or "\0" in name:
        return None
    path = root / relative
    real, top = os.path.realpath(path), os.path.realpath(root)
    return path if real.startswith(top + os.sep) else None


def verify_release(root: Path, archive: Path, log=print) -> bool:
    require_named_file(archive, "release archive", RELEASE_MAX_BYTES)
    archive = archive.resolve()
    doc = load_provenance(archive)
    want = {s["name"]: s["digest"]["sha256"] for s in doc["subject"]}
    if want.get(archive.name) != sha256_file(archive):
        raise ReleaseError(f"{archive}: its sha256 is not the one its provenance records")
    params = doc["predicate"]["buildDefinition"]["externalParameters"]
    deps = doc["predicate"]["buildDefinition"]["resolvedDependencies"]
    with tempfile.TemporaryDirectory(prefix="hexbundle-verify-") as tmp:
        workdir = Path(tmp)
        source = next((d for d in deps if d.get("name") == "source"), {})
        src = source_tree_for(root, source, workdir, log)
        problems = check_materials(deps, src if src != root else root, log)
        if problems:
            raise ReleaseError("the recorded materials are not what this tree has:\n  "
                               + "\n  ".join(problems))
        overrides = {k: params[k] for k in ("model", "device", "plan", "backend", "executor")}
        overrides.update({k: str(v).lower() if isinstance(v, bool) else str(v)
                          for k, v in params["compile"].items()})
        from hexbundle.config.build import load_build
        cfg = load_build(src, overrides)
        bundle_dir = clean_build(scratch_layout(cfg, workdir / "build"), overrides, log,
                                 remote_cache=False)
        rebuilt = {p.name: sha256_file(p) for p in bundle_dir.iterdir()}
        recorded = archive_members(archive)
        prefix = archive.name[:-len(".tar.gz")]
        again = workdir / archive.name
        write_archive(bundle_dir, again, prefix, params["source_date_epoch"])
        return report_comparison(recorded, rebuilt, sha256_file(again) == want[archive.name],
                                 params["backend"], log)


def report_comparison(recorded: dict, rebuilt: dict, archive_same: bool, backend: str,
                      log) -> bool:
    names = sorted(set(recorded) | set(rebuilt))
    ok, body = True, []
    for name in names:
        if name not in rebuilt:
            verdict, ok = "MISSING from the rebuild", False
        elif name not in recorded:
            verdict, ok = "EXTRA in the rebuild", False
        elif recorded[name] == rebuilt[name]:
            verdict = "identical"
        else:
            verdict, ok = "DIFFERS", False
            if backend == "qairt" and name.endswith(".bin"):
                verdict += " (context binary from the QAIRT SDK: the compiler is not bit-for-bit " \
                           "reproducible here; inspect before trusting)"
        body.append((name, verdict))
    body.append(("archive", "identical" if archive_same else "DIFFERS"))
    for line in tables.table(("file", "result"), body):
        log(line)
    return ok and archive_same


# ---------------------------------------------------------------------------------------------
# doit actions

def verify_release_command(root: Path, archive: list) -> None:
    """`doit verify_release ARCHIVE`: ReleaseError unless the release reproduces."""
    if len(archive) != 1:
        raise ReleaseError("usage: doit verify_release build/release/<name>.tar.gz")
    with about_argument("ARCHIVE", archive[0]):
        reproduces = verify_release(root, Path(archive[0]))
    if not reproduces:
        raise ReleaseError("the release does not reproduce: see the table above")
