"""``vllm.grpc.engine.VllmEngine``: the worker protocol that smg speaks to vLLM, served by the
reference frontend next to lmrpc.v1, on the same port.

A thin translation layer, not a second server: every RPC is turned into the lmrpc.v1 request
and answered by the in-process lmrpc services (``InferenceService.generate`` as an async
iterator, ``ControlService`` for load, abort, flush, discovery, detokenization), so one engine,
one request table and one set of limits and checks serve both protocols. ``docs/vllm-dialect.md``
maps every field.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import (
    AbortRequest,
    GenerateResponse,
    GetServerInfoRequest,
    RequestIds,
)
from reference_server.frontend.dialects.base.service import DialectBase
from reference_server.frontend.dialects.vllm_engine import info
from reference_server.frontend.dialects.vllm_engine.requests import to_lmrpc
from reference_server.frontend.dialects.vllm_engine.responses import GenerateTranslator

SUBSCRIBE_KV_EVENTS = "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents"
#: The dialect's administrative RPCs: the admin role when authentication is on (AUTH-2).
VLLM_ADMIN_METHODS = frozenset(
    f"/vllm.grpc.engine.VllmEngine/{name}" for name in ("FlushCache", "StartProfile", "StopProfile")
)


class VllmEngineService(DialectBase, vllm.VllmEngineBase):
    kv_events_path = SUBSCRIBE_KV_EVENTS

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
        """The ids are decoded back to text for the embedding model (``embed_token_ids``)."""
        ids = list(message.tokenized.input_ids) if message.tokenized is not None else []
        values, prompt_tokens = await self.embed_token_ids(message.request_id, ids)
        return vllm.EmbedResponse(embedding=values, prompt_tokens=prompt_tokens, embedding_dim=len(values))

    # ── health and discovery ────────────────────────────────────────────────────────────────

    async def health_check(self, message: vllm.HealthCheckRequest) -> vllm.HealthCheckResponse:
        healthy, why = self.health()
        return vllm.HealthCheckResponse(healthy=healthy, message=why)

    async def get_model_info(self, message: vllm.GetModelInfoRequest) -> vllm.GetModelInfoResponse:
        return info.model_info(await self.lmrpc_model(), self.source)

    async def get_server_info(self, message: vllm.GetServerInfoRequest) -> vllm.GetServerInfoResponse:
        engine = self.ctx.ready_engine()
        load = await self.lmrpc_load()
        server = (await self.control.get_server_info(GetServerInfoRequest())).server
        assert server is not None
        dtype = self.ctx.config.engine.dtype
        return info.server_info(
            load,
            engine.info,
            uptime_seconds=server.uptime_seconds,
            last_receive_timestamp=self._last_receive,
            model_dtype="" if dtype == "auto" else dtype,
        )

    async def get_loads(self, message: vllm.GetLoadsRequest) -> vllm.GetLoadsResponse:
        load, engine_info, gen_throughput, cache_hit_rate = await self.rated_load(message.dp_rank)
        return info.loads(load, engine_info, gen_throughput=gen_throughput, cache_hit_rate=cache_hit_rate)
