"""``sglang.grpc.scheduler.SglangScheduler``: the worker protocol that smg speaks to SGLang,
served by the reference frontend on its own port (``--sglang-port``).

Its own port because smg detects a worker's protocol by which engine's ``HealthCheck`` answers,
trying SGLang's first (``detect_backend.rs``): a port answering both SGLang and vLLM would be
taken for SGLang. Like the vLLM dialect it is a thin translation layer onto the in-process
lmrpc services (one engine, one request table, one set of limits and checks);
``docs/sglang-dialect.md`` maps every field and says what the protocol cannot express.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc.v1 import AbortRequest, AbortStatus, GenerateResponse, GetServerInfoRequest, RequestIds
from reference_server.frontend.dialects.base.service import DialectBase
from reference_server.frontend.dialects.sglang_scheduler import info
from reference_server.frontend.dialects.sglang_scheduler.requests import to_lmrpc
from reference_server.frontend.dialects.sglang_scheduler.responses import GenerateTranslator
from reference_server.frontend.dialects.vllm_engine.requests import unimplemented

SERVICE = "/sglang.grpc.scheduler.SglangScheduler/"
SUBSCRIBE_KV_EVENTS = SERVICE + "SubscribeKvEvents"
#: The protocol's administrative RPCs: the admin role when authentication is on (AUTH-2).
SGLANG_ADMIN_METHODS = frozenset(
    SERVICE + name
    for name in ("FlushCache", "StartProfile", "StopProfile", "LoadLoRAAdapter", "UnloadLoRAAdapter")
)


class SglangSchedulerService(DialectBase, sglang.SglangSchedulerBase):
    kv_events_path = SUBSCRIBE_KV_EVENTS

    # ── generation ──────────────────────────────────────────────────────────────────────────

    async def generate(self, message: sglang.GenerateRequest) -> AsyncIterator[sglang.GenerateResponse]:
        self._last_receive = time.time()
        request = to_lmrpc(message)
        translator = GenerateTranslator(stream=message.stream)
        lmrpc_events = cast(AsyncGenerator[GenerateResponse], self.inference.generate(request))
        async with contextlib.aclosing(lmrpc_events) as events:
            async for event in events:
                for response in translator.translate(event):
                    yield response

    async def abort(self, message: sglang.AbortRequest) -> sglang.AbortResponse:
        """One id per call; ``success`` says whether it covered a request in flight (``reason``
        is the caller's note: smg sends "Stream dropped"). An unknown id is remembered for the
        abort grace period, so an Abort that overtakes its Generate still wins (ABORT-6)."""
        rid = message.request_id
        if not rid:
            return sglang.AbortResponse(success=False, message="request_id is empty: nothing to abort")
        response = await self.control.abort(AbortRequest(request_ids=RequestIds(ids=[rid])))
        aborted = any(o.status == AbortStatus.ABORTED for o in response.outcomes)
        return sglang.AbortResponse(
            success=aborted, message=f"request {rid} {'aborted' if aborted else 'is not in flight'}"
        )

    async def embed(self, message: sglang.EmbedRequest) -> sglang.EmbedResponse:
        """The ids are decoded back to text for the embedding model (``embed_token_ids``)."""
        if message.is_cross_encoder or message.texts:
            raise unimplemented("is_cross_encoder, texts", "no cross-encoder scoring")
        if message.mm_inputs is not None:
            raise unimplemented("mm_inputs", "a text-only model")
        ids = list(message.tokenized.input_ids) if message.tokenized is not None else []
        values, prompt_tokens = await self.embed_token_ids(message.request_id, ids)
        return sglang.EmbedResponse(embedding_dim=len(values), embedding=values, prompt_tokens=prompt_tokens)

    # ── health and discovery ────────────────────────────────────────────────────────────────

    async def health_check(self, message: sglang.HealthCheckRequest) -> sglang.HealthCheckResponse:
        healthy, why = self.health()
        return sglang.HealthCheckResponse(healthy=healthy, message=why)

    async def get_model_info(self, message: sglang.GetModelInfoRequest) -> sglang.GetModelInfoResponse:
        return info.model_info(await self.lmrpc_model(), self.source)

    async def get_server_info(self, message: sglang.GetServerInfoRequest) -> sglang.GetServerInfoResponse:
        engine = self.ctx.ready_engine()
        load = await self.lmrpc_load()
        server = (await self.control.get_server_info(GetServerInfoRequest())).server
        assert server is not None
        return info.server_info(
            load,
            engine.info,
            await self.lmrpc_model(),
            self.source,
            uptime_seconds=server.uptime_seconds,
            last_receive_timestamp=self._last_receive,
        )

    async def get_loads(self, message: sglang.GetLoadsRequest) -> sglang.GetLoadsResponse:
        load, engine_info, gen_throughput, cache_hit_rate = await self.rated_load(message.dp_rank)
        return info.loads(load, engine_info, gen_throughput=gen_throughput, cache_hit_rate=cache_hit_rate)

    # ── administration ──────────────────────────────────────────────────────────────────────

    async def load_lo_ra_adapter(
        self, message: sglang.LoadLoRaAdapterRequest
    ) -> sglang.LoadLoRaAdapterResponse:
        raise unimplemented("LoadLoRAAdapter", "no LoRA adapters")

    async def unload_lo_ra_adapter(
        self, message: sglang.UnloadLoRaAdapterRequest
    ) -> sglang.UnloadLoRaAdapterResponse:
        raise unimplemented("UnloadLoRAAdapter", "no LoRA adapters")

    async def list_loaded_lo_ra_adapters(
        self, message: sglang.ListLoadedLoRaAdaptersRequest
    ) -> sglang.ListLoadedLoRaAdaptersResponse:
        return sglang.ListLoadedLoRaAdaptersResponse()  # none are loaded, ever
