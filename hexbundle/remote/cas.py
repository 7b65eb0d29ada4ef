"""The gRPC side of a REAPI cache: ActionCache, ContentAddressableStorage, ByteStream, Capabilities.

Blobs up to BATCH_BLOB_BYTES go in batch calls (many per round trip); larger ones stream through
ByteStream in CHUNK_BYTES pieces, read from or written to a file as they pass, so memory stays
bounded whatever a blob's size. Every blob read is checked against its digest (size and SHA-256)
as it arrives; the caller writes it to a temp file and keeps it only when it matches.

Errors, all RemoteError (the cache degrades to a local build, it never fails one):
  RemoteUnavailable  the server cannot be reached, or stopped answering (one warning, then the
                     run goes on without it)
  BlobMismatch       bytes that do not match their digest (refused)
  RemoteError        anything else the server refused (a missing blob, a denied write)
"""
from __future__ import annotations

import hashlib
import threading
import uuid
from pathlib import Path
from typing import Callable, Iterable, Optional

import grpc

from hexbundle.config.build import RemoteSettings
from hexbundle.config.remote import header_metadata, parse_target, tls_files
from hexbundle.remote import reapi
from hexbundle.support.errors import HexbundleError

CHUNK_BYTES = 1 << 20          # ByteStream pieces, both ways
BATCH_BLOB_BYTES = 1 << 20     # larger blobs stream
BATCH_TOTAL_BYTES = 3 << 20    # per batch call, below gRPC's 4 MiB default message limit
MAX_MESSAGE_BYTES = 16 << 20   # what we accept from a server in one message
STREAM_BYTES_PER_S = 8 << 20   # the slowest transfer a stream's deadline allows for

# Codes that mean the server is not there (or not any more): stop asking it for this run.
UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
               grpc.StatusCode.CANCELLED}


class RemoteError(HexbundleError):
    """The remote cache refused or failed a call."""


class RemoteUnavailable(RemoteError):
    """The remote cache cannot be reached."""


class BlobMismatch(RemoteError):
    """A blob's bytes do not match its digest."""


def open_channel(settings: RemoteSettings, root: Path) -> grpc.Channel:
    target, _ = parse_target(settings.cache)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.enable_retries", 0)]
    tls = tls_files(settings, root)   # as checked when the config loaded (config.remote)
    if tls is None:
        return grpc.insecure_channel(target, options=options)
    ca, cert, key = tls
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                         certificate_chain=cert)
    return grpc.secure_channel(target, creds, options=options)


def _unary(channel, path: str, request_cls, response_cls):
    return channel.unary_unary(path, request_serializer=request_cls.SerializeToString,
                               response_deserializer=reapi.decoder(response_cls))


