"""``vllm.grpc.engine.VllmEngine``: the worker protocol that smg speaks to vLLM, served by the
reference frontend next to lmrpc.v1, on the same port.

A thin translation layer, not a second server: every RPC is turned into the lmrpc.v1 request
and answered by the in-process lmrpc services (``InferenceService.generate`` as an async
iterator, ``ControlService`` for load, abort, flush, discovery, detokenization), so one engine,
one request table and one set of limits and checks serve both protocols. ``docs/vllm-dialect.md``
maps every field.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Protocol, cast

import grpclib.const
import grpclib.server
from grpclib import GRPCError, Status

from lmrpc._gen.smg.grpc.common import (
    FlushCacheRequest,
    FlushCacheResponse,
    GetTokenizerChunk,
    GetTokenizerRequest,
    ProfileResponse,
    StartProfileRequest,
    StopProfileRequest,
)
from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import (
    AbortRequest,
    DetokenizeRequest,
    GenerateResponse,
    GetLoadRequest,
    GetModelInfoRequest,
    GetServerInfoRequest,
    RequestIds,
)
from lmrpc.v1 import EmbedRequest as LmrpcEmbedRequest
from lmrpc.v1 import FlushCacheRequest as LmrpcFlushCacheRequest
from reference_server.frontend.context import FrontendContext, Phase
from reference_server.frontend.control import ControlService
from reference_server.frontend.inference import InferenceService
from reference_server.frontend.kv_events import KvEventHub
from reference_server.frontend.smg.kv_stream import kv_events_handler
from reference_server.frontend.smg.tokenizer_bundle import TokenizerZip, build_tokenizer_zip
from reference_server.frontend.vllm import info
from reference_server.frontend.vllm.requests import to_lmrpc
from reference_server.frontend.vllm.responses import GenerateTranslator
from reference_server.models.source import ModelSource

SUBSCRIBE_KV_EVENTS = "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents"
#: The dialect's administrative RPCs: the admin role when authentication is on (AUTH-2).
VLLM_ADMIN_METHODS = frozenset(
    f"/vllm.grpc.engine.VllmEngine/{name}" for name in ("FlushCache", "StartProfile", "StopProfile")
)


class ServingRates(Protocol):
    """Rates the frontend measures (reference_server.frontend.metrics), for GetLoads."""

    def gen_throughput(self) -> float: ...

    def cache_hit_rate(self) -> float: ...


class VllmEngineService(vllm.VllmEngineBase):
    def __init__(
        self,
        context: FrontendContext,
        inference: InferenceService,
        control: ControlService,
        kv_events: KvEventHub,
        source: ModelSource,
        rates: ServingRates | None = None,
    ) -> None:
        self.ctx = context
        self.inference = inference
        self.control = control
        self.kv_events = kv_events
        self.source = source
        self.rates = rates
        self._tokenizer_zip: asyncio.Future[TokenizerZip] | None = None
        self._last_receive = 0.0

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping = super().__mapping__()
        subscribe = mapping[SUBSCRIBE_KV_EVENTS]
        mapping[SUBSCRIBE_KV_EVENTS] = grpclib.const.Handler(
            kv_events_handler(self.kv_events),
            subscribe.cardinality,
            subscribe.request_type,
            subscribe.reply_type,
        )
        return mapping

    async def _call_rpc_handler_server_stream(
        self, handler: Callable[..., Any], stream: grpclib.server.Stream[Any, Any], request: Any
    ) -> None:
        # The same streaming discipline as lmrpc's own Generate (generator closed on cancel,
        # the loop yielded to between messages), whatever it grows into.
        call = cast(Any, InferenceService._call_rpc_handler_server_stream)
        await call(self, handler, stream, request)

    # ── generation ──────────────────────────────────────────────────────────────────────────

    async def generate(self, message: vllm.GenerateRequest) -> AsyncIterator[vllm.GenerateResponse]:
        self._last_receive = time.time()
        request = to_lmrpc(message)
        translator = GenerateTranslator(stream=message.stream)
        lmrpc_events = cast(AsyncGenerator[GenerateResponse], self.inference.generate(request))
        async with contextlib.aclosing(lmrpc_events) as events:
            async for event in events:
                for response in translator.translate(event):
                    yield response

    async def abort(self, message: vllm.AbortRequest) -> vllm.AbortResponse:
        if message.request_ids:  # the dialect's empty list is a no-op, as in vLLM
            await self.control.abort(AbortRequest(request_ids=RequestIds(ids=list(message.request_ids))))
        return vllm.AbortResponse()

    async def embed(self, message: vllm.EmbedRequest) -> vllm.EmbedResponse:
        """The embedding model has a tokenizer of its own, so the ids (the generation model's,
        as smg tokenizes with the tokenizer this server hands out) are decoded back to their
        text, special tokens included, and that text is embedded. ``prompt_tokens`` counts the
        embedding model's tokens."""
        if message.tokenized is None or not message.tokenized.input_ids:
            raise GRPCError(Status.INVALID_ARGUMENT, "tokenized.input_ids must not be empty")
        detokenized = await self.control.detokenize(
            DetokenizeRequest(token_ids=list(message.tokenized.input_ids), skip_special_tokens=False)
        )
        response = await self.inference.embed(
            LmrpcEmbedRequest(request_id=message.request_id, texts=[detokenized.text])
        )
        values = response.embeddings[0].values
        prompt_tokens = response.usage.prompt_tokens if response.usage is not None else 0
        return vllm.EmbedResponse(embedding=values, prompt_tokens=prompt_tokens, embedding_dim=len(values))

    # ── health and discovery ────────────────────────────────────────────────────────────────

    async def health_check(self, message: vllm.HealthCheckRequest) -> vllm.HealthCheckResponse:
        phase = self.ctx.phase
        if phase is Phase.SERVING:
            return vllm.HealthCheckResponse(healthy=True, message="serving")
        detail = f": {self.ctx.failure}" if phase is Phase.FAILED and self.ctx.failure else ""
        return vllm.HealthCheckResponse(healthy=False, message=f"{phase.value}{detail}")

    async def get_model_info(self, message: vllm.GetModelInfoRequest) -> vllm.GetModelInfoResponse:
        response = await self.control.get_model_info(GetModelInfoRequest())
        assert response.model is not None
        return info.model_info(response.model, self.source)

    async def get_server_info(self, message: vllm.GetServerInfoRequest) -> vllm.GetServerInfoResponse:
        engine = self.ctx.ready_engine()
        load = await self.control.get_load(GetLoadRequest())
        server = (await self.control.get_server_info(GetServerInfoRequest())).server
        assert load.current is not None and server is not None
        dtype = self.ctx.config.engine.dtype
        return info.server_info(
            load.current,
            engine.info,
            uptime_seconds=server.uptime_seconds,
            last_receive_timestamp=self._last_receive,
            model_dtype="" if dtype == "auto" else dtype,
        )

    async def get_loads(self, message: vllm.GetLoadsRequest) -> vllm.GetLoadsResponse:
        if message.dp_rank not in (None, 0):
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"dp_rank={message.dp_rank}: this server has one data-parallel rank (0)",
            )
        engine = self.ctx.ready_engine()
        load = await self.control.get_load(GetLoadRequest())
        assert load.current is not None
        rates = self.rates
        return info.loads(
            load.current,
            engine.info,
            gen_throughput=rates.gen_throughput() if rates else 0.0,
            cache_hit_rate=rates.cache_hit_rate() if rates else 0.0,
        )

    async def get_tokenizer(self, message: GetTokenizerRequest) -> AsyncIterator[GetTokenizerChunk]:
        bundle = await self._tokenizer()
        for data, sha256 in bundle.chunks():
            yield GetTokenizerChunk(data=data, sha256=sha256)

    # ── administration ──────────────────────────────────────────────────────────────────────

    async def flush_cache(self, message: FlushCacheRequest) -> FlushCacheResponse:
        """Never waits and never fails for requests in flight: prefixes they use stay cached."""
        if not math.isfinite(message.timeout_s) or message.timeout_s < 0:
            raise GRPCError(Status.INVALID_ARGUMENT, f"timeout_s={message.timeout_s} must be >= 0 and finite")
        response = await self.control.flush_cache(LmrpcFlushCacheRequest())
        return FlushCacheResponse(
            success=True,
            message=f"released {response.released_tokens} cached KV tokens (prefixes in use stay cached)",
        )

    async def start_profile(self, message: StartProfileRequest) -> ProfileResponse:
        raise GRPCError(
            Status.UNIMPLEMENTED, "StartProfile is not supported by this server: it has no profiler"
        )

    async def stop_profile(self, message: StopProfileRequest) -> ProfileResponse:
        raise GRPCError(
            Status.UNIMPLEMENTED, "StopProfile is not supported by this server: it has no profiler"
        )

    async def _tokenizer(self) -> TokenizerZip:
        """The zip, built once (in a thread) by the first caller; later callers share it. A
        build that failed is tried again by the next caller."""
        if self._tokenizer_zip is None:
            engine = self.ctx.ready_engine()
            self._tokenizer_zip = asyncio.ensure_future(
                asyncio.to_thread(build_tokenizer_zip, engine.tokenizer, engine.info)
            )
        try:
            return await asyncio.shield(self._tokenizer_zip)
        except Exception as exc:
            self._tokenizer_zip = None
            raise GRPCError(Status.INTERNAL, f"cannot build the tokenizer bundle: {exc}") from exc
