"""Release builds: byte-identical archives across directories, times, umask, TZ, locale and
environment; provenance; verify_release; input pins."""
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest

from conftest import copy_project, variant_dir

EPOCH = "1700000000"
NAME = "qwen2-tiny-iq9075-four"


def release(project, env_extra, umask):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "TZ"))}
    env.update(env_extra)
    cmd = f"umask {umask:03o} && exec {sys.executable} -m doit release"
    proc = subprocess.run(["sh", "-c", cmd], cwd=project.root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return project.root / "build" / "release"


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_two_release_builds_are_byte_identical(tmp_path):
    a = copy_project(tmp_path / "first" / "checkout")
    b = copy_project(tmp_path / "second-dir" / "elsewhere")
    out_a = release(a, {"SOURCE_DATE_EPOCH": EPOCH, "TZ": "UTC", "LC_ALL": "C"}, 0o022)
    out_b = release(b, {"SOURCE_DATE_EPOCH": EPOCH, "TZ": "Asia/Shanghai",
                        "LC_ALL": "C.UTF-8", "HEXBUNDLE_UNRELATED": "x" * 100}, 0o077)
    archive_a = (out_a / f"{NAME}.tar.gz").read_bytes()
    assert archive_a == (out_b / f"{NAME}.tar.gz").read_bytes()
    assert (out_a / "SHA256SUMS").read_text() == (out_b / "SHA256SUMS").read_text()
    assert (out_a / "SHA256SUMS").read_text().split()[0] == hashlib.sha256(archive_a).hexdigest()
    with tarfile.open(out_a / f"{NAME}.tar.gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {
        (int(EPOCH), 0, 0, "", "")}
    assert archive_a[4:8] == b"\0\0\0\0", "gzip header carries a timestamp"


def test_provenance_is_an_in_toto_slsa_statement(tmp_path):
    proj = copy_project(tmp_path / "p")
    out = release(proj, {"SOURCE_DATE_EPOCH": EPOCH}, 0o022)
    doc = json.loads((out / "provenance.json").read_text())
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["predicateType"] == "https://slsa.dev/provenance/v1"
    subject = {s["name"]: s["digest"]["sha256"] for s in doc["subject"]}
    archive = out / f"{NAME}.tar.gz"
    assert subject[archive.name] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert f"{NAME}/manifest.json" in subject
    deps = {d["name"]: d for d in doc["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["source"]["digest"] == {}     # a copy without git: recorded as unknown
    cfg = (proj.root / "configs" / "build.toml").read_bytes()
    assert deps["configs/build.toml"]["digest"]["sha256"] == hashlib.sha256(cfg).hexdigest()
    assert "build/qwen2-tiny/inputs/prompt_ar128_cl256_1_of_4.onnx" in deps
    params = doc["predicate"]["buildDefinition"]["externalParameters"]
    assert params["source_date_epoch"] == int(EPOCH) and params["backend"] == "reference"
    assert doc["predicate"]["runDetails"]["builder"]["version"]["hexbundle"]


def test_release_needs_a_time(tmp_path):
    proj = copy_project(tmp_path / "p")
    run = proj.doit("release", check=False, env={"SOURCE_DATE_EPOCH": ""})
    assert run.code != 0 and "SOURCE_DATE_EPOCH" in run.out + run.err


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_verify_release_reproduces_and_reports_differences(tmp_path):
    proj = copy_project(tmp_path / "p")
    subprocess.run(["git", "init", "-q"], cwd=proj.root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=proj.root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   cwd=proj.root, check=True, env={**os.environ,
                                                   "GIT_COMMITTER_DATE": "1700000000 +0000",
                                                   "GIT_AUTHOR_DATE": "1700000000 +0000"})
    out = release(proj, {}, 0o022)  # time from the commit
    archive = out / f"{NAME}.tar.gz"
    ok = proj.doit("verify_release", str(archive))
    assert "identical" in ok.out and "DIFFERS" not in ok.out
    assert "WARNING" not in ok.out  # a clean commit: rebuilt from exactly that commit

    # A release whose bin is not what the recorded sources build: reported, named, non-zero.
    from hexbundle.release.reproducible import write_archive
    doc = json.loads((out / "provenance.json").read_text())
    bundle = variant_dir(proj.root / "build" / "release-work", proj.root) / "bundle"
    victim = bundle / "qwen2_tiny_part_2_of_4.bin"
    data = bytearray(victim.read_bytes())
    data[5000] ^= 0xFF
    victim.unlink()
    victim.write_bytes(bytes(data))
    write_archive(bundle, archive, NAME, 1700000000)
    doc["subject"][0]["digest"]["sha256"] = hashlib.sha256(archive.read_bytes()).hexdigest()
    (out / "provenance.json").write_text(json.dumps(doc))
    bad = proj.doit("verify_release", str(archive), check=False)
    assert bad.code != 0
    assert re.search(r"^qwen2_tiny_part_2_of_4\.bin\s+DIFFERS$", bad.out, re.M), bad.out
    assert re.search(r"^qwen2_tiny_part_3_of_4\.bin\s+identical$", bad.out, re.M), bad.out


def test_pinned_input_mismatch_names_file_and_both_digests(project):
    project.doit("bundle")
    model = project.root / "configs" / "models" / "qwen2-tiny.toml"
    wrong = "0" * 32
    model.write_text(model.read_text().replace(
        "seed = 0\n", f'seed = 0\n\n[inputs.pins]\n"prompt_ar128_cl256_2_of_4.onnx" = '
        f'"xxh3_128:{wrong}"\n'))
    run = project.doit("bundle", check=False)
    assert run.code != 0
    text = run.out + run.err
    assert "prompt_ar128_cl256_2_of_4.onnx: xxh3_128 is" in text and wrong in text


def test_the_clean_build_runs_its_steps_as_the_command_line_said(project):
    """`doit release container.memory=48g remote_cache=...`: the nested clean build gets the
    step containers' settings and the remote cache from the command line too, besides what the
    release builds; other keys are what the release's configuration resolved."""
    from hexbundle.config.build import load_build
    from hexbundle.release.reproducible import clean_build_overrides
    given = {"container.memory": "48g", "container.user": "1000:1000",
             "remote_cache": "grpc://cache:8980", "weights_packing": "true"}
    cfg = load_build(project.root, given)
    args = clean_build_overrides(cfg, given)
    assert args["container.memory"] == "48g" and args["container.user"] == "1000:1000"
    assert args["remote_cache"] == "grpc://cache:8980"
    assert args["model"] == "qwen2-tiny" and args["device"] == "iq9075"
    assert args["weights_packing"] == "true" and args["executor"] == "local"
