"""Issue 14, items 7, 8 (the doit DB, bundle/) and 9: the build root is checked and only a root
hexbundle made is cleaned up; state of the wrong shape is set aside with one line; a full disk
under the DB, a bad lock timeout, `doit dumpdb` and an ONNX onnxruntime refuses are messages,
never tracebacks. Real `doit` runs in a copy of the project."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, copy_project

STATE = Path("build") / ".hexbundle"


def no_traceback(run) -> None:
    assert "Traceback" not in run.out + run.err, run.out + run.err


@pytest.fixture
def built_copy(tmp_path):
    proj = copy_project(tmp_path / "proj")
    proj.doit("bundle")
    return proj


# ---------------------------------------------------------------------------------------------
# 7. the build root

@pytest.mark.parametrize("where", ["/", "home", "project", "parent"])
def test_a_build_root_that_is_not_a_build_directory_is_refused(tmp_path, where):
    proj = copy_project(tmp_path / "proj")
    home = tmp_path / "home"
    home.mkdir()
    root = {"/": "/", "home": str(home), "project": str(proj.root),
            "parent": str(proj.root.parent)}[where]
    run = proj.doit("bundle", env={"HEXBUNDLE_BUILD_ROOT": root, "HOME": str(home)},
                    check=False)
    assert run.code == 3, run.out + run.err
    assert f"HEXBUNDLE_BUILD_ROOT={root}: build root" in run.err, run.err
    no_traceback(run)
    assert not (Path(root) / ".hexbundle").exists()


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_shared_scratch_directory_is_never_swept(tmp_path):
    proj = copy_project(tmp_path / "proj")
    shared = tmp_path / "scratch"
    shared.mkdir()
    # another program's files, named like ours by chance
    (shared / ".x.123.0123456789ab.tmp").write_text("theirs")
    (shared / ".bundle.4242.0123456789ab.old").mkdir()
    (shared / ".bundle.4242.0123456789ab.old" / "keep").write_text("theirs")
    (shared / ".bundle.4242.0123456789ab.tmp").mkdir()
    before = sorted(p.relative_to(shared) for p in shared.rglob("*"))
    env = {"HEXBUNDLE_BUILD_ROOT": str(shared)}
    for command in ("bundle", "check_sizes"):
        run = proj.doit(command, env=env)
        assert "is not a build root hexbundle made" in run.err, run.err
        after = {p.relative_to(shared) for p in shared.rglob("*")}
        assert set(before) <= after, set(before) - after
    assert not (shared / "bundle").exists()   # their .old directory was not "put back"
    assert not (shared / ".hexbundle" / "build-root.json").exists()


def test_a_copied_build_root_marker_vouches_for_nothing(tmp_path):
    """Issue 26, item 3: a build-root.json copied into a shared directory made the sweep delete
    the user's files named like temp files. The marker names the root it was written for."""
    proj = copy_project(tmp_path / "proj")
    proj.doit("bundle")
    shared = tmp_path / "shared"
    (shared / ".hexbundle").mkdir(parents=True)
    shutil.copy2(proj.root / "build" / ".hexbundle" / "build-root.json",
                 shared / ".hexbundle" / "build-root.json")
    theirs = [shared / ".notes.txt.123.0123456789ab.tmp", shared / ".a.4242.0123456789ab.tmp",
              shared / "data" / ".b.77.0123456789ab.tmp"]
    for path in theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("theirs")
    run = proj.doit("bundle", env={"HEXBUNDLE_BUILD_ROOT": str(shared)})
    assert all(p.read_text() == "theirs" for p in theirs), run.err
    assert "is not a build root hexbundle made" in run.err, run.err


def test_a_new_build_root_is_marked_and_cleaned_up(tmp_path):
    proj = copy_project(tmp_path / "proj")
    scratch = tmp_path / "new-root"
    env = {"HEXBUNDLE_BUILD_ROOT": str(scratch)}
    proj.doit("bundle", env=env)
    assert json.loads((scratch / ".hexbundle" / "build-root.json").read_text())["hexbundle"]
    variant = scratch / "qwen2-tiny" / "iq9075" / "four" / "reference"
    left = variant / "bin" / ".x.bin.4242.0123456789ab.tmp"
    left.write_text("left by a killed run")
    run = proj.doit("bundle", env=env)
    assert not left.exists() and "left by an interrupted run" in run.err
    assert "not a build root hexbundle made" not in run.err


