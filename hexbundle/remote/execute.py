"""REAPI remote execution of one Action: upload what the server lacks, Execute, follow the
Operation stream, return the ActionResult (issue 37, docs/remote-cache.md "Remote execution").

    executor = RemoteExecutor(settings, root)      # settings.cache: the Execution server's URL
    result = executor.execute(action_digest, blobs, on_stage=print, timeout=600)

`blobs`: (hash, size) -> bytes or a local Path, every blob the Action needs (the Action, its
Command, the Directory messages and every input file: a worker has nothing else). They go
through FindMissingBlobs and only the missing ones are uploaded (batch calls, or ByteStream for
large files: remote/cas.py). Then Execute(skip_cache_lookup=false) streams Operations: their
stage (QUEUED, EXECUTING, COMPLETED) goes to `on_stage`; when one is done its ExecuteResponse
holds the ActionResult. A stream the server closes before the Operation is done is resumed
with WaitExecution.

The result is not trusted here: the caller fetches and checks its outputs exactly as it checks
a cache hit (remote/cache.py's download path). Errors are typed, each with a message naming
the server and what to do:

  ExecutionUnavailable     the server cannot be reached, or went away mid-execution
  ExecutionDenied          UNAUTHENTICATED / PERMISSION_DENIED (credentials, instance)
  ExecutionMissingBlobs    FAILED_PRECONDITION: the server lost an input between the upload
                           and the execution
  ExecutionTimeout         no result within `timeout` seconds (an Action no worker matches
                           stays QUEUED for ever): the Operation is cancelled
  ActionFailed             the Command exited non-zero, or the server's status is an error
                           (its stderr, when the worker kept it, is in the message)
  ExecutionGarbled         an Operation, its metadata or its ExecuteResponse that is not the
                           message it must be (bytes that do not parse, an Any of another type)

`cancel_all()` sends CancelOperation for every Operation in flight (Ctrl-C, SIGTERM) and stops
the executor: a step still uploading, or whose Execute is just being answered, has its
Operation cancelled too, and every step waiting in `execute` raises Cancelled (an interrupt,
not an error: no step falls back to a local build while the run stops).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Optional

import grpc

from hexbundle.remote import reapi
from hexbundle.remote.cas import CasClient, RemoteError, RemoteUnavailable, _unary

# ExecutionStage.Value
STAGES = {0: "unknown", 1: "cache-check", 2: "queued", 3: "executing", 4: "completed"}
STDERR_SHOWN = 2000   # bytes of a failed action's stderr in its error


class ExecutionError(RemoteError):
    """Remote execution failed; `kind` names how (for the fallback's message)."""

    kind = "failed"


class ExecutionUnavailable(ExecutionError, RemoteUnavailable):
    kind = "unavailable"


class ExecutionDenied(ExecutionError):
    kind = "permission denied"


class ExecutionMissingBlobs(ExecutionError):
    kind = "missing blobs"


class ExecutionTimeout(ExecutionError):
    kind = "timeout"


class Cancelled(KeyboardInterrupt):
    """The run was interrupted and this step's Operation cancelled (RemoteExecutor.cancel_all):
    it unwinds the step's thread as Ctrl-C does, no fallback, no failure line."""


class ActionFailed(ExecutionError):
    kind = "failed action"

    def __init__(self, message: str, result=None, tail: str = ""):
        super().__init__(message)
        self.result = result
        self.tail = tail   # the end of the worker's stderr (else stdout), as read

    @property
    def last_line(self) -> str:
        """The tail's last non-empty line: what a worker that cannot run the Command says
        (the import error of scripts/step.py)."""
        lines = [line.strip() for line in self.tail.splitlines() if line.strip()]
        return lines[-1] if lines else ""


class ExecutionGarbled(ExecutionError):
    kind = "garbled answer"


def _unpack(any_msg, cls, where: str):
    """An Any's message (our private pool's Any: type_url + bytes), from a server: an Any of
    another type, or bytes that are not the message, is ExecutionGarbled (reapi.decode)."""
    name = cls.DESCRIPTOR.full_name
    if any_msg.type_url and not any_msg.type_url.endswith("/" + name):
        raise ExecutionGarbled(f"{where}: the server sent a {any_msg.type_url} where a {name} "
                               "belongs; refused")
    try:
        return reapi.decode(cls, any_msg.value, f"{where}: the server sent")
    except reapi.Undecodable as exc:
        raise ExecutionGarbled(f"{exc}; refused") from None


class RemoteExecutor:
    """One Execution server and instance; thread-safe: -n N steps share it."""

    def __init__(self, settings, root: Path):
        self.cas = CasClient(settings, root)
        c = self.cas.channel
        self._execute = c.unary_stream(reapi.EXECUTE,
                                       request_serializer=reapi.ExecuteRequest.SerializeToString,
                                       response_deserializer=reapi.decoder(reapi.Operation))
        self._wait = c.unary_stream(reapi.WAIT_EXECUTION,
                                    request_serializer=reapi.WaitExecutionRequest.SerializeToString,
                                    response_deserializer=reapi.decoder(reapi.Operation))
        self._cancel = _unary(c, reapi.CANCEL_OPERATION, reapi.CancelOperationRequest,
                              reapi.Empty)
        self._lock = threading.Lock()
        self.in_flight: dict = {}      # operation name -> the streaming call
        self.stopped = False           # cancel_all() was called: nothing more is executed
        self.labels: dict = {}         # operation name -> what the caller called it (a task)
        self.cancelled: list = []      # those CancelOperation reached: their labels

    @property
    def where(self) -> str:
        return f"remote executor {self.cas.where}"

    def close(self) -> None:
        self.cas.close()

    # ------------------------------------------------------------------ upload

    def upload_missing(self, blobs: dict) -> int:
        """FindMissingBlobs (in batches), then upload the missing ones; how many were sent."""
        keys = list(blobs)
        missing: set = set()
        for i in range(0, len(keys), FIND_BATCH):
            missing |= self.cas.find_missing(reapi.Digest(hash=h, size_bytes=s)
                                             for h, s in keys[i:i + FIND_BATCH])
        self.cas.upload({k: blobs[k] for k in missing})
        return len(missing)

    # ------------------------------------------------------------------ execute

    def execute(self, action_digest, blobs: dict, timeout: float,
                on_stage: Optional[Callable[[str], None]] = None, label: str = "",
                skip_cache_lookup: bool = False):
        """The ActionResult of the Action (exit code 0), its blobs uploaded first. `label`:
        how cancel_all names its Operation (the step). `skip_cache_lookup`: run it even if the
        server's ActionCache has a result (one refused here before)."""
        try:
            self.upload_missing(blobs)
        except RemoteUnavailable as exc:
            raise ExecutionUnavailable(f"{exc}; remote executor unreachable") from None
        except RemoteError as exc:
            raise self._typed(exc) from None
        self._check_stopped()
        deadline = time.monotonic() + timeout
        request = reapi.ExecuteRequest(instance_name=self.cas.instance,
                                       action_digest=action_digest,
                                       skip_cache_lookup=skip_cache_lookup)
        call = self._start(self._execute, request, deadline, "Execute")
        name = ""
        last_stage = None
        while True:
            try:
                for op in call:
                    if op.name and op.name != name:
                        name = op.name
                        self._track(name, call, label)
                    self._check_stopped()   # cancelled: its last stage is not the step's
                    stage = STAGES.get(_unpack(op.metadata, reapi.ExecuteOperationMetadata,
                                               f"{self.where}: operation {name} metadata").stage,
                                       "unknown") if op.metadata.value else None
                    if stage and stage != last_stage and on_stage:
                        on_stage(stage)
                    last_stage = stage or last_stage
                    if op.done:
                        self._forget(name)
                        return self._result(op, action_digest)
            except ExecutionGarbled:
                self._forget(name)
                self.cancel(name)   # nothing it answers is believed: it need not run on
                raise
            except grpc.RpcError as exc:
                self._forget(name)
                self._check_stopped()   # cancelled by cancel_all: not an error of the server
                code = exc.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
                        code == grpc.StatusCode.CANCELLED and time.monotonic() >= deadline):
                    self.cancel(name)
                    raise ExecutionTimeout(
                        f"{self.where}: action {reapi.digest_text(action_digest)} not done "
                        f"within {timeout:.0f}s (last stage: {last_stage or 'none'}; "
                        "remote_timeout); its operation was cancelled. An Action no worker "
                        "matches (its platform properties) stays queued for ever") from None
                raise self._typed(self.cas._error("Execute", exc)) from None
            # the stream ended without a done Operation: resume it
            if not name:
                raise ExecutionUnavailable(f"{self.where}: Execute ended before naming its "
                                           "operation")
            call = self._start(self._wait, reapi.WaitExecutionRequest(name=name), deadline,
                               "WaitExecution")
            self._track(name, call, label)   # the call cancel_all cuts is this one now

    def _start(self, method, request, deadline: float, what: str):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ExecutionTimeout(f"{self.where}: {what}: no time left (remote_timeout)")
        return method(request, timeout=remaining, metadata=self.cas.metadata)

    def _track(self, name: str, call, label: str) -> None:
        """The Operation is in flight; if the run is stopping already, it is cancelled now."""
        with self._lock:
            self.labels[name] = label or name
            stopped = self.stopped
            if not stopped:
                self.in_flight[name] = call
        if stopped:
            if self.cancel(name):
                with self._lock:
                    self.cancelled.append(self.labels[name])
            call.cancel()
            self._check_stopped()

    def _check_stopped(self) -> None:
        if self.stopped:
            raise Cancelled(f"{self.where}: the run was interrupted; operation cancelled")

    def _forget(self, name: str) -> None:
        with self._lock:
            self.in_flight.pop(name, None)

    def _typed(self, exc: RemoteError) -> ExecutionError:
        text = str(exc).replace("remote cache", "remote executor")
        if isinstance(exc, RemoteUnavailable):
            return ExecutionUnavailable(text)
        if "UNAUTHENTICATED" in text or "PERMISSION_DENIED" in text:
            return ExecutionDenied(text)
        if "FAILED_PRECONDITION" in text:
            return ExecutionMissingBlobs(f"{text}; the server lost an input after it was "
                                         "uploaded (its CAS evicted it?)")
        return ExecutionError(text)

    def _result(self, op, action_digest):
        key = reapi.digest_text(action_digest)
        if op.error.code != 0:
            raise self._status_error(op.error, key)
        response = _unpack(op.response, reapi.ExecuteResponse,
                           f"{self.where}: the response to action {key}")
        if response.status.code != 0:
            raise self._status_error(response.status, key)
        result = response.result
        if result.exit_code != 0:
            name, tail = self._output_tail(result)
            raise ActionFailed(f"{self.where}: action {key} exited {result.exit_code} on "
                               f"worker {result.execution_metadata.worker or '?'}"
                               + (f"; its {name}:\n{tail}" if tail else ""), result, tail)
        return result

    def _status_error(self, status, key: str) -> ExecutionError:
        code = grpc.StatusCode.UNKNOWN
        for c in grpc.StatusCode:
            if c.value[0] == status.code:
                code = c
        text = f"{self.where}: action {key}: {code.name} ({status.message})"
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return ExecutionMissingBlobs(text)
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return ExecutionDenied(text)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ExecutionTimeout(text)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            return ExecutionUnavailable(text)
        return ActionFailed(text)

    def _output_tail(self, result) -> tuple:
        """("stderr", its last STDERR_SHOWN bytes) of a failed action, or stdout's when its
        stderr is empty (the step runner says its own errors on stdout); never more is read."""
        for name, raw, digest in (("stderr", result.stderr_raw, result.stderr_digest),
                                  ("stdout", result.stdout_raw, result.stdout_digest)):
            pieces: list = []
            try:
                self.cas.read_log(bytes(raw), digest, pieces.append, STDERR_SHOWN, tail=True)
            except RemoteError:
                continue
            text = b"".join(pieces).decode(errors="replace").rstrip()
            if text:
                return name, text
        return "stderr", ""

    def write_logs(self, result, fh, limit: int) -> None:
        """The worker's stdout and stderr into the open log file `fh`, each at most `limit`
        bytes, streamed (cas.read_log: a size and a time limit); what could not be read is
        said in the file."""
        for name, raw, digest in (("stdout", result.stdout_raw, result.stdout_digest),
                                  ("stderr", result.stderr_raw, result.stderr_digest)):
            fh.write(f"# the worker's {name}:\n".encode())
            try:
                note = self.cas.read_log(bytes(raw), digest, fh.write, limit)
            except RemoteError as exc:
                note = f"(not read: {exc})"
            if note:
                fh.write(f"\n# {name} {note}\n".encode())

    # ------------------------------------------------------------------ cancel

    def cancel(self, name: str) -> bool:
        """CancelOperation (best effort: the server may be gone)."""
        if not name:
            return False
        try:
            self._cancel(reapi.CancelOperationRequest(name=name), timeout=self.cas.timeout,
                         metadata=self.cas.metadata)
            return True
        except grpc.RpcError:
            return False

    def cancel_all(self) -> list:
        """Cancel every Operation in flight and stop the executor (Ctrl-C, SIGTERM): one an
        `execute` starts later is cancelled as soon as it is named. The names cancelled."""
        with self._lock:
            self.stopped = True
            flying = dict(self.in_flight)
            self.in_flight.clear()
        done = [name for name in flying if self.cancel(name)]
        with self._lock:
            self.cancelled += [self.labels.get(name, name) for name in done]
        for call in flying.values():   # the waiting threads raise Cancelled
            call.cancel()
        return done


FIND_BATCH = 10000   # digests per FindMissingBlobs call (a few hundred KB)
