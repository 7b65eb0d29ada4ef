"""A build step run on a REAPI Execution server (`remote_executor`): its Action executed by a
worker, its outputs fetched and checked exactly like a cache hit before they are renamed into
place (remote/cache.py's _unusable and _download: listed outputs, sizes, SHA-256 while they
stream, the step's own checks, then the atomic rename), the worker's stdout and stderr kept in
the step's log.

Any failure (remote/execute.py's typed errors, or outputs that fail the checks) is one warning
and a local build under `remote_fallback = local` (the default), or the build's error under
`remote_fallback = fail`. An unreachable server is not asked again in the run. Commands that exit
non-zero on a worker the same way (the exit code and the last line of the worker's stderr: a
worker whose interpreter cannot import numpy fails every step alike) are one line for the run,
naming the worker and that line, not one warning a step.

Ctrl-C or SIGTERM cancels every Operation of the run (CancelOperation), whichever thread waits
on it: under `doit -n N` the interrupt lands in doit's main thread while N steps' threads wait
on the server, so the session registers its stop with support.inflight, which graph.interrupts
calls once the interrupt has unwound doit; the steps' threads then raise execute.Cancelled (no
fallback) and the stop waits for them to leave (their temp files removed) before the run exits.

The stages of the Operations (queued, executing, completed) go to support.inflight: on a
terminal the reporter draws them in its status line; elsewhere each is a line
(`  remote convert:part_1_of_4: queued`).
"""
from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from hexbundle.config.layout import Layout
from hexbundle.config.remote import executor_settings
from hexbundle.formats.origins import record_origin, refuse_action, refused_actions
from hexbundle.remote.action import StepAction
from hexbundle.remote.cache import (LOG_BYTES, OutputsRefused, _download, _unusable,
                                    action_or_local, build_locally)
from hexbundle.remote.cas import BlobMismatch, RemoteError
from hexbundle.remote.execute import (ActionFailed, Cancelled, ExecutionError,
                                      ExecutionUnavailable, RemoteExecutor)
from hexbundle.support import inflight
from hexbundle.support.console import say, warn
from hexbundle.support.errors import HexbundleError
from hexbundle.support.files import open_in_place


LINE_SHOWN = 400   # characters of a failed action's last line of output in its warning


class RemoteExecutionFailed(HexbundleError):
    """remote_fallback = fail and the step could not be executed remotely."""

    remote_failure = True   # about the server, not the step's inputs: nothing is evicted