# ---------------------------------------------------------------------------------------------
# 8. the doit DB and bundle/ of the wrong shape

@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("key, value", [(None, ["not", "a", "record"]), ("_values_:", [1]),
                                        ("deps:", 5)])
def test_a_db_record_of_another_type_is_set_aside_and_the_run_carries_on(built_copy, key, value):
    db = built_copy.doit_db()
    data = json.loads(db.read_text())
    if key is None:
        data["bundle"] = value
    else:
        data["bundle"][key] = value
    db.write_text(json.dumps(data))
    run = built_copy.doit("bundle")
    no_traceback(run)
    lines = [ln for ln in run.err.splitlines() if "wrong shape" in ln]
    assert len(lines) == 1 and "doit-db.json" in lines[0] and "(bundle)" in lines[0], run.err
    assert run.executed == {"bundle"}   # the other records were kept
    assert (db.parent / "doit-db.json.damaged").is_file()
    assert built_copy.doit("bundle").executed == set()


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_directory_in_place_of_the_db_is_set_aside(built_copy):
    db = built_copy.doit_db()
    db.unlink()
    db.mkdir()
    (db / "x").write_text("x")
    run = built_copy.doit("bundle")
    no_traceback(run)
    assert "doit-db.json was a directory" in run.err and "set aside" in run.err, run.err
    assert db.is_file() and (db.parent / "doit-db.json.damaged" / "x").is_file()
    assert built_copy.doit("bundle").executed == set()


def test_a_bundle_symlink_is_set_aside_and_the_bundle_rebuilt(built_copy, tmp_path):
    bundle = built_copy.bundle()
    elsewhere = tmp_path / "elsewhere"
    shutil.move(bundle, elsewhere)
    bundle.symlink_to(elsewhere)
    good = sorted(p.name for p in elsewhere.iterdir())
    run = built_copy.doit("bundle")
    no_traceback(run)
    assert "bundle was a symlink" in run.err and "bundle.link" in run.err, run.err
    assert bundle.is_dir() and not bundle.is_symlink()
    assert sorted(p.name for p in bundle.iterdir()) == good
    assert sorted(p.name for p in elsewhere.iterdir()) == good   # the link's target: untouched
    assert built_copy.doit("bundle").executed == set()


# ---------------------------------------------------------------------------------------------
# 9. tracebacks that are messages

@pytest.mark.parametrize("value", ["nan", "inf", "-1", "soon"])
def test_a_bad_lock_timeout_is_refused_naming_the_variable(tmp_path, value):
    proj = copy_project(tmp_path / "proj")
    run = proj.doit("bundle", env={"HEXBUNDLE_LOCK_TIMEOUT": value}, check=False)
    assert run.code == 3
    assert f"HEXBUNDLE_LOCK_TIMEOUT={value!r}" in run.err, run.err
    no_traceback(run)


def test_doit_dumpdb_prints_the_json_db(built_copy):
    shutil.copy2(ROOT / "pyproject.toml", built_copy.root)   # where the command is registered
    run = built_copy.doit("dumpdb")
    assert "doit-db.json: " in run.out and "\nbundle -> {" in run.out, run.out
    # every DB of the build root: the model's (its inputs steps) and the variant's
    assert f"dependency DB {built_copy.model_db()}: 5 task(s)\n" in run.out, run.out
    assert f"dependency DB {built_copy.doit_db()}: 18 task(s)\n" in run.out, run.out
    no_traceback(run)
    built_copy.doit_db().write_text("[1]")
    bad = built_copy.doit("dumpdb", check=False)
    assert bad.code == 3 and "not a dependency DB" in bad.err
    no_traceback(bad)


