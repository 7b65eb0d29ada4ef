"""The toolchain pins, without a Docker engine: SDK archive checks, SDK version checks, the lock
and wheelhouse, the image build context, the SDK installer, the no-engine message."""
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from hexbundle.backends import describe
from hexbundle.config import toolchain
from hexbundle.support.errors import ConfigError, ToolchainError
from hexbundle.toolchain import image, wheelhouse
from conftest import CONFIGS

ROOT = Path(__file__).resolve().parent.parent
STANDIN_SDK = Path(__file__).resolve().parent / "standin_qairt"
INSTALLER = ROOT / "scripts" / "install_sdk.py"


def toolchain_project(tmp_path, sha256=""):
    """A project root holding only what hexbundle.config.toolchain and hexbundle.toolchain read (plus the Dockerfile, lock)."""
    root = tmp_path / "proj"
    (root / "configs").mkdir(parents=True)
    text = (CONFIGS / "configs" / "toolchain.toml").read_text()
    text = text.replace('sha256 = ""', f'sha256 = "{sha256}"')
    (root / "configs" / "toolchain.toml").write_text(text)
    for rel in ("Dockerfile", "requirements/container.lock"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes((ROOT / rel).read_bytes())
    return root


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- configs/toolchain.toml ----------------------------------------------------------------------

def test_the_pin_is_qairt_2_42_and_describe_reports_it():
    tc = toolchain.load_toolchain(ROOT)
    assert tc.sdk_version == "2.42.0.251225"
    assert describe("qairt") == ("QAIRT 2.42.0.251225", True)
    assert "@sha256:" in tc.base and tc.base.startswith("ubuntu:22.04@")
    assert tc.python_version == "3.10"


def test_the_dockerfile_default_base_is_the_pinned_one():
    tc = toolchain.load_toolchain(ROOT)
    assert f"ARG BASE={tc.base}\n" in tc.dockerfile.read_text()


def test_an_unknown_key_in_the_toolchain_config_is_refused(tmp_path):
    root = toolchain_project(tmp_path)
    path = root / "configs" / "toolchain.toml"
    path.write_text(path.read_text().replace("[image]\n", "[image]\nbse = 'x'\n"))
    with pytest.raises(ConfigError, match=r"unknown key 'image.bse'.*did you mean 'image.base'"):
        toolchain.load_toolchain(root)


def test_a_malformed_sha256_pin_is_refused(tmp_path):
    root = toolchain_project(tmp_path, sha256="abc")
    with pytest.raises(ConfigError, match="sdk.sha256"):
        toolchain.load_toolchain(root)


# --- the staged SDK archive -----------------------------------------------------------------------

def test_no_staged_archive_means_an_image_without_the_sdk(tmp_path):
    tc = toolchain.load_toolchain(toolchain_project(tmp_path))
    assert not tc.sdk_archive.exists()
    assert toolchain.staged_sdk(tc) is None


def test_a_staged_archive_with_another_digest_is_refused_naming_both_and_the_place(tmp_path):
    pinned = "1" * 64
    tc = toolchain.load_toolchain(toolchain_project(tmp_path, sha256=pinned))
    tc.sdk_archive.parent.mkdir(parents=True)
    tc.sdk_archive.write_bytes(b"not the SDK")
    with pytest.raises(ToolchainError) as err:
        toolchain.staged_sdk(tc)
    msg = str(err.value)
    assert str(tc.sdk_archive) in msg and pinned in msg and sha256(b"not the SDK") in msg
    assert "put the archive of QAIRT 2.42.0.251225 at" in msg


def test_an_unpinned_staged_archive_is_refused_with_its_digest_to_check(tmp_path):
    tc = toolchain.load_toolchain(toolchain_project(tmp_path))
    tc.sdk_archive.parent.mkdir(parents=True)
    tc.sdk_archive.write_bytes(b"an archive")
    with pytest.raises(ToolchainError, match=f"pins no sha256.*{sha256(b'an archive')}.*sdk.sha256"):
        toolchain.staged_sdk(tc)


def test_the_pinned_archive_is_accepted(tmp_path):
    tc = toolchain.load_toolchain(toolchain_project(tmp_path, sha256=sha256(b"the SDK")))
    tc.sdk_archive.parent.mkdir(parents=True)
    tc.sdk_archive.write_bytes(b"the SDK")
    assert toolchain.staged_sdk(tc) == sha256(b"the SDK")


# --- the SDK seen at run time -----------------------------------------------------------------------

def test_the_installed_sdk_version_comes_from_sdk_yaml():
    sdk = toolchain.installed_sdk({"QNN_SDK_ROOT": str(STANDIN_SDK)})
    assert sdk.version == "2.42.0.251225" and sdk.variable == "QNN_SDK_ROOT"
    tc = toolchain.load_toolchain(ROOT)
    assert toolchain.require_pinned_sdk(tc, {"QAIRT_SDK_ROOT": str(STANDIN_SDK)}).root == STANDIN_SDK


def test_another_sdk_version_is_refused(tmp_path):
    (tmp_path / "sdk.yaml").write_text("name: qairt\nversion: 2.44.0.260101\n")
    tc = toolchain.load_toolchain(ROOT)
    with pytest.raises(ToolchainError, match=r"2\.44\.0\.260101.*pins 2\.42\.0\.251225"):
        toolchain.require_pinned_sdk(tc, {"QAIRT_SDK_ROOT": str(tmp_path)})


def test_no_sdk_at_all_says_where_the_qairt_backend_runs():
    with pytest.raises(ToolchainError, match="QAIRT_SDK_ROOT.*doit image"):
        toolchain.installed_sdk({})


# --- the lock and the wheelhouse ---------------------------------------------------------------------

def fake_wheelhouse(tmp_path):
    root = toolchain_project(tmp_path)
    tc = toolchain.load_toolchain(root)
    tc.wheelhouse.mkdir(parents=True)
    wheels = {"alpha": b"alpha wheel", "beta_pkg": b"beta wheel"}
    entries = []
    for name, data in wheels.items():
        (tc.wheelhouse / f"{name}-1.0-py3-none-any.whl").write_bytes(data)
        entries.append(wheelhouse.Locked(wheelhouse.normalize(name), "1.0", (sha256(data),)))
    wheelhouse.write_lock(tc.lock, entries, tc.requirements, tc)
    return tc


def test_the_committed_lock_pins_every_wheel_by_sha256():
    entries = wheelhouse.read_lock(ROOT / "requirements" / "container.lock")
    names = {e.name for e in entries}
    assert {"numpy", "onnx", "tomli", "xxhash", "doit"} <= names
    assert all(len(e.hashes) >= 1 for e in entries)
    assert next(e for e in entries if e.name == "numpy").version.startswith("2.2.")


def test_tokenizers_is_a_runtime_dependency_and_in_the_image_lock():
    """The bundle step reads tokenizer.json with the tokenizers library (formats/tokenizer.py),
    on the host and in the container; exceptiongroup is what anyio, under it, needs on 3.10."""
    import tomli
    project = tomli.loads((ROOT / "pyproject.toml").read_text())
    assert any(d.startswith("tokenizers") for d in project["project"]["dependencies"])
    names = {e.name for e in wheelhouse.read_lock(ROOT / "requirements" / "container.lock")}
    assert {"tokenizers", "huggingface-hub", "exceptiongroup"} <= names


def test_a_lock_round_trips_and_a_complete_wheelhouse_verifies(tmp_path):
    tc = fake_wheelhouse(tmp_path)
    found = wheelhouse.verify(tc)
    assert sorted(p.name for p in found.values()) == ["alpha-1.0-py3-none-any.whl",
                                                      "beta_pkg-1.0-py3-none-any.whl"]
    # download() with nothing missing touches no network
    wheelhouse.download(tc)
    assert (tc.wheelhouse / wheelhouse.SUMS).read_text().count(".whl") == 2


def test_an_altered_or_missing_wheel_is_named(tmp_path):
    tc = fake_wheelhouse(tmp_path)
    (tc.wheelhouse / "beta_pkg-1.0-py3-none-any.whl").write_bytes(b"tampered")
    with pytest.raises(ToolchainError, match=r"beta-pkg==1\.0.*other bytes.*beta_pkg-1\.0"):
        wheelhouse.verify(tc)
    (tc.wheelhouse / "alpha-1.0-py3-none-any.whl").unlink()
    with pytest.raises(ToolchainError, match=r"2 locked wheel\(s\).*alpha==1\.0"):
        wheelhouse.verify(tc)


def test_a_lock_line_without_a_hash_is_refused(tmp_path):
    path = tmp_path / "x.lock"
    path.write_text("numpy==2.2.6\n")
    with pytest.raises(ToolchainError, match="entry 1 is not"):
        wheelhouse.read_lock(path)


# --- the image build context ---------------------------------------------------------------------

def context_entries(ctx):
    buf = io.BytesIO()
    digest = image.write_context(ctx, buf)
    assert digest == sha256(buf.getvalue())
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
        return buf.getvalue(), tar.getmembers()


def test_the_context_holds_exactly_the_listed_files_deterministically(tmp_path):
    tc = fake_wheelhouse(tmp_path)
    (tc.root / "build" / "junk.bin").write_bytes(b"x" * 100)   # outputs never enter
    ctx = image.plan_context(tc, image.check_sources(tc), wheelhouse.verify(tc))
    first, members = context_entries(ctx)
    second, _ = context_entries(image.plan_context(tc, image.check_sources(tc),
                                                   wheelhouse.verify(tc)))
    assert first == second
    names = [m.name for m in members]
    assert names == ["requirements", "sdk", "wheelhouse", "Dockerfile",
                     "requirements/container.lock", "sdk/install_sdk.py",
                     "wheelhouse/alpha-1.0-py3-none-any.whl",
                     "wheelhouse/beta_pkg-1.0-py3-none-any.whl"]
    assert {(m.mtime, m.uid, m.gid, m.uname) for m in members} == {(image.CONTEXT_MTIME, 0, 0, "")}
    assert ctx.sdk_sha256 is None


def test_the_context_carries_the_sdk_archive_only_when_it_is_the_pinned_one(tmp_path):
    tc = fake_wheelhouse(tmp_path)
    tc.sdk_archive.parent.mkdir(parents=True)
    tc.sdk_archive.write_bytes(b"the SDK")
    path = tc.path
    path.write_text(path.read_text().replace('sha256 = ""', f'sha256 = "{sha256(b"the SDK")}"'))
    tc = toolchain.load_toolchain(tc.root)
    ctx = image.plan_context(tc, image.check_sources(tc), wheelhouse.verify(tc))
    assert ctx.sdk_sha256 == sha256(b"the SDK")
    _, members = context_entries(ctx)
    assert f"sdk/{tc.sdk_archive.name}" in [m.name for m in members]
    args = image.build_args(tc, ctx, "base:tag")
    assert args["SDK_VERSION"] == "2.42.0.251225" and args["SDK_SHA256"] == sha256(b"the SDK")
    assert args["SDK_PYTHONPATH"] == "/opt/qcom/aistack/qairt/2.42.0.251225/lib/python"


def test_doit_image_refuses_a_wrong_archive_before_asking_docker(project, tmp_path):
    shutil.copy2(ROOT / "Dockerfile", project.root / "Dockerfile")
    shutil.copytree(ROOT / "requirements", project.root / "requirements")
    archive = project.root / "toolchain" / "v2.42.0.251225.zip"
    archive.parent.mkdir()
    archive.write_bytes(b"wrong bytes")
    cfg = project.root / "configs" / "toolchain.toml"
    cfg.write_text(cfg.read_text().replace('sha256 = ""', f'sha256 = "{"2" * 64}"'))
    # no wheelhouse (-s: not even its task) and no engine: the archive check comes first anyway
    run = project.doit("-s", "image", env={"DOCKER_HOST": "unix:///nonexistent/x.sock"},
                       check=False)
    assert run.code != 0
    assert str(archive) in run.out and "2" * 64 in run.out and sha256(b"wrong bytes") in run.out
    assert "no Docker engine" not in run.out


# --- the SDK installer (runs inside the image build) --------------------------------------------

def make_sdk_zip(path: Path, version="2.42.0.251225", extra=None):
    with zipfile.ZipFile(path, "w") as zf:
        def add(name, data, mode):
            info = zipfile.ZipInfo(f"qairt/{version}/{name}")
            info.external_attr = mode << 16
            zf.writestr(info, data)
        add("sdk.yaml", f"version: {version}\n", 0o100644)
        add("bin/x86_64-linux-clang/qnn-tool", "#!/bin/sh\necho hi\n", 0o100755)
        add("lib/python/qairt/__init__.py", "", 0o100644)
        for name, data, mode in extra or []:
            add(name, data, mode)
    return sha256(path.read_bytes())


def install(tmp_path, archive, digest, version="2.42.0.251225"):
    dest = tmp_path / "dest"
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "install_sdk.py").write_bytes(INSTALLER.read_bytes())
    (ctx / archive.name).write_bytes(archive.read_bytes())
    return subprocess.run([sys.executable, str(ctx / "install_sdk.py"), "--version", version,
                           "--sha256", digest, "--archive", archive.name, "--install-dir",
                           "/opt/qairt/x", "--dest", str(dest)],
                          capture_output=True, text=True, check=False), \
        dest / "opt" / "qairt" / "x"