class ExecSession:
    """The Execution server of one doit run, shared by the steps' threads."""

    def __init__(self, settings, root: Path):
        self.settings = settings
        self.executor = RemoteExecutor(executor_settings(settings), root)
        self.client = self.executor.cas      # what cache._download reads blobs through
        self.down = False
        self._lock = threading.Lock()
        self._left = threading.Condition(self._lock)   # notified when a step leaves
        self.active = 0                # steps between their Action and their outputs in place
        self.said: set = set()         # the ways actions failed that a warning named already
        inflight.on_interrupt(self.stop)

    @property
    def where(self) -> str:
        return self.executor.where

    @contextlib.contextmanager
    def step(self, task: str):
        """A step on the server: counted (stop() waits for it to leave), its stage cleared
        from support.inflight when it leaves."""
        with self._lock:
            if self.executor.stopped:
                raise Cancelled(f"{self.where}: the run was interrupted")
            self.active += 1
        try:
            yield
        finally:
            inflight.done(task)
            with self._lock:
                self.active -= 1
                self._left.notify_all()

    def failed_action(self, task: str, exc: ActionFailed) -> str:
        """The one line for a Command that exited non-zero on a worker, or "" when an action
        failed the same way before in this run (the exit code and the last line of what the
        worker said): a worker that cannot run the Commands (no numpy in its interpreter) fails
        every step alike, and one line says so, not one a step. The full tail is the step's
        error under remote_fallback = fail."""
        code = exc.result.exit_code
        line = exc.last_line
        with self._lock:
            if (code, line) in self.said:
                return ""
            self.said.add((code, line))
        worker = exc.result.execution_metadata.worker or "?"
        if len(line) > LINE_SHOWN:
            line = line[:LINE_SHOWN] + "..."
        said = f", saying: {line}" if line else ", saying nothing"
        return (f"hexbundle: warning: remote execution failed: {task}'s action exited {code} on "
                f"worker {worker}{said}; building it here, and every step whose action fails "
                "so (said once) (remote_fallback = local)")

    def stop(self) -> list:
        """Ctrl-C, SIGTERM: cancel every Operation in flight, then wait (at most remote_timeout)
        for the steps' threads to unwind; the lines for the user."""
        self.executor.cancel_all()
        with self._lock:
            self._left.wait_for(lambda: self.active == 0, timeout=self.settings.timeout)
            cancelled, waiting = list(self.executor.cancelled), self.active
        lines = []
        if cancelled:
            lines.append(f"hexbundle: cancelled {len(cancelled)} remote operation"
                         f"{'s' if len(cancelled) != 1 else ''} on the {self.where} "
                         f"(CancelOperation): {', '.join(cancelled)}")
        if waiting:
            lines.append(f"hexbundle: {waiting} remote step(s) had not stopped after "
                         f"{self.settings.timeout}s (remote_timeout); they stop with the run "
                         "(a temp file left is removed by the next run)")
        return lines


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
        with remote.step(task):
            _execute(layout, remote, task, step, check)
    except (ExecutionError, OutputsRefused, BlobMismatch, RemoteError, OSError) as exc:
        if remote.executor.stopped:   # the run is stopping: no fallback, no warning
            raise Cancelled(f"{task}: interrupted") from None
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
        elif isinstance(exc, ActionFailed) and exc.result is not None:
            said = remote.failed_action(task, exc)
            if said:
                warn(said)
        else:
            warn(f"hexbundle: warning: {task}: remote execution failed ({kind}): {exc}; "
                 "building locally (remote_fallback = local)")
        build_locally(layout, task, outputs, run_locally)


def _execute(layout: Layout, remote: ExecSession, task: str, step: StepAction,
             check: Optional[Callable[[dict], None]]) -> None:
    started = time.monotonic()

    def on_stage(stage: str) -> None:
        if not inflight.set_stage(task, stage):   # the reporter's status line shows it
            say(f"  remote {task}: {stage}")

    blobs = {**step.files, **step.blobs}
    try:
        result = remote.executor.execute(step.digest, blobs, float(layout.cfg.remote.exec_timeout),
                                         on_stage, label=task,
                                         skip_cache_lookup=step.key in refused_actions(layout.records))
    except BaseException as exc:
        if not isinstance(exc, Exception):   # Ctrl-C, SIGTERM: the server stops it too
            remote.executor.cancel_all()
        raise
    problem = _unusable(result, step)
    if problem:
        raise OutputsRefused(f"the result of action {step.key} {problem}")
    try:
        fetched = _download(remote, result, step, check)   # raises OutputsRefused, BlobMismatch
    except OutputsRefused:
        refuse_action(layout.records, step.key)   # the server's cached answer is not asked for again
        raise
    worker = result.execution_metadata.worker or "?"
    _write_log(layout, remote, task, step, worker, result)
    record_origin(layout.records, task, {"origin": "remote-execution", "server": remote.client.url,
                                 "instance": remote.client.instance, "action": step.key,
                                 "worker": worker, "python": step.command.arguments[0]},
                  list(step.outputs.values()))
    say(f"  remote {task} {time.monotonic() - started:.1f}s: {len(fetched)} file(s) from "
        f"worker {worker}")


def _write_log(layout: Layout, remote: ExecSession, task: str, step: StepAction, worker: str,
               result) -> None:
    """The step's log: where it ran, then the worker's stdout and stderr, streamed from the
    server into the file (each at most LOG_BYTES, within remote_timeout: execute.write_logs)."""
    head = (f"# remote execution on {remote.where}, worker {worker}\n"
            f"# action {step.key}\n" +
            "".join(f"# {path}\n" for path in sorted(step.outputs)))
    layout.logs_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open_in_place(layout.log(task), "wb") as fh:   # never through a link
            fh.write(head.encode())
            remote.executor.write_logs(result, fh, LOG_BYTES)
    except OSError:
        pass   # a log is a note