def _mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_full_disk_under_the_db_is_a_message_and_the_next_run_resumes(built_copy, tmp_path):
    state = built_copy.root / STATE
    saved = tmp_path / "state"
    shutil.copytree(state, saved)
    # Room for the state as built (in tmpfs pages) and a little more: the filler takes the rest
    pages = sum(-(-f.stat().st_size // 4096) for f in saved.rglob("*") if f.is_file())
    if not _mount_tmpfs(state, f"{(pages + 16) * 4}k"):
        pytest.skip("needs root and tmpfs mounts (a small file system under build/.hexbundle)")
    try:
        shutil.copytree(saved, state, dirs_exist_ok=True)
        fd = os.open(state / "filler", os.O_WRONLY | os.O_CREAT)   # no room for a new DB
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        (built_copy.build_dir() / "bin" / "qwen2_tiny_part_2_of_4.bin").unlink()
        run = built_copy.doit("bundle", check=False)
        assert run.code == 3, run.out + run.err
        no_traceback(run)
        msg = [ln for ln in run.err.splitlines() if "cannot save the dependency DB" in ln]
        assert len(msg) == 1 and "doit-db.json (No space left on device;" in msg[0], run.err
        assert "KiB free" in msg[0] and "free some disk space" in msg[0]
        assert json.loads(built_copy.doit_db().read_text())   # the last saved DB, whole
    finally:
        shutil.copytree(state, saved, dirs_exist_ok=True, ignore=lambda d, names: ["filler"])
        subprocess.run(["umount", str(state)], check=True)
    shutil.rmtree(state)
    shutil.copytree(saved, state)
    again = built_copy.doit("bundle")
    no_traceback(again)
    assert built_copy.doit("bundle").executed == set()


def test_an_onnx_onnxruntime_refuses_is_a_verify_error_naming_it(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from hexbundle.runtime.onnx_graph import OnnxGraph
    from hexbundle.support.errors import VerifyError

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / "refused.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    import numpy as np
    with pytest.raises(VerifyError, match=r"refused\.onnx: onnxruntime .* refused the float ONNX"):
        OnnxGraph(path).run({"x": np.zeros((1, 4), np.float32)})


def test_doit_verify_when_onnxruntime_refuses_the_float_onnx(built_copy):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    path = built_copy.root / "build/qwen2-tiny/inputs/prompt_ar128_cl256_1_of_4.onnx"
    model = onnx.load(str(path), load_external_data=False)
    # An opset of a domain no node uses: onnx.checker and the build's own validation take it
    # (the bundle is rebuilt from it), onnxruntime refuses to load the model. (An ai.onnx opset
    # 99 no longer gets this far: the convert step refuses it, tests/test_validate_inputs.py.)
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 99))
    onnx.save(model, str(path))
    run = built_copy.doit("verify", check=False)
    assert run.code != 0
    no_traceback(run)
    assert "convert:part_1_of_4_prompt" in run.out   # rebuilt from the tampered file
    text = run.out + run.err
    assert f"verify failed: {path}: onnxruntime " in text and "refused the float ONNX" in text, \
        text


# ---------------------------------------------------------------------------------------------
# issue 26, item 7: state of the wrong shape is a message or set aside, never a traceback

NESTED = "[" * 100000 + "]" * 100000   # past the JSON parser's recursion limit
VARIANT_DB = STATE / "db" / "qwen2-tiny" / "iq9075" / "four" / "reference" / "doit-db.json"


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("where, says", [
    (STATE / "digests.json", "digests.json is not a JSON object: set aside"),
    (VARIANT_DB, "reference/doit-db.json was unreadable (damaged outside hexbundle?); set aside"),
    (STATE / "db" / "qwen2-tiny" / "doit-db.json",
     "qwen2-tiny/doit-db.json was unreadable (damaged outside hexbundle?); set aside"),
], ids=["digest-cache", "variant-db", "model-db"])
def test_deeply_nested_json_state_is_set_aside_and_the_run_carries_on(built_copy, where, says):
    (built_copy.root / where).write_text(NESTED)
    run = built_copy.doit("bundle", check=False)
    no_traceback(run)
    assert run.code == 0 and says in run.err, run.out + run.err
    again = built_copy.doit("bundle")   # and every later run is as it should be
    assert not again.executed, again.out


def _replace(path: Path, make) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    make(path)


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("where, make, says", [
    (STATE / "lock", lambda p: p.mkdir(), "lock: hexbundle keeps a file there (the build lock), "
                                          "but it is a directory"),
    (STATE / "containers", lambda p: p.write_text("x"),
     "containers: hexbundle keeps a directory there (the records of the step containers), but "
     "it is a file"),
    (STATE / "db", lambda p: p.write_text("x"),
     "db: hexbundle keeps a directory there (the dependency DBs), but it is a file"),
    (STATE / "build-root.json", lambda p: p.mkdir(),
     "build-root.json: hexbundle keeps a file there (the mark of a build root hexbundle made), "
     "but it is a directory"),
], ids=["lock-a-directory", "containers-a-file", "db-a-file", "marker-a-directory"])
def test_state_of_the_wrong_kind_is_a_message(built_copy, where, make, says):
    _replace(built_copy.root / where, make)
    run = built_copy.doit("bundle", check=False)
    no_traceback(run)
    assert run.code == 3 and says in run.err, run.out + run.err
    assert "move it away or remove it" in run.err


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_symlinked_lock_is_never_written_through(built_copy, tmp_path):
    """Issue 26, item 4: the lock as a symlink overwrote its target."""
    victim = tmp_path / "precious.txt"
    victim.write_text("precious")
    _replace(built_copy.root / STATE / "lock", lambda p: p.symlink_to(victim))
    run = built_copy.doit("bundle", check=False)
    no_traceback(run)
    assert run.code == 3 and "(the build lock), but it is a symbolic link" in run.err, run.err
    assert victim.read_text() == "precious"


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_build_root_that_is_a_file_is_a_message(built_copy, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    run = built_copy.doit("bundle", env={"HEXBUNDLE_BUILD_ROOT": str(afile)}, check=False)
    no_traceback(run)
    assert run.code == 3 and "afile: hexbundle keeps a directory there (the build root), but it " \
        "is a file" in run.err, run.err


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_file_where_the_bundle_directory_belongs_is_replaced_by_the_bundle(built_copy):
    bundle = built_copy.bundle()
    shutil.rmtree(bundle)
    bundle.write_text("x")
    (built_copy.build_dir() / "bin" / "qwen2_tiny_part_1_of_4.bin").unlink()   # bundle reruns
    run = built_copy.doit("bundle", check=False)
    no_traceback(run)
    assert run.code == 0 and (bundle / "genie_config.json").is_file(), run.out + run.err


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("linked", ["bin", "dlc", "logs", "origins"])
def test_an_output_directory_linked_outside_the_build_root_is_refused(built_copy, tmp_path,
                                                                      linked):
    """Issue 26, item 4: a symlinked bin/ sent the bins outside the build root."""
    directory = built_copy.build_dir() / linked
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(directory), str(elsewhere))
    directory.symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    (built_copy.root / "build" / "qwen2-tiny" / "inputs" / "tokenizer.json").touch()
    run = built_copy.doit("bundle", check=False)
    no_traceback(run)
    assert run.code == 3, run.out + run.err
    assert f"{linked}: a symbolic link (to {elsewhere}) where hexbundle writes its outputs" \
        in run.err, run.err
    assert sorted(p.name for p in elsewhere.iterdir()) == before


# ---------------------------------------------------------------------------------------------
# issue 26, item 4: no state file is read or written through a symbolic link

MODEL_DB = STATE / "db" / "qwen2-tiny" / "doit-db.json"
# Bytes that read as each state file's own kind (a DB with one record, a cache of one entry of
# the wrong shape): a reader that follows the link takes them in; a writer replaces them.
OUTSIDE = b'{"outside-task": {}}\n'


def _outside_file(tmp_path: Path, name: str) -> Path:
    outside = tmp_path / "outside" / name
    outside.parent.mkdir(parents=True, exist_ok=True)
    outside.write_bytes(OUTSIDE)
    return outside


def _files(directory: Path) -> dict:
    """Each file under `directory`: its bytes and inode (a write through a link, or a rename over
    a file in a linked directory, changes one or the other)."""
    return {p.relative_to(directory): (p.read_bytes(), p.stat().st_ino)
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("where", [
    STATE / "digests.json", STATE / "code-imports.json", VARIANT_DB, MODEL_DB,
    STATE / "doit-db.json",
], ids=["digest-cache", "code-imports", "variant-db", "model-db", "former-db"])
def test_a_state_file_linked_outside_the_build_root_is_set_aside_unread(built_copy, tmp_path,
                                                                        where):
    outside = _outside_file(tmp_path, where.name)
    link = built_copy.root / where
    _replace(link, lambda p: p.symlink_to(outside))
    (built_copy.build_dir() / "bin" / "qwen2_tiny_part_2_of_4.bin").unlink()   # work to save
    run = built_copy.doit("bundle", check=False)
    no_traceback(run)
    assert run.code == 0, run.out + run.err
    assert outside.read_bytes() == OUTSIDE
    said = [ln for ln in run.err.splitlines() if where.name in ln and "set aside" in ln]
    assert len(said) == 1, run.err
    # the link itself was moved aside (kept, pointing where it did), never followed
    aside = [p for p in link.parent.iterdir() if p.is_symlink()]
    assert [os.readlink(p) for p in aside] == [str(outside)], run.err
    assert not link.is_symlink()
    assert "outside-task" not in (link.read_text() if link.is_file() else "")
    again = built_copy.doit("bundle")
    no_traceback(again)
    assert where.name not in again.err and not again.executed, again.out + again.err


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("where", [
    STATE / "db" / "qwen2-tiny", STATE / "db" / "qwen2-tiny" / "iq9075", VARIANT_DB.parent,
], ids=["model-dir", "device-dir", "variant-dir"])
def test_a_state_directory_linked_outside_the_build_root_is_refused(built_copy, tmp_path,
                                                                    where):
    directory = built_copy.root / where
    outside = tmp_path / "outside"
    shutil.move(str(directory), str(outside))
    directory.symlink_to(outside)
    before = _files(outside)
    (built_copy.build_dir() / "bin" / "qwen2_tiny_part_2_of_4.bin").unlink()   # work to save
    run = built_copy.doit("bundle", check=False)
    no_traceback(run)
    assert run.code == 3, run.out + run.err
    assert (f"{directory}: hexbundle keeps a directory there (the dependency DBs), but it is a "
            "symbolic link: move it away or remove it") in run.err, run.err
    assert _files(outside) == before
    directory.unlink()   # as the message says
    again = built_copy.doit("bundle")
    no_traceback(again)
    assert _files(outside) == before and built_copy.doit_db().is_file()


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_symlinked_build_root_marker_is_never_written_through(built_copy, tmp_path):
    outside = _outside_file(tmp_path, "build-root.json")
    _replace(built_copy.root / STATE / "build-root.json", lambda p: p.symlink_to(outside))
    run = built_copy.doit("bundle", check=False)
    no_traceback(run)
    assert run.code == 3 and ("(the mark of a build root hexbundle made), but it is a symbolic "
                              "link") in run.err, run.err
    assert outside.read_bytes() == OUTSIDE


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_step_log_linked_outside_the_build_root_is_replaced_not_written_through(built_copy,
                                                                                  tmp_path):
    log = built_copy.build_dir() / "logs" / "compile__part_2_of_4.log"
    outside = _outside_file(tmp_path, log.name)
    _replace(log, lambda p: p.symlink_to(outside))
    (built_copy.build_dir() / "bin" / "qwen2_tiny_part_2_of_4.bin").unlink()   # the step reruns
    run = built_copy.doit("bundle", check=False)
    no_traceback(run)
    assert run.code == 0 and "compile:part_2_of_4" in run.executed, run.out + run.err
    assert outside.read_bytes() == OUTSIDE
    assert log.is_file() and not log.is_symlink() and log.stat().st_size > 0


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
def test_a_step_record_linked_outside_the_build_root_is_not_read(built_copy, tmp_path):
    """origins/<task>.json: where a step's outputs came from, read into build-info.json."""
    record = built_copy.build_dir() / "origins" / "inputs__tokenizer.json"
    outside = tmp_path / "outside" / record.name
    outside.parent.mkdir()
    outside.write_text(json.dumps({"task": "inputs:tokenizer", "outside": "read through a link",
                                   "outputs": {}}))
    _replace(record, lambda p: p.symlink_to(outside))
    (built_copy.bundle() / "manifest.json").unlink()   # the bundle step reruns and reads them
    run = built_copy.doit("bundle", check=False)
    no_traceback(run)
    assert run.code == 0 and "bundle" in run.executed, run.out + run.err
    info = (built_copy.build_dir() / "build-info.json").read_text()
    assert "read through a link" not in info


@pytest.mark.heavy   # measured > 5 s: the full suite (`pytest --full`)
@pytest.mark.parametrize("command", [("dumpdb",), ("list", "--status")])
def test_a_read_only_command_does_not_read_a_linked_db(built_copy, tmp_path, command):
    shutil.copy2(ROOT / "pyproject.toml", built_copy.root)   # where dumpdb is registered
    db = built_copy.doit_db()
    outside = tmp_path / "outside" / db.name
    outside.parent.mkdir()
    records = json.loads(db.read_text())
    records["outside-task"] = {}
    outside.write_text(json.dumps(records))   # up to date: a reader of it would say so
    before = outside.read_bytes()
    _replace(db, lambda p: p.symlink_to(outside))
    run = built_copy.doit(*command, check=False)
    no_traceback(run)
    assert "outside-task" not in run.out and "\nU bundle " not in "\n" + run.out, run.out
    assert f"{db}: a symbolic link" in run.err, run.err
    assert outside.read_bytes() == before and db.is_symlink()   # read-only: nothing moved


def test_own_files_are_never_opened_through_a_link(tmp_path, monkeypatch):
    """support.files: what every reader and in-place writer of hexbundle's own files uses."""
    from hexbundle.graph import lock as build_lock
    from hexbundle.support.errors import HexbundleError
    from hexbundle.support.files import LinkedStateError, open_in_place, read_state

    victim = tmp_path / "victim"
    victim.write_bytes(OUTSIDE)
    link = tmp_path / "state" / "file"
    link.parent.mkdir()
    link.symlink_to(victim)
    with pytest.raises(LinkedStateError):
        read_state(link)
    fifo = tmp_path / "state" / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):   # at once: no writer awaited
        read_state(fifo)
    with pytest.raises(FileNotFoundError):
        read_state(tmp_path / "state" / "none")
    with open_in_place(link) as fh:   # a log: the link is replaced, its target left alone
        fh.write("log")
    assert not link.is_symlink() and link.read_text() == "log"
    assert victim.read_bytes() == OUTSIDE
    lock = tmp_path / "state" / "lock"
    lock.symlink_to(victim)   # put there after check_state_shapes looked, say
    monkeypatch.setattr(build_lock, "_held", None)
    with pytest.raises(HexbundleError, match="the build lock.*symbolic link"):
        build_lock.hold_lock(lock, tmp_path)
    assert victim.read_bytes() == OUTSIDE


VARIANT = Path("build") / "qwen2-tiny" / "iq9075" / "four" / "reference"


@pytest.mark.parametrize("directory", [
    "dlc", pytest.param("bin", marks=pytest.mark.heavy), pytest.param("logs", marks=pytest.mark.heavy)])
def test_an_output_directory_that_is_a_file_is_a_message(built_copy, directory):
    """Issue 36, item 4: dlc/ replaced by a regular file ended in convert's FileExistsError
    traceback (bin/ in compile's). Refused before any step, as a symbolic link there is."""
    _replace(built_copy.root / VARIANT / directory, lambda p: p.write_text("x"))
    run = built_copy.doit("bundle", "--always-execute", check=False)   # convert would mkdir dlc/
    no_traceback(run)
    assert run.code != 0 and (f"{directory}: hexbundle keeps a directory there (its outputs), "
                              "but it is a file: move it away or remove it") in run.out + run.err, \
        run.out + run.err
    assert (built_copy.root / VARIANT / directory).read_text() == "x"   # the user's, kept
