"""Mutants of server state and unary answers: load, health, embeddings, limits, capacity, the window."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from grpclib import GRPCError, Status
from grpclib.const import Cardinality, Handler
from grpclib.health.v1.health_pb2 import HealthCheckResponse
from grpclib.server import Stream

from conformance.stream.live import RawMessage
from lmrpc.v1 import (
    GenerateRequest,
    GenerateResponse,
    GetLoadRequest,
    GetModelInfoRequest,
    GetServerInfoRequest,
)

from ..proxy import Call, Out, Replayed
from .base import Mutant, kind
from .unary import UnaryMutant


class ActiveCountsProducingOnly(Mutant):
    name = "active-counts-producing-only"
    fault = "GetLoad counts only requests that have produced tokens as active (not those still waiting)"
    expected = frozenset({"LOAD-1[ground-truth]", "LOAD-1[waiting]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if kind(event) == "delta":
                call.flags["producing"] = True
            yield event

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "get_load" and reply.current is not None:
            waiting = sum(1 for c in self.calls.values() if not c.flags.get("producing"))
            reply.current.active_requests = max(0, reply.current.active_requests - waiting)
        return reply


class WatchClosesEarly(Mutant):
    name = "watch-closes-early"
    fault = "Health/Watch ends at once with status OK and no message"
    expected = frozenset({"HEALTH-2[watch]"})

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()

        async def watch(stream: Stream[Any, Any]) -> None:
            await stream.recv_message()

        mapping["/grpc.health.v1.Health/Watch"] = Handler(
            watch, Cardinality.UNARY_STREAM, RawMessage, RawMessage
        )
        return mapping


class NotServingWhilePaused(Mutant):
    name = "not-serving-while-paused"
    fault = "Health/Check answers NOT_SERVING while generation is paused (the server still accepts requests)"
    expected = frozenset({"HEALTH-1[paused]", "LIFE-3[pause]"})

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.paused = False

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method in ("pause_generation", "resume_generation"):
            self.paused = method == "pause_generation"
        return reply

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()
        forward = mapping["/grpc.health.v1.Health/Check"].func

        async def check(stream: Stream[Any, Any]) -> None:
            if not self.paused:
                await forward(stream)
                return
            await stream.recv_message()
            reply = HealthCheckResponse(status=HealthCheckResponse.NOT_SERVING)
            await stream.send_message(RawMessage(reply.SerializeToString()))

        mapping["/grpc.health.v1.Health/Check"] = Handler(
            check, Cardinality.UNARY_UNARY, RawMessage, RawMessage
        )
        return mapping


class EmbedReversed(UnaryMutant):
    name = "embed-reversed"
    fault = "Embed returns the embeddings in reverse input order"
    expected = frozenset({"EMBED-1", "EMBED-1[batches]"})
    method = "embed"

    def edit(self, reply: Any) -> Any:
        reply.embeddings = list(reversed(reply.embeddings))
        return reply


class EmbedIdNotEchoed(UnaryMutant):
    name = "embed-id-not-echoed"
    fault = "EmbedResponse.request_id is always a server-assigned id"
    expected = frozenset({"EMBED-1[batches]", "EMBED-3", "EMBED-3[generate-id]"})
    method = "embed"

    def edit(self, reply: Any) -> Any:
        reply.request_id = "assigned-by-server"
        return reply


class StopStringLimitMisreported(UnaryMutant):
    name = "stop-string-limit-misreported"
    fault = "ServerInfo.limits.max_stop_string_bytes is 10 more than the limit the server enforces"
    expected = frozenset({"CAP-2[combined]", "CAP-5[max_stop_string_bytes]"})
    method = "get_server_info"

    def edit(self, reply: Any) -> Any:
        if reply.server.limits is not None:
            reply.server.limits.max_stop_string_bytes += 10
        return reply


class LimitsReportedAsNone(UnaryMutant):
    name = "limits-reported-as-none"
    fault = (
        "ServerInfo.limits reports max_stop_string_bytes and max_abort_request_ids as 0 (none) while the "
        "server enforces them"
    )
    expected = frozenset({"CAP-5[no-stop-string-limit]", "CAP-5[no-abort-ids-limit]"})
    method = "get_server_info"

    def edit(self, reply: Any) -> Any:
        if reply.server.limits is not None:
            reply.server.limits.max_stop_string_bytes = 0
            reply.server.limits.max_abort_request_ids = 0
        return reply


class WindowOffByOne(Mutant):
    name = "window-off-by-one"
    fault = "a token_ids prompt whose max_tokens fills the context window exactly is rejected"
    expected = frozenset({"REQ-6[exact-fit]", "REQ-7", "REQ-7[waits-for-capacity]"})

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        request = await stream.recv_message()
        assert request is not None
        stopping = request.stopping
        if request.token_ids is not None and stopping is not None and stopping.max_tokens is not None:
            model = (await self.control.get_model_info(GetModelInfoRequest())).model
            window = model.max_context_tokens if model is not None else 0
            if len(request.token_ids.ids) + stopping.max_tokens >= window:
                raise GRPCError(
                    Status.INVALID_ARGUMENT, "stopping.max_tokens plus the prompt exceeds the window"
                )
        await super()._generate(Replayed(stream, request))


class CapacityWaitRefused(Mutant):
    name = "capacity-wait-refused"
    fault = "a token_ids request that would have to wait for KV capacity is refused RESOURCE_EXHAUSTED"
    expected = frozenset({"REQ-7[waits-for-capacity]"})

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        request = await stream.recv_message()
        assert request is not None
        need = _reservation(request)
        if need:
            load = (await self.control.get_load(GetLoadRequest())).current
            held = sum(_reservation(c.request) for c in self.calls.values())
            if load is not None and held + need > load.kv_tokens_total:
                raise GRPCError(Status.RESOURCE_EXHAUSTED, "the KV cache is full")
        await super()._generate(Replayed(stream, request))


def _reservation(request: GenerateRequest) -> int:
    """prompt + n * max_tokens of a token_ids request (what the reference reserves), else 0."""
    stopping, sampling = request.stopping, request.sampling
    if request.token_ids is None or stopping is None or stopping.max_tokens is None:
        return 0
    n = (sampling.n if sampling is not None and sampling.n else None) or 1
    return len(request.token_ids.ids) + n * stopping.max_tokens


class WaitingLimitOffByOne(Mutant):
    name = "waiting-limit-off-by-one"
    fault = "a Generate is refused RESOURCE_EXHAUSTED one request before limits.max_waiting_requests"
    expected = frozenset({"CAP-5[max_waiting_requests]"})

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        request = await stream.recv_message()
        assert request is not None
        info = (await self.control.get_server_info(GetServerInfoRequest())).server
        limit = info.limits.max_waiting_requests if info is not None and info.limits is not None else 0
        if limit and len(self.calls) >= limit - 1:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "too many requests in flight; retry later")
        await super()._generate(Replayed(stream, request))


SERVER_FAULTS: tuple[type[Mutant], ...] = (
    WaitingLimitOffByOne,
    ActiveCountsProducingOnly,
    WatchClosesEarly,
    NotServingWhilePaused,
    EmbedReversed,
    EmbedIdNotEchoed,
    StopStringLimitMisreported,
    LimitsReportedAsNone,
    WindowOffByOne,
    CapacityWaitRefused,
)
