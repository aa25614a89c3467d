"""smg's engine layer: what the drivers of its two engine protocols share (``vllm.grpc.engine.VllmEngine``,
``sglang.grpc.scheduler.SglangScheduler``): discovery, the text a case sends, stub adapters with
lmrpc.v1's methods, and Generate through the normaliser.

These protocols are *gateway-side tokenizer* protocols: the server takes and returns token ids,
and the gateway (smg) tokenizes, detokenizes and matches stop strings itself. So does the
driver: a case's text prompt is tokenized with the server's own ``GetTokenizer`` bundle, as smg
does, and what the protocol cannot carry is dropped from the request the record keeps
(``express``), so that every check judges the request the server actually got.

Nothing in these protocols advertises what lmrpc.v1's ``Capabilities`` do. The driver states
what the protocol can express; what only the server can promise (determinism, a prefix cache)
comes from ``--assume`` (``Promises``).
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, ClassVar

import betterproto2
from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.const import Cardinality
from tokenizers import Tokenizer

from conformance.drivers.adapter import DriverInference, adapts, unsupported, unsupported_error
from conformance.drivers.base import (
    DEADLINE_STATUSES,
    MAX_OUTPUTS,
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    Discovered,
    Driver,
    Promises,
    json_object,
)
from conformance.drivers.bundle import Bundle, BundleError
from conformance.drivers.normalize import Normalizer
from conformance.stream.record import Finding
from conformance.stream.wire import Decoded
from conformance.vocabulary import CaseSkipped
from lmrpc._gen.smg.grpc.common import FlushCacheRequest as NativeFlushCacheRequest
from lmrpc._gen.smg.grpc.common import GetTokenizerRequest
from lmrpc.v1 import (
    AbortOutcome,
    AbortRequest,
    AbortResponse,
    Capabilities,
    ControlServiceStub,
    EffectiveDefaults,
    FlushCacheRequest,
    FlushCacheResponse,
    GenerateRequest,
    GenerateResponse,
    GetLoadRequest,
    GetLoadResponse,
    GetModelInfoRequest,
    GetModelInfoResponse,
    GetServerInfoRequest,
    GetServerInfoResponse,
    InferenceServiceStub,
    Load,
    ModelInfo,
    ResponseOptions,
    ServerInfo,
    ServerLimits,
    TokenIds,
)

if TYPE_CHECKING:
    from betterproto2.grpclib.grpclib_client import MetadataLike

# The semantic defaults both engines document, for what default_sampling_params_json leaves out.
SMG_DEFAULTS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
}


def defaults_from(json_text: str, max_context: int) -> EffectiveDefaults:
    """``default_sampling_params_json`` as lmrpc's EffectiveDefaults. The default max_tokens is
    the engine's own and not reported: the window stands in for it (an upper bound)."""
    given = json_object(json_text, "GetModelInfo.default_sampling_params_json")
    values = {**SMG_DEFAULTS, **{k: v for k, v in given.items() if k in SMG_DEFAULTS}}
    top_k = int(values["top_k"])
    return EffectiveDefaults(
        temperature=float(values["temperature"]),
        top_p=float(values["top_p"]),
        top_k=max(top_k, 0),  # -1 is SGLang's "disabled", lmrpc's is 0
        min_p=float(values["min_p"]),
        frequency_penalty=float(values["frequency_penalty"]),
        presence_penalty=float(values["presence_penalty"]),
        repetition_penalty=float(values["repetition_penalty"]),
        n=1,
        max_tokens=max_context,
        min_tokens=0,
    )


