"""``sglang.runtime.v1.SglangService``, SGLang's native gRPC service (the one every SGLang process
serves beside HTTP), as the harness drives it.

It is a *server-side tokenizer* protocol: ``TextGenerate`` takes text and ``Generate`` token ids,
and the server matches stop strings itself. The driver sends every request through ``Generate``
(token ids out, which every check needs); a text prompt is first tokenized with the server's own
``Tokenize``, the ids ``TextGenerate`` would run. Its semantics, as SGLang's clients rely on them:

- responses are *cumulative* unless ``GetServerInfo`` declares ``incremental_streaming_output``:
  every response of an output carries all of its ids so far, each extending the last (SRT-1);
  declared deltas carry only new ids;
- ``meta_info`` is a map of JSON texts: ``id``, ``index`` (which output, where n > 1),
  ``prompt_tokens``, ``completion_tokens`` (the output's so far), ``cached_tokens`` and
  ``finish_reason`` (null until the output ends, then ``{"type": ..., "matched": ...}``) (SRT-2);
- an output's last response is the only one with a finish reason, and it says ``finished``
  (SRT-3);
- ``Abort`` takes one ``rid`` or ``abort_all`` and its ``success`` says nothing per id; an aborted
  stream ends in-band, every unfinished output finishing "abort" (SRT-4).

The breaks of those rules that leave no trace in the normalised events are findings of the SRT
clauses (contract §15); the rest is judged by the lmrpc.v1 clauses through this protocol's
profile. There is no seed, no chat input (chat is the OpenAI pass-through, ``ChatComplete``) and
no advertised capability: what the server promises beyond the protocol comes from ``--assume``.

lmrpc.v1's ``Embed`` is ``OpenAIEmbed`` (a batch of texts, as ``/v1/embeddings`` takes it): its
``data`` in the order listed, its ``usage.prompt_tokens``; an in-band ``status_code`` other than
200 is read as the gRPC status of that HTTP status (400 INVALID_ARGUMENT, ...). The server embeds
exactly when OpenAIEmbed answers a text (discovery asks once: SGLang serves one model, and an
embedding request to a generation model is a 400).
``TextEmbed``, ``Embed``, ``Score``, ``Rerank`` and the administration RPCs are read natively by
the sglang-runtime cases (``cases/sglang_runtime_*.py``), which call them through ``stub`` and
``openai_json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.const import Cardinality

from conformance.drivers.adapter import DriverInference, adapts, unsupported_error
from conformance.drivers.base import Discovered, Driver, json_object
from conformance.drivers.engine import (
    DEADLINE_STATUSES,
    JSON_OBJECT_SCHEMA,
    MAX_OUTPUTS,
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    Promises,
    constraint_of,
)
from conformance.drivers.normalize import Normalizer
from conformance.stream.record import Finding
from conformance.stream.wire import Decoded
from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import (
    AbortOutcome,
    AbortRequest,
    AbortResponse,
    AbortStatus,
    Capabilities,
    ControlServiceStub,
    DetokenizeRequest,
    DetokenizeResponse,
    EffectiveDefaults,
    Embedding,
    EmbeddingModelInfo,
    EmbedRequest,
    EmbedResponse,
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
    PauseGenerationRequest,
    PauseGenerationResponse,
    ResponseOptions,
    ResumeGenerationRequest,
    ResumeGenerationResponse,
    SamplingParams,
    ServerInfo,
    ServerLimits,
    StoppingCriteria,
    TokenIds,
    TokenizeRequest,
    TokenizeResponse,
    Usage,
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
META_NUMBERS = ("prompt_tokens", "completion_tokens", "cached_tokens")
REASONS = ("stop", "length", "abort")
HTTP_OK = 200
# The gRPC status of an HTTP status an OpenAI JSON RPC answers in band (the reverse of gRPC's
# HTTP mapping); anything else unsuccessful is INTERNAL.
STATUS_OF_HTTP = {
    400: Status.INVALID_ARGUMENT,
    401: Status.UNAUTHENTICATED,
    403: Status.PERMISSION_DENIED,
    404: Status.NOT_FOUND,
    409: Status.ALREADY_EXISTS,
    429: Status.RESOURCE_EXHAUSTED,
    499: Status.CANCELLED,
    501: Status.UNIMPLEMENTED,
    503: Status.UNAVAILABLE,
    504: Status.DEADLINE_EXCEEDED,
}
PROBE_TEXT = "Hello"  # what discovery embeds to learn whether, and in how many dimensions, the server does


def _integer(value: object) -> int | None:
    """A count as the server meant it: an integer, or digits in a string (SRT-2 reports the type)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def error_message(body: object) -> str:
    """The message of an OpenAI error object (``{"error": {"message": ...}}``), else the body."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))
    return str(body)[:200]


@dataclass(frozen=True, slots=True)
class JsonAnswer:
    """What an OpenAI JSON RPC (OpenAIEmbed, Score, Rerank) answered: its in-band HTTP status and its
    body, parsed (the raw text where it is not JSON)."""

    status_code: int
    body: Any

    @property
    def ok(self) -> bool:
        return self.status_code == HTTP_OK

    def refusal(self, rpc: str) -> GRPCError:
        status = STATUS_OF_HTTP.get(self.status_code, Status.INTERNAL)
        return GRPCError(status, f"{rpc} answered status_code {self.status_code}: {error_message(self.body)}")


def _float(value: object) -> float:
    """A vector's value as sent; NaN for one that is no number (never a norm of 1)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


