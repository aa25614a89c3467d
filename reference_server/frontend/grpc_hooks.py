"""Every place the frontend reaches into grpclib's and betterproto2's private parts, in one order.

grpclib (pinned below 0.5) has no public hook that sees every call before its handler, and
betterproto2's generated services stream through a private method; so, and only here:

1. ``StreamingDiscipline`` overrides betterproto2's private ``_call_rpc_handler_server_stream``
   for every service of ours (``install`` refuses a service without it);
2. a service's raw handlers (``ServesRawHandlers``: smg's SubscribeKvEvents) replace the
   generated ones in the server's private handler mapping (``Server._mapping``);
3. the edge guard wraps every handler (``EdgeGuard.guarded``): authentication, framing, strict
   decoding, stalled readers;
4. with metrics on, RPC counting wraps the guarded handler, so it counts the guard's refusals;
5. the mapping answers an unknown path from a handler (a well-formed UNIMPLEMENTED);
6. a malformed ``grpc-timeout`` header (the gRPC spec: 1 to 8 digits and a unit) is refused
   with INTERNAL, as grpc-go and gRPC C-core refuse it, where grpclib says UNKNOWN and lets 9
   digits through: its ``Deadline`` and its refusal are replaced in ``grpclib.server``, once per
   process.

``install`` does 2 to 6 on one server, once; ``frontend/app.py`` calls it for every server it
builds. tests/integration/test_edge.py checks the hooks still work.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import grpclib.server
from betterproto2.grpclib import ServiceBase
from grpclib import GRPCError, Status
from grpclib.const import Cardinality, Handler
from grpclib.metadata import Deadline
from grpclib.server import Server, Stream

from reference_server.frontend.edge.guard import EdgeGuard
from reference_server.frontend.metrics.observe import counted_handlers
from reference_server.frontend.metrics.stats import ServingStats

RawHandler = Callable[[Stream[Any, Any]], Coroutine[Any, Any, None]]


class StreamingDiscipline:
    """Mixed in before a betterproto2 service base: its server-streaming calls close the
    handler's generator as soon as the call is cancelled (its finally-block aborts the engine
    request), and yield to the loop after every message so one fast stream cannot starve other
    calls, health checks and cancellations."""

    async def _call_rpc_handler_server_stream(
        self, handler: Callable[..., Any], stream: Stream[Any, Any], request: Any
    ) -> None:
        async with contextlib.aclosing(handler(request)) as responses:
            async for response in responses:
                await stream.send_message(response)
                await asyncio.sleep(0)


@runtime_checkable
class ServesRawHandlers(Protocol):
    def raw_handlers(self) -> Mapping[str, RawHandler]:
        """Paths served by a raw grpclib handler instead of the generated one."""
        ...


def install(server: Server, services: Sequence[object], guard: EdgeGuard, stats: ServingStats | None) -> None:
    """Hooks 2 to 5 on ``server``, built from ``services`` (and grpclib's own: health,
    reflection). Call once per server, before it starts."""
    for service in services:
        if isinstance(service, ServiceBase) and not isinstance(service, StreamingDiscipline):
            raise TypeError(f"{type(service).__name__} must derive from StreamingDiscipline")
    handlers: dict[str, Handler] = dict(server._mapping)
    for service in services:
        if isinstance(service, ServesRawHandlers):
            handlers.update(_raw(handlers, service.raw_handlers()))
    handlers = guard.guarded(handlers)
    if stats is not None:
        handlers = counted_handlers(handlers, stats)
    server._mapping = _AnswersUnknownPaths(handlers)
    _refuse_malformed_timeouts_as_internal()


def _raw(handlers: Mapping[str, Handler], raw: Mapping[str, RawHandler]) -> dict[str, Handler]:
    return {
        path: Handler(
            func, handlers[path].cardinality, handlers[path].request_type, handlers[path].reply_type
        )
        for path, func in raw.items()
    }


async def _unimplemented(stream: Stream[Any, Any]) -> None:
    raise GRPCError(Status.UNIMPLEMENTED, "Method not found")


class _AnswersUnknownPaths(dict[str, Handler]):
    """grpclib answers an unknown path with a trailers-only response that lacks ``content-type``,
    which clients read as UNKNOWN; answering from a handler gives a well-formed UNIMPLEMENTED.
    (The unknown path passes neither the guard nor the counting, as before.)"""

    _unknown = Handler(_unimplemented, Cardinality.UNARY_UNARY, bytes, bytes)

    def get(self, key: str, default: Any = None) -> Handler:
        return super().get(key) or self._unknown


_TIMEOUT = re.compile(r"[0-9]{1,8}[HMSmun]")
_GRPCLIB_TIMEOUT_REFUSAL = "Invalid grpc-timeout header"  # grpclib.server.request_handler's message


class _StrictDeadline(Deadline):
    @classmethod
    def from_headers(cls, headers: Any) -> Deadline | None:
        for name, value in headers:
            if name == "grpc-timeout" and not _TIMEOUT.fullmatch(value):
                raise ValueError(f"grpc-timeout {value!r}")  # grpclib refuses the call (hook 6)
        return super().from_headers(headers)


def _refuse_malformed_timeouts_as_internal() -> None:
    if getattr(grpclib.server, "Deadline", None) is _StrictDeadline:
        return
    plain_abort = grpclib.server._abort

    async def abort(
        h2_stream: Any, h2_status: int, grpc_status: Status | None = None, grpc_message: str | None = None
    ) -> None:
        if grpc_message == _GRPCLIB_TIMEOUT_REFUSAL:
            grpc_status = Status.INTERNAL
            grpc_message = "malformed grpc-timeout header: 1 to 8 digits and a unit (H, M, S, m, u, n)"
        await plain_abort(h2_stream, h2_status, grpc_status, grpc_message)

    setattr(grpclib.server, "Deadline", _StrictDeadline)  # noqa: B010 (not exported: mypy)
    grpclib.server._abort = abort
