"""Mutants of the unary RPCs: server info, load, abort, health, reflection, tokenize, embed, admin."""

from __future__ import annotations

from typing import Any

from grpclib import GRPCError, Status
from grpclib.const import Cardinality, Handler
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.server import Stream

from conformance.stream.live import RawMessage
from lmrpc.v1 import AbortResponse, GenerateRequest, PauseGenerationResponse

from ..proxy import Replayed
from .base import Mutant

HEALTH_CHECK = "/grpc.health.v1.Health/Check"


class UnaryMutant(Mutant):
    """Rewrites the reply of one unary method: subclasses set ``method`` and ``edit``."""

    method = ""

    def edit(self, reply: Any) -> Any:
        return reply

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        return self.edit(reply) if method == self.method else reply


class ContractRevisionWrong(UnaryMutant):
    name = "contract-revision-wrong"
    fault = "ServerInfo.contract_revision says 1 (the previous revision)"
    expected = frozenset({"SVC-3"})
    method = "get_server_info"

    def edit(self, reply: Any) -> Any:
        reply.server.contract_revision = 1
        return reply


class StopStringsUnadvertised(UnaryMutant):
    name = "stop-strings-unadvertised"
    fault = "stop_strings is advertised false, yet requests using stop strings are accepted"
    expected = frozenset({"CAP-1[stop_strings]"})
    method = "get_server_info"

    def edit(self, reply: Any) -> Any:
        reply.server.capabilities.stop_strings = False
        return reply


class LoadNeverIdle(UnaryMutant):
    name = "load-never-idle"
    fault = "GetLoad always reports one more active request than there is"
    expected = frozenset({"LOAD-1[idle]"})
    method = "get_load"

    def edit(self, reply: Any) -> Any:
        reply.current.active_requests += 1
        return reply


class LoadWaitingAsRunning(UnaryMutant):
    name = "load-waiting-as-running"
    fault = "GetLoad counts the requests waiting behind a pause as running"
    expected = frozenset({"LOAD-1[ground-truth]"})
    method = "get_load"

    def edit(self, reply: Any) -> Any:
        if reply.current is not None:
            reply.current.running_sequences += reply.current.waiting_sequences
            reply.current.waiting_sequences = 0
        return reply


class KvInUseUnreported(UnaryMutant):
    name = "kv-in-use-unreported"
    fault = "GetLoad reports kv_tokens_in_use 0 whatever runs (unknown read as empty)"
    expected = frozenset({"LOAD-1[ground-truth]"})
    method = "get_load"

    def edit(self, reply: Any) -> Any:
        if reply.current is not None:
            reply.current.kv_tokens_in_use = 0
        return reply


class EmbedNotNormalized(UnaryMutant):
    name = "embed-not-normalized"
    fault = "embeddings are not L2-normalized (scaled by 2)"
    expected = frozenset({"EMBED-2", "EMBED-1[batches]"})
    method = "embed"

    def edit(self, reply: Any) -> Any:
        for embedding in reply.embeddings:
            embedding.values = [2 * v for v in embedding.values]
        return reply


class TokenizeAddsBos(UnaryMutant):
    name = "tokenize-adds-bos"
    fault = "Tokenize prepends a BOS token that Generate does not use"
    expected = frozenset(
        {
            "REQ-8[chat-content]",
            "REQ-8[parse-as-default]",
            "REQ-8[parse_special_tokens]",
            "REQ-8[text]",
            "SAMPLE-8[add_generation_prompt]",
            "TOK-1",
            "TOK-1[chat]",
            "TOK-1[text]",
            "TOK-1[unknown-role]",
            "USAGE-2",
            "USAGE-2[tokenize]",
        }
    )
    method = "tokenize"

    def edit(self, reply: Any) -> Any:
        reply.token_ids = [1, *reply.token_ids]
        return reply


