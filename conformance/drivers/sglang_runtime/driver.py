"""The driver of ``sglang.runtime.v1.SglangService``: requests expressed in its fields, discovery
from its server info, Generate read through ``reader``, the lmrpc.v1 stubs in ``rpcs``."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Cardinality

from conformance.drivers.base import (
    DEADLINE_STATUSES,
    JSON_OBJECT_SCHEMA,
    MAX_OUTPUTS,
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    Discovered,
    Driver,
    Promises,
    constraint_of,
    json_object,
)
from conformance.drivers.normalize import Normalizer
from conformance.drivers.sglang_runtime.json_answer import JsonAnswer
from conformance.drivers.sglang_runtime.reader import RuntimeReader
from conformance.drivers.sglang_runtime.rpcs import RuntimeControl, RuntimeInference
from conformance.stream.record import Finding
from conformance.stream.wire import Decoded
from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import (
    Capabilities,
    ControlServiceStub,
    EffectiveDefaults,
    EmbeddingModelInfo,
    GenerateRequest,
    InferenceServiceStub,
    Load,
    ModelInfo,
    ResponseOptions,
    SamplingParams,
    ServerInfo,
    ServerLimits,
    StoppingCriteria,
    TokenIds,
)

if TYPE_CHECKING:
    from betterproto2.grpclib.grpclib_client import MetadataLike


SERVICE = "sglang.runtime.v1.SglangService"
TOP_K_DISABLED = -1  # SGLang's "no top-k"; lmrpc's is 0
# SGLang's request defaults (its SamplingParams), for what a request leaves out.
SGLANG_DEFAULTS = EffectiveDefaults(
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    min_p=0.0,
    frequency_penalty=0.0,
    presence_penalty=0.0,
    repetition_penalty=1.0,
    n=1,
    max_tokens=128,
    min_tokens=0,
)
PROBE_TEXT = "Hello"  # what discovery embeds to learn whether, and in how many dimensions, the server does


def _seconds(value: object) -> float:
    """A duration as the server wrote it; 0 when it wrote none, or no number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return 0.0


def guided_decoding(request: GenerateRequest) -> rt.GuidedDecoding | None:
    """lmrpc's constraint as SGLang's ``guided_decoding`` (a JSON object is the schema of any object)."""
    if request.constraint is None:
        return None
    constraint = constraint_of(request)
    if constraint is None:  # no kind set: SGLang's own refusal of an empty guided_decoding
        return rt.GuidedDecoding()
    kind, value = constraint
    if kind == "choice":
        return rt.GuidedDecoding(choice=rt.ChoiceConstraint(values=value))
    if kind == "json_object":
        return rt.GuidedDecoding(json_schema=JSON_OBJECT_SCHEMA)
    return rt.GuidedDecoding(**{kind: value})