def _seconds(value: object) -> float:
    """A duration as the server wrote it; 0 when it wrote none, or no number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return 0.0


# ── the normalised views of one native response ─────────────────────────
@dataclass(frozen=True, slots=True)
class _Top:
    values: list[float]
    token_ids: list[int]


@dataclass(frozen=True, slots=True)
class _Logprobs:
    token_logprobs: list[float]
    token_ids: list[int]
    top_logprobs: list[_Top]


@dataclass(frozen=True, slots=True)
class _View:
    """One output's new ids (a chunk) or its whole output (a complete), with the counts of meta_info."""

    token_ids: list[int]
    output_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    index: int
    output_logprobs: _Logprobs | None
    finish_reason: str = ""
    matched_token_id: int | None = None
    matched_stop_str: str | None = None


def _logprobs(meta: dict[str, Any], start: int) -> _Logprobs | None:
    """The output's logprob tuples ``[logprob, token_id, text]`` from ``start`` on."""
    tuples = meta.get("output_token_logprobs")
    if not isinstance(tuples, list):
        return None
    tops = meta.get("output_top_logprobs")
    tops = tops if isinstance(tops, list) else []
    rows = [t for t in tuples[start:] if isinstance(t, list) and len(t) >= 2]
    top_rows = []
    for i in range(start, start + len(rows)):
        candidates = tops[i] if i < len(tops) and isinstance(tops[i], list) else []
        good = [c for c in candidates if isinstance(c, list) and len(c) >= 2]
        top_rows.append(_Top([float(c[0]) for c in good], [int(c[1]) for c in good]))
    return _Logprobs([float(t[0]) for t in rows], [int(t[1]) for t in rows], top_rows)


@dataclass
class _OutputState:
    ids: list[int] = field(default_factory=list)
    finishes: int = 0
    rid: str | None = None
    # declared incremental: the logprob lists of every response so far (SGLang slices them as it
    # slices the ids), so the output's lists read as a cumulative stream's do
    token_logprobs: list[Any] = field(default_factory=list)
    top_logprobs: list[Any] = field(default_factory=list)

    def logprob_lists(self, meta: dict[str, Any], incremental: bool) -> dict[str, Any]:
        """``meta``'s logprob lists as the whole output's so far."""
        if not incremental or not isinstance(meta.get("output_token_logprobs"), list):
            return meta
        tops = meta.get("output_top_logprobs")
        self.token_logprobs += meta["output_token_logprobs"]
        self.top_logprobs += tops if isinstance(tops, list) else [[] for _ in meta["output_token_logprobs"]]
        return {"output_token_logprobs": self.token_logprobs, "output_top_logprobs": self.top_logprobs}