def test_the_installer_unpacks_the_sdk_root_keeping_modes(tmp_path):
    archive = tmp_path / "v2.42.0.251225.zip"
    digest = make_sdk_zip(archive)
    proc, root = install(tmp_path, archive, digest)
    assert proc.returncode == 0, proc.stderr
    assert (root / "sdk.yaml").read_text() == "version: 2.42.0.251225\n"
    tool = root / "bin" / "x86_64-linux-clang" / "qnn-tool"
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755
    assert (root / "lib" / "python" / "qairt" / "__init__.py").is_file()


@pytest.mark.parametrize("problem", ["digest", "version", "traversal"])
def test_the_installer_refuses_a_wrong_archive(tmp_path, problem):
    archive = tmp_path / "v2.42.0.251225.zip"
    extra = [("../../../../escape.txt", "x", 0o100644)] if problem == "traversal" else None
    digest = make_sdk_zip(archive, extra=extra)
    proc, _ = install(tmp_path, archive, "0" * 64 if problem == "digest" else digest,
                      version="2.42.0.999999" if problem == "version" else "2.42.0.251225")
    assert proc.returncode != 0
    assert {"digest": "is not the pinned", "version": "not the pinned 2.42.0.999999",
            "traversal": "outside the SDK directory"}[problem] in proc.stderr
    assert not (tmp_path / "escape.txt").exists()