class SmgDriver(Driver):
    cumulative: ClassVar[bool]  # chunk counts are the output's totals so far (SGLang), else per chunk
    echoes_request_id: ClassVar[bool]  # every response carries the request id
    seeds: ClassVar[bool]  # the protocol has a seed field
    response_type: ClassVar[type[betterproto2.Message]]
    probed_before: ClassVar[tuple[str, ...]] = ()  # services whose HealthCheck smg tries first
    carries_text = False  # the gateway detokenizes
    names_constraint_fields = False

    def __init__(self, promises: Promises | None = None) -> None:
        promises = promises or Promises()
        if promises.seeded_sampling and not self.seeds:
            raise ValueError(f"--assume seeded_sampling: {self.protocol} has no seed field")
        self.promises = promises
        self.model = ModelInfo()
        self._tokenizer: Tokenizer | None = None
        self.tokenizer_problem = "discovery has not run"  # why there is no tokenizer, when there is none
        self.cache_block_tokens = 0  # GetServerInfo.block_size, where the protocol has it

    # ── what each protocol defines ───────────────────────────
    @abstractmethod
    def stub(self, channel: Channel) -> Any:
        """The protocol's generated client stub."""

    @abstractmethod
    def native_request(self, request: GenerateRequest) -> betterproto2.Message:
        """The protocol's GenerateRequest for an expressed lmrpc.v1 request."""

    @abstractmethod
    def express_options(self, request: GenerateRequest) -> GenerateRequest:
        """Drop or fill what the protocol cannot carry as lmrpc would read it (a copy is given)."""

    @abstractmethod
    async def native_abort(self, stub: Any, ids: list[str], timeout: float | None) -> list[AbortOutcome]: ...

    @abstractmethod
    def health_request(self) -> betterproto2.Message: ...

    async def probe(self, channel: Channel, timeout_s: float) -> None:
        """smg's own probe of a worker: the engine's HealthCheck."""
        await self.stub(channel).health_check(self.health_request(), timeout=timeout_s)

    @abstractmethod
    def model_request(self) -> betterproto2.Message: ...

    @abstractmethod
    def server_request(self) -> betterproto2.Message: ...

    @abstractmethod
    def loads_request(self) -> betterproto2.Message: ...

    @property
    def generate_path(self) -> str:
        return f"/{self.service}/Generate"

    # ── requests ─────────────────────────────────────────────
    def tokenize(self, text: str) -> list[int]:
        return list(self._loaded_tokenizer().encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: list[int]) -> str | None:
        return str(self._loaded_tokenizer().decode(token_ids, skip_special_tokens=True))

    def _loaded_tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise CaseSkipped(
                f"text is tokenized as smg does, with the server's GetTokenizer bundle, which does not load "
                f"({self.tokenizer_problem}): SMG-1 holds the finding"
            )
        return self._tokenizer

    def express(self, request: GenerateRequest) -> GenerateRequest:
        out = GenerateRequest.parse(bytes(request))
        if out.chat is not None:
            raise ValueError(f"{self.protocol} has no chat input: the gateway renders chat templates")
        if out.text is not None:
            out.token_ids, out.text = TokenIds(ids=self.tokenize(out.text)), None
        out.parse_special_tokens = None
        asked = out.response or ResponseOptions()
        out.response = ResponseOptions(
            return_text=False,  # the gateway detokenizes
            return_token_ids=True,
            return_logprobs=asked.return_logprobs,
            top_logprobs=asked.top_logprobs if asked.return_logprobs else 0,
            skip_special_tokens=asked.skip_special_tokens,
            final_only=asked.final_only,
        )
        return self.express_options(out)

    # ── Generate ─────────────────────────────────────────────
    async def events(
        self,
        channel: Channel,
        request: GenerateRequest,
        deadline_s: float | None,
        findings: list[Finding],
        metadata: MetadataLike | None = None,
    ) -> AsyncGenerator[Decoded]:
        native = self.native_request(request)
        rid = request.request_id
        normalizer = Normalizer(request, self.cumulative, tuple(self.model.eos_token_ids), findings)
        received = 0
        try:
            async with channel.request(
                self.generate_path,
                Cardinality.UNARY_STREAM,
                type(native),
                self.response_type,
                timeout=deadline_s,
                metadata=metadata,
            ) as stream:
                await stream.send_message(native, end=True)
                while (message := await stream.recv_message()) is not None:
                    received += 1
                    for event in self._normalised(normalizer, rid, message):
                        yield Decoded(event, None, True)
                await stream.recv_trailing_metadata()
        except GRPCError as exc:
            if not received or (deadline_s is not None and exc.status in DEADLINE_STATUSES):
                raise  # refused before the first message, or our own deadline: the status is the answer
            yield Decoded(normalizer.failure(rid, exc.status, exc.message or ""), None, True)

    def _normalised(self, normalizer: Normalizer, rid: str, message: Any) -> list[GenerateResponse]:
        echoed = message.request_id if self.echoes_request_id else rid
        kind, body = betterproto2.which_one_of(message, "response")
        if body is not None and kind == "chunk":
            return normalizer.chunk(echoed, body)
        if body is not None and kind == "complete":
            return normalizer.complete(echoed, body)
        return normalizer.nothing(echoed)

    # ── discovery ────────────────────────────────────────────
    async def discover(self, channel: Channel, timeout_s: float) -> Discovered:
        stub = self.stub(channel)
        self.model = await self.model_info(stub, timeout_s)
        load = await self.load(stub, timeout_s)
        await self.load_tokenizer(channel, timeout_s)
        server = await self.server_info(stub, timeout_s)
        return Discovered(server, self.model, None, load.kv_tokens_total, self.cache_block_tokens)

    async def load_tokenizer(self, channel: Channel, timeout_s: float) -> None:
        """The server's tokenizer, from its GetTokenizer bundle, as smg loads it. A bundle that does
        not load is SMG-1's finding, not the end of the run: the cases that send text then skip
        with its reason, and the rest run."""
        try:
            self._tokenizer = (await self.bundle(channel, timeout_s)).tokenizer()
        except (BundleError, GRPCError, TimeoutError) as exc:
            self._tokenizer, self.tokenizer_problem = None, f"{type(exc).__name__}: {exc}"

    async def bundle(self, channel: Channel, timeout_s: float) -> Bundle:
        async def collect() -> Bundle:
            chunks = [
                (c.data, c.sha256) async for c in self.stub(channel).get_tokenizer(GetTokenizerRequest())
            ]
            return Bundle(tuple(chunks))

        return await asyncio.wait_for(collect(), timeout_s)

    async def model_info(self, stub: Any, timeout: float | None) -> ModelInfo:
        native = await stub.get_model_info(self.model_request(), timeout=timeout)
        return ModelInfo(
            model_id=native.served_model_name or native.model_path,
            architecture=native.model_type,
            vocab_size=native.vocab_size,
            max_context_tokens=native.max_context_length,
            eos_token_ids=list(native.eos_token_ids),
            bos_token_id=None if native.bos_token_id < 0 else native.bos_token_id,
            defaults=defaults_from(native.default_sampling_params_json, native.max_context_length),
            has_chat_template=False,
        )

    async def load(self, stub: Any, timeout: float | None) -> Load:
        """GetLoads summed over data-parallel ranks. A request is counted in ``active_requests``
        by ``num_total_reqs``, or by its running and waiting sequences where that is more."""
        native = await stub.get_loads(self.loads_request(), timeout=timeout)
        ranks = list(native.loads)
        running = sum(r.num_running_reqs for r in ranks)
        waiting = sum(r.num_waiting_reqs for r in ranks)
        return Load(
            active_requests=max(sum(r.num_total_reqs for r in ranks), running + waiting),
            running_sequences=running,
            waiting_sequences=waiting,
            kv_tokens_in_use=sum(r.num_used_tokens for r in ranks),
            kv_tokens_total=sum(r.max_total_num_tokens for r in ranks),
        )

    async def server_info(self, stub: Any, timeout: float | None) -> ServerInfo:
        """What the protocol can say about the server; GetServerInfo is optional (smg only warns
        when it fails), so a server without it still gets a name."""
        name, version, uptime, instance = self.protocol, "", 0.0, ""
        try:
            native = await stub.get_server_info(self.server_request(), timeout=timeout)
            self.cache_block_tokens = int(getattr(native, "block_size", 0) or 0)  # vLLM says; SGLang does not
            name = native.server_type or name
            version = getattr(native, "sglang_version", "")
            uptime = native.uptime_seconds
            started = getattr(native, "start_time", None)  # SGLang's instance: the moment it started
            instance = started.isoformat() if started is not None else ""
        except GRPCError as exc:
            if exc.status is not Status.UNIMPLEMENTED:
                raise
        return ServerInfo(
            server_name=name,
            server_version=version,
            contract_revision=0,
            capabilities=self.capabilities(),
            uptime_seconds=uptime,
            limits=ServerLimits(),
            instance_id=instance,
        )

    def capabilities(self) -> Capabilities:
        """What the protocol can express, and what ``--assume`` says the server promises."""
        return Capabilities(
            text_input=True,  # tokenized by the driver with the server's bundle, as smg does
            token_ids_input=True,
            max_outputs=MAX_OUTPUTS,
            truncation_sampling=True,
            penalties=True,
            seeded_sampling=self.promises.seeded_sampling,
            deterministic_greedy=self.promises.deterministic_greedy,
            stop_strings=True,
            stop_token_ids=True,
            logprobs=True,
            max_top_logprobs=MAX_TOP_LOGPROBS,
            prefix_cache=self.promises.prefix_cache,
            final_only=True,
            max_stop_strings=MAX_STOP_STRINGS,
            constrained_decoding=True,
        )

    # ── health (SMG-4) ───────────────────────────────────────
    async def health(self, channel: Channel, timeout: float | None) -> tuple[bool, str]:
        reply = await self.stub(channel).health_check(self.health_request(), timeout=timeout)
        return bool(reply.healthy), str(reply.message)

    def control(self, channel: Channel) -> ControlServiceStub:
        return SmgControl(channel, self)

    def inference(self, channel: Channel) -> InferenceServiceStub:
        return DriverInference(channel, self)


