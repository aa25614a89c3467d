"""A mutating gRPC proxy for one of smg's engine protocols (``vllm.grpc.engine.VllmEngine`` or
``sglang.grpc.scheduler.SglangScheduler``, message types from the pinned smg-grpc-proto in gen/) or
for SGLang's native ``sglang.runtime.v1.SglangService``:
forwards every RPC of the service, plus health and reflection, to a real reference server, and lets
a mutant subclass inject exactly one fault. No fault-injection code lives in the server.

Every method of the service is forwarded typed, so a hook sees the protocol's own messages; paths
the service does not have (another engine's HealthCheck, say) answer UNIMPLEMENTED, as on the
server behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import betterproto2
from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler
from grpclib.server import Server, Stream

from conformance.spec.descriptors import message_class
from conformance.stream.live import RawMessage
from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.client import parse_target

from ..proxy import PASSTHROUGH

Message = betterproto2.Message


@dataclass
class EngineCall:
    """One Generate call going through the proxy."""

    request: Any  # the protocol's GenerateRequest, as sent upstream
    aborted: asyncio.Event = field(default_factory=asyncio.Event)  # an Abort the proxy kept for itself
    flags: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.request.sampling_params.n or 1) if self.request.sampling_params else 1

    @property
    def streaming(self) -> bool:
        return bool(self.request.stream)


async def _unimplemented(stream: Stream[Any, Any]) -> None:
    raise GRPCError(Status.UNIMPLEMENTED, "Method not found")


class _Mapping(dict[str, Handler]):
    """Unknown paths get a normal UNIMPLEMENTED response (grpclib's default lacks content-type)."""

    def get(self, key: str, default: Any = None) -> Handler:
        return super().get(key) or Handler(_unimplemented, Cardinality.UNARY_UNARY, RawMessage, RawMessage)


def _method(path: str) -> str:
    """``/pkg.Service/GetModelInfo`` -> ``get_model_info``."""
    name = path.rsplit("/", 1)[1]
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


class EngineProxy:
    """Forwards everything unchanged. Subclasses pick the protocol; mutants override the hooks."""

    protocol: ClassVar[str]
    module: ClassVar[ModuleType]  # the generated module of the protocol
    base: ClassVar[type[Any]]  # its generated ServiceBase: the paths, cardinalities and types to serve

    name: ClassVar[str] = "reference-proxy"
    fault: ClassVar[str] = ""
    expected: ClassVar[frozenset[str]] = frozenset()  # case IDs or globs that must fail
    tolerated: ClassVar[frozenset[str]] = frozenset()  # may also fail, for a reason stated beside it
    # input classes (spec/coverage.py) that set the fault off: a case that sent one may also fail
    triggered_by: ClassVar[frozenset[str]] = frozenset()
    is_control: ClassVar[bool] = False  # a correct variant: must pass everything

    @classmethod
    def describe(cls) -> str:
        """The fault: ``fault``, else the docstring of the behaviour the mutant takes."""
        return cls.fault or next((k.__doc__ for k in cls.__mro__ if k.__doc__), "").split("\n\n")[0]

    def __init__(self, upstream: str) -> None:
        self.channel = Channel(*parse_target(upstream))
        self.calls: dict[str, EngineCall] = {}
        self.handlers: dict[str, Handler] = self.base.__mapping__(self.base)  # type: ignore[arg-type]

    # ── hooks ────────────────────────────────────────────────
    def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The GenerateResponses sent downstream. Mutants override it with an async generator."""
        return events

    async def unary(self, method: str, request: Any) -> Any:
        """Forward one unary call (``method``: ``get_loads``, ``abort``, ...); mutants override it."""
        return await self.forward(method, request)

    def replies(self, method: str, replies: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The replies of a server-streaming call other than Generate (GetTokenizer, KV events)."""
        return replies

    def passthrough_allowed(self, path: str) -> bool:
        return True

    # ── forwarding ───────────────────────────────────────────
    def path(self, method: str) -> str:
        return next(p for p in self.handlers if _method(p) == method)

    async def forward(self, method: str, request: Any, timeout: float | None = None) -> Any:
        path = self.path(method)
        handler = self.handlers[path]
        async with self.channel.request(
            path, Cardinality.UNARY_UNARY, handler.request_type, handler.reply_type, timeout=timeout
        ) as up:
            await up.send_message(request, end=True)
            reply = await up.recv_message()
            await up.recv_trailing_metadata()
        return reply

    async def upstream_stream(self, method: str, request: Any, deadline: Any) -> AsyncGenerator[Any]:
        path = self.path(method)
        handler = self.handlers[path]
        reply_type, decode = handler.reply_type, None
        if (
            method == "subscribe_kv_events"
        ):  # betterproto2 cannot decode KvEventBatch: protobuf's runtime does
            reply_type, decode = RawMessage, message_class("smg.grpc.common.KvEventBatch").FromString
        async with self.channel.request(
            path, Cardinality.UNARY_STREAM, handler.request_type, reply_type, deadline=deadline
        ) as up:
            await up.send_message(request, end=True)
            async for reply in up:
                yield decode(reply.data) if decode is not None else reply

    def pin_seed(self, request: Any) -> Any:
        return request

    def request_id(self, request: Any) -> str:
        return str(request.request_id)

    # ── plumbing ─────────────────────────────────────────────
    def __mapping__(self) -> dict[str, Handler]:
        mapping: dict[str, Handler] = {}
        for path, handler in self.handlers.items():
            method = _method(path)
            if method == "generate":
                func: Callable[[Stream[Any, Any]], Any] = self._generate
            elif handler.cardinality is Cardinality.UNARY_STREAM:
                func = self._streaming(method)
            else:
                func = self._unary(method)
            mapping[path] = Handler(func, handler.cardinality, handler.request_type, RawMessage)
        for path, cardinality in PASSTHROUGH.items():
            if self.passthrough_allowed(path):
                mapping[path] = Handler(
                    self._passthrough(path, cardinality), cardinality, RawMessage, RawMessage
                )
        return mapping

    def _unary(self, method: str) -> Callable[[Stream[Any, Any]], Any]:
        async def handle(stream: Stream[Any, Any]) -> None:
            request = await stream.recv_message()
            try:
                reply = await self.unary(method, request)
            except GRPCError as exc:
                raise GRPCError(exc.status, exc.message) from None
            await stream.send_message(RawMessage(bytes(reply)))

        return handle

    def _streaming(self, method: str) -> Callable[[Stream[Any, Any]], Any]:
        async def handle(stream: Stream[Any, Any]) -> None:
            request = await stream.recv_message()
            try:
                async with (
                    contextlib.aclosing(self.upstream_stream(method, request, stream.deadline)) as up,
                    contextlib.aclosing(_closable(self.replies(method, up))) as out,
                ):
                    async for reply in out:
                        await stream.send_message(RawMessage(reply.SerializeToString()))
            except GRPCError as exc:
                raise GRPCError(exc.status, exc.message) from None

        return handle

    def _passthrough(self, path: str, cardinality: Cardinality) -> Callable[[Stream[Any, Any]], Any]:
        async def handle(stream: Stream[Any, Any]) -> None:
            try:
                async with self.channel.request(
                    path, cardinality, RawMessage, RawMessage, deadline=stream.deadline
                ) as up:
                    await up.send_request()

                    async def pump_up() -> None:
                        async for message in stream:
                            await up.send_message(message)
                        await up.end()

                    pump = asyncio.ensure_future(pump_up())
                    try:
                        async for reply in up:
                            await stream.send_message(reply)
                    finally:
                        pump.cancel()
            except GRPCError as exc:
                raise GRPCError(exc.status, exc.message) from None

        return handle

    async def _generate(self, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        assert request is not None
        call = EngineCall(self.pin_seed(request))
        rid = self.request_id(request)
        if rid:
            self.calls[rid] = call
        try:
            # Close both generators deterministically: an upstream call left to the garbage collector
            # stays open (and keeps generating) while a reference cycle keeps its frame alive.
            async with (
                contextlib.aclosing(
                    self.upstream_stream("generate", call.request, stream.deadline)
                ) as events,
                contextlib.aclosing(_closable(self.transform(call, events))) as outgoing,
            ):
                async for item in outgoing:
                    await stream.send_message(RawMessage(item if isinstance(item, bytes) else bytes(item)))
                    await asyncio.sleep(0)
        except GRPCError as exc:
            raise GRPCError(exc.status, exc.message) from None
        finally:
            if self.calls.get(rid) is call:
                del self.calls[rid]


async def _closable(events: AsyncIterator[Any]) -> AsyncGenerator[Any]:
    async for event in events:
        yield event


class VllmEngineProxy(EngineProxy):
    protocol = "vllm-engine"
    module = vllm
    base = vllm.VllmEngineBase

    def pin_seed(self, request: Any) -> Any:
        """Give an unseeded request a seed derived from its content, so that it behaves the same in
        every self-test run and a mutant's effect repeats exactly (the server may pick any seed)."""
        params = request.sampling_params
        if params is not None and params.seed is None:
            content = vllm.GenerateRequest.parse(bytes(request))
            content.request_id = ""
            params.seed = zlib.crc32(bytes(content)) & 0x7FFFFFFF
        return request


class SglangSchedulerProxy(EngineProxy):
    protocol = "sglang-scheduler"
    module = sglang
    base = sglang.SglangSchedulerBase


class RuntimeProxy(EngineProxy):
    """SGLang's native service, ``sglang.runtime.v1.SglangService`` (not an smg engine protocol, but
    proxied the same way: its Generate is the stream the hooks see)."""

    protocol = "sglang-runtime"
    module = rt
    base = rt.SglangServiceBase

    def request_id(self, request: Any) -> str:
        return str(request.rid or "")


def make_server(proxy: EngineProxy) -> Server:
    server = Server([proxy])
    server._mapping = _Mapping(server._mapping)
    return server
