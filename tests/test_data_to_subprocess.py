"""Data from an input file reaching a subprocess or a file read (issue 40, kind 2): a release's
provenance is read with the configs' care. Its commit reaches `git archive` only as 40 hex digits
(and after "--"), its materials are files of the source tree only (no hashing oracle on other
files), and a hostile statement (deep nesting, wrong types, missing keys, a huge epoch) is a
message naming the file and the key, never a traceback."""
import copy
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from hexbundle.release.reproducible import verify_release, write_archive
from hexbundle.support.errors import HexbundleError
from conftest import copy_project

NAME = "qwen2-tiny-iq9075-four"
SECRET = b"a private file the user can read\n"


def git_commit(root: Path) -> str:
    env = {**os.environ, "GIT_COMMITTER_DATE": "1700000000 +0000",
           "GIT_AUTHOR_DATE": "1700000000 +0000"}
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   cwd=root, check=True, env=env)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


def make_release(where: Path, doc: dict) -> Path:
    """A release directory: an archive and `doc` as its provenance, the subject's digest the
    archive's own (so verify_release reads on)."""
    bundle = where / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text("{}\n")
    archive = where / "release" / f"{NAME}.tar.gz"
    archive.parent.mkdir()
    write_archive(bundle, archive, NAME, 1700000000)
    doc = copy.deepcopy(doc)
    try:
        doc["subject"][0]["digest"]["sha256"] = hashlib.sha256(archive.read_bytes()).hexdigest()
    except (KeyError, TypeError, IndexError):
        pass   # a statement broken there on purpose
    (archive.parent / "provenance.json").write_text(json.dumps(doc))
    return archive


def statement(commit: str = "", deps: list = ()) -> dict:
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": f"{NAME}.tar.gz", "digest": {"sha256": "0" * 64}}],
        "predicate": {"buildDefinition": {
            "externalParameters": {"model": "qwen2-tiny", "device": "iq9075", "plan": "four",
                                   "backend": "reference", "executor": "local", "compile": {},
                                   "source_date_epoch": 1700000000},
            "resolvedDependencies": [
                {"name": "source", "digest": {"gitCommit": commit} if commit else {},
                 "annotations": {"dirty": False}}, *deps]}},
    }


def at(doc: dict, path: str, value) -> dict:
    """doc with the value at dotted `path` replaced (a key "-" removes it)."""
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value == "-":
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


BUILD = "predicate.buildDefinition"
PARAMS = f"{BUILD}.externalParameters"
SOURCE_DIGEST = f"{BUILD}.resolvedDependencies.0.digest"

# (id, the statement from (tmp dir, a secret file outside the tree), what the message names)
CASES = [
    ("commit-output-option", lambda t, s: statement(f"--output={t / 'pwned'}"), "gitCommit"),
    ("commit-list-option", lambda t, s: statement("--list"), "gitCommit"),
    ("commit-ref-not-a-commit", lambda t, s: statement("HEAD"), "gitCommit"),
    ("commit-not-a-string", lambda t, s: at(statement("a" * 40), SOURCE_DIGEST,
                                            {"gitCommit": ["x"]}), "digest"),
    ("material-dotdot", lambda t, s: statement(deps=[{"name": "../" * 12 + str(s)[1:],
                                                      "digest": {"sha256": "1" * 64}}]),
     "not a file of the source tree"),
    ("material-absolute", lambda t, s: statement(deps=[{"name": str(s),
                                                        "digest": {"sha256": "1" * 64}}]),
     "not a file of the source tree"),
    ("material-symlink-out", lambda t, s: statement(deps=[{"name": "link-out",
                                                           "digest": {"sha256": "1" * 64}}]),
     "not a file of the source tree"),
    ("subject-a-string", lambda t, s: at(statement(), "subject", "x"), "'subject'"),
    ("subject-no-digest", lambda t, s: at(statement(), "subject.0.digest", "-"),
     "'digest.sha256'"),
    ("parameters-missing-plan", lambda t, s: at(statement(), f"{PARAMS}.plan", "-"),
     "'plan'"),
    ("parameters-a-list", lambda t, s: at(statement(), PARAMS, []), "'externalParameters'"),
    ("epoch-1e300", lambda t, s: at(statement(), f"{PARAMS}.source_date_epoch", 1e300),
     "source_date_epoch"),
    ("epoch-past-tar", lambda t, s: at(statement(), f"{PARAMS}.source_date_epoch", 10 ** 30),
     "source_date_epoch"),
    ("epoch-a-string", lambda t, s: at(statement(), f"{PARAMS}.source_date_epoch", "1"),
     "source_date_epoch"),
    ("compile-option-key", lambda t, s: at(statement(), f"{PARAMS}.compile", {"--output": "x"}),
     "compile"),
    ("compile-nested", lambda t, s: at(statement(), f"{PARAMS}.compile", {"a": {"b": 1}}),
     "compile"),
    ("dependency-a-list", lambda t, s: at(statement(), f"{BUILD}.resolvedDependencies", [[1]]),
     "'name'"),
    ("dependencies-missing", lambda t, s: at(statement(), f"{BUILD}.resolvedDependencies", "-"),
     "'resolvedDependencies'"),
    ("not-an-object", lambda t, s: [1, 2], "'subject'"),
]


@pytest.mark.parametrize("make, named", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_hostile_provenance_is_refused_naming_the_key(tmp_path, make, named, capsys):
    root = tmp_path / "tree"
    root.mkdir()
    (root / "README").write_text("x\n")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    (root / "link-out").symlink_to(secret)
    git_commit(root)
    archive = make_release(tmp_path / "rel", make(tmp_path, secret))
    with pytest.raises(HexbundleError) as caught:
        verify_release(root, archive, log=print)
    said = str(caught.value) + capsys.readouterr().out
    assert named in said
    assert hashlib.sha256(SECRET).hexdigest() not in said, "a digest of a file outside"
    assert not (tmp_path / "pwned").exists()


def test_a_provenance_nested_past_the_parsers_depth_is_a_message(tmp_path):
    archive = make_release(tmp_path, statement())
    (archive.parent / "provenance.json").write_text("[" * 100_000)
    with pytest.raises(HexbundleError, match="provenance.json: not JSON"):
        verify_release(tmp_path, archive)


def test_verify_release_with_an_option_for_a_commit_end_to_end(tmp_path):
    """Through `doit verify_release`: "gitCommit": "--output=FILE" created FILE; now a message
    naming the file and the key, exit non-zero, no traceback."""
    project = copy_project(tmp_path / "p")
    git_commit(project.root)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    archive = make_release(tmp_path / "rel", statement(f"--output={victim}"))
    run = project.doit("verify_release", str(archive), check=False)
    assert run.code != 0
    assert "Traceback" not in run.out + run.err
    assert "provenance.json" in run.out + run.err and "gitCommit" in run.out + run.err
    assert victim.read_text() == "the user's file\n"
