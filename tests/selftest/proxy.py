"""A mutating gRPC proxy: forwards lmrpc, health and reflection calls to a real reference server,
and lets a mutant subclass inject exactly one fault. No fault-injection code lives in the server.

Generate replies are sent downstream as raw bytes, so a mutant can emit anything the wire allows
(invalid UTF-8 included); everything else is re-encoded from betterproto2 messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler
from grpclib.server import Server, Stream

from conformance.stream.live import RawMessage
from lmrpc.client import parse_target
from lmrpc.v1 import (
    AbortRequest,
    ControlServiceStub,
    DetokenizeRequest,
    EmbedRequest,
    FlushCacheRequest,
    GenerateRequest,
    GenerateResponse,
    GetLoadRequest,
    GetModelInfoRequest,
    GetServerInfoRequest,
    InferenceServiceStub,
    ListModelsRequest,
    PauseGenerationRequest,
    RerankRequest,
    ResumeGenerationRequest,
    SamplingParams,
    ScoreRequest,
    StartProfileRequest,
    StopProfileRequest,
    TokenizeRequest,
    UpdateWeightsRequest,
)

Out = GenerateResponse | bytes
CONTROL = "/lmrpc.v1.ControlService/"
UNARY: dict[str, tuple[str, type[Any]]] = {  # path -> (stub method, request type)
    CONTROL + "GetServerInfo": ("get_server_info", GetServerInfoRequest),
    CONTROL + "GetModelInfo": ("get_model_info", GetModelInfoRequest),
    CONTROL + "GetLoad": ("get_load", GetLoadRequest),
    CONTROL + "Abort": ("abort", AbortRequest),
    CONTROL + "Tokenize": ("tokenize", TokenizeRequest),
    CONTROL + "Detokenize": ("detokenize", DetokenizeRequest),
    CONTROL + "FlushCache": ("flush_cache", FlushCacheRequest),
    CONTROL + "PauseGeneration": ("pause_generation", PauseGenerationRequest),
    CONTROL + "ResumeGeneration": ("resume_generation", ResumeGenerationRequest),
    CONTROL + "ListModels": ("list_models", ListModelsRequest),
    CONTROL + "StartProfile": ("start_profile", StartProfileRequest),
    CONTROL + "StopProfile": ("stop_profile", StopProfileRequest),
    CONTROL + "UpdateWeights": ("update_weights", UpdateWeightsRequest),
    "/lmrpc.v1.InferenceService/Embed": ("embed", EmbedRequest),
    "/lmrpc.v1.InferenceService/Score": ("score", ScoreRequest),
    "/lmrpc.v1.InferenceService/Rerank": ("rerank", RerankRequest),
}
INFERENCE_UNARY = frozenset({"embed", "score", "rerank"})
PASSTHROUGH = {  # raw byte forwarding, path -> cardinality
    "/grpc.health.v1.Health/Check": Cardinality.UNARY_UNARY,
    "/grpc.health.v1.Health/Watch": Cardinality.UNARY_STREAM,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": Cardinality.STREAM_STREAM,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": Cardinality.STREAM_STREAM,
}


@dataclass
class Call:
    """One Generate call going through the proxy."""

    request: GenerateRequest  # as sent upstream (after rewrite_request)
    original: GenerateRequest | None = None  # as the client sent it
    injected: asyncio.Queue[Out] = field(default_factory=asyncio.Queue)  # events a mutant pushes in
    flags: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return (self.request.sampling.n if self.request.sampling and self.request.sampling.n else None) or 1


async def _unimplemented(stream: Stream[Any, Any]) -> None:
    raise GRPCError(Status.UNIMPLEMENTED, "Method not found")


class _Mapping(dict[str, Handler]):
    """Unknown paths get a normal UNIMPLEMENTED response (grpclib's default lacks content-type)."""

    def get(self, key: str, default: Any = None) -> Handler:
        return super().get(key) or Handler(_unimplemented, Cardinality.UNARY_UNARY, RawMessage, RawMessage)


class Proxy:
    """Forwards everything unchanged. Mutants override the hooks below."""

    name: ClassVar[str] = "reference (unmutated proxy)"

    def __init__(self, upstream: str) -> None:
        self.channel = Channel(*parse_target(upstream))
        self.control = ControlServiceStub(self.channel)
        self.inference = InferenceServiceStub(self.channel)
        self.calls: dict[str, Call] = {}

    # ── hooks ────────────────────────────────────────────────
    def rewrite_request(self, request: GenerateRequest) -> GenerateRequest:
        return request

    def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        """The events sent downstream. Mutants override it with an async generator."""
        return events

    async def unary(self, method: str, request: Any) -> Any:
        """Forward one unary lmrpc call; mutants override per method."""
        stub = self.inference if method in INFERENCE_UNARY else self.control
        return await getattr(stub, method)(request)

    def passthrough_allowed(self, path: str) -> bool:
        return True

    # ── plumbing ─────────────────────────────────────────────
    def __mapping__(self) -> dict[str, Handler]:
        mapping: dict[str, Handler] = {
            "/lmrpc.v1.InferenceService/Generate": Handler(
                self._generate, Cardinality.UNARY_STREAM, GenerateRequest, RawMessage
            ),
        }
        for path, (method, request_type) in UNARY.items():
            mapping[path] = Handler(
                self._unary_handler(method), Cardinality.UNARY_UNARY, request_type, object
            )
        for path, cardinality in PASSTHROUGH.items():
            if self.passthrough_allowed(path):
                mapping[path] = Handler(
                    self._passthrough(path, cardinality), cardinality, RawMessage, RawMessage
                )
        return mapping

    def _unary_handler(self, method: str) -> Callable[[Stream[Any, Any]], Any]:
        async def handle(stream: Stream[Any, Any]) -> None:
            request = await stream.recv_message()
            try:
                reply = await self.unary(method, request)
            except GRPCError as exc:
                raise GRPCError(exc.status, exc.message) from None
            await stream.send_message(reply)

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

    async def upstream_events(
        self, request: GenerateRequest, deadline: Any
    ) -> AsyncGenerator[GenerateResponse]:
        async with self.channel.request(
            "/lmrpc.v1.InferenceService/Generate",
            Cardinality.UNARY_STREAM,
            GenerateRequest,
            GenerateResponse,
            deadline=deadline,
        ) as up:
            await up.send_message(request, end=True)
            async for event in up:
                yield event

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        request = await stream.recv_message()
        assert request is not None
        call = Call(self.rewrite_request(pin_seed(GenerateRequest.parse(bytes(request)))), original=request)
        call.flags["client_id"] = request.request_id
        if request.request_id:
            self.calls[request.request_id] = call
        try:
            # Close both generators deterministically: an upstream call left to the garbage collector stays
            # open (and keeps generating) for as long as a reference cycle keeps its frame alive.
            async with (
                contextlib.aclosing(self.upstream_events(call.request, stream.deadline)) as events,
                contextlib.aclosing(_closable(self.transform(call, events))) as outgoing,
            ):
                async for item in outgoing:
                    await stream.send_message(RawMessage(item if isinstance(item, bytes) else bytes(item)))
                    await asyncio.sleep(0)
        except GRPCError as exc:
            raise GRPCError(exc.status, exc.message) from None
        finally:
            if self.calls.get(request.request_id) is call:
                del self.calls[request.request_id]


async def _closable(events: AsyncIterator[Out]) -> AsyncGenerator[Out]:
    async for event in events:
        yield event


def pin_seed(request: GenerateRequest) -> GenerateRequest:
    """Give an unseeded request a seed derived from its content, so that the same request behaves the
    same in every self-test run (a server may pick seeds any way it likes, SAMPLE-4); mutant effects
    that depend on what the fake engine generates then repeat exactly."""
    sampling = request.sampling or SamplingParams()
    if sampling.seed is None:
        content = GenerateRequest.parse(bytes(request))
        content.request_id = ""
        sampling.seed = zlib.crc32(bytes(content))
        request.sampling = sampling
    return request


class Replayed:
    """A server stream whose first message a mutant already read: hands it out once more (as
    ``recv_message`` or by iteration) and counts what is sent on."""

    def __init__(self, stream: Stream[Any, Any], first: Any) -> None:
        self._stream, self._first = stream, first
        self.deadline = stream.deadline
        self.sent = 0

    async def recv_message(self) -> Any:
        first, self._first = self._first, None
        return first

    def __aiter__(self) -> Replayed:
        return self

    async def __anext__(self) -> Any:
        if self._first is None:
            raise StopAsyncIteration
        return await self.recv_message()

    async def send_message(self, message: Any) -> None:
        self.sent += 1
        await self._stream.send_message(message)


def make_server(proxy: Proxy) -> Server:
    server = Server([proxy])
    server._mapping = _Mapping(server._mapping)
    return server
