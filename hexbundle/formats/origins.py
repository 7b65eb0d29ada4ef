"""Where each build step's outputs came from: built here, or fetched from a remote cache.

One small JSON file per task, `build/<model>/<device>/<plan>/<backend>/origins/<task>.json`,
written after every run of a step (hexbundle.remote.cache):

    {"task": "compile:part_2_of_4", "origin": "remote-cache" | "local",
     "server": "grpc://HOST:PORT", "instance": "", "action": "<sha256>/<size>",
     "uploaded": true | false,            (local builds with a read-write cache)
     "outputs": {"build/...bin": "<xxh3_128>"}}

A record is only believed while its outputs are still those bytes (`read_origins` compares the
digests, through the digest cache): a step rebuilt without a record, or an output edited by
hand, drops it. build-info.json (formats.manifest) and a release's provenance gather them.

Refused remote results: `build/.hexbundle/remote-refused.json`, {"actions": ["<sha256>/<size>",
...]}, the Actions whose fetched outputs were refused (at the fetch, or later by a step that
read them: graph/remote_steps.py evicts those): their cached results are never used again in
this build root (remote/cache.py, remote/executed.py).
"""
from __future__ import annotations

from pathlib import Path

from hexbundle.config.layout import Records
from hexbundle.support import hashing
from hexbundle.support.atomic import write_json
from hexbundle.support.console import warn
from hexbundle.support.errors import HexbundleError
from hexbundle.support.jsondoc import read_state_json


def write_origin(records: Records, task: str, origin: dict, outputs: list) -> None:
    outs = {records.logical(p): hashing.digest(p) for p in sorted(map(Path, outputs))}
    records.origins_dir.mkdir(parents=True, exist_ok=True)
    write_json(records.step_origin(task), {"task": task, **origin, "outputs": outs})


def record_origin(records: Records, task: str, origin: dict, outputs: list) -> None:
    """write_origin for the outputs that exist; a record is a note: a full disk warns, it does
    not fail a good build."""
    try:
        write_origin(records, task, origin, [p for p in map(Path, outputs) if p.is_file()])
    except (OSError, HexbundleError) as exc:
        warn(f"hexbundle: warning: cannot record where {task}'s outputs came from ({exc})")


def _records_of(records: Records):
    """(path, record) of each readable origin record with its outputs, sorted by file name."""
    if not records.origins_dir.is_dir():
        return
    for path in sorted(records.origins_dir.glob("*.json")):
        try:
            doc = read_state_json(path)   # a link (never followed): no record
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("outputs"), dict):
            yield path, doc


def read_origins(records: Records) -> dict:
    """task -> its record (without "task" and "outputs"), for the records whose outputs are all
    still the bytes they name; sorted by task."""
    out = {}
    for path, doc in _records_of(records):
        if all(_still(records, name, digest) for name, digest in doc["outputs"].items()):
            out[str(doc.get("task", path.stem))] = {k: v for k, v in doc.items()
                                                    if k not in ("task", "outputs")}
    return dict(sorted(out.items()))


def _still(records: Records, logical: str, digest) -> bool:
    path = _path(records, logical)
    try:
        return hashing.digest(path) == digest
    except OSError:
        return False


def remote_summary(origins: dict) -> dict:
    """{"steps_from_cache": [...], "servers": [{"server", "instance"}]} of a set of records."""
    hits = {t: o for t, o in origins.items() if o.get("origin") == "remote-cache"}
    servers = sorted({(o.get("server", ""), o.get("instance", "")) for o in hits.values()})
    return {"steps_from_cache": sorted(hits),
            "servers": [{"server": s, "instance": i} for s, i in servers]}


REMOTE_ORIGINS = ("remote-cache", "remote-execution")


def fetched_records(records: Records, files: list) -> dict:
    """task -> (its record, its output paths) of the steps whose outputs came from a remote
    cache or executor, are still those bytes, and include one of `files`."""
    wanted = {records.logical(Path(f)) for f in files}
    out = {}
    for path, doc in _records_of(records):
        if doc.get("origin") not in REMOTE_ORIGINS or not wanted & set(doc["outputs"]):
            continue
        if all(_still(records, name, digest) for name, digest in doc["outputs"].items()):
            out[str(doc.get("task", path.stem))] = (doc, [_path(records, n) for n in doc["outputs"]])
    return out


def forget_origin(records: Records, task: str) -> None:
    try:
        records.step_origin(task).unlink()
    except OSError:
        pass


def refused_path(records: Records) -> Path:
    return records.state_dir / "remote-refused.json"


def refused_actions(records: Records) -> set:
    """The Action keys ("hash/size") whose remote results were refused in this build root."""
    try:
        doc = read_state_json(refused_path(records))
    except (OSError, ValueError):
        return set()
    actions = doc.get("actions") if isinstance(doc, dict) else None
    return {a for a in actions if isinstance(a, str)} if isinstance(actions, list) else set()


def refuse_action(records: Records, action: str) -> None:
    """Never use the remote result of `action` again here (a note: a full disk warns)."""
    try:
        records.state_dir.mkdir(parents=True, exist_ok=True)
        write_json(refused_path(records),
                   {"actions": sorted(refused_actions(records) | {action})})
    except (OSError, HexbundleError) as exc:
        warn(f"hexbundle: warning: cannot record the refused remote result {action} ({exc})")


def _path(records: Records, logical: str) -> Path:
    return records.build_root / logical[len("build/"):] if logical.startswith("build/") \
        else records.root / logical
