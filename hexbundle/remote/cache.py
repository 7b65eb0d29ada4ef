"""A build step through a remote cache: look up its Action, fetch the outputs on a hit, else run
it here and (read-write mode) upload what it wrote.

Hit:   GetActionResult -> the result must list exactly the step's outputs, exit code 0 -> every
       output is fetched into a temp file beside its target, checked against its digest while
       it streams (SHA-256, and the XXH3 taken in the same pass goes to the digest cache, so
       doit's checker reads nothing again) -> only when all are complete and correct are they
       renamed into place. The step's log says where they came from; `cache hit` is printed.
Miss:  the step runs as without a cache; then FindMissingBlobs for its outputs, its log, the
       Command and the Action; the missing ones are uploaded (batch calls, or ByteStream for
       large files, streamed from disk); then UpdateActionResult.

Failures degrade, never corrupt, never fail the build:
  - the server unreachable (at the first call, or mid-run): one warning, and every later step of
    the run builds locally without asking it again;
  - a blob whose bytes do not match its digest, a blob the server lost, a result that lists
    other files: refused with a warning naming it; the step runs locally (and, read-write,
    uploads its good outputs again);
  - an upload that fails: a warning; the local build stands.
A partial download never lands: temp files are removed, targets stay as they were. A result
refused by the step's checks (its key among them: steps/check.py) is remembered in the build
root (formats.origins.refuse_action) and never fetched again there. A result's log is streamed
into the step's log, bounded in size and time (cas.read_log).

Each run of a step leaves a record (formats.origins) of where its outputs came from; the
bundle's build-info.json and a release's provenance gather them.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from hexbundle import __version__
from hexbundle.config.build import RemoteSettings
from hexbundle.config.layout import Layout
from hexbundle.formats.origins import record_origin, refuse_action, refused_actions
from hexbundle.remote import reapi
from hexbundle.remote.action import StepAction
from hexbundle.remote.cas import (BlobCheck, BlobMismatch, CasClient, RemoteError,
                                  RemoteUnavailable)
from hexbundle.support import hashing
from hexbundle.support.atomic import commit, create_temp, discard
from hexbundle.support.console import say, warn
from hexbundle.support.errors import HexbundleError, output_error
from hexbundle.support.files import open_in_place

LOG_BYTES = 1 << 20   # a step's log goes to the cache with its outputs, up to this much


class RemoteSession:
    """The remote cache of one doit run: one client, shared by the steps' threads. Once the
    server proves unreachable it is not asked again in this run (one warning)."""

    def __init__(self, settings: RemoteSettings, root: Path):
        self.settings = settings
        self.client = CasClient(settings, root)
        self.read_write = settings.cache_mode == "read-write"
        self.down = False
        self.refused: set = set()      # (hash, size) refused as corrupt: upload them again
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return self.client.where

    def give_up(self, exc: RemoteError) -> None:
        with self._lock:
            if self.down:
                return
            self.down = True
        warn(f"hexbundle: warning: {exc}; building locally, without the remote cache, for "
             "the rest of this run")


_sessions: dict = {}
_sessions_lock = threading.Lock()


def session(layout: Layout):
    """The run's RemoteSession, or None when no remote cache is configured."""
    settings = layout.cfg.remote
    if not settings.cache:
        return None
    key = (settings, str(layout.root))
    with _sessions_lock:
        if key not in _sessions:
            _sessions[key] = RemoteSession(settings, layout.root)
            hashing.cache().with_sha256 = True   # the outputs' SHA-256 in the same read
        return _sessions[key]


def run_cached(layout: Layout, task: str, outputs: list, make_action: Callable[[], StepAction],
               run_locally: Callable[[], None],
               check: Optional[Callable[[dict], None]] = None) -> None:
    """Run one step (its targets: `outputs`) through the remote cache, if one is configured;
    then record where its outputs came from. `check({target: temp file})`: the checks the step
    gives its own outputs, run on a hit's downloads before they are renamed into place (a
    HexbundleError: discarded, one warning, built locally)."""
    remote = session(layout)
    step = action_or_local(layout, task, outputs, remote, make_action, run_locally,
                           "no remote cache lookup ({exc})")
    if step is None:
        return
    if fetch(layout, remote, task, step, check):
        return
    run_locally()
    uploaded = remote.read_write and not remote.down and upload(layout, remote, task, step)
    record_origin(layout.records, task, {"origin": "local", "server": remote.client.url,
                                 "instance": remote.client.instance, "action": step.key,
                                 "uploaded": uploaded}, outputs)


def build_locally(layout: Layout, task: str, outputs: list,
                  run_locally: Callable[[], None]) -> None:
    """The step built here, and its origin record says so."""
    run_locally()
    record_origin(layout.records, task, {"origin": "local"}, outputs)


