"""Robustness (issue 7): tampered outputs, killed and interrupted builds, a full disk, two runs at
once, bad inputs. Real doit runs in subprocesses; a run is held at a chosen point with the test
hook HEXBUNDLE_TEST_PAUSE_AT (hexbundle/support/testhooks.py), then killed, interrupted or released.

Whatever goes wrong: a clear message naming the file (and key or tensor) and what to do, a
non-zero exit, no traceback, and the previous good bundle and manifest left exactly as they were.
"""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DoitRun, Held, snapshot, steps_run, tiny_as_export
from hexbundle.config.build import BUILD_SCHEMA, load_build
from hexbundle.config.schema import read_toml
from hexbundle.formats.encodings import EncodingsError, load_encodings
from hexbundle.formats.manifest import BundleIntegrityError, verify_bundle_files
from hexbundle.graph import recovery
from hexbundle.support.atomic import exchange_dirs, is_temp_name, swap_in
from hexbundle.support.errors import ConfigError

BIN2 = "qwen2_tiny_part_2_of_4.bin"
VARIANT = "build/qwen2-tiny/iq9075/four/reference"   # the default build's own directory


# ---------------------------------------------------------------------------------------------
# helpers

def leftovers(build: Path) -> list:
    """Temp files / staging directories of our writers anywhere under build/."""
    found = []
    for dirpath, dirnames, filenames in os.walk(build):
        for name in dirnames + filenames:
            if is_temp_name(name):
                found.append(Path(dirpath, name))
    return found


def flip_byte(path: Path, offset: int = 5000) -> None:
    """A hand edit in place: same size, same inode, new mtime."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x01]))


def scale_weight(onnx_path: Path, tensor_name: str, factor: float) -> None:
    """Change one weight's bytes in place in the external .data file."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.name == tensor_name)
    info = {e.key: e.value for e in init.external_data}
    offset, length = int(info.get("offset", 0)), int(info["length"])
    with open(onnx_path.parent / info["location"], "r+b") as fh:
        fh.seek(offset)
        values = np.frombuffer(fh.read(length), dtype=np.float32) * factor
        fh.seek(offset)
        fh.write(values.astype(np.float32).tobytes())


