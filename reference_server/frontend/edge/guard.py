"""The server's edge: every call passes here before its handler runs, on every service.

For each call, in order: route (an unknown method gets a well-formed UNIMPLEMENTED), authenticate
and authorize (when ``--auth`` is on), read exactly one length-prefixed request message within
the size limit, decode it strictly (off the event loop when it is large), and hand the handler a
stream whose ``send_message`` notices a client that stopped reading (FLOW-2). A request that
has not arrived whole within the stall timeout ends the call.

The guard wraps handlers (``guarded``); ``frontend/grpc_hooks.py`` puts the wrapped handlers in
the server's private handler mapping, in order with the other hooks, and answers unknown paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from grpclib import GRPCError, Status
from grpclib.const import Handler
from grpclib.server import Stream

from reference_server.frontend.edge.auth import ANONYMOUS, Credentials, Principal
from reference_server.frontend.edge.call import Call, enter_call
from reference_server.frontend.edge.decoding import StrictDecoder
from reference_server.frontend.edge.framing import (
    RawStream,
    protocol_stream,
    read_message,
    read_single_message,
)
from reference_server.tracing import valid_traceparent

_T = TypeVar("_T")

#: Methods any caller may use when authentication is on: probes and service discovery.
PUBLIC_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1.", "/grpc.reflection.v1alpha.")
PUBLIC = Principal("public", "client")
#: Messages larger than this are decoded in a worker thread, so the event loop keeps serving.
INLINE_DECODE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class EdgePolicy:
    max_message_bytes: int
    stall_timeout_s: float  # 0: never give up on a client that does not read
    credentials: Credentials | None = None  # None: authentication off
    admin_methods: frozenset[str] = frozenset()


class EdgeGuard:
    def __init__(self, policy: EdgePolicy, decoder: StrictDecoder) -> None:
        self.policy = policy
        self.decoder = decoder

    def guarded(self, handlers: Mapping[str, Handler]) -> dict[str, Handler]:
        """Every handler, each call through the guard first."""
        for handler in handlers.values():
            self.decoder.spec(handler.request_type)  # fail at start-up, not on the first call
        return {path: self._guard(path, h) for path, h in handlers.items()}

    def _guard(self, path: str, handler: Handler) -> Handler:
        async def serve(stream: Stream[Any, Any]) -> None:
            call = Call(method=path, principal=self._authorize(path, stream))
            sent = stream.metadata.get("traceparent", "") if stream.metadata is not None else ""
            call.traceparent = valid_traceparent(str(sent))
            enter_call(call)
            if handler.cardinality.client_streaming:
                requests = _RequestStream(self, protocol_stream(stream), handler.request_type)
            else:
                data = await self.arriving(
                    read_single_message(protocol_stream(stream), self.policy.max_message_bytes)
                )
                requests = _RequestStream(
                    self, None, handler.request_type, await self.decode(data, handler.request_type)
                )
            guarded = _GuardedStream(stream, requests, call, self.policy.stall_timeout_s)
            try:
                await handler.func(cast(Stream[Any, Any], guarded))
            except _ClientStalled:
                await stream.cancel()  # RST_STREAM: the client read nothing for two stall periods

        return Handler(serve, handler.cardinality, handler.request_type, handler.reply_type)

    async def arriving(self, read: Awaitable[_T]) -> _T:
        """A unary call's request, or DEADLINE_EXCEEDED if it is not whole within the stall timeout:
        a client that opens calls and never finishes sending them holds no handler for ever.
        (Request streams, only reflection's here, may idle between messages.)"""
        timeout = self.policy.stall_timeout_s
        if not timeout:
            return await read
        try:
            async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancellation
                return await read
        except TimeoutError:
            raise GRPCError(
                Status.DEADLINE_EXCEEDED,
                f"the request message did not arrive within {timeout:g} s (limits.stall_timeout_seconds)",
            ) from None

    async def decode(self, data: bytes, message_type: type) -> Any:
        """Decode strictly; large messages in a worker thread, so the event loop keeps serving."""
        if len(data) > INLINE_DECODE_BYTES:
            return await asyncio.to_thread(self.decoder.decode, data, message_type)
        return self.decoder.decode(data, message_type)

    def _authorize(self, path: str, stream: Stream[Any, Any]) -> Principal:
        credentials = self.policy.credentials
        if credentials is None:
            return ANONYMOUS
        if path.startswith(PUBLIC_PREFIXES):
            return PUBLIC
        principal = credentials.authenticate(stream.metadata, stream.peer.cert())
        if path in self.policy.admin_methods and not principal.is_admin:
            raise GRPCError(Status.PERMISSION_DENIED, f"{path} needs the admin role")
        return principal


class _ClientStalled(Exception):
    pass


class _RequestStream:
    """The call's request messages, each read within the size limit and decoded strictly: the
    one message of a unary-request call (already read), or a client stream read on demand."""

    def __init__(
        self, guard: EdgeGuard, raw: RawStream | None, message_type: type, first: Any = None
    ) -> None:
        self._guard = guard
        self._raw = raw
        self._message_type = message_type
        self._next = first

    async def recv(self) -> Any:
        if self._raw is None:
            message, self._next = self._next, None
            return message
        data = await read_message(self._raw, self._guard.policy.max_message_bytes)
        if data is None:
            return None
        return await self._guard.decode(data, self._message_type)


class _GuardedStream:
    """What a handler sees: checked requests, and a send that notices a stalled client."""

    def __init__(
        self, stream: Stream[Any, Any], requests: _RequestStream, call: Call, stall_timeout_s: float
    ) -> None:
        self._stream = stream
        self._requests = requests
        self._call = call
        self._stall_timeout_s = stall_timeout_s
        self._task: asyncio.Task[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stalls = 0

    async def recv_message(self) -> Any:
        return await self._requests.recv()

    def __aiter__(self) -> _GuardedStream:
        return self

    async def __anext__(self) -> Any:
        message = await self.recv_message()
        if message is None:
            raise StopAsyncIteration
        return message

    async def send_message(self, message: Any) -> None:
        if not self._stall_timeout_s:
            await self._stream.send_message(message)
            return
        self._task = asyncio.current_task()
        self._stalls = 0
        self._timer = asyncio.get_running_loop().call_later(self._stall_timeout_s, self._on_stall)
        try:
            await self._stream.send_message(message)
        except asyncio.CancelledError:
            if self._stalls < 2:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise _ClientStalled from None
        finally:
            self._timer.cancel()

    def _on_stall(self) -> None:
        """A message has waited a whole stall period for the client to read."""
        self._stalls += 1
        if self._stalls == 1 and self._call.on_stall is not None:
            self._call.on_stall()  # stop the work; the call will end with a RequestError
        if self._stalls == 1:
            self._timer = asyncio.get_running_loop().call_later(self._stall_timeout_s, self._on_stall)
        elif self._task is not None:
            self._task.cancel()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
