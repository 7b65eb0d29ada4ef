"""A hostile REAPI server on 127.0.0.1 for the tests: it forwards every call to a real one
(BuildGrid) byte for byte, except where a test makes it lie. grpc's generic handlers and the
real protos (hexbundle.remote.reapi's messages, byte-checked against BuildGrid's generated
classes in test_remote_cache.py), no stubs.

The lies, each a hook (None: the real server's answer):
  answer(request, real)      GetActionResult: the ActionResult to send (None: NOT_FOUND; bytes:
                             sent as they are), e.g. another action's result, a stale one, a
                             digest made huge, garbage
  read(request)              ByteStream.Read: ReadResponses to stream instead (a stall, a
                             trickle, garbage)
  batch_read(request, real)  BatchReadBlobs: the response to send instead (other bytes)
  operation(raw: bytes)      Execute / WaitExecution: each Operation the real server streams,
                             as bytes, rewritten (garbage, another result): the bytes to send
"""
from __future__ import annotations

from concurrent import futures

import grpc

from hexbundle.remote import reapi

STREAM_OUT = {reapi.BYTESTREAM_READ}
OPERATIONS = {reapi.EXECUTE, reapi.WAIT_EXECUTION}
STREAM_IN = {reapi.BYTESTREAM_WRITE}


class HostileProxy:
    """`answer(request: GetActionResultRequest, real: ActionResult or None)` -> the ActionResult
    to send (None: NOT_FOUND). `read(request: ReadRequest)` -> an iterator of ReadResponse to
    stream instead of the real server's (None: the real one's)."""

    def __init__(self, upstream: str, answer=None, read=None, operation=None, batch_read=None):
        self.read = read
        self.operation = operation
        self.batch_read = batch_read
        self.upstream = grpc.insecure_channel(upstream.removeprefix("grpc://"))
        self.answer = answer
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers([_Handler(self)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(0)
        self.upstream.close()

    def get_action_result(self, request_bytes: bytes, context):
        request = reapi.GetActionResultRequest.FromString(request_bytes)
        call = self.upstream.unary_unary(reapi.GET_ACTION_RESULT)
        try:
            real = reapi.ActionResult.FromString(call(request_bytes))
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                context.abort(exc.code(), exc.details())
            real = None
        result = self.answer(request, real) if self.answer else real
        if result is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such action")
        return result if isinstance(result, bytes) else result.SerializeToString()


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: HostileProxy):
        self.proxy = proxy

    def service(self, details):
        method, channel = details.method, self.proxy.upstream
        if method == reapi.GET_ACTION_RESULT:
            return grpc.unary_unary_rpc_method_handler(self.proxy.get_action_result)
        if method in STREAM_OUT:
            call = channel.unary_stream(method)

            def read(req, ctx):
                own = self.proxy.read(reapi.ReadRequest.FromString(req)) if self.proxy.read \
                    else None
                if own is None:
                    return iter(call(req))
                return (r.SerializeToString() for r in own)
            return grpc.unary_stream_rpc_method_handler(read)
        if method in OPERATIONS:
            call = channel.unary_stream(method)

            def operations(req, ctx):
                for raw in call(req):
                    yield self.proxy.operation(raw) if self.proxy.operation else raw
            return grpc.unary_stream_rpc_method_handler(operations)
        if method == reapi.BATCH_READ_BLOBS and self.proxy.batch_read:
            call = channel.unary_unary(method)

            def batch_read(req, ctx):
                real = reapi.BatchReadBlobsResponse.FromString(call(req))
                return self.proxy.batch_read(reapi.BatchReadBlobsRequest.FromString(req),
                                             real).SerializeToString()
            return grpc.unary_unary_rpc_method_handler(batch_read)
        if method in STREAM_IN:
            call = channel.stream_unary(method)
            return grpc.stream_unary_rpc_method_handler(lambda reqs, ctx: call(reqs))
        call = channel.unary_unary(method)
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: call(req))
