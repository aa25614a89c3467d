"""``vllm.grpc.engine.VllmEngine``: the worker protocol that smg speaks to vLLM, served by the
reference frontend next to lmrpc.v1, on the same port (unless ``--no-vllm-engine``).

A thin translation layer, not a second server: every RPC is turned into the lmrpc.v1 request
and answered by the in-process lmrpc services (``dialects/base/``), so one engine, one request
table and one set of limits and checks serve every protocol. ``docs/protocols/vllm-engine.md`` maps every
field.
"""

from __future__ import annotations

from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import GenerateRequest
from reference_server.config import ServerConfig
from reference_server.frontend.dialects.base.dialect import Dialect
from reference_server.frontend.dialects.base.smg_common import SmgEngineDialect
from reference_server.frontend.dialects.vllm_engine import info
from reference_server.frontend.dialects.vllm_engine.requests import to_lmrpc
from reference_server.frontend.dialects.vllm_engine.responses import GenerateTranslator

SERVICE = "vllm.grpc.engine.VllmEngine"


class VllmEngineService(SmgEngineDialect[vllm.GenerateRequest, vllm.GenerateResponse], vllm.VllmEngineBase):
    kv_events_path = f"/{SERVICE}/SubscribeKvEvents"
    # vLLM holds a token that ends inside a character until it completes, and matches stop strings
    # on that text: smg, decoding the ids as vLLM's engine sends them, then sees the whole stop
    whole_token_text = True

    def lmrpc_request(self, message: vllm.GenerateRequest) -> GenerateRequest:
        return to_lmrpc(message)

    def translator(self, message: vllm.GenerateRequest) -> GenerateTranslator:
        return GenerateTranslator(stream=message.stream)

    async def abort(self, message: vllm.AbortRequest) -> vllm.AbortResponse:
        if message.request_ids:  # the dialect's empty list is a no-op, as in vLLM
            await self.abort_request_ids(list(message.request_ids))
        return vllm.AbortResponse()

    async def embed(self, message: vllm.EmbedRequest) -> vllm.EmbedResponse:
        """The ids are decoded back to text for the embedding model (``embed_tokenized``)."""
        values, prompt_tokens = await self.embed_tokenized(message.request_id, message.tokenized)
        return vllm.EmbedResponse(embedding=values, prompt_tokens=prompt_tokens, embedding_dim=len(values))

    async def health_check(self, message: vllm.HealthCheckRequest) -> vllm.HealthCheckResponse:
        healthy, why = self.health()
        return vllm.HealthCheckResponse(healthy=healthy, message=why)

    async def get_model_info(self, message: vllm.GetModelInfoRequest) -> vllm.GetModelInfoResponse:
        return vllm.GetModelInfoResponse(**await self.model_info_fields())

    async def get_server_info(self, message: vllm.GetServerInfoRequest) -> vllm.GetServerInfoResponse:
        facts = await self.server_facts()
        dtype = self.ctx.config.engine.dtype
        return info.server_info(facts, model_dtype="" if dtype == "auto" else dtype)

    async def get_loads(self, message: vllm.GetLoadsRequest) -> vllm.GetLoadsResponse:
        return info.loads(await self.rated_load(message.dp_rank))


def _enabled(config: ServerConfig) -> bool:
    return config.vllm_engine


VLLM_ENGINE = Dialect(
    name="vllm-engine",
    grpc_service=SERVICE,
    service=VllmEngineService,
    admin_rpcs=("FlushCache", "StartProfile", "StopProfile"),
    enabled=_enabled,
)