class CasClient:
    """One server and instance. Thread-safe (gRPC channels are): doit -n 2 steps share it."""

    def __init__(self, settings: RemoteSettings, root: Path):
        self.url = settings.cache
        self.instance = settings.instance
        self.timeout = float(settings.timeout)
        self.metadata = header_metadata(settings.header)
        self.channel = open_channel(settings, root)
        c = self.channel
        self._get_result = _unary(c, reapi.GET_ACTION_RESULT, reapi.GetActionResultRequest,
                                  reapi.ActionResult)
        self._update_result = _unary(c, reapi.UPDATE_ACTION_RESULT,
                                     reapi.UpdateActionResultRequest, reapi.ActionResult)
        self._find_missing = _unary(c, reapi.FIND_MISSING_BLOBS, reapi.FindMissingBlobsRequest,
                                    reapi.FindMissingBlobsResponse)
        self._batch_update = _unary(c, reapi.BATCH_UPDATE_BLOBS, reapi.BatchUpdateBlobsRequest,
                                    reapi.BatchUpdateBlobsResponse)
        self._batch_read = _unary(c, reapi.BATCH_READ_BLOBS, reapi.BatchReadBlobsRequest,
                                  reapi.BatchReadBlobsResponse)
        self._capabilities = _unary(c, reapi.GET_CAPABILITIES, reapi.GetCapabilitiesRequest,
                                    reapi.ServerCapabilities)
        self._read = c.unary_stream(reapi.BYTESTREAM_READ,
                                    request_serializer=reapi.ReadRequest.SerializeToString,
                                    response_deserializer=reapi.decoder(reapi.ReadResponse))
        self._write = c.stream_unary(reapi.BYTESTREAM_WRITE,
                                     request_serializer=reapi.WriteRequest.SerializeToString,
                                     response_deserializer=reapi.decoder(reapi.WriteResponse))

    @property
    def where(self) -> str:
        return f"{self.url} (instance {self.instance!r})" if self.instance else self.url

    def close(self) -> None:
        self.channel.close()

    def _call(self, what: str, fn, request, timeout: Optional[float] = None):
        try:
            return fn(request, timeout=timeout or self.timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise self._error(what, exc) from None

    def _error(self, what: str, exc: grpc.RpcError) -> RemoteError:
        code = exc.code() if hasattr(exc, "code") else None
        detail = (exc.details() if hasattr(exc, "details") else "") or str(code)
        name = code.name if code else "?"
        if code in UNREACHABLE:
            return RemoteUnavailable(f"remote cache {self.where}: {what}: {name} ({detail})")
        if code == grpc.StatusCode.INTERNAL and detail == reapi.GARBLED_DETAIL:
            return RemoteError(f"remote cache {self.where}: {what}: the server's answer is not "
                               "a valid REAPI message (bytes that do not parse); refused")
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return RemoteError(f"remote cache {self.where}: {what}: {name} ({detail}); check "
                               "remote_header (its credentials) and remote_instance")
        return RemoteError(f"remote cache {self.where}: {what}: {name} ({detail})")

    # ------------------------------------------------------------------ the action cache

    def get_action_result(self, action_digest):
        """The cached ActionResult, or None when the server has none (a miss)."""
        request = reapi.GetActionResultRequest(instance_name=self.instance,
                                               action_digest=action_digest)
        try:
            return self._get_result(request, timeout=self.timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise self._error("GetActionResult", exc) from None

    def update_action_result(self, action_digest, result) -> None:
        self._call("UpdateActionResult", self._update_result, reapi.UpdateActionResultRequest(
            instance_name=self.instance, action_digest=action_digest, action_result=result))

    def capabilities(self):
        return self._call("GetCapabilities", self._capabilities,
                          reapi.GetCapabilitiesRequest(instance_name=self.instance))

    # ------------------------------------------------------------------ blobs

    def find_missing(self, digests: Iterable) -> set:
        """The (hash, size) of those of `digests` the server does not hold."""
        digests = list({reapi.digest_key(d): d for d in digests}.values())
        if not digests:
            return set()
        response = self._call("FindMissingBlobs", self._find_missing,
                              reapi.FindMissingBlobsRequest(instance_name=self.instance,
                                                            blob_digests=digests))
        return {reapi.digest_key(d) for d in response.missing_blob_digests}

    def upload(self, blobs: dict) -> None:
        """Upload blobs: (hash, size) -> bytes or a local Path (streamed, checked as it goes)."""
        small, large = [], []
        for key, source in sorted(blobs.items()):
            (small if key[1] <= BATCH_BLOB_BYTES else large).append((key, source))
        batch, total = [], 0
        for key, source in small:
            data = source if isinstance(source, bytes) else Path(source).read_bytes()
            if total + len(data) > BATCH_TOTAL_BYTES and batch:
                self._upload_batch(batch)
                batch, total = [], 0
            batch.append((key, data))
            total += len(data)
        if batch:
            self._upload_batch(batch)
        for key, source in large:
            self._upload_stream(key, source)

    def _upload_batch(self, batch: list) -> None:
        request = reapi.BatchUpdateBlobsRequest(instance_name=self.instance)
        for (hash_, size), data in batch:
            request.requests.add(digest=reapi.Digest(hash=hash_, size_bytes=size), data=data)
        response = self._call("BatchUpdateBlobs", self._batch_update, request)
        for r in response.responses:
            if r.status.code != 0:
                raise RemoteError(f"remote cache {self.where}: BatchUpdateBlobs refused "
                                  f"{reapi.digest_text(r.digest)}: code {r.status.code} "
                                  f"({r.status.message})")

    def _resource(self, kind: str, key: tuple) -> str:
        name = f"{kind}/{key[0]}/{key[1]}"
        return f"{self.instance}/{name}" if self.instance else name

    def _upload_stream(self, key: tuple, source) -> None:
        """ByteStream Write of a file (or bytes) in CHUNK_BYTES pieces; the bytes sent are
        hashed on the way, and a file that changed since its digest was taken is refused."""
        resource = self._resource(f"uploads/{uuid.uuid4()}/blobs", key)
        sent = hashlib.sha256()
        changed = []

        def requests():
            offset = 0
            if isinstance(source, bytes):
                pieces = (source[i:i + CHUNK_BYTES] for i in range(0, len(source), CHUNK_BYTES))
            else:
                pieces = _file_pieces(Path(source))
            for piece in pieces:
                sent.update(piece)
                yield reapi.WriteRequest(resource_name=resource if offset == 0 else "",
                                         write_offset=offset, data=piece)
                offset += len(piece)
            if offset != key[1] or sent.hexdigest() != key[0]:
                changed.append(offset)
                return   # not finished: the server drops the upload
            yield reapi.WriteRequest(resource_name=resource if offset == 0 else "",
                                     write_offset=offset, finish_write=True)

        try:
            response = self._write(requests(), timeout=self._stream_timeout(key[1]),
                                   metadata=self.metadata)
        except grpc.RpcError as exc:
            if changed:
                raise BlobMismatch(f"{source}: changed while it was uploaded (not the bytes of "
                                   f"{key[0]}/{key[1]}); not cached") from None
            raise self._error(f"ByteStream.Write {key[0]}/{key[1]}", exc) from None
        if changed:
            raise BlobMismatch(f"{source}: changed while it was uploaded; not cached")
        if response.committed_size not in (key[1], -1):
            raise RemoteError(f"remote cache {self.where}: ByteStream.Write of "
                              f"{key[0]}/{key[1]} committed {response.committed_size} bytes")

    def _stream_timeout(self, size: int) -> float:
        return self.timeout + size / STREAM_BYTES_PER_S

    def read_log(self, raw: bytes, digest, sink: Callable[[bytes], None], limit: int,
                 tail: bool = False) -> str:
        """A log an ActionResult names (inline `raw`, else the blob `digest`) into `sink`: at
        most `limit` bytes (the last ones when `tail`), within one deadline (remote_timeout plus
        the time `limit` bytes take: a log declared a TiB and sent a byte at a time is cut, and
        never held whole). What arrived is written as it comes (callers pass a file's write).
        Returns a note for the reader: "" when the whole log arrived and matched its digest."""
        if raw:
            piece = raw[-limit:] if tail else raw[:limit]
            sink(piece)
            return "" if len(piece) == len(raw) else f"(the last {limit} of {len(raw)} bytes)" \
                if tail else f"(the first {limit} of {len(raw)} bytes)"
        if not digest.hash:
            return ""
        size = digest.size_bytes
        if size <= limit:
            self.read_blob(digest, sink)
            return ""
        offset = size - limit if tail else 0
        self._read_range(digest, offset, limit, sink)
        where = "last" if tail else "first"
        return f"(the {where} {limit} of {size} bytes, unchecked: its digest is of the whole log)"

    def _read_range(self, digest, offset: int, limit: int, sink) -> None:
        """ByteStream Read of `limit` bytes from `offset` (read_offset, read_limit): a server
        that sends more is cut at `limit`."""
        request = reapi.ReadRequest(resource_name=self._resource("blobs", reapi.digest_key(
            digest)), read_offset=offset, read_limit=limit)
        call = self._read(request, timeout=self._stream_timeout(limit), metadata=self.metadata)
        idle = IdleWatch(call, self.timeout)
        got = 0
        try:
            for response in call:
                idle.touch()
                data = bytes(response.data)[:limit - got]
                got += len(data)
                sink(data)
                if got >= limit:
                    call.cancel()   # more than asked for: not read
                    break
        except grpc.RpcError as exc:
            raise self._error(f"ByteStream.Read {reapi.digest_text(digest)} (bytes {offset}+"
                              f"{limit})", exc) from None
        finally:
            idle.stop()

    def read_blob(self, digest, sink: Callable[[bytes], None]) -> None:
        """Fetch a blob into `sink`, piece by piece, checking size and SHA-256 as it arrives:
        BlobMismatch when they differ (the sink has then seen bytes the caller must throw
        away), RemoteError when the server does not have it."""
        check = BlobCheck(digest)
        if digest.size_bytes <= BATCH_BLOB_BYTES:
            response = self._call("BatchReadBlobs", self._batch_read, reapi.BatchReadBlobsRequest(
                instance_name=self.instance, digests=[digest]))
            found = [r for r in response.responses if r.digest.hash == digest.hash]
            if not found or found[0].status.code != 0:
                why = f"code {found[0].status.code} ({found[0].status.message})" if found else \
                    "not in the response"
                raise RemoteError(f"remote cache {self.where}: blob {reapi.digest_text(digest)}: "
                                  f"{why}")
            check.feed(found[0].data, sink)
        else:
            request = reapi.ReadRequest(resource_name=self._resource("blobs", reapi.digest_key(
                digest)))
            call = self._read(request, timeout=self._stream_timeout(digest.size_bytes),
                              metadata=self.metadata)
            idle = IdleWatch(call, self.timeout)   # a stream that stalls is cut after `timeout`
            try:
                for response in call:
                    idle.touch()
                    check.feed(response.data, sink)
            except grpc.RpcError as exc:
                if idle.fired:
                    raise RemoteUnavailable(
                        f"remote cache {self.where}: ByteStream.Read "
                        f"{reapi.digest_text(digest)}: no data for {self.timeout:.0f}s after "
                        f"{check.size} of {digest.size_bytes} bytes (remote_timeout); "
                        "refused") from None
                raise self._error(f"ByteStream.Read {reapi.digest_text(digest)}", exc) from None
            finally:
                idle.stop()
        check.finish()


class IdleWatch:
    """Cancels a streaming call when no piece arrived for `seconds` (the stream's own deadline
    grows with the declared size: a stall would otherwise hold the build for hours)."""

    def __init__(self, call, seconds: float):
        self.call, self.seconds, self.fired = call, seconds, False
        self._timer = None
        self.touch()

    def touch(self) -> None:
        self.stop()
        self._timer = threading.Timer(self.seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        self.call.cancel()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


class BlobCheck:
    """Size and SHA-256 of a blob as its pieces arrive."""

    def __init__(self, digest):
        self.digest = digest
        self.sha = hashlib.sha256()
        self.size = 0

    def feed(self, data: bytes, sink) -> None:
        self.size += len(data)
        if self.size > self.digest.size_bytes:
            raise BlobMismatch(f"blob {reapi.digest_text(self.digest)}: the server sent more "
                               f"than {self.digest.size_bytes} bytes; refused")
        self.sha.update(data)
        sink(data)

    def finish(self) -> None:
        if self.size != self.digest.size_bytes or self.sha.hexdigest() != self.digest.hash:
            raise BlobMismatch(f"blob {reapi.digest_text(self.digest)}: the server sent "
                               f"{self.size} bytes whose SHA-256 is {self.sha.hexdigest()}; "
                               "refused")


def _file_pieces(path: Path):
    with open(path, "rb", buffering=0) as fh:
        while piece := fh.read(CHUNK_BYTES):
            yield piece
