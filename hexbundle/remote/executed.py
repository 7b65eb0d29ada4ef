"""A build step run on a REAPI Execution server (`remote_executor`): its Action executed by a
worker, its outputs fetched and checked exactly like a cache hit before they are renamed into
place (remote/cache.py's _unusable and _download: listed outputs, sizes, SHA-256 while they
stream, the step's own checks, then the atomic rename), the worker's stdout and stderr kept in
the step's log.

Any failure (remote/execute.py's typed errors, or outputs that fail the checks) is one warning
and a local build under `remote_fallback = local` (the default), or the build's error under
`remote_fallback = fail`. An unreachable server is not asked again in the run. Ctrl-C or SIGTERM
while a step waits on the server cancels its Operation (CancelOperation) before it unwinds.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Optional

from hexbundle.config.layout import Layout
from hexbundle.config.remote import executor_settings
from hexbundle.formats.origins import record_origin
from hexbundle.remote.action import StepAction
from hexbundle.remote.cache import (OutputsRefused, _download, _unusable, action_or_local,
                                    build_locally)
from hexbundle.remote.cas import BlobMismatch, RemoteError
from hexbundle.remote.execute import ExecutionError, ExecutionUnavailable, RemoteExecutor
from hexbundle.support.console import say, warn
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import open_in_place


class RemoteExecutionFailed(HexbundleError):
    """remote_fallback = fail and the step could not be executed remotely."""


class ExecSession:
    """The Execution server of one doit run, shared by the steps' threads."""

    def __init__(self, settings, root: Path):
        self.settings = settings
        self.executor = RemoteExecutor(executor_settings(settings), root)
        self.client = self.executor.cas      # what cache._download reads blobs through
        self.down = False
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return self.executor.where


_sessions: dict = {}
_sessions_lock = threading.Lock()


def exec_session(layout: Layout) -> ExecSession:
    settings = layout.cfg.remote
    key = (settings, str(layout.root))
    with _sessions_lock:
        if key not in _sessions:
            _sessions[key] = ExecSession(settings, layout.root)
            say(f"hexbundle: steps run on the {_sessions[key].where}; "
                f"remote_fallback = {settings.fallback}")
        return _sessions[key]


def run_executed(layout: Layout, task: str, outputs: list, make_action: Callable[[], StepAction],
                 run_locally: Callable[[], None],
                 check: Optional[Callable[[dict], None]] = None) -> None:
    """Run one step on the Execution server; on failure fall back (or fail) as configured."""
    remote = exec_session(layout)
    step = action_or_local(layout, task, outputs, remote, make_action, run_locally,
                           "not executed remotely ({exc}); building locally")
    if step is None:
        return
    try:
        _execute(layout, remote, task, step, check)
    except (ExecutionError, OutputsRefused, BlobMismatch, RemoteError, OSError) as exc:
        kind = getattr(exc, "kind", "wrong outputs" if isinstance(
            exc, (OutputsRefused, BlobMismatch)) else "failed")
        if layout.cfg.remote.fallback == "fail":
            raise RemoteExecutionFailed(
                f"{task}: remote execution failed ({kind}): {exc}; remote_fallback = fail (set "
                "remote_fallback = local to build such a step here)") from None
        if isinstance(exc, ExecutionUnavailable):
            with remote._lock:
                already, remote.down = remote.down, True
            if not already:
                warn(f"hexbundle: warning: {task}: remote execution failed ({kind}): {exc}; "
                     "building locally (remote_fallback = local), without the Execution "
                     "server for the rest of this run")
        else:
            warn(f"hexbundle: warning: {task}: remote execution failed ({kind}): {exc}; "
                 "building locally (remote_fallback = local)")
        build_locally(layout, task, outputs, run_locally)


def _execute(layout: Layout, remote: ExecSession, task: str, step: StepAction,
             check: Optional[Callable[[dict], None]]) -> None:
    started = time.monotonic()

    def on_stage(stage: str) -> None:
        say(f"  remote {task}: {stage}")

    blobs = {**step.files, **step.blobs}
    try:
        result = remote.executor.execute(step.digest, blobs, float(layout.cfg.remote.exec_timeout),
                                         on_stage)
    except BaseException as exc:
        if not isinstance(exc, Exception):   # Ctrl-C, SIGTERM: the server stops it too
            remote.executor.cancel_all()
        raise
    problem = _unusable(result, step)
    if problem:
        raise OutputsRefused(f"the result of action {step.key} {problem}")
    stdout, stderr = _logs(remote, result)
    fetched = _download(remote, result, step, check)   # raises OutputsRefused, BlobMismatch
    worker = result.execution_metadata.worker or "?"
    _write_log(layout, remote, task, step, worker, stdout, stderr)
    record_origin(layout, task, {"origin": "remote-execution", "server": remote.client.url,
                                 "instance": remote.client.instance, "action": step.key,
                                 "worker": worker}, list(step.outputs.values()))
    say(f"  remote {task} {time.monotonic() - started:.1f}s: {len(fetched)} file(s) from "
        f"worker {worker}")


def _logs(remote: ExecSession, result) -> tuple:
    try:
        return remote.executor.logs(result)
    except RemoteError:
        return b"", b""


def _write_log(layout: Layout, remote: ExecSession, task: str, step: StepAction, worker: str,
               stdout: bytes, stderr: bytes) -> None:
    head = (f"# remote execution on {remote.where}, worker {worker}\n"
            f"# action {step.key}\n" +
            "".join(f"# {path}\n" for path in sorted(step.outputs)))
    layout.logs_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open_in_place(layout.log(task), "wb") as fh:   # never through a link
            fh.write(head.encode() + b"# the worker's stdout:\n" + stdout +
                     b"# the worker's stderr:\n" + stderr)
    except OSError:
        pass   # a log is a note