# --- the docker executor without an engine ------------------------------------------------------

def test_no_engine_says_how_to_reach_one_or_to_build_locally(project):
    run = project.doit("inputs:tokenizer", "executor=docker",
                       env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"}, check=False)
    assert run.code != 0
    assert "no Docker engine answers at unix:///nonexistent/docker.sock" in run.out
    assert "DOCKER_HOST" in run.out and 'executor = "local"' in run.out


def test_doit_image_without_an_engine_fails_before_fetching_any_wheel(project):
    """No engine answers: `doit image` says so, and how to get one, before the wheelhouse is
    fetched (it used to download the 33 locked wheels, 73 s, and only then find no engine)."""
    shutil.copy2(ROOT / "Dockerfile", project.root / "Dockerfile")
    shutil.copytree(ROOT / "requirements", project.root / "requirements")
    # No index, no site pip config: were a download attempted, it would fail at once, not fetch.
    env = {"DOCKER_HOST": "unix:///nonexistent.sock", "PIP_CONFIG_FILE": os.devnull,
           "PIP_NO_INDEX": "1"}
    run = project.doit("image", env=env, check=False)
    assert run.code != 0
    assert "no Docker engine answers at unix:///nonexistent.sock" in run.out, run.out + run.err
    assert "dockerd" in run.out and "DOCKER_HOST" in run.out   # what to do
    assert "locked wheels" not in run.out and "-m pip download" not in run.out + run.err
    wheels = project.root / "build" / "wheelhouse"
    assert not wheels.exists() or not any(wheels.iterdir()), sorted(wheels.iterdir())


def test_the_image_record_is_read_back(tmp_path):
    (tmp_path / "build" / "image").mkdir(parents=True)
    image.write_record(tmp_path, {"id": "sha256:abc", "tag": "t", "labels": {}})
    assert image.read_record(tmp_path)["id"] == "sha256:abc"
    assert (tmp_path / "build" / "image" / "image-id.txt").read_text() == "sha256:abc\n"
    assert json.loads((tmp_path / "build" / "image" / "image.json").read_text())["tag"] == "t"
