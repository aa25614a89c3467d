"""What every smg engine dialect of the reference frontend shares: one path onto lmrpc.v1.

A dialect is a thin translation layer, not a second server. Each RPC becomes the lmrpc.v1
request and is answered by the in-process lmrpc services, so one engine, one request table and
one set of limits and checks serve every protocol. This base holds the parts that do not depend
on the dialect's message types: the streaming discipline of Generate, the health answer, the
tokenizer bundle (built once per server, shared by the dialects), and the lmrpc facts the
discovery RPCs translate.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Protocol, cast

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
from lmrpc.v1 import DetokenizeRequest, EmbedRequest, GetLoadRequest, GetModelInfoRequest, Load, ModelInfo
from lmrpc.v1 import FlushCacheRequest as LmrpcFlushCacheRequest
from reference_server.frontend.context import FrontendContext, Phase
from reference_server.frontend.control import ControlService
from reference_server.frontend.dialects.base.kv_stream import kv_events_handler
from reference_server.frontend.dialects.base.tokenizer_bundle import TokenizerZip, build_tokenizer_zip
from reference_server.frontend.inference import InferenceService
from reference_server.frontend.kv_events import KvEventHub
from reference_server.ipc import EngineInfo
from reference_server.models.source import ModelSource

NO_TOKEN_ID = -1  # int32 ids the model lacks (pad, and BOS for some models)


class ServingRates(Protocol):
    """Rates the frontend measures (reference_server.frontend.metrics), for GetLoads."""

    def gen_throughput(self) -> float: ...

    def cache_hit_rate(self) -> float: ...


class TokenizerZipSource:
    """The tokenizer zip, built once (in a thread) by the first caller of any dialect; later
    callers share it. A build that failed is tried again by the next caller."""

    def __init__(self, ctx: FrontendContext) -> None:
        self.ctx = ctx
        self._zip: asyncio.Future[TokenizerZip] | None = None

    async def get(self) -> TokenizerZip:
        if self._zip is None:
            engine = self.ctx.ready_engine()
            self._zip = asyncio.ensure_future(
                asyncio.to_thread(build_tokenizer_zip, engine.tokenizer, engine.info)
            )
        try:
            return await asyncio.shield(self._zip)
        except Exception as exc:
            self._zip = None
            raise GRPCError(Status.INTERNAL, f"cannot build the tokenizer bundle: {exc}") from exc


class DialectBase:
    """Mixed in before the generated service base: ``class X(DialectBase, xyz.XyzBase)``."""

    #: the protocol's SubscribeKvEvents path, served from the radix cache's event hub
    kv_events_path: ClassVar[str]

    def __init__(
        self,
        context: FrontendContext,
        inference: InferenceService,
        control: ControlService,
        kv_events: KvEventHub,
        source: ModelSource,
        tokenizer_zip: TokenizerZipSource,
        rates: ServingRates | None = None,
    ) -> None:
        self.ctx = context
        self.inference = inference
        self.control = control
        self.kv_events = kv_events
        self.source = source
        self.tokenizer_zip = tokenizer_zip
        self.rates = rates
        self._last_receive = 0.0  # when the last Generate arrived (the protocols' server info)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping: dict[str, grpclib.const.Handler] = cast(Any, super()).__mapping__()
        subscribe = mapping[self.kv_events_path]
        mapping[self.kv_events_path] = grpclib.const.Handler(
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

    def health(self) -> tuple[bool, str]:
        """``(healthy, message)``: healthy only while SERVING; the message names the phase
        (``starting``, ``draining``, ``failed: <why>``)."""
        phase = self.ctx.phase
        if phase is Phase.SERVING:
            return True, "serving"
        detail = f": {self.ctx.failure}" if phase is Phase.FAILED and self.ctx.failure else ""
        return False, f"{phase.value}{detail}"

    # ── the RPCs both protocols share (smg.grpc.common messages) ─────────────────────────────

    async def get_tokenizer(self, message: GetTokenizerRequest) -> AsyncIterator[GetTokenizerChunk]:
        bundle = await self.tokenizer_zip.get()
        for data, sha256 in bundle.chunks():
            yield GetTokenizerChunk(data=data, sha256=sha256)

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

    async def rated_load(self, dp_rank: int | None) -> tuple[Load, EngineInfo, float, float]:
        """What GetLoads reports: our Load, the engine's facts, generation throughput and cache
        hit rate (0 without metrics)."""
        if dp_rank not in (None, 0):
            raise GRPCError(
                Status.INVALID_ARGUMENT, f"dp_rank={dp_rank}: this server has one data-parallel rank (0)"
            )
        engine = self.ctx.ready_engine()
        load = await self.lmrpc_load()
        rates = self.rates
        if rates is None:
            return load, engine.info, 0.0, 0.0
        return load, engine.info, rates.gen_throughput(), rates.cache_hit_rate()

    async def embed_token_ids(self, request_id: str, token_ids: list[int]) -> tuple[list[float], int]:
        """``(embedding, prompt_tokens)`` of a tokenized input. The embedding model has a
        tokenizer of its own, so the ids (the generation model's, as smg tokenizes with the
        tokenizer this server hands out) are decoded back to their text, special tokens
        included, and that text is embedded; ``prompt_tokens`` counts the embedding model's
        tokens."""
        if not token_ids:
            raise GRPCError(Status.INVALID_ARGUMENT, "tokenized.input_ids must not be empty")
        detokenized = await self.control.detokenize(
            DetokenizeRequest(token_ids=token_ids, skip_special_tokens=False)
        )
        response = await self.inference.embed(EmbedRequest(request_id=request_id, texts=[detokenized.text]))
        prompt_tokens = response.usage.prompt_tokens if response.usage is not None else 0
        return list(response.embeddings[0].values), prompt_tokens

    async def lmrpc_model(self) -> ModelInfo:
        response = await self.control.get_model_info(GetModelInfoRequest())
        assert response.model is not None
        return response.model

    async def lmrpc_load(self) -> Load:
        response = await self.control.get_load(GetLoadRequest())
        assert response.current is not None
        return response.current


def model_path_label(source: ModelSource, model_id: str) -> str:
    """Where smg looks for the tokenizer first: the model directory of a Hugging Face checkpoint
    (loaded when smg shares the filesystem), else the model id, which is no path, so smg fetches
    the tokenizer over GetTokenizer."""
    return str(source.path) if source.kind == "hf" else model_id


def sampling_defaults_json(model: ModelInfo) -> str:
    """lmrpc's EffectiveDefaults as ``default_sampling_params_json``: the values smg reads
    (``worker/sampling_defaults.rs``: temperature, top_p, top_k, min_p, repetition_penalty)."""
    defaults = model.defaults
    if defaults is None:
        return "{}"
    values = {
        "temperature": defaults.temperature,
        "top_p": defaults.top_p,
        "top_k": defaults.top_k,
        "min_p": defaults.min_p,
        "repetition_penalty": defaults.repetition_penalty,
    }
    return json.dumps(values, sort_keys=True)
