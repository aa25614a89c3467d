"""``sglang.grpc.scheduler.SglangScheduler``: the worker protocol that smg speaks to SGLang,
served by the reference frontend on its own port (``--sglang-scheduler-port``).

Its own port because smg detects a worker's protocol by which engine's ``HealthCheck`` answers,
trying SGLang's first (``detect_backend.rs``): a port answering both SGLang and vLLM would be
taken for SGLang. Like the vLLM dialect it is a thin translation layer onto the in-process
lmrpc services (``dialects/base/``); ``docs/protocols/sglang-scheduler.md`` maps every field and says what
the protocol cannot express.
"""

from __future__ import annotations

from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc.v1 import GenerateRequest
from reference_server.config import ServerConfig
from reference_server.frontend.dialects.base.dialect import Dialect
from reference_server.frontend.dialects.base.requests import unimplemented
from reference_server.frontend.dialects.base.smg_common import SmgEngineDialect
from reference_server.frontend.dialects.sglang_scheduler import info
from reference_server.frontend.dialects.sglang_scheduler.requests import to_lmrpc
from reference_server.frontend.dialects.sglang_scheduler.responses import GenerateTranslator

SERVICE = "sglang.grpc.scheduler.SglangScheduler"


class SglangSchedulerService(
    SmgEngineDialect[sglang.GenerateRequest, sglang.GenerateResponse], sglang.SglangSchedulerBase
):
    kv_events_path = f"/{SERVICE}/SubscribeKvEvents"

    def lmrpc_request(self, message: sglang.GenerateRequest) -> GenerateRequest:
        return to_lmrpc(message)

    def translator(self, message: sglang.GenerateRequest) -> GenerateTranslator:
        return GenerateTranslator(stream=message.stream)

    async def abort(self, message: sglang.AbortRequest) -> sglang.AbortResponse:
        """One id per call; ``success`` says whether it covered a request in flight (``reason``
        is the caller's note: smg sends "Stream dropped"). An unknown id is remembered for the
        abort grace period, so an Abort that overtakes its Generate still wins (ABORT-6)."""
        rid = message.request_id
        if not rid:
            return sglang.AbortResponse(success=False, message="request_id is empty: nothing to abort")
        aborted = await self.abort_request_ids([rid])
        return sglang.AbortResponse(
            success=aborted, message=f"request {rid} {'aborted' if aborted else 'is not in flight'}"
        )

    async def embed(self, message: sglang.EmbedRequest) -> sglang.EmbedResponse:
        """The ids are decoded back to text for the embedding model (``embed_tokenized``)."""
        if message.is_cross_encoder or message.texts:
            raise unimplemented("is_cross_encoder, texts", "no cross-encoder scoring")
        if message.mm_inputs is not None:
            raise unimplemented("mm_inputs", "a text-only model")
        values, prompt_tokens = await self.embed_tokenized(message.request_id, message.tokenized)
        return sglang.EmbedResponse(embedding_dim=len(values), embedding=values, prompt_tokens=prompt_tokens)

    async def health_check(self, message: sglang.HealthCheckRequest) -> sglang.HealthCheckResponse:
        healthy, why = self.health()
        return sglang.HealthCheckResponse(healthy=healthy, message=why)

    async def get_model_info(self, message: sglang.GetModelInfoRequest) -> sglang.GetModelInfoResponse:
        return sglang.GetModelInfoResponse(**await self.model_info_fields())

    async def get_server_info(self, message: sglang.GetServerInfoRequest) -> sglang.GetServerInfoResponse:
        facts = await self.server_facts()
        return info.server_info(facts, await self.lmrpc_model(), self.source)

    async def get_loads(self, message: sglang.GetLoadsRequest) -> sglang.GetLoadsResponse:
        return info.loads(await self.rated_load(message.dp_rank))

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


def _own_port(config: ServerConfig) -> int | None:
    return config.sglang_scheduler_port


def _enabled(config: ServerConfig) -> bool:
    return config.sglang_scheduler_port is not None


SGLANG_SCHEDULER = Dialect(
    name="sglang-scheduler",
    grpc_service=SERVICE,
    service=SglangSchedulerService,
    admin_rpcs=("FlushCache", "StartProfile", "StopProfile", "LoadLoRAAdapter", "UnloadLoRAAdapter"),
    enabled=_enabled,
    own_port=_own_port,
)