class SglangRuntimeDriver(Driver):
    protocol = "sglang-runtime"
    service = SERVICE
    abort_outcomes = False  # success says nothing per id
    carries_text = False  # Generate returns ids (TextGenerate's text is read by SGLang's own cases)
    field_names = MappingProxyType(
        {
            "max_tokens": "max_new_tokens",
            "min_tokens": "min_new_tokens",
            "request_id": "rid",
            "token_ids": "input_ids",
            "token": "input_ids",
            "stop_strings": "stop",
            "top_logprobs": "top_logprobs_num",
            "return_logprobs": "return_logprob",
        }
    )

    def __init__(self, promises: Promises | None = None) -> None:
        promises = promises or Promises()
        if promises.seeded_sampling:
            raise ValueError("--assume seeded_sampling: sglang-runtime has no seed field")
        self.promises = promises
        self.model = ModelInfo()
        self.embedding: EmbeddingModelInfo | None = None
        self.incremental = False

    async def probe(self, channel: Channel, timeout_s: float) -> None:
        await self.stub(channel).health_check(rt.HealthCheckRequest(), timeout=timeout_s)

    def stub(self, channel: Channel) -> rt.SglangServiceStub:
        return rt.SglangServiceStub(channel)

    # ── requests ─────────────────────────────────────────────
    def express(self, request: GenerateRequest) -> GenerateRequest:
        out = GenerateRequest.parse(bytes(request))
        if out.chat is not None:
            raise ValueError("sglang-runtime has no chat input on Generate: chat is ChatComplete's")
        out.parse_special_tokens = None
        asked = out.response or ResponseOptions()
        out.response = ResponseOptions(
            return_text=False,  # Generate returns ids; TextGenerate text (SRT-1's case reads both)
            return_token_ids=True,
            return_logprobs=asked.return_logprobs,
            top_logprobs=asked.top_logprobs if asked.return_logprobs else 0,
            final_only=asked.final_only,
        )
        s = out.sampling or SamplingParams()
        out.sampling = SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            frequency_penalty=s.frequency_penalty,
            presence_penalty=s.presence_penalty,
            repetition_penalty=s.repetition_penalty,
            n=s.n,
            seed=None,  # no seed field
        )
        if out.stopping is not None:
            out.stopping.include_stop_in_output = False  # no no_stop_trim field
        return out

    def native_request(self, request: GenerateRequest, ids: list[int]) -> rt.GenerateRequest:
        s = request.sampling or SamplingParams()
        st = request.stopping or StoppingCriteria()
        r = request.response or ResponseOptions()
        top_k = s.top_k
        params = rt.SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=TOP_K_DISABLED if top_k == 0 else top_k,
            min_p=s.min_p,
            frequency_penalty=s.frequency_penalty,
            presence_penalty=s.presence_penalty,
            repetition_penalty=s.repetition_penalty,
            max_new_tokens=st.max_tokens,
            min_new_tokens=st.min_tokens,
            stop=list(st.stop_strings),
            stop_token_ids=list(st.stop_token_ids),
            ignore_eos=st.ignore_eos or None,
            n=s.n,
            guided_decoding=guided_decoding(request),
        )
        return rt.GenerateRequest(
            input_ids=ids,
            sampling_params=params,
            stream=not r.final_only,
            return_logprob=r.return_logprobs or None,
            top_logprobs_num=r.top_logprobs if r.return_logprobs and r.top_logprobs else None,
            rid=request.request_id or None,
        )

    async def prompt_ids(
        self, channel: Channel, request: GenerateRequest, timeout: float | None
    ) -> list[int]:
        if request.token_ids is not None:
            return list(request.token_ids.ids)
        reply = await self.stub(channel).tokenize(
            rt.TokenizeRequest(text=request.text or ""), timeout=timeout
        )
        return list(reply.tokens)

    # ── Generate ─────────────────────────────────────────────
    async def events(
        self,
        channel: Channel,
        request: GenerateRequest,
        deadline_s: float | None,
        findings: list[Finding],
        metadata: MetadataLike | None = None,
    ) -> AsyncGenerator[Decoded]:
        ids = await self.prompt_ids(channel, request, deadline_s)
        tokenized = GenerateRequest.parse(bytes(request))
        tokenized.text, tokenized.token_ids = None, TokenIds(ids=ids)
        normalizer = Normalizer(tokenized, True, tuple(self.model.eos_token_ids), findings)
        reader = RuntimeReader(normalizer, self.incremental, request.request_id)
        native = self.native_request(request, ids)
        received = 0
        try:
            async with channel.request(
                f"/{SERVICE}/Generate",
                Cardinality.UNARY_STREAM,
                rt.GenerateRequest,
                rt.GenerateResponse,
                timeout=deadline_s,
                metadata=metadata,
            ) as stream:
                await stream.send_message(native, end=True)
                while (message := await stream.recv_message()) is not None:
                    received += 1
                    for event in reader.read(message):
                        yield Decoded(event, None, True)
                await stream.recv_trailing_metadata()
        except GRPCError as exc:
            if not received or (deadline_s is not None and exc.status in DEADLINE_STATUSES):
                raise
            yield Decoded(normalizer.failure(request.request_id, exc.status, exc.message or ""), None, True)

    # ── discovery ────────────────────────────────────────────
    async def discover(self, channel: Channel, timeout_s: float) -> Discovered:
        stub = self.stub(channel)
        server_json = await self.server_json(stub, timeout_s)
        self.incremental = bool(server_json.get("incremental_streaming_output", False))
        self.model = await self.model_info(stub, timeout_s, server_json)
        self.embedding = await self.embedding_model(stub, timeout_s)
        load = await self.load(stub, timeout_s)
        return Discovered(self.server_info(server_json), self.model, self.embedding, load.kv_tokens_total)

    async def openai_json(
        self,
        rpc: Callable[..., Awaitable[rt.OpenAiResponse]],
        body: object,
        timeout: float | None,
        metadata: MetadataLike | None = None,
    ) -> JsonAnswer:
        """One OpenAI JSON RPC (``stub.open_ai_embed``, ``stub.score``, ``stub.rerank``) with ``body``."""
        reply = await rpc(
            rt.OpenAiRequest(json_body=json.dumps(body).encode()), timeout=timeout, metadata=metadata
        )
        text = reply.json_body.decode("utf-8", errors="replace")
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            parsed = text
        return JsonAnswer(reply.status_code, parsed)

    async def embedding_model(
        self, stub: rt.SglangServiceStub, timeout: float | None
    ) -> EmbeddingModelInfo | None:
        """The embedding model, if OpenAIEmbed embeds a text: its name (the answer's ``model``), its
        dimensions (the vector's length) and the longest input (its ListModels card's
        ``max_model_len``, 0 when none is listed). None where OpenAIEmbed refuses or fails."""
        try:
            answer = await self.openai_json(stub.open_ai_embed, {"input": [PROBE_TEXT]}, timeout)
        except GRPCError:
            return None
        data = answer.body.get("data") if answer.ok and isinstance(answer.body, dict) else None
        vector = (
            data[0].get("embedding")
            if isinstance(data, list) and data and isinstance(data[0], dict)
            else None
        )
        if not isinstance(vector, list) or not vector:
            return None
        name = str(answer.body.get("model") or "")
        try:
            cards = (await stub.list_models(rt.ListModelsRequest(), timeout=timeout)).models
        except GRPCError:
            cards = []
        longest = next((card.max_model_len or 0 for card in cards if card.id == name), 0)
        return EmbeddingModelInfo(model_id=name, dimensions=len(vector), max_input_tokens=longest)

    async def server_json(self, stub: rt.SglangServiceStub, timeout: float | None) -> dict[str, Any]:
        reply = await stub.get_server_info(rt.GetServerInfoRequest(), timeout=timeout)
        return json_object(reply.json_info, "GetServerInfo.json_info")

    async def model_info(
        self, stub: rt.SglangServiceStub, timeout: float | None, server: dict[str, Any]
    ) -> ModelInfo:
        native = await stub.get_model_info(rt.GetModelInfoRequest(), timeout=timeout)
        info = json_object(native.json_info, "GetModelInfo.json_info")
        window = int(info.get("max_context_length") or server.get("context_length") or 0)
        bos = info.get("bos_token_id")
        eos = info.get("eos_token_ids") or []
        return ModelInfo(
            model_id=str(server.get("served_model_name") or native.model_path),
            architecture=str(info.get("model_type", "")),
            vocab_size=int(info.get("vocab_size") or 0),
            max_context_tokens=window,
            eos_token_ids=[int(t) for t in eos] if isinstance(eos, list) else [],
            bos_token_id=bos if isinstance(bos, int) and bos >= 0 else None,
            defaults=SGLANG_DEFAULTS,
            has_chat_template=False,
        )

    async def load(self, stub: rt.SglangServiceStub, timeout: float | None) -> Load:
        """GetLoad's ranks summed (SGLang's GetLoadsReqOutput fields)."""
        reply = await stub.get_load(rt.GetLoadRequest(), timeout=timeout)
        try:
            ranks = json.loads(reply.json_info or "[]")
        except ValueError:
            ranks = []
        ranks = [r for r in (ranks if isinstance(ranks, list) else [ranks]) if isinstance(r, dict)]

        def total(key: str) -> int:
            return sum(int(r.get(key) or 0) for r in ranks)

        running, waiting = total("num_running_reqs"), total("num_waiting_reqs")
        return Load(
            active_requests=running + waiting,
            running_sequences=running,
            waiting_sequences=waiting,
            kv_tokens_in_use=total("num_used_tokens"),
            kv_tokens_total=total("max_total_num_tokens"),
        )

    def server_info(self, server: dict[str, Any]) -> ServerInfo:
        return ServerInfo(
            server_name=str(server.get("server_type") or "sglang"),
            server_version=str(server.get("version", "")),
            contract_revision=0,
            capabilities=self.capabilities(),
            uptime_seconds=_seconds(server.get("uptime_seconds")),
            limits=ServerLimits(),
        )

    def capabilities(self) -> Capabilities:
        """What the protocol can express, and what ``--assume`` says the server promises."""
        return Capabilities(
            text_input=True,  # tokenized by the server's own Tokenize
            token_ids_input=True,
            max_outputs=MAX_OUTPUTS,
            truncation_sampling=True,
            penalties=True,
            deterministic_greedy=self.promises.deterministic_greedy,
            stop_strings=True,
            stop_token_ids=True,
            logprobs=True,
            max_top_logprobs=MAX_TOP_LOGPROBS,
            prefix_cache=self.promises.prefix_cache,
            tokenize=True,
            embed=self.embedding is not None,  # OpenAIEmbed, as lmrpc.v1's Embed
            admin=True,
            final_only=True,
            max_stop_strings=MAX_STOP_STRINGS,
            constrained_decoding=True,
        )

    def control(self, channel: Channel) -> ControlServiceStub:
        return RuntimeControl(channel, self)

    def inference(self, channel: Channel) -> InferenceServiceStub:
        return RuntimeInference(channel, self)