class UnknownAbortFails(Mutant):
    name = "unknown-abort-fails"
    fault = "Abort of an id that is not in flight fails with NOT_FOUND"
    expected = frozenset(  # every ABORT-1 case but twice-while-ending, whose two Aborts name a live id
        {
            "ABORT-1[prefix-id]",
            "ABORT-1[unknown]",
            "CAP-5[max_abort_request_ids]",
            "ABORT-1[finished]",
            "ABORT-1[finished-then-reused]",
            "ABORT-1[twice]",
            "ABORT-1[mixed]",
            "ABORT-1[duplicate-ids]",
            "ABORT-6",
            "ABORT-6[after-expiry]",
            "EMBED-3",
        }
    )

    async def unary(self, method: str, request: Any) -> Any:
        if method == "abort" and request.request_ids is not None:
            unknown = [i for i in request.request_ids.ids if i not in self.calls]
            if unknown:
                raise GRPCError(Status.NOT_FOUND, f"no request {unknown[0]!r}")
        return await super().unary(method, request)


class AbortAllNoop(Mutant):
    name = "abort-all-noop"
    fault = "Abort(all) does nothing and reports no outcome"
    expected = frozenset({"ABORT-5", "ABORT-5[waiting]"})

    async def unary(self, method: str, request: Any) -> Any:
        if method == "abort" and request.all is not None:
            return AbortResponse()
        return await super().unary(method, request)


class PauseIgnored(Mutant):
    name = "pause-ignored"
    fault = "PauseGeneration answers OK and does nothing"
    expected = frozenset({"LOAD-1[ground-truth]", "LIFE-3[pause]"})

    async def unary(self, method: str, request: Any) -> Any:
        if method == "pause_generation":
            return PauseGenerationResponse()
        return await super().unary(method, request)


class NoReflectionV1alpha(Mutant):
    name = "no-reflection-v1alpha"
    fault = "only grpc.reflection.v1 is served, not v1alpha"
    expected = frozenset({"SVC-2[reflection-v1alpha]"})

    def passthrough_allowed(self, path: str) -> bool:
        return "v1alpha" not in path


class HealthPerServiceMissing(Mutant):
    name = "health-per-service-missing"
    fault = 'Health/Check knows only the overall service "", not the lmrpc services'
    expected = frozenset({"HEALTH-1", "HEALTH-1[in-flight]"})

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()
        forward = mapping["/grpc.health.v1.Health/Check"].func

        async def check(stream: Stream[Any, Any]) -> None:
            raw = await stream.recv_message()
            assert raw is not None
            if HealthCheckRequest.FromString(raw.data).service:
                raise GRPCError(Status.NOT_FOUND, "unknown service")
            await forward(Replayed(stream, raw))

        mapping["/grpc.health.v1.Health/Check"] = Handler(
            check, Cardinality.UNARY_UNARY, RawMessage, RawMessage
        )
        return mapping


class HealthUnhealthyWhileBusy(Mutant):
    name = "health-unhealthy-while-busy"
    fault = "Health/Check answers NOT_SERVING whenever a request is in flight (busy read as broken)"
    expected = frozenset({"HEALTH-1[in-flight]", "HEALTH-1[paused]"})
    # may also fail: HEALTH-1 runs beside other cases, whose streams make this mutant NOT_SERVING
    tolerated = frozenset({"HEALTH-1"})

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.in_flight = 0

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        self.in_flight += 1
        try:
            await super()._generate(stream)
        finally:
            self.in_flight -= 1

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()
        forward = mapping[HEALTH_CHECK].func

        async def check(stream: Stream[Any, Any]) -> None:
            raw = await stream.recv_message()
            assert raw is not None
            if self.in_flight:
                busy = HealthCheckResponse(status=HealthCheckResponse.NOT_SERVING)
                await stream.send_message(RawMessage(busy.SerializeToString()))
                return
            await forward(Replayed(stream, raw))

        mapping[HEALTH_CHECK] = Handler(check, Cardinality.UNARY_UNARY, RawMessage, RawMessage)
        return mapping


UNARY_MUTANTS: tuple[type[Mutant], ...] = (
    ContractRevisionWrong,
    StopStringsUnadvertised,
    LoadNeverIdle,
    LoadWaitingAsRunning,
    KvInUseUnreported,
    EmbedNotNormalized,
    TokenizeAddsBos,
    UnknownAbortFails,
    AbortAllNoop,
    PauseIgnored,
    NoReflectionV1alpha,
    HealthPerServiceMissing,
    HealthUnhealthyWhileBusy,
)