@dataclass
class RuntimeReader:
    """Reads one Generate call's native responses into lmrpc.v1 events, checking SRT-1..3."""

    normalizer: Normalizer
    incremental: bool  # the server declared incremental_streaming_output
    sent_rid: str
    _outputs: dict[int, _OutputState] = field(default_factory=dict)
    _rid: str | None = None

    def note(self, clause: str, what: str, want: object, got: object) -> None:
        self.normalizer.note(clause, what, want, got)

    def meta(self, native: rt.GenerateResponse) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for key, text in native.meta_info.items():
            try:
                values[key] = json.loads(text)
            except ValueError:
                self.note("SRT-2", f"meta_info[{key!r}]", "JSON text", text[:60])
                values[key] = text
        for key in ("id", *META_NUMBERS, "finish_reason"):
            if key not in values:
                self.note("SRT-2", f"meta_info[{key!r}]", "present on every response", "missing")
        if "id" in values and not isinstance(values["id"], str):
            self.note("SRT-2", "meta_info['id']", "a JSON string", native.meta_info["id"][:60])
        for key in META_NUMBERS:
            if key in values and (not isinstance(values[key], int) or isinstance(values[key], bool)):
                self.note("SRT-2", f"meta_info[{key!r}]", "a JSON integer", native.meta_info[key][:60])
        reason = values.get("finish_reason")
        if reason is not None and not (isinstance(reason, dict) and reason.get("type") in REASONS):
            self.note("SRT-2", "meta_info['finish_reason']", 'null or {"type": "stop"|"length"|"abort", ...}',
                      native.meta_info.get("finish_reason", "")[:80])  # fmt: skip
            if isinstance(reason, str):  # read as meant, so that one fault is reported once
                values["finish_reason"] = {"type": reason}
        return values

    def read(self, native: rt.GenerateResponse) -> list[GenerateResponse]:
        meta = self.meta(native)
        rid = meta.get("id") if isinstance(meta.get("id"), str) else None
        self._check_rid(rid)
        request_id = self.sent_rid or rid or ""
        index = meta.get("index", 0)
        index = index if isinstance(index, int) and not isinstance(index, bool) else 0
        output = self._outputs.setdefault(index, _OutputState())
        ids = list(native.output_ids)
        prompt, completion, cached = (_integer(meta.get(key)) for key in META_NUMBERS)
        new = self._new_ids(index, output, ids, completion)
        reason = meta.get("finish_reason")
        reason = reason if isinstance(reason, dict) else None
        self._check_finished(index, output, reason, native.finished)
        prompt, completion, cached = prompt or 0, completion or 0, cached or 0
        start = len(output.ids)
        output.ids += new
        lists = output.logprob_lists(meta, self.incremental)
        events: list[GenerateResponse] = []
        if self.normalizer.streaming and (new or reason is None):
            # on the finished response, the output's last ids (if any) become a chunk of their own
            so_far = completion if reason is None else len(output.ids)
            chunk = _View(new, [], prompt, so_far, cached, index, _logprobs(lists, start))
            events += self.normalizer.chunk(request_id, chunk)
        if reason is not None:
            matched = reason.get("matched")
            complete = _View(
                [],
                list(output.ids),
                prompt,
                completion,
                cached,
                index,
                _logprobs(lists, 0),
                finish_reason=str(reason.get("type", "")),
                matched_token_id=matched
                if isinstance(matched, int) and not isinstance(matched, bool)
                else None,
                matched_stop_str=matched if isinstance(matched, str) else None,
            )
            events += self.normalizer.complete(request_id, complete)
        return events

    def _check_rid(self, rid: str | None) -> None:
        if rid is None:
            return
        if self.sent_rid and rid != self.sent_rid:
            self.note("SRT-2", "meta_info['id']", f"the rid sent ({self.sent_rid!r})", rid)
        elif self._rid is not None and rid != self._rid:
            self.note("SRT-2", "meta_info['id']", f"the same id on every response ({self._rid!r})", rid)
        self._rid = self._rid or rid

    def _new_ids(self, index: int, output: _OutputState, ids: list[int], completion: int | None) -> list[int]:
        """The ids new in this response. Where meta_info's count tells a whole output from a delta
        (after the first response), it decides; elsewhere the server's declaration does, and a
        response that does not extend the output cannot be cumulative. What the server sent against
        what it declared is an SRT-1 finding."""
        if not self.normalizer.streaming:
            return ids
        seen = output.ids
        extends = ids[: len(seen)] == seen
        as_whole = extends and len(ids) == completion
        as_delta = len(seen) + len(ids) == completion
        cumulative = as_whole if as_whole != as_delta else extends and not self.incremental
        if cumulative == self.incremental:
            declared = "incremental (only new ids)" if self.incremental else "cumulative (all ids so far)"
            self.note("SRT-1", f"response of output {index}: output_ids",
                      f"{declared}, as GetServerInfo declares; the output has {len(seen)} ids before it",
                      f"{len(ids)} ids {ids[:8]}, completion_tokens {completion}")  # fmt: skip
        return ids[len(seen) :] if cumulative else ids

    def _check_finished(
        self, index: int, output: _OutputState, reason: dict[str, Any] | None, finished: bool
    ) -> None:
        if output.finishes and (reason is not None or not finished):
            self.note("SRT-3", f"output {index}", "no response after its finished one", "another response")
        if reason is not None:
            output.finishes += 1
        if finished and reason is None:
            self.note("SRT-3", f"response of output {index}", "finished = true only with a finish_reason",
                      "finished = true, finish_reason null")  # fmt: skip
        if reason is not None and not finished:
            self.note("SRT-3", f"response of output {index}", "finished = true with its finish_reason",
                      f"finish_reason {reason.get('type')!r}, finished = false")  # fmt: skip


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
                Embedding(values=[_float(x) for x in v] if isinstance(v, list) else []) for v in vectors
            ],
            usage=Usage(prompt_tokens=_integer(prompt_tokens) or 0),
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
