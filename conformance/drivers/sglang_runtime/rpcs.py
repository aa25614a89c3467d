"""lmrpc.v1's two services over the native service: Generate through the driver, Embed through
OpenAIEmbed, and the control RPCs mapped onto the native ones."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from grpclib import GRPCError, Status
from grpclib.client import Channel

from conformance.drivers.adapter import DriverInference, adapts, unsupported_error
from conformance.drivers.sglang_runtime.reader import as_count
from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import (
    AbortOutcome,
    AbortRequest,
    AbortResponse,
    AbortStatus,
    ControlServiceStub,
    DetokenizeRequest,
    DetokenizeResponse,
    Embedding,
    EmbedRequest,
    EmbedResponse,
    FlushCacheRequest,
    FlushCacheResponse,
    GetLoadRequest,
    GetLoadResponse,
    GetModelInfoRequest,
    GetModelInfoResponse,
    GetServerInfoRequest,
    GetServerInfoResponse,
    PauseGenerationRequest,
    PauseGenerationResponse,
    ResumeGenerationRequest,
    ResumeGenerationResponse,
    TokenizeRequest,
    TokenizeResponse,
    Usage,
)

if TYPE_CHECKING:
    from conformance.drivers.sglang_runtime.driver import SglangRuntimeDriver


def as_float(value: object) -> float:
    """A vector's value as sent; NaN for one that is no number (never a norm of 1)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


class RuntimeInference(DriverInference):
    """lmrpc.v1's InferenceService: Generate through the driver, Embed through OpenAIEmbed."""

    def __init__(self, channel: Channel, driver: SglangRuntimeDriver) -> None:
        super().__init__(channel, driver)
        self.runtime = driver
        self.native = driver.stub(channel)

    @adapts
    async def embed(self, message: EmbedRequest | None, timeout: float | None) -> EmbedResponse:
        """The texts as one OpenAIEmbed batch; the embeddings in the order ``data`` lists them. The
        protocol carries no request id: the response's is empty."""
        texts = list(message.texts) if message is not None else []
        # no "model": the one model SGLang serves answers (what a name must be differs by release)
        answer = await self.runtime.openai_json(self.native.open_ai_embed, {"input": texts}, timeout)
        if not answer.ok:
            raise answer.refusal("OpenAIEmbed")
        answered = answer.body if isinstance(answer.body, dict) else {}
        data = answered.get("data")
        usage = answered.get("usage")
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise GRPCError(
                Status.UNKNOWN, f"OpenAIEmbed answered no list of embeddings: {str(answer.body)[:200]}"
            )
        vectors = [d.get("embedding") for d in data]
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return EmbedResponse(
            request_id="",
            embeddings=[
                Embedding(values=[as_float(x) for x in v] if isinstance(v, list) else []) for v in vectors
            ],
            usage=Usage(prompt_tokens=as_count(prompt_tokens) or 0),
        )


class RuntimeControl(ControlServiceStub):
    """lmrpc.v1's ControlService, answered through SglangService's RPCs."""

    def __init__(self, channel: Channel, driver: SglangRuntimeDriver) -> None:
        super().__init__(channel)
        self.driver = driver
        self.native = driver.stub(channel)

    @adapts
    async def get_server_info(
        self, message: GetServerInfoRequest | None, timeout: float | None
    ) -> GetServerInfoResponse:
        server = await self.driver.server_json(self.native, timeout)
        return GetServerInfoResponse(server=self.driver.server_info(server))

    @adapts
    async def get_model_info(
        self, message: GetModelInfoRequest | None, timeout: float | None
    ) -> GetModelInfoResponse:
        server = await self.driver.server_json(self.native, timeout)
        return GetModelInfoResponse(model=await self.driver.model_info(self.native, timeout, server))

    @adapts
    async def get_load(self, message: GetLoadRequest | None, timeout: float | None) -> GetLoadResponse:
        load = await self.driver.load(self.native, timeout)
        load.paused = bool((await self.driver.server_json(self.native, timeout)).get("is_paused", False))
        return GetLoadResponse(current=load)

    @adapts
    async def abort(self, message: AbortRequest | None, timeout: float | None) -> AbortResponse:
        if message is not None and message.all is not None:
            await self.native.abort(rt.AbortRequest(abort_all=True), timeout=timeout)
            return AbortResponse()
        if message is None or message.request_ids is None or not message.request_ids.ids:
            await self.native.abort(rt.AbortRequest(), timeout=timeout)  # no target: the server's to refuse
            return AbortResponse()
        outcomes = []
        for rid in dict.fromkeys(message.request_ids.ids):  # one rid per call
            await self.native.abort(rt.AbortRequest(rid=rid), timeout=timeout)
            outcomes.append(AbortOutcome(request_id=rid, status=AbortStatus.UNSPECIFIED))
        return AbortResponse(outcomes=outcomes)

    @adapts
    async def flush_cache(
        self, message: FlushCacheRequest | None, timeout: float | None
    ) -> FlushCacheResponse:
        reply = await self.native.flush_cache(rt.FlushCacheRequest(), timeout=timeout)
        if not reply.success:
            raise GRPCError(Status.FAILED_PRECONDITION, f"FlushCache: {reply.message}")
        return FlushCacheResponse()

    @adapts
    async def tokenize(self, message: TokenizeRequest | None, timeout: float | None) -> TokenizeResponse:
        if message is None or message.text is None:
            raise unsupported_error(
                self.driver.protocol, "Tokenize of chat messages (ChatComplete renders chat)"
            )
        reply = await self.native.tokenize(rt.TokenizeRequest(text=message.text), timeout=timeout)
        return TokenizeResponse(token_ids=list(reply.tokens))

    @adapts
    async def detokenize(
        self, message: DetokenizeRequest | None, timeout: float | None
    ) -> DetokenizeResponse:
        ids = list(message.token_ids) if message is not None else []
        reply = await self.native.detokenize(rt.DetokenizeRequest(tokens=ids), timeout=timeout)
        return DetokenizeResponse(text=reply.text)

    @adapts
    async def pause_generation(
        self, message: PauseGenerationRequest | None, timeout: float | None
    ) -> PauseGenerationResponse:
        await self.native.pause_generation(rt.PauseGenerationRequest(mode="in_place"), timeout=timeout)
        return PauseGenerationResponse()

    @adapts
    async def resume_generation(
        self, message: ResumeGenerationRequest | None, timeout: float | None
    ) -> ResumeGenerationResponse:
        await self.native.continue_generation(rt.ContinueGenerationRequest(), timeout=timeout)
        return ResumeGenerationResponse()