class SmgControl(ControlServiceStub):
    """lmrpc.v1's ControlService, answered through an engine protocol's RPCs."""

    def __init__(self, channel: Channel, driver: SmgDriver) -> None:
        super().__init__(channel)
        self.driver = driver
        self.native = driver.stub(channel)

    @adapts
    async def get_server_info(
        self, message: GetServerInfoRequest | None, timeout: float | None
    ) -> GetServerInfoResponse:
        return GetServerInfoResponse(server=await self.driver.server_info(self.native, timeout))

    @adapts
    async def get_model_info(
        self, message: GetModelInfoRequest | None, timeout: float | None
    ) -> GetModelInfoResponse:
        return GetModelInfoResponse(model=await self.driver.model_info(self.native, timeout))

    @adapts
    async def get_load(self, message: GetLoadRequest | None, timeout: float | None) -> GetLoadResponse:
        return GetLoadResponse(current=await self.driver.load(self.native, timeout))

    @adapts
    async def abort(self, message: AbortRequest | None, timeout: float | None) -> AbortResponse:
        if message is None or message.request_ids is None:
            raise unsupported_error(self.driver.protocol, "Abort of all requests")
        ids = list(dict.fromkeys(message.request_ids.ids))
        return AbortResponse(outcomes=await self.driver.native_abort(self.native, ids, timeout))

    @adapts
    async def flush_cache(
        self, message: FlushCacheRequest | None, timeout: float | None
    ) -> FlushCacheResponse:
        reply = await self.native.flush_cache(NativeFlushCacheRequest(timeout_s=0.0), timeout=timeout)
        if not reply.success:
            raise GRPCError(Status.FAILED_PRECONDITION, f"FlushCache: {reply.message}")
        return FlushCacheResponse()

    tokenize = unsupported("Tokenize")

    detokenize = unsupported("Detokenize")

    pause_generation = unsupported("PauseGeneration")

    resume_generation = unsupported("ResumeGeneration")