def own_data_copy(onnx_path: Path) -> Path:
    """The graph records a copy of its .data of its own (as an export with one .data per graph
    does); returns the ONNX path."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    copies = {}
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                copy = copies.setdefault(entry.value, f"{onnx_path.stem}.own.data")
                shutil.copy(onnx_path.parent / entry.value, onnx_path.parent / copy)
                entry.value = copy
    onnx_path.write_bytes(model.SerializeToString())
    return onnx_path


def no_traceback(run: DoitRun) -> None:
    assert "Traceback" not in run.out + run.err, run.out + run.err


def finished_tasks(text: str) -> set:
    """Tasks whose step reported success ("  ok <task> [...]") before the run was stopped."""
    return steps_run(text)


# ---------------------------------------------------------------------------------------------
# tampering and drift

@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_hand_edited_bin_is_named_and_rebuilt_to_the_same_bytes(project):
    project.doit("bundle")
    good = snapshot(project.bundle())
    flip_byte(project.build_dir() / "bin" / BIN2)   # the bundle's copy is the same inode

    run = project.doit("bundle")
    assert (f"hexbundle: {VARIANT}/bin/{BIN2} changed since compile:part_2_of_4 "
            "built it: rebuilding") in run.out
    assert f"{VARIANT}/bundle/{BIN2} changed since bundle built it" in run.out
    assert run.executed == {"compile:part_2_of_4", "bundle"}, run.out
    assert snapshot(project.bundle()) == good
    assert project.doit("bundle").executed == set()


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_hand_edited_dlc_is_reconverted_and_nothing_else(project):
    project.doit("bundle")
    good = snapshot(project.bundle())
    dlc = project.build_dir() / "dlc" / "prompt_ar128_cl256_3_of_4.dlc"
    flip_byte(dlc)
    run = project.doit("bundle")
    assert f"{dlc.relative_to(project.root)} changed since convert:part_3_of_4_prompt" in run.out
    # the reconverted DLC has its old bytes again, so the compile and bundle stay up to date
    assert run.executed == {"convert:part_3_of_4_prompt"}, run.out
    assert snapshot(project.bundle()) == good


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_check_sizes_reverifies_bundle_digests_and_bundle_repairs_it(project):
    project.doit("bundle")
    good = snapshot(project.bundle())
    files = len(project.manifest()["files"])
    assert f"bundle check: {files} files of {VARIANT}/bundle match" in \
        project.doit("check_sizes").out
    genie = project.bundle() / "genie_config.json"
    genie.write_text(genie.read_text().replace('"temp": 0.8', '"temp": 0.9'))

    run = project.doit("check_sizes", check=False)
    assert run.code != 0
    assert (f"{VARIANT}/bundle/genie_config.json: XXH3-128" in run.out
            and "changed since it was built; run `doit bundle`" in run.out), run.out
    no_traceback(run)

    repaired = project.doit("bundle")
    assert "bundle/genie_config.json changed since bundle built it" in repaired.out
    assert repaired.executed == {"bundle"}
    assert snapshot(project.bundle()) == good
    assert project.doit("check_sizes").code == 0


def edit_keeping_mtime(path: Path, edit) -> None:
    """An in-place edit of the same size, then the old times put back (`touch -r`, `cp -p`,
    `os.utime`): size, mtime and inode as before; only the ctime tells."""
    before = path.stat()
    edit(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == \
        (before.st_size, before.st_mtime_ns, before.st_ino)


def same_size_genie_edit(path: Path) -> None:
    text = path.read_text()
    assert '"temp": 0.8' in text
    path.write_text(text.replace('"temp": 0.8', '"temp": 0.9'))   # in place: same inode


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("kind", ["bin", "dlc", "bundle file", "input"])
def test_same_size_edit_with_the_mtime_put_back_is_rebuilt(project, kind):
    """Issue 14 item 1: the stat key has the ctime, which no user call can set."""
    project.doit("bundle")
    good = snapshot(project.bundle())
    build = project.build_dir()
    path, edit, expect = {
        "bin": (build / "bin" / BIN2, flip_byte, {"compile:part_2_of_4", "bundle"}),
        "dlc": (build / "dlc" / "prompt_ar128_cl256_3_of_4.dlc", flip_byte,
                {"convert:part_3_of_4_prompt"}),
        "bundle file": (project.bundle() / "genie_config.json", same_size_genie_edit, {"bundle"}),
        "input": (project.root / "build" / "qwen2-tiny" / "inputs" / "part_2_of_4.data",
                  flip_byte, {"convert:part_2_of_4_prompt", "convert:part_2_of_4_token"}),
    }[kind]
    edit_keeping_mtime(path, edit)
    run = project.doit("bundle")
    no_traceback(run)
    assert expect <= run.executed, run.out
    if kind != "input":
        assert f"{path.relative_to(project.root)} changed since" in run.out, run.out
        assert snapshot(project.bundle()) == good   # rebuilt to the same bytes
    assert project.doit("bundle").executed == set()


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_bundle_rebuild_links_bins_without_hashing_them_again(project, tmp_path):
    project.doit("bundle")
    model = project.root / "configs" / "models" / "qwen2-tiny.toml"
    model.write_text(model.read_text().replace("max_num_tokens = 256", "max_num_tokens = 255"))
    trace = tmp_path / "hashed.txt"
    run = project.doit("bundle", env={"HEXBUNDLE_HASH_TRACE": str(trace)})
    assert run.executed == {"bundle"}
    hashed = trace.read_text().splitlines()
    assert hashed and not [h for h in hashed if h.endswith(".bin")], hashed


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_compile_refuses_a_dlc_whose_weight_bytes_changed(project):
    """Issue 14 item 3: a DLC edited after convert (however its change went unseen) is refused
    by the compile that reads it, naming the DLC and the tensor; no bin is committed."""
    from hexbundle.formats.dlc import read_dlc
    project.doit("bundle")
    dlc = project.build_dir() / "dlc" / "prompt_ar128_cl256_2_of_4.dlc"
    with read_dlc(dlc) as reader:
        tensor = next(iter(reader.tensors))
        offset = reader.blobs[reader.tensors[tensor].blob].offset + 3
    flip_byte(dlc, offset)
    (project.build_dir() / "bin" / BIN2).unlink()
    run = project.doit("-s", "compile:part_2_of_4", check=False)   # compile alone, no convert
    assert run.code != 0
    assert (f"{dlc.name}: blob 'weight/{tensor}' (tensor '{tensor}') does not match its recorded "
            "XXH3-128") in run.out + run.err and "rebuild it (doit convert)" in run.out + run.err
    no_traceback(run)
    assert not (project.build_dir() / "bin" / BIN2).exists()
    assert not leftovers(project.build_dir())


def _rewrite_manifest(project, edit) -> None:
    path = project.bundle() / "manifest.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("key, value", [("deployable", True), ("backend", "qairt"),
                                        ("plan", "other"), ("compile", {})])
def test_check_sizes_checks_the_manifests_own_fields_against_the_build(project, key, value):
    """Issue 14 item 4: a manifest edited to say what the build is not ("deployable": false ->
    true) is refused by check_sizes."""
    project.doit("bundle")
    _rewrite_manifest(project, lambda doc: doc.__setitem__(key, value))
    run = project.doit("check_sizes", check=False)
    assert run.code != 0, run.out
    assert f"bundle/manifest.json: '{key}' is {json.dumps(value)}, but this build makes" in run.out
    no_traceback(run)


@pytest.mark.parametrize("args, named", [
    # compile first rebuilds bin/X.bin (it sees its target changed): the bundle's copy differs
    (["check_sizes"], f"differs from {VARIANT}/bin/" + BIN2 + ", which compile wrote"),
    # the check alone: bin/ is the same tampered inode; the bin's own blob digests tell
    (["-s", "check_sizes"], "digest mismatch"),
], ids=["with-compile", "alone"])
@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_check_sizes_refuses_a_tampered_bin_whose_manifest_digest_was_rewritten(project, args,
                                                                                 named):
    from hexbundle.formats.ctxbin import read_ctxbin
    from hexbundle.support.hashing import file_digest
    project.doit("bundle")
    shipped = project.bundle() / BIN2
    with read_ctxbin(shipped) as reader:
        weight = list(reader.blobs.values())[-1]
    flip_byte(shipped, weight.offset + 1)   # bin/ too: one inode
    _rewrite_manifest(project, lambda doc: doc["files"][BIN2].__setitem__(
        "xxh3_128", file_digest(shipped)))
    run = project.doit(*args, check=False)
    assert run.code != 0, run.out
    assert f"bundle/{BIN2}" in run.out and named in run.out, run.out
    no_traceback(run)


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_bundle_removes_an_unlisted_file_from_the_bundle(project):
    project.doit("bundle")
    good = snapshot(project.bundle())
    (project.bundle() / "notes.txt").write_text("x")
    run = project.doit("bundle")
    assert "bundle/notes.txt is not part of the bundle: removing it" in run.out
    assert run.executed == {"bundle"}, run.out
    assert snapshot(project.bundle()) == good
    assert project.doit("check_sizes").code == 0
    assert project.doit("bundle").executed == set()


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_after_a_recompile_the_bundles_bins_are_hard_links_again(project):
    project.doit("bundle")
    built, shipped = project.build_dir() / "bin" / BIN2, project.bundle() / BIN2
    assert os.path.samefile(built, shipped)
    built.unlink()   # compile writes the same bytes again, as a new file
    run = project.doit("bundle")
    assert "compile:part_2_of_4" in run.executed, run.out
    assert os.path.samefile(built, shipped), run.out
    assert project.doit("bundle").executed == set()


def copy_bundle(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


@pytest.mark.parametrize("damage, named", [
    (lambda b: flip_byte(b / BIN2), BIN2),
    (lambda b: (b / "tokenizer.json").unlink(), "tokenizer.json: listed in manifest.json but missing"),
    (lambda b: (b / "notes.txt").write_text("x"), "notes.txt: not listed in manifest.json"),
    (lambda b: (b / "manifest.json").unlink(), "manifest.json: missing"),
    (lambda b: (b / "manifest.json").write_text("{"), "manifest.json: unreadable"),
], ids=["edited-bin", "missing-file", "extra-file", "no-manifest", "bad-manifest"])
def test_verify_bundle_names_the_file(built, tmp_path, damage, named):
    bundle = copy_bundle(built.bundle(), tmp_path / "bundle")
    assert verify_bundle_files(bundle) == len(built.manifest()["files"])
    damage(bundle)
    with pytest.raises(BundleIntegrityError, match=re.escape(named)):
        verify_bundle_files(bundle)


# ---------------------------------------------------------------------------------------------
# killed, interrupted, out of space

@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_kill_during_compile_leaves_no_partial_bin_and_the_rerun_resumes(project, tmp_path):
    held = Held(project, ["bundle"], pause_at="compile", tmp=tmp_path / "held")
    held.wait_paused()
    bins = project.build_dir() / "bin"
    partial = [p for p in bins.iterdir() if p.name.endswith(".tmp")]
    assert len(partial) == 1, list(bins.iterdir())   # the kill really lands mid-write
    final = bins / (partial[0].name[1:].split(".bin.")[0] + ".bin")   # .<name>.<pid>.<id>.tmp
    held.proc.send_signal(signal.SIGKILL)
    killed = held.finish()
    assert killed.code == -signal.SIGKILL
    assert not final.exists()
    done = finished_tasks(killed.out)
    assert done, killed.out
    json.loads(project.doit_db().read_text())

    rerun = project.doit("bundle")
    assert "removed 1 temporary file(s) left by an interrupted run" in rerun.err
    assert not done & rerun.executed, "finished steps ran again"
    assert f"compile:{final.stem.removeprefix('qwen2_tiny_')}" in rerun.executed
    assert leftovers(project.root / "build") == []
    assert project.doit("check_sizes").code == 0


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_kill_during_convert_keeps_the_previous_bundle(project, tmp_path):
    project.doit("bundle")
    good = snapshot(project.bundle())
    inputs = project.root / "build" / "qwen2-tiny" / "inputs"
    for graph in ("prompt_ar128_cl256_3_of_4", "token_ar1_cl256_3_of_4"):
        scale_weight(inputs / f"{graph}.onnx", "model.layers.2.mlp.up_proj.weight", 0.5)
    dlcs = {p.name: p.read_bytes() for p in (project.build_dir() / "dlc").iterdir()}

    held = Held(project, ["bundle"], pause_at="convert", tmp=tmp_path / "held")
    held.wait_paused()
    held.proc.send_signal(signal.SIGKILL)
    held.finish()
    assert snapshot(project.bundle()) == good
    dlc_dir = project.build_dir() / "dlc"
    assert {p.name: p.read_bytes() for p in dlc_dir.iterdir() if p.suffix == ".dlc"} == dlcs
    assert leftovers(project.root / "build"), "the kill did not land mid-write"

    rerun = project.doit("bundle")
    assert {"convert:part_3_of_4_prompt", "convert:part_3_of_4_token", "compile:part_3_of_4",
            "bundle"} <= rerun.executed
    now = snapshot(project.bundle())
    assert {n for n in now if now[n] != good[n]} == {"qwen2_tiny_part_3_of_4.bin", "manifest.json"}
    assert leftovers(project.root / "build") == []


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_kill_during_bundle_assembly_keeps_the_previous_bundle(project, tmp_path):
    project.doit("bundle")
    good = snapshot(project.bundle())
    model = project.root / "configs" / "models" / "qwen2-tiny.toml"
    model.write_text(model.read_text().replace("max_num_tokens = 256", "max_num_tokens = 255"))

    held = Held(project, ["bundle"], pause_at="bundle", tmp=tmp_path / "held")
    held.wait_paused()
    held.proc.send_signal(signal.SIGKILL)
    held.finish()
    assert snapshot(project.bundle()) == good
    staging = [p for p in leftovers(project.root / "build") if p.is_dir()]
    assert staging, "no staging directory: the kill did not land mid-assembly"

    rerun = project.doit("bundle")
    assert rerun.executed == {"bundle"}
    assert "left by an interrupted run" in rerun.err
    genie = json.loads((project.bundle() / "genie_config.json").read_text())
    assert genie["dialog"]["max-num-tokens"] == 255
    assert leftovers(project.root / "build") == []


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_full_disk_during_compile_is_a_clean_error_with_nothing_partial(project):
    project.doit("bundle")
    good = snapshot(project.bundle())
    victim = project.build_dir() / "bin" / BIN2
    limit = victim.stat().st_size // 2   # room for the DB, logs and digests, not for this bin
    victim.unlink()

    # The limit set in a small Python that then execs doit (both survive exec): a preexec_fn
    # would force fork(), which gRPC loaded in this worker can crash (conftest.py).
    small_disk = ("import os, resource, signal, sys\n"
                  "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG\n"
                  f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
                  "os.execv(sys.executable, [sys.executable, '-m', 'doit', 'bundle'])")
    proc = subprocess.run([sys.executable, "-c", small_disk], cwd=project.root,
                          capture_output=True, text=True, timeout=600)
    run = DoitRun(proc.returncode, proc.stdout, proc.stderr)
    assert run.code != 0
    assert f"bin/{BIN2}: cannot write it (File too large); free disk space" in run.out, run.out
    no_traceback(run)
    assert not victim.exists() and leftovers(project.root / "build") == []
    assert snapshot(project.bundle()) == good

    again = project.doit("bundle")   # the same bytes again, as a new file: the bundle relinks
    assert again.executed == {"compile:part_2_of_4", "bundle"}
    assert f"bundle/{BIN2} is no longer a hard link to" in again.out
    assert os.path.samefile(victim, project.bundle() / BIN2)
    assert snapshot(project.bundle()) == good


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_ctrl_c_stops_cleanly_and_the_next_run_resumes(project, tmp_path):
    held = Held(project, ["bundle"], pause_at="compile", tmp=tmp_path / "held")
    held.wait_paused()
    held.proc.send_signal(signal.SIGINT)
    stopped = held.finish()
    assert stopped.code != 0
    assert "hexbundle: interrupted" in stopped.err
    no_traceback(stopped)
    assert leftovers(project.root / "build") == [], "Ctrl-C left a temp file"
    done = finished_tasks(stopped.out)

    rerun = project.doit("bundle")
    assert not done & rerun.executed, "finished steps ran again"
    assert rerun.executed and "left by an interrupted run" not in rerun.err


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_an_unreadable_dependency_db_is_set_aside_and_the_build_redone(project):
    project.doit("bundle")
    good = snapshot(project.bundle())
    db = project.doit_db()
    db.write_text(db.read_text()[:100])   # as a killed in-place writer would leave it
    run = project.doit("bundle")
    assert "doit-db.json was unreadable" in run.err and "set aside" in run.err
    assert "bundle" in run.executed
    # the model's DB still vouches for its inputs: they are not generated again
    assert not [t for t in run.executed if t.startswith("inputs")], run.out
    assert snapshot(project.bundle()) == good
    assert project.doit("bundle").executed == set()


def test_dependency_db_writes_are_atomic(tmp_path, capsys, monkeypatch):
    from hexbundle.graph import db as durable
    from hexbundle.graph.db import DbSaveError, DurableJsonDB
    monkeypatch.setattr(durable, "_reported_db_failure", False)

    class FailingCodec:
        def encode(self, data):
            raise OSError(28, "No space left on device")

        def decode(self, text):
            return json.loads(text)

    path = tmp_path / "doit-db.json"
    path.write_text('{"task": {"k": 1}}')
    db = DurableJsonDB(str(path), codec=FailingCodec())
    db.set("task", "k", 2)
    with pytest.raises(DbSaveError, match=r"cannot save the dependency DB .*doit-db"
                       r"\.json \(No space left on device; \d+ KiB free .*free some disk space"):
        db.save()
    assert json.loads(path.read_text()) == {"task": {"k": 1}}   # doit's own dump: empty file
    assert list(tmp_path.iterdir()) == [path]
    with pytest.raises(SystemExit) as stop:   # doit's last save (Dependency.close): one message
        db.dump()
    assert stop.value.code == 3
    assert capsys.readouterr().err.startswith("hexbundle: cannot save the dependency DB ")
    assert json.loads(path.read_text()) == {"task": {"k": 1}}


def test_an_interrupted_swap_gets_the_previous_bundle_back(tmp_path):
    build = tmp_path / "build"
    old = build / "m" / "d" / ".bundle.4242.0123456789ab.old"   # swap_in's name for it
    old.mkdir(parents=True)
    (old / "manifest.json").write_text("{}")
    nested = build / "release-work"       # another build root: its own runs clean it
    (nested / ".hexbundle").mkdir(parents=True)
    (nested / ".x.bin.4242.0123456789ab.tmp").write_text("partial")
    assert recovery.restore_interrupted_swaps(build, tmp_path) == [build / "m" / "d" / "bundle"]
    assert (build / "m" / "d" / "bundle" / "manifest.json").read_text() == "{}"
    assert recovery.sweep_temp_files(build, tmp_path) == []
    assert (nested / ".x.bin.4242.0123456789ab.tmp").exists()


def test_swap_in_replaces_the_bundle_whole(tmp_path):
    final, staging = tmp_path / "bundle", tmp_path / ".bundle.new"
    final.mkdir()
    (final / "a").write_text("old")
    staging.mkdir()
    (staging / "a").write_text("new")
    swap_in(staging, final)
    assert (final / "a").read_text() == "new" and sorted(tmp_path.iterdir()) == [final]

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "which").write_text("a")
    if not exchange_dirs(a, b):
        pytest.skip("this kernel or file system has no RENAME_EXCHANGE (two renames are used)")
    assert (b / "which").read_text() == "a" and not (a / "which").exists()


# ---------------------------------------------------------------------------------------------
# one temp-name scheme (support.atomic): what every writer leaves when killed is swept, and
# nothing else is

def test_temp_names_name_their_target_and_are_never_a_targets_own_name():
    from hexbundle.support.atomic import displaced_target, temp_name
    for target in ("x.bin", "bundle", "offline-kit.tar", ".digests.json", "a.1.0123456789ab.tmp"):
        assert is_temp_name(temp_name(target)) and is_temp_name(temp_name(target, "old"))
        assert displaced_target(temp_name(target, "old")) == target
        assert displaced_target(temp_name(target)) is None
        assert temp_name(target) != temp_name(target)
    assert not is_temp_name("bundle") and not is_temp_name("offline-kit.tar")


def killed(writer, die_at_rename: int = 0) -> None:
    """Run writer() in a forked process and SIGKILL it: where the writer kills itself, or, with
    die_at_rename=n, at its n-th rename (os.replace / os.rename), before that rename happens."""
    pid = os.fork()
    if pid == 0:   # the writer's process: it must not return into pytest
        try:
            if die_at_rename:
                calls = []

                def dying(real):
                    def call(*args, **kwargs):
                        calls.append(args)
                        if len(calls) >= die_at_rename:
                            os.kill(os.getpid(), signal.SIGKILL)
                        return real(*args, **kwargs)
                    return call
                os.replace, os.rename = dying(os.replace), dying(os.rename)
            writer()
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
        f"{writer.__name__} was not killed mid-write (status {status})"


def tree(build: Path) -> dict:
    """relative path -> bytes (files) or None (directories), everything under build/."""
    out = {}
    for path in sorted(build.rglob("*")):
        out[path.relative_to(build).as_posix()] = None if path.is_dir() else path.read_bytes()
    return out


def test_every_writers_temp_names_are_swept_after_a_kill_and_nothing_else(tmp_path):
    from doit.dependency import JSONCodec

    from hexbundle.backends import qairt
    from hexbundle.bench import benchmark
    from hexbundle.formats.container import ContainerWriter
    from hexbundle.inputs import synthetic
    from hexbundle.release import offline_kit
    from hexbundle.support import atomic, hashing
    from hexbundle.toolchain import wheelhouse

    build = tmp_path / "build"
    d = build / "m" / "d"
    for sub in ("bin", "dlc", "inputs", "bundle"):
        (d / sub).mkdir(parents=True)
    (d / "bundle" / "manifest.json").write_text('{"old": true}')
    (build / "m" / "e" / "bundle").mkdir(parents=True)
    (build / "m" / "e" / "bundle" / "manifest.json").write_text('{"old": "e"}')
    data = d / "inputs" / "prompt.data"
    data.write_bytes(b"\1" * 4096)
    variant_db = build / ".hexbundle" / "db" / "m" / "d" / "p" / "b" / "doit-db.json"
    variant_db.parent.mkdir(parents=True)
    variant_db.write_text('{"task": {"k": 1}}')
    (build / "wheelhouse").mkdir()
    (build / "bench").mkdir()
    wheel = build / "wheelhouse" / "pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK wheel")
    (build / "offline-kit" / "source").mkdir(parents=True)
    (build / "offline-kit" / "source" / "dodo.py").write_text("# kit\n")
    # Names like ours, or like the schemes before it, that are not temp names: never touched.
    for name in (".notes.tmp", "notes.tmp", ".x.bin.tmp-12", ".x.bin.link-12", ".tmp-12-x.bin",
                 "x.bin.123.0123456789ab.tmp", ".x.bin.123.0123456789AB.tmp",
                 ".x.bin.123.0123456789a.tmp", ".x.bin.12a.0123456789ab.tmp",
                 ".x.bin.123.0123456789ab.tmp.bin", ".x.bin.123.0123456789ab.older"):
        (d / "bin" / name).write_text("keep")
    for name in (".bundle.abc123", ".bundle-old.abc123", ".qairt-tmp-abc123"):
        (d / name).mkdir()
        (d / name / "keep").write_text("keep")
    before = tree(build)

    def generic_json():   # atomic_output: write_atomic / write_json (configs, reports, records)
        atomic.write_json(d / "build-info.json", {"executor": "local"})

    def container_bin():   # formats.container: a DLC / context binary streamed blob by blob
        with ContainerWriter(d / "bin" / "x.bin", b"HBTEST\0\0") as writer:
            writer.add_blob("w", [b"\2" * 5000])
            os.kill(os.getpid(), signal.SIGKILL)

    def bundle_staging():   # steps.bundle: the staging directory, complete, not swapped in
        with atomic.staged_dir(d / "bundle") as staging:
            (staging / "manifest.json").write_text('{"new": true}')
            os.kill(os.getpid(), signal.SIGKILL)

    def bundle_swap_cut_in_half():   # swap_in without RENAME_EXCHANGE, killed between renames
        atomic.exchange_dirs = lambda a, b: False
        with atomic.staged_dir(build / "m" / "e" / "bundle") as staging:
            (staging / "manifest.json").write_text('{"new": "e"}')

    def synthetic_input():   # inputs.synthetic (and inputs.generate's streamed .data): open_input_file
        synthetic.write_input_file(d / "inputs" / "prompt.onnx", b"onnx")

    def qairt_outputs():   # backends.qairt: the SDK's save path and its scratch directory
        with qairt.output_file(d / "dlc" / "g.dlc") as tmp, qairt.scratch_dir(d / "dlc") as s:
            (s.tmp / "sdk-scratch").write_text("scratch")   # the SDK's working dir
            (s.save / "g.dlc").write_text("dlc")
            tmp.write_text("dlc")
            os.kill(os.getpid(), signal.SIGKILL)

    def digest_cache():   # support.hashing: the digest cache, saved after a new digest
        hashing.DigestCache(build / ".hexbundle" / "digests.json").digest(data)

    def doit_db():   # graph.db.DurableJsonDB: doit's dependency DB
        from hexbundle.graph.db import DurableJsonDB
        db = DurableJsonDB(str(variant_db), codec=JSONCodec())
        db.set("task", "k", 2)
        db.save()

    def wheelhouse_sums():   # toolchain.wheelhouse: SHA256SUMS (write_lock: the same call)
        wheelhouse.write_sums(build / "wheelhouse", [wheel])

    def wheelhouse_resolve():   # toolchain.wheelhouse.lock: pip downloads into a scratch dir
        def pip_download(tc, dest, requirements, extra):
            (dest / "dep-2.0-py3-none-any.whl").write_bytes(b"PK half")
            os.kill(os.getpid(), signal.SIGKILL)
        wheelhouse.pip_download = pip_download
        tc = type("Tc", (), {"wheelhouse": build / "wheelhouse", "requirements": Path("x.in")})
        wheelhouse.lock(tc)

    def bench_results():   # bench.benchmark: results.json
        benchmark.write_results({"rows": []}, build / "bench" / "results.json")

    def offline_kit_tar():   # release.offline_kit: offline-kit.tar (was offline-kit.tar.tmp)
        offline_kit.write_tar(build / "offline-kit", build / "offline-kit.tar")

    def offline_kit_staging():   # release.offline_kit.make_kit: the kit directory being filled
        with atomic.staged_dir(build / "offline-kit", mode=0o777) as staging:
            (staging / "kit.json").write_text("{}")
            os.kill(os.getpid(), signal.SIGKILL)

    writers = [(generic_json, 1), (container_bin, 0), (bundle_staging, 0),
               (bundle_swap_cut_in_half, 2), (synthetic_input, 1),
               (qairt_outputs, 0), (digest_cache, 1), (doit_db, 1), (wheelhouse_sums, 1),
               (wheelhouse_resolve, 0), (bench_results, 1), (offline_kit_tar, 1),
               (offline_kit_staging, 0)]
    left = set()
    for writer, die_at_rename in writers:
        killed(writer, die_at_rename)
        now = set(leftovers(build))
        assert now - left, f"{writer.__name__} left no temp name: the kill missed the write"
        left = now
    assert not (build / "m" / "e" / "bundle").exists()   # the swap really was cut in half
    assert any(p.name.startswith(".offline-kit.tar.") for p in left)

    assert recovery.restore_interrupted_swaps(build, tmp_path) == [build / "m" / "e" / "bundle"]
    removed = recovery.sweep_temp_files(build, tmp_path)
    assert leftovers(build) == []
    assert set(removed) == {p for p in left if not p.name.endswith(".old")}
    assert tree(build) == before   # every target as it was, every other file untouched


# ---------------------------------------------------------------------------------------------
# two runs at once

@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_second_run_waits_for_the_first_and_never_corrupts_the_db(project, tmp_path):
    first = Held(project, ["bundle"], pause_at="compile", tmp=tmp_path / "first")
    first.wait_paused()
    second = Held(project, ["bundle"], tmp=tmp_path / "second")
    second.wait_for(lambda: "waiting for another hexbundle run" in second.text(), "wait message")
    assert f"(pid {first.proc.pid}) on build/" in second.text()

    refused = project.doit("bundle", env={"HEXBUNDLE_LOCK_TIMEOUT": "0"}, check=False)
    assert refused.code == 3
    assert (f"another hexbundle run (pid {first.proc.pid}) is using build/ (lock "
            "build/.hexbundle/lock); wait for it to finish") in refused.err
    no_traceback(refused)
    assert project.doit("list").code == 0   # read-only commands do not wait

    first.release()
    assert first.finish().code == 0
    later = second.finish()
    assert later.code == 0 and later.executed == set(), later.out
    json.loads(project.doit_db().read_text())
    assert project.doit("bundle").executed == set()


# ---------------------------------------------------------------------------------------------
# bad inputs, through doit, on an exported copy of the tiny model

EXPORT = "qwen2-tiny-export"
P2, T2 = "prompt_ar128_cl256_2_of_4", "token_ar1_cl256_2_of_4"
D2 = "part_2_of_4"   # the part's one data file, recorded by both graphs


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return tiny_as_export(tmp_path_factory.mktemp("exported") / "proj", EXPORT)


@contextmanager
def restored(project):
    """Undo whatever a case does to the export and the configs."""
    watched = [project.root / "exports", project.root / "configs"]
    saved = {p: p.read_bytes() for d in watched for p in d.rglob("*") if p.is_file()}
    try:
        yield
    finally:
        for d in watched:
            for p in d.rglob("*"):
                if p.is_file() and p not in saved:
                    p.unlink()
        for p, data in saved.items():
            if not p.exists() or p.read_bytes() != data:
                p.write_bytes(data)


def _ex(project, name):
    return project.root / "exports" / "qwen2-tiny" / name


def _edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))   # NaN / Infinity are written as JSON's NaN / Infinity


def _param(data, name):
    return next(e for e in data["param_encodings"] if e["name"] == name)


def _edit_text(path, old, new):
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def _set_scale(value):
    return lambda p: _edit_json(_ex(p, f"{P2}.encodings"), lambda d: _param(
        d, "model.layers.0.self_attn.v_proj.weight")["scale"].__setitem__(0, value))


MODEL_TOML = f"configs/models/{EXPORT}.toml"
BAD_INPUTS = {
    "onnx-truncated": (lambda p: _ex(p, f"{P2}.onnx").write_bytes(_ex(p, f"{P2}.onnx").read_bytes()[:4000]),
                       [f"{P2}.onnx: cannot parse ONNX model", "re-export it"]),
    "onnx-garbage": (lambda p: _ex(p, f"{P2}.onnx").write_bytes(bytes(range(256)) * 16),
                     [f"{P2}.onnx: cannot parse ONNX model", "re-export it"]),
    "data-missing": (lambda p: _ex(p, f"{D2}.data").unlink(),
                     [f"exports/qwen2-tiny/{D2}.data", "How to produce them"]),
    "data-short": (lambda p: _ex(p, f"{D2}.data").write_bytes(_ex(p, f"{D2}.data").read_bytes()[:100000]),
                   ["_2_of_4.onnx: tensor 'model.layers.0.self_attn.v_proj.weight'", "has only 100000",
                    "truncated or from another export"]),
    "encodings-malformed": (lambda p: _ex(p, f"{P2}.encodings").write_text('{"version": "1.0.0",'),
                            [f"{P2}.encodings: not valid JSON", "re-export the encodings"]),
    "encodings-lack-a-weight": (
        lambda p: _edit_json(_ex(p, f"{P2}.encodings"), lambda d: d["param_encodings"].remove(
            _param(d, "model.layers.0.self_attn.o_proj.weight"))),
        [f"{P2}.encodings: no int encoding for weight 'model.layers.0.self_attn.o_proj.weight'",
         "re-export the encodings with this layer quantized"]),
    "encodings-name-unknown-tensor": (
        lambda p: _edit_json(_ex(p, f"{P2}.encodings"), lambda d: d["param_encodings"].append(
            {**d["param_encodings"][0], "name": "model.layers.9.mlp.up_proj.weight"})),
        [f"{P2}.encodings: param encoding for 'model.layers.9.mlp.up_proj.weight'",
         "the encodings belong to another export"]),
    "encodings-bitwidth-3": (
        lambda p: _edit_json(_ex(p, f"{P2}.encodings"), lambda d: _param(
            d, "model.layers.0.self_attn.v_proj.weight").update(bw=3)),
        ["('model.layers.0.self_attn.v_proj.weight'): key 'bw' is 3", "one of 4, 8, 16 bits"]),
    "scale-zero": (_set_scale(0.0), ["v_proj.weight'): key 'scale' channel 0 is 0.0",
                                     "finite, > 0"]),
    "scale-negative": (_set_scale(-0.5), ["v_proj.weight'): key 'scale' channel 0 is -0.5"]),
    "scale-nan": (_set_scale(math.nan), ["v_proj.weight'): key 'scale' channel 0 is NaN"]),
    "scale-infinite": (_set_scale(math.inf), ["v_proj.weight'): key 'scale' channel 0 is Infinity"]),
    "shared-weight-differs": (
        lambda p: scale_weight(own_data_copy(_ex(p, f"{T2}.onnx")), "model.layers.0.mlp.up_proj.weight", 0.5),
        [(f"{BIN2}: weight sharing is on, but tensor 'model.layers.0.mlp.up_proj.weight' differs "
          f"between graphs '{P2}' and '{T2}'"), "exported with the same weights"]),
    "tokenizer-missing": (lambda p: _ex(p, "tokenizer.json").unlink(),
                          ["exports/qwen2-tiny/tokenizer.json", "no export writes it; it is the "
                           "model's own tokenizer.json from its Hugging Face repository"]),
    "tokenizer-invalid": (lambda p: _ex(p, "tokenizer.json").write_text("{]"),
                          ["tokenizer.json: not a valid tokenizer.json",
                           "replace it with the model's Hugging Face tokenizer.json"]),
    "tokenizer-lacks-special": (
        lambda p: _edit_json(_ex(p, "tokenizer.json"), lambda d: d["added_tokens"].pop()),
        ["tokenizer.json: special token '<|endoftext|>' (eot", "fix that table"]),
    "config-typo": (lambda p: _edit_text(p.root / "configs/build.toml", "backend =", "backedn ="),
                    ["configs/build.toml: unknown key 'backedn' (did you mean 'backend'?)"]),
    "config-wrong-type": (lambda p: _edit_text(p.root / MODEL_TOML, "num_layers = 4", 'num_layers = "4"'),
                          [f"{MODEL_TOML}: key 'architecture.num_layers' is str '4'; expected an integer"]),
    "config-not-utf8": (lambda p: (p.root / MODEL_TOML).write_bytes(b"\xff\xfe[model]\n"),
                        [f"{MODEL_TOML}: not UTF-8 text", "save it as UTF-8 TOML"]),
    "config-unknown-device": (
        lambda p: _edit_text(p.root / "configs/build.toml", 'device = "iq9075"', 'device = "iq9999"'),
        ["configs/build.toml: device = 'iq9999': unknown device 'iq9999'; known: iq9075, qcm6690",
         "configs/boards, chipsets in"]),
    "config-soc-arch-mismatch": (
        lambda p: _edit_text(p.root / "configs/devices.toml",
                             'soc_model = 77\ndsp_arch = "v73"', 'soc_model = 77\ndsp_arch = "v75"'),
        ["configs/devices.toml: chipset.qcs9075: soc_model 77 with dsp_arch v75 is not what "
         "Qualcomm's chipset table says (it gives qualcomm-qcs9075 soc_model 77, v73",
         "regenerate the table with scripts/make_devices.py"]),
    "config-graph-names-out-of-order": (
        lambda p: (_edit_text(p.root / MODEL_TOML, "num_layers = 4", "num_layers = 10"),
                   _edit_text(p.root / MODEL_TOML, "layers_per_part = [0, 2, 1, 1]",
                              "layers_per_part = [0, 4, 3, 3]\n\n[plans.eleven]\n"
                              "layers_per_part = [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]")),
        ["plan 'eleven'", "Graph names must sort in pipeline order", "use fewer than 10 parts"],
        ("plan=eleven",)),
    "config-inputs-outside-project": (
        lambda p: _edit_text(p.root / MODEL_TOML, 'dir = "exports/qwen2-tiny"', 'dir = "../../etc"'),
        [f"{MODEL_TOML}: key 'inputs.dir' = '../../etc' points outside the project"]),
    "config-inputs-in-build": (
        lambda p: _edit_text(p.root / MODEL_TOML, 'dir = "exports/qwen2-tiny"',
                             'dir = "build/qwen2-tiny/inputs"'),
        [(f"{MODEL_TOML}: key 'inputs.dir' = 'build/qwen2-tiny/inputs' is inside the build "
          "directory"), "keep the export elsewhere"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_fails_cleanly_and_keeps_the_good_bundle(exported, case):
    mutate, expected, *extra = BAD_INPUTS[case]
    with restored(exported):
        mutate(exported)
        run = exported.doit("bundle", f"model={EXPORT}", *(extra[0] if extra else ()),
                            check=False)
    text = run.out + run.err
    assert run.code != 0, text
    for fragment in expected:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
    no_traceback(run)
    assert snapshot(exported.bundle(EXPORT)) == exported.good


def test_unknown_model_on_the_command_line(exported):
    run = exported.doit("bundle", "model=qwen4-tiny", check=False)
    assert run.code == 3
    assert "command line: model = 'qwen4-tiny': unknown model 'qwen4-tiny'" in run.err
    known = run.err.split("known: ", 1)[1].strip().split(", ")
    assert "qwen2-tiny" in known and known == sorted(known), run.err
    no_traceback(run)


def test_after_the_bad_inputs_the_export_builds_again(exported):
    exported.doit("bundle", f"model={EXPORT}")
    assert snapshot(exported.bundle(EXPORT)) == exported.good


# ---------------------------------------------------------------------------------------------
# file-level fuzzing: never a traceback, always a clean error

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300),
                 st.text(alphabet='[]{}=,."\'#\n\t abcdez019_-+:', max_size=200)
                 .map(lambda t: t.encode())))
def test_fuzz_any_bytes_as_a_toml_config(tmp_path, raw):
    path = tmp_path / "build.toml"
    path.write_bytes(raw)
    try:
        read_toml(path, BUILD_SCHEMA)
    except ConfigError as exc:
        assert str(path) in str(exc)


def test_deeply_nested_toml_is_a_config_error(tmp_path):
    path = tmp_path / "build.toml"
    path.write_text("model = " + "[" * 1000 + "]" * 1000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        read_toml(path, BUILD_SCHEMA)


TOML_LITERALS = ['"x"', '""', "-1", "0", "3", "1e309", "inf", "nan", "true", "[]", '[1, "a"]',
                 "{}", "{a = 1}", "1979-05-27", '"../../etc"', "99999999999999999999", '"v99"',
                 "[0, 1]", '"iq9075"', "0.5"]


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzzcfg")
    shutil.copytree(Path(__file__).resolve().parent.parent / "configs", root / "configs")
    return root


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(file=st.sampled_from(["build.toml", "models/qwen2-tiny.toml", "boards/iq9075.toml",
                             "devices.toml"]),
       edits=st.lists(st.tuples(st.integers(0, 200), st.sampled_from(TOML_LITERALS + ["<drop>"])),
                      min_size=1, max_size=3))
def test_fuzz_edited_configs_only_raise_config_errors(fuzz_root, file, edits):
    """Real config files with values replaced or lines dropped: load, or a ConfigError."""
    path = fuzz_root / "configs" / file
    original = path.read_text()
    lines = original.splitlines()
    for index, literal in edits:
        i = index % len(lines)
        if literal == "<drop>":
            lines[i] = ""
        elif "=" in lines[i] and not lines[i].lstrip().startswith("#"):
            lines[i] = lines[i].split("=", 1)[0] + "= " + literal
    path.write_text("\n".join(lines) + "\n")
    try:
        load_build(fuzz_root)
    except ConfigError:
        pass
    finally:
        path.write_text(original)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), min_size=1, max_size=4))
def test_fuzz_corrupted_encodings_file(built, tmp_path, flips):
    """A real encodings file with a few bytes changed: loads, or an EncodingsError naming it."""
    src = built.root / "build" / "qwen2-tiny" / "inputs" / f"{P2}.encodings"
    data = bytearray(src.read_bytes())
    for offset, xor in flips:
        data[offset % len(data)] ^= xor
    path = tmp_path / "fuzz.encodings"
    path.write_bytes(bytes(data))
    try:
        load_encodings(path)
    except EncodingsError as exc:
        assert str(path) in str(exc)