def action_or_local(layout: Layout, task: str, outputs: list, remote,
                    make_action: Callable[[], StepAction], run_locally: Callable[[], None],
                    unmade: str) -> Optional[StepAction]:
    """The step's Action for the remote cache or executor (`remote`: its session); None once
    the step was built here instead: no session, a server given up on in this run, or an Action
    that cannot be made (`unmade`, its `{exc}` filled in: the warning's reason)."""
    if remote is None or remote.down:
        build_locally(layout, task, outputs, run_locally)
        return None
    try:
        return make_action()
    except (HexbundleError, OSError) as exc:   # e.g. an input vanished: the step will say so
        warn(f"hexbundle: warning: {task}: {unmade.format(exc=exc)}")
        build_locally(layout, task, outputs, run_locally)
        return None


# ---------------------------------------------------------------------------------- hit


def fetch(layout: Layout, remote: RemoteSession, task: str, step: StepAction,
          check: Optional[Callable[[dict], None]] = None) -> bool:
    """True if the step's outputs came from the cache and are in place."""
    started = time.monotonic()
    if step.key in refused_actions(layout.records):   # refused here before: never used again
        return False
    try:
        result = remote.client.get_action_result(step.digest)
    except RemoteError as exc:
        # Unreachable, or refusing lookups (a wrong instance, credentials, an API it lacks):
        # every later step would get the same answer, so one warning and no more asking.
        remote.give_up(exc)
        return False
    if result is None:
        return False
    problem = _unusable(result, step)
    if problem:
        warn(f"hexbundle: warning: {task}: the cached result of action {step.key} on "
             f"{remote.where} {problem}; building locally")
        return False
    try:
        fetched = _download(remote, result, step, check)
    except OutputsRefused as exc:
        refuse_action(layout.records, step.key)
        warn(f"hexbundle: warning: {task}: the cached result of action {step.key} on "
             f"{remote.where} fails the checks a local build gets ({exc}); discarded, building "
             "locally")
        return False
    except RemoteUnavailable as exc:
        remote.give_up(exc)
        return False
    except BlobMismatch as exc:
        with remote._lock:
            remote.refused.update(reapi.digest_key(f.digest) for f in result.output_files)
        warn(f"hexbundle: warning: {task}: {exc} ({remote.where}); building locally")
        return False
    except RemoteError as exc:
        warn(f"hexbundle: warning: {task}: {exc}; building locally")
        return False
    _write_hit_log(layout, remote, task, step, result)
    record_origin(layout.records, task, {"origin": "remote-cache", "server": remote.client.url,
                                 "instance": remote.client.instance, "action": step.key},
                  list(step.outputs.values()))
    size = sum(f.digest.size_bytes for f in result.output_files)
    say(f"  cache hit {task} {time.monotonic() - started:.1f}s: {len(fetched)} file(s), "
        f"{size / (1 << 20):.1f} MiB from {remote.where}")
    return True


# A convert's or compile's outputs are at most this many times its inputs, plus a floor: a bin
# is its DLCs' weights once (shared), a DLC its graph's weights packed. (Generated inputs come
# from a few config files: the free disk space is their bound.)
OUTPUTS_PER_INPUT_BYTE, OUTPUTS_FLOOR = 4, 64 << 20
DERIVED_STEPS = ("convert", "compile")


def _unusable(result, step: StepAction) -> str:
    """Why a cached result cannot stand for the step ("" when it can)."""
    if result.exit_code != 0:
        return f"exited {result.exit_code}"
    listed = sorted(f.path for f in result.output_files)
    if listed != sorted(step.outputs):
        return f"lists {listed}, not the step's outputs {sorted(step.outputs)}"
    return _oversized(result, step)


