"""What every dialect of the reference frontend shares: one path onto lmrpc.v1.

A dialect is a thin translation layer, not a second server. Each RPC becomes the lmrpc.v1
request and is answered by the in-process lmrpc services, so one engine, one request table and
one set of limits and checks serve every protocol. ``DialectBase`` holds what does not depend on
the dialect's message types: Generate (translate the request, stream lmrpc's events through the
dialect's translator, with lmrpc's streaming discipline), the health answer, and the lmrpc facts
that discovery, load, abort and embedding translate.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar, cast

from grpclib import GRPCError, Status

from lmrpc.v1 import (
    AbortRequest,
    AbortStatus,
    DetokenizeRequest,
    EmbedRequest,
    GenerateRequest,
    GenerateResponse,
    GetLoadRequest,
    GetModelInfoRequest,
    GetServerInfoRequest,
    Load,
    ModelInfo,
    RequestIds,
)
from reference_server.frontend.context import FrontendContext, Phase
from reference_server.frontend.control import ControlService
from reference_server.frontend.dialects.base.info import ModelInfoFields, RatedLoad, model_info_fields
from reference_server.frontend.dialects.base.requests import check_one_data_parallel_rank
from reference_server.frontend.dialects.base.tokenizer_bundle import TokenizerZipSource
from reference_server.frontend.dialects.base.translator import GenerateTranslator
from reference_server.frontend.grpc_hooks import StreamingDiscipline
from reference_server.frontend.inference import InferenceService
from reference_server.frontend.kv_events import KvEventHub
from reference_server.ipc import EngineInfo
from reference_server.models.source import ModelSource

DialectRequest = TypeVar("DialectRequest")
DialectResponse = TypeVar("DialectResponse")
Translated = TypeVar("Translated")


class ServingRates(Protocol):
    """Rates the frontend measures (reference_server.frontend.metrics), for GetLoads."""

    def gen_throughput(self) -> float: ...

    def cache_hit_rate(self) -> float: ...


class Tokenized(Protocol):
    """A dialect's tokenized input."""

    @property
    def input_ids(self) -> Sequence[int]: ...


@dataclass(frozen=True, slots=True)
class Backend:
    """What a dialect translates onto: the in-process lmrpc.v1 services and what the server
    keeps once for every dialect."""

    ctx: FrontendContext
    inference: InferenceService
    control: ControlService
    kv_events: KvEventHub
    source: ModelSource
    tokenizer_zip: TokenizerZipSource  # one bundle for every smg dialect
    rates: ServingRates | None = None


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the dialects' GetServerInfo translate."""

    load: Load
    engine: EngineInfo
    uptime_seconds: float
    started_at_unix: float  # when the server process started, on the wall clock
    last_receive_timestamp: float  # when the last Generate arrived (0: none yet)