def _oversized(result, step: StepAction) -> str:
    """A result declaring more bytes than the step can make, or than the disk holds: refused
    before a byte is fetched (a 1 TiB declaration once held a build for its whole deadline)."""
    declared = sum(f.digest.size_bytes for f in result.output_files)
    inputs = sum(p.stat().st_size for p in step.inputs.values() if p.is_file())
    most = max(OUTPUTS_PER_INPUT_BYTE * inputs, OUTPUTS_FLOOR)
    derived = len(step.command.arguments) > 1 and step.command.arguments[1] in DERIVED_STEPS
    if derived and declared > most:
        return (f"declares {declared / (1 << 30):.2f} GiB of outputs, more than the step can "
                f"make ({OUTPUTS_PER_INPUT_BYTE}x its {inputs / (1 << 20):.1f} MiB of inputs)")
    target = next(iter(step.outputs.values()))
    existing = next(p for p in (target, *target.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if declared > free:
        return (f"declares {declared / (1 << 30):.2f} GiB of outputs, more than the "
                f"{free / (1 << 30):.2f} GiB free at {existing}")
    return ""


class OutputsRefused(HexbundleError):
    """Downloaded outputs that matched their digests but fail the step's own checks."""


def _download(remote: RemoteSession, result, step: StepAction,
              check: Optional[Callable[[dict], None]] = None) -> list:
    """Every output into a temp file beside its target, checked; then all renamed into place.
    Nothing is renamed unless every output arrived whole, matched its digest and passed
    `check` (the checks the step gives its own outputs)."""
    temps, target = [], None
    try:
        for out in result.output_files:
            target = step.outputs[out.path]
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd, tmp = create_temp(target)
            except OSError as exc:
                raise output_error(target, exc) from None
            temps.append((tmp, target, out))
            xxh = hashing.new_hasher()
            with os.fdopen(fd, "wb") as fh:
                def sink(data: bytes, fh=fh, xxh=xxh) -> None:
                    xxh.update(data)
                    fh.write(data)
                if out.contents or out.digest.size_bytes == 0:
                    _inline(out, sink)
                else:
                    remote.client.read_blob(out.digest, sink)
            out_xxh = xxh.hexdigest()
            temps[-1] = (tmp, target, out, out_xxh)
    except OSError as exc:   # a full disk: the same error a local build would give
        for entry in temps:
            discard(entry[0])
        raise output_error(target, exc) from None
    except BaseException:
        for entry in temps:
            discard(entry[0])
        raise
    if check is not None:
        try:
            check({entry[1]: entry[0] for entry in temps})
        except HexbundleError as exc:
            for entry in temps:
                discard(entry[0])
            raise OutputsRefused(str(exc).splitlines()[0]) from None
    for tmp, target, out, digest in temps:
        commit(tmp, target)
    for tmp, target, out, digest in temps:
        hashing.cache().record(target, digest, out.digest.hash)
    return [t[1] for t in temps]


def _inline(out, sink) -> None:
    """An output the server sent inside the result (small files, the empty file): checked."""
    check = BlobCheck(out.digest)
    check.feed(bytes(out.contents), sink)
    check.finish()


def _write_hit_log(layout: Layout, remote: RemoteSession, task: str, step: StepAction,
                   result) -> None:
    """The step's log says where its outputs came from, then the log of the run that made
    them (when the cache kept it)."""
    lines = [f"# cache hit: outputs fetched from the remote cache {remote.where}",
             f"# action {step.key}; the step did not run here",
             *[f"# {out.path} sha256 {reapi.digest_text(out.digest)}"
               for out in result.output_files]]
    layout.logs_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open_in_place(layout.log(task), "wb") as fh:   # never through a link
            fh.write(("\n".join(lines) + "\n").encode())
            if result.stdout_raw or result.stdout_digest.hash:
                fh.write(b"# the log of the run that built them:\n")
                try:   # streamed in, at most LOG_BYTES, within remote_timeout (cas.read_log)
                    note = remote.client.read_log(bytes(result.stdout_raw), result.stdout_digest,
                                                  fh.write, LOG_BYTES)
                except RemoteError as exc:
                    note = f"(not read: {exc})"
                if note:
                    fh.write(f"\n# that log {note}\n".encode())
    except OSError:
        pass   # a log is a note


# --------------------------------------------------------------------------------- miss


def upload(layout: Layout, remote: RemoteSession, task: str, step: StepAction) -> bool:
    """Upload the step's outputs, log, Command and Action, then its ActionResult. True when
    the cache took it; a warning (never a failure) when it did not."""
    try:
        result, blobs = _result(layout, task, step)
        missing = remote.client.find_missing(
            reapi.Digest(hash=h, size_bytes=s) for h, s in blobs)
        with remote._lock:
            missing |= remote.refused & set(blobs)   # a corrupt copy there: send ours again
        remote.client.upload({k: blobs[k] for k in missing})
        remote.client.update_action_result(step.digest, result)
    except RemoteUnavailable as exc:
        remote.give_up(exc)
        return False
    except (RemoteError, OSError) as exc:
        warn(f"hexbundle: warning: {task}: not uploaded to the remote cache ({exc})")
        return False
    return True


def _result(layout: Layout, task: str, step: StepAction) -> tuple:
    """(ActionResult, {(hash, size): bytes or Path}) of a step that just ran here."""
    result = reapi.ActionResult(exit_code=0)
    result.execution_metadata.worker = f"hexbundle {__version__}"
    blobs = dict(step.blobs)
    for rpath, local in sorted(step.outputs.items()):
        st = os.stat(local)
        digest = reapi.Digest(hash=hashing.cache().sha256(local, st), size_bytes=st.st_size)
        result.output_files.add(path=rpath, digest=digest)
        blobs[reapi.digest_key(digest)] = local
    log = _log_bytes(layout.log(task))
    if log:
        log_digest = reapi.digest_of(log)
        result.stdout_digest.CopyFrom(log_digest)
        blobs[reapi.digest_key(log_digest)] = log
    return result, blobs


def _log_bytes(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(LOG_BYTES)
    except OSError:
        return b""