class DialectBase(StreamingDiscipline, ABC, Generic[DialectRequest, DialectResponse]):
    """Mixed in before the generated service base:
    ``class X(DialectBase[xyz.GenerateRequest, xyz.GenerateResponse], xyz.XyzBase)``."""

    # Stop strings matched on text released a whole token at a time (DetokenizeConfig), where the
    # protocol's own engine does so and its gateway decodes the ids: vLLM's detokenizer.
    whole_token_text: ClassVar[bool] = False

    def __init__(self, backend: Backend) -> None:
        self.ctx = backend.ctx
        self.inference = backend.inference
        self.control = backend.control
        self.kv_events = backend.kv_events
        self.source = backend.source
        self.tokenizer_zip = backend.tokenizer_zip
        self.rates = backend.rates
        self._last_receive = 0.0  # when the last Generate arrived (the protocols' server info)

    # ── what each dialect says ──────────────────────────────────────────────────────────────

    @abstractmethod
    def lmrpc_request(self, message: DialectRequest) -> GenerateRequest:
        """The dialect's Generate request as lmrpc.v1's; refusals raise GRPCError."""

    @abstractmethod
    def translator(self, message: DialectRequest) -> GenerateTranslator[DialectResponse]:
        """What turns lmrpc.v1's Generate events into this call's responses."""

    # ── generation ──────────────────────────────────────────────────────────────────────────

    async def generate(self, message: DialectRequest) -> AsyncIterator[DialectResponse]:
        self._last_receive = time.time()  # a request refused in translation arrived too
        request = self.lmrpc_request(message)
        async for response in self.translated_generate(request, self.translator(message)):
            yield response

    async def translated_generate(
        self, request: GenerateRequest, translator: GenerateTranslator[Translated]
    ) -> AsyncIterator[Translated]:
        """lmrpc.v1's Generate of ``request``, each event through ``translator`` (for a dialect
        with more than one generating RPC)."""
        self._last_receive = time.time()
        lmrpc_events = cast(
            AsyncGenerator[GenerateResponse],
            self.inference.generate(request, whole_token_text=self.whole_token_text),
        )
        async with contextlib.aclosing(lmrpc_events) as events:
            async for event in events:
                for response in translator.translate(event):
                    yield response

    async def abort_request_ids(self, request_ids: list[str]) -> bool:
        """Abort these requests as lmrpc.v1's Abort does; True if any was in flight."""
        response = await self.control.abort(AbortRequest(request_ids=RequestIds(ids=request_ids)))
        return any(o.status == AbortStatus.ABORTED for o in response.outcomes)

    async def embed_tokenized(self, request_id: str, tokenized: Tokenized | None) -> tuple[list[float], int]:
        """``(embedding, prompt_tokens)`` of a tokenized input. The embedding model has a
        tokenizer of its own, so the ids (the generation model's, as smg tokenizes with the
        tokenizer this server hands out) are decoded back to their text, special tokens
        included, and that text is embedded; ``prompt_tokens`` counts the embedding model's
        tokens."""
        token_ids = list(tokenized.input_ids) if tokenized is not None else []
        if not token_ids:
            raise GRPCError(Status.INVALID_ARGUMENT, "tokenized.input_ids must not be empty")
        detokenized = await self.control.detokenize(
            DetokenizeRequest(token_ids=token_ids, skip_special_tokens=False)
        )
        response = await self.inference.embed(EmbedRequest(request_id=request_id, texts=[detokenized.text]))
        prompt_tokens = response.usage.prompt_tokens if response.usage is not None else 0
        return list(response.embeddings[0].values), prompt_tokens

    # ── health and discovery ────────────────────────────────────────────────────────────────

    def health(self) -> tuple[bool, str]:
        """``(healthy, message)``: healthy only while SERVING; the message names the phase
        (``starting``, ``draining``, ``failed: <why>``)."""
        phase = self.ctx.phase
        if phase is Phase.SERVING:
            return True, "serving"
        detail = f": {self.ctx.failure}" if phase is Phase.FAILED and self.ctx.failure else ""
        return False, f"{phase.value}{detail}"

    async def server_facts(self) -> ServerFacts:
        engine = self.ctx.ready_engine()
        load = await self.lmrpc_load()
        server = (await self.control.get_server_info(GetServerInfoRequest())).server
        assert server is not None
        return ServerFacts(
            load, engine.info, server.uptime_seconds, self.ctx.started_at_unix, self._last_receive
        )

    async def rated_load(self, dp_rank: int | None) -> RatedLoad:
        """What GetLoads reports: our Load, the engine's facts, generation throughput and cache
        hit rate (0 without metrics)."""
        check_one_data_parallel_rank("dp_rank", dp_rank)
        engine = self.ctx.ready_engine()
        load = await self.lmrpc_load()
        rates = self.rates
        if rates is None:
            return RatedLoad(load, engine.info, 0.0, 0.0)
        return RatedLoad(load, engine.info, rates.gen_throughput(), rates.cache_hit_rate())

    async def model_info_fields(self) -> ModelInfoFields:
        return model_info_fields(await self.lmrpc_model(), self.source)

    async def lmrpc_model(self) -> ModelInfo:
        response = await self.control.get_model_info(GetModelInfoRequest())
        assert response.model is not None
        return response.model

    async def lmrpc_load(self) -> Load:
        response = await self.control.get_load(GetLoadRequest())
        assert response.current is not None
        return response.current
