"""``sglang.runtime.v1.SglangService``: the gRPC server SGLang runs beside its HTTP server in every
process, served by the reference frontend on a port of its own (``--sglang-runtime-port``).

A translation layer like the other dialects (``dialects/base/``): generation goes through
lmrpc.v1's Generate, embeddings through its Embed, the rest through its ControlService, and the
profiler and weight updates through the frontend's engine administration. ``docs/protocols/sglang-runtime.md`` maps
every RPC and field, and says what the protocol cannot express.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar, cast

from grpclib import GRPCError, Status

from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import (
    AbortRequest,
    AllRequests,
    DetokenizeRequest,
    EmbedRequest,
    FlushCacheRequest,
    GenerateRequest,
    GenerateResponse,
    GetModelInfoRequest,
    PauseGenerationRequest,
    ResumeGenerationRequest,
    TokenizeRequest,
)
from reference_server.config import ServerConfig
from reference_server.frontend.dialects.base.dialect import Dialect
from reference_server.frontend.dialects.base.service import Backend, DialectBase
from reference_server.frontend.dialects.sglang_runtime import info
from reference_server.frontend.dialects.sglang_runtime.meta import LogprobOptions, embedding_meta
from reference_server.frontend.dialects.sglang_runtime.openai_body import (
    DEFAULT_MODEL,
    Body,
    OpenAIError,
    parse_object,
    requested_model,
    unimplemented,
)
from reference_server.frontend.dialects.sglang_runtime.openai_embed import (
    EMBED_PARAMETERS,
    RERANK_PARAMETERS,
    SCORE_PARAMETERS,
    Embedded,
    embeddings_body,
    embeddings_request,
    rerank_body,
    rerank_request,
    score_body,
    score_request,
)
from reference_server.frontend.dialects.sglang_runtime.openai_generate import (
    CHAT_PARAMETERS,
    COMPLETION_PARAMETERS,
    OPENAI_FIELD_NAMES,
    ChatAnswer,
    CompletionAnswer,
    OpenAIAnswer,
    OpenAIGeneration,
    chat_generation,
    completion_generation,
)
from reference_server.frontend.dialects.sglang_runtime.requests import (
    NATIVE_FIELD_NAMES,
    GenerateOptions,
    generate_options,
    rename_fields,
    renamed,
    text_generate_options,
)
from reference_server.frontend.dialects.sglang_runtime.responses import (
    CumulativeTranslator,
    TextTranslator,
    TokenTranslator,
)
from reference_server.frontend.engine_admin import EngineAdmin

SERVICE = "sglang.runtime.v1.SglangService"
LOAD_FORMATS = ("auto", "gguf", "safetensors")
PAUSE_MODES = ("abort", "retract", "in_place")  # SGLang's PauseGenerationReqInput.mode values
#: SGLang 0.5.23's words for its server's refusals (its compiled gRPC server, _grpc.so)
ABORT_NEEDS_RID = "Abort requires a non-empty rid unless abort_all is true"
DETOKENIZE_NEGATIVE = "Detokenize tokens must be non-negative"
CLASSIFY_NEEDS_INPUT = "Classify requires either text or input_ids"
#: UpdateWeightsFromDisk's refusals that SGLang answers in the response (success = false)
WEIGHT_REFUSALS = (
    Status.INVALID_ARGUMENT,
    Status.NOT_FOUND,
    Status.FAILED_PRECONDITION,
    Status.UNIMPLEMENTED,
)
ENGINE_STATE_POLL_S = 0.1  # how often WatchEngineState looks for a change of health or pause
Cumulative = TypeVar("Cumulative", bound=CumulativeTranslator[Any])
NO_CLASSIFIER = "it serves no classification model (only a generation model and an embedding model)"


class SglangRuntimeService(DialectBase[rt.GenerateRequest, rt.GenerateResponse], rt.SglangServiceBase):
    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        self.admin = EngineAdmin(backend.ctx)

    # ── native generation ───────────────────────────────────────────────────────────────────

    def lmrpc_request(self, message: rt.GenerateRequest) -> GenerateRequest:
        return self._generate_options(message).request

    def translator(self, message: rt.GenerateRequest) -> TokenTranslator:
        return self._token_translator(self._generate_options(message))

    async def generate(self, message: rt.GenerateRequest) -> AsyncIterator[rt.GenerateResponse]:
        options = self._generate_options(message)
        translated = self.translated_generate(options.request, self._token_translator(options))
        async for response in renamed(
            cast(AsyncGenerator[rt.GenerateResponse], translated), NATIVE_FIELD_NAMES
        ):
            yield response

    async def text_generate(self, message: rt.TextGenerateRequest) -> AsyncIterator[rt.TextGenerateResponse]:
        options = text_generate_options(message)
        translated = self.translated_generate(options.request, self._translator(TextTranslator, options))
        async for response in renamed(
            cast(AsyncGenerator[rt.TextGenerateResponse], translated), NATIVE_FIELD_NAMES
        ):
            yield response

    def _generate_options(self, message: rt.GenerateRequest) -> GenerateOptions:
        return generate_options(message, self.ctx.serving_engine().info.vocab_size)

    def _token_translator(self, options: GenerateOptions) -> TokenTranslator:
        translator = self._translator(TokenTranslator, options)
        translator.return_text = options.return_text
        return translator

    def _translator(self, kind: type[Cumulative], options: GenerateOptions) -> Cumulative:
        logprobs = None
        if options.logprobs is not None:
            text = self._token_text if options.logprobs.with_text else _no_text
            logprobs = LogprobOptions(options.logprobs.top, text)
        return kind(stream=options.stream, logprobs=logprobs)

    def _token_text(self, token_id: int) -> str:
        return self.ctx.ready_engine().tokenizer.decode([token_id], skip_special_tokens=False)

    # ── embeddings and classification ───────────────────────────────────────────────────────

    async def text_embed(self, message: rt.TextEmbedRequest) -> rt.TextEmbedResponse:
        if not message.text:
            raise GRPCError(Status.INVALID_ARGUMENT, "text must not be empty")
        embedded = await self._embedded("TextEmbed", [message.text], message.rid)
        rid = message.rid or self.ctx.table.new_request_id()
        return rt.TextEmbedResponse(
            embedding=embedded.vectors[0], meta_info=embedding_meta(rid, embedded.prompt_tokens)
        )

    async def embed(self, message: rt.EmbedRequest) -> rt.EmbedResponse:
        """The ids (the generation model's, as Tokenize gives them) are decoded to their text for
        the embedding model, which has a tokenizer of its own; prompt_tokens counts its tokens."""
        if not message.input_ids:
            raise GRPCError(Status.INVALID_ARGUMENT, "input_ids must not be empty")
        if min(message.input_ids) < 0:
            raise GRPCError(Status.INVALID_ARGUMENT, "input_ids must be >= 0")
        self._require_embedding_model("Embed")
        try:
            values, prompt_tokens = await self.embed_tokenized(message.rid or "", message)
        except GRPCError as error:
            raise _renamed_error(error, (("token_ids[", "input_ids["), ("request_id", "rid"))) from None
        rid = message.rid or self.ctx.table.new_request_id()
        return rt.EmbedResponse(embedding=values, meta_info=embedding_meta(rid, prompt_tokens))

    async def classify(self, message: rt.ClassifyRequest) -> rt.ClassifyResponse:
        if not message.text and not message.input_ids:  # SGLang's check comes first
            raise GRPCError(Status.INVALID_ARGUMENT, CLASSIFY_NEEDS_INPUT)
        raise unimplemented("Classify", NO_CLASSIFIER)

    async def _embedded(self, rpc: str, texts: list[str], rid: str | None = None) -> Embedded:
        self._require_embedding_model(rpc)
        try:
            response = await self.inference.embed(EmbedRequest(request_id=rid or "", texts=texts))
        except GRPCError as error:
            raise _renamed_error(error, (("request_id", "rid"),)) from None
        tokens = response.usage.prompt_tokens if response.usage is not None else 0
        return Embedded([list(e.values) for e in response.embeddings], tokens)

    def _require_embedding_model(self, rpc: str) -> None:
        if not self.ctx.serving_engine().capabilities.embed:
            raise unimplemented(rpc, "it runs no embedding model (it was started with --no-embedding)")

    # ── tokenization, health, discovery, load ───────────────────────────────────────────────

    async def tokenize(self, message: rt.TokenizeRequest) -> rt.TokenizeResponse:
        """The ids TextGenerate runs. The model's tokenizer adds no special tokens of its own
        (its chat template writes them), so ``add_special_tokens`` gives the same ids either way."""
        ids = list((await self.control.tokenize(TokenizeRequest(text=message.text))).token_ids)
        engine = self.ctx.ready_engine()
        return rt.TokenizeResponse(
            tokens=ids, count=len(ids), max_model_len=engine.info.max_context_tokens, input_text=message.text
        )

    async def detokenize(self, message: rt.DetokenizeRequest) -> rt.DetokenizeResponse:
        """As SGLang's: the tokenizer's ``decode`` with special tokens kept, and ids outside the
        vocabulary left out (a Hugging Face tokenizer decodes them to nothing)."""
        for i, token_id in enumerate(message.tokens):
            if token_id < 0:
                raise GRPCError(Status.INVALID_ARGUMENT, f"{DETOKENIZE_NEGATIVE}: tokens[{i}]={token_id}")
        vocab_size = self.ctx.serving_engine().info.vocab_size
        known = [token_id for token_id in message.tokens if token_id < vocab_size]
        response = await self.control.detokenize(
            DetokenizeRequest(token_ids=known, skip_special_tokens=False)
        )
        return rt.DetokenizeResponse(text=response.text)

    async def health_check(self, message: rt.HealthCheckRequest) -> rt.HealthCheckResponse:
        healthy, _ = self.health()
        return rt.HealthCheckResponse(healthy=healthy)

    async def watch_engine_state(
        self, message: rt.WatchEngineStateRequest
    ) -> AsyncIterator[rt.EngineStateSnapshot]:
        """SGLang's snapshot now, then a new one (the next revision) whenever health or the pause
        changes, until the client goes away; ``instance_id`` is the server's start in Unix
        nanoseconds, as SGLang's is its engine's. While the server is not healthy the snapshot
        carries no discovery (there is no engine to describe)."""
        instance_id = int(self.ctx.started_at_unix * 1e9)
        revision = 0
        seen: tuple[bool, bool] | None = None
        while True:
            healthy, _ = self.health()
            paused = (await self.lmrpc_load()).paused if healthy else False
            if (healthy, paused) != seen:
                seen = (healthy, paused)
                revision += 1
                snapshot = rt.EngineStateSnapshot(
                    instance_id=instance_id, revision=revision, healthy=healthy, is_pause=paused
                )
                if healthy:
                    snapshot.model_info = await self.get_model_info(rt.GetModelInfoRequest())
                    snapshot.server_info = await self.get_server_info(rt.GetServerInfoRequest())
                yield snapshot
            await asyncio.sleep(ENGINE_STATE_POLL_S)

    async def get_model_info(self, message: rt.GetModelInfoRequest) -> rt.GetModelInfoResponse:
        fields = await self.model_info_fields()
        return rt.GetModelInfoResponse(
            model_path=fields["model_path"], json_info=info.model_info_json(fields)
        )

    async def get_server_info(self, message: rt.GetServerInfoRequest) -> rt.GetServerInfoResponse:
        facts = await self.server_facts()
        model = await self.lmrpc_model()
        json_info = info.server_info_json(facts, model, self.source, self.ctx.config.engine.dtype)
        return rt.GetServerInfoResponse(json_info=json_info)

    async def list_models(self, message: rt.ListModelsRequest) -> rt.ListModelsResponse:
        response = await self.control.get_model_info(GetModelInfoRequest())
        assert response.model is not None
        return rt.ListModelsResponse(models=info.model_cards(response.model, response.embedding_model))

    async def get_load(self, message: rt.GetLoadRequest) -> rt.GetLoadResponse:
        return rt.GetLoadResponse(json_info=info.load_json(await self.rated_load(message.dp_rank)))

    # ── abort, cache, pause ─────────────────────────────────────────────────────────────────

    async def abort(self, message: rt.AbortRequest) -> rt.AbortResponse:
        """As SGLang's, ``success`` says the abort was carried out, not that a request was in
        flight. Aborting all needs the admin role under --auth (lmrpc's rule, AUTH-2); a rid
        not seen yet is remembered for the abort grace period (ABORT-6)."""
        if message.abort_all:
            await self.control.abort(AbortRequest(all=AllRequests()))
        elif message.rid:
            await self.abort_request_ids([message.rid])
        else:
            raise GRPCError(Status.INVALID_ARGUMENT, ABORT_NEEDS_RID)
        return rt.AbortResponse(success=True)

    async def flush_cache(self, message: rt.FlushCacheRequest) -> rt.FlushCacheResponse:
        """Never waits or fails for requests in flight: the prefixes they use stay cached."""
        released = (await self.control.flush_cache(FlushCacheRequest())).released_tokens
        return rt.FlushCacheResponse(
            success=True,
            message=f"Cache flushed: released {released} cached KV tokens (prefixes in use stay).",
        )

    async def pause_generation(self, message: rt.PauseGenerationRequest) -> rt.PauseGenerationResponse:
        """``abort`` (also an empty mode, SGLang's default) ends every request in flight, then
        pauses; ``in_place`` pauses with requests kept where they are, their KV cache too;
        ``retract`` pauses the same way: this engine cannot move running requests back to the
        queue, so their KV cache stays rather than being freed (the message says so)."""
        mode = message.mode or "abort"
        if mode not in PAUSE_MODES:
            raise GRPCError(Status.INVALID_ARGUMENT, f"mode={mode!r} must be one of {', '.join(PAUSE_MODES)}")
        await self.control.pause_generation(PauseGenerationRequest())
        if mode == "abort":
            await self.control.abort(AbortRequest(all=AllRequests()))
        note = (
            " Requests keep their KV cache in place: this engine does not retract."
            if mode == "retract"
            else ""
        )
        return rt.PauseGenerationResponse(message=f"Generation paused (mode={mode}).{note}")

    async def continue_generation(
        self, message: rt.ContinueGenerationRequest
    ) -> rt.ContinueGenerationResponse:
        await self.control.resume_generation(ResumeGenerationRequest())
        return rt.ContinueGenerationResponse(message="Generation continued.")

    # ── OpenAI JSON pass-through ────────────────────────────────────────────────────────────

    async def chat_complete(self, message: rt.OpenAiRequest) -> AsyncIterator[rt.OpenAiStreamChunk]:
        try:
            body = Body(parse_object(message.json_body), CHAT_PARAMETERS)
            model = requested_model(body, self.ctx.serving_engine().info.model_id)
            generation = chat_generation(body)
        except OpenAIError as error:
            raise error.as_grpc() from None
        answer = ChatAnswer(generation, model, self._token_text)
        async for chunk in self._openai_chunks(generation, answer):
            yield chunk

    async def complete(self, message: rt.OpenAiRequest) -> AsyncIterator[rt.OpenAiStreamChunk]:
        engine = self.ctx.serving_engine()
        try:
            body = Body(parse_object(message.json_body), COMPLETION_PARAMETERS)
            model = requested_model(body, engine.info.model_id)
            generation = completion_generation(body, engine.tokenizer.decode)
        except OpenAIError as error:
            raise error.as_grpc() from None
        answer = CompletionAnswer(generation, model, self._token_text)
        async for chunk in self._openai_chunks(generation, answer):
            yield chunk

    async def _openai_chunks(
        self, generation: OpenAIGeneration, answer: OpenAIAnswer
    ) -> AsyncIterator[rt.OpenAiStreamChunk]:
        events = cast(AsyncGenerator[GenerateResponse], self.inference.generate(generation.request))
        async with contextlib.aclosing(renamed(events, OPENAI_FIELD_NAMES)) as lmrpc_events:
            async for event in lmrpc_events:
                for chunk in answer.add(event):
                    yield rt.OpenAiStreamChunk(json_chunk=json.dumps(chunk).encode(), finished=False)
        if generation.stream:
            yield rt.OpenAiStreamChunk(json_chunk=b"", finished=True)  # SGLang's end of a stream
        else:  # SGLang's bridge gives the whole answer its HTTP status
            yield rt.OpenAiStreamChunk(
                json_chunk=json.dumps(answer.body()).encode(), finished=True, status_code=200
            )

    async def open_ai_embed(self, message: rt.OpenAiRequest) -> rt.OpenAiResponse:
        try:
            body = Body(parse_object(message.json_body), EMBED_PARAMETERS)
            requested_model(body, self._embedding_model_id())  # SGLang answers its own model's path
            request = embeddings_request(body)
            embedded = await self._openai_embedded("OpenAIEmbed", request.texts)
            return _ok(embeddings_body(request, embedded, self._embedding_model_id()))
        except OpenAIError as error:
            return rt.OpenAiResponse(json_body=error.body(), status_code=error.status_code)

    async def open_ai_classify(self, message: rt.OpenAiRequest) -> rt.OpenAiResponse:
        raise unimplemented("OpenAIClassify", NO_CLASSIFIER)

    async def score(self, message: rt.OpenAiRequest) -> rt.OpenAiResponse:
        try:
            body = Body(parse_object(message.json_body), SCORE_PARAMETERS)
            model = body.string("model") or DEFAULT_MODEL  # SGLang's score repeats it, unread
            ranking = score_request(body)
            embedded = await self._openai_embedded("Score", [ranking.query, *ranking.texts])
            return _ok(score_body(ranking, embedded, model))
        except OpenAIError as error:
            return rt.OpenAiResponse(json_body=error.body(), status_code=error.status_code)

    async def rerank(self, message: rt.OpenAiRequest) -> rt.OpenAiResponse:
        try:
            body = Body(parse_object(message.json_body), RERANK_PARAMETERS)
            body.string("model")  # SGLang's rerank body has no model: any string is let through
            request = rerank_request(body)
            ranking = request.ranking
            embedded = await self._openai_embedded("Rerank", [ranking.query, *ranking.texts])
            return _ok(rerank_body(request, embedded))
        except OpenAIError as error:
            return rt.OpenAiResponse(json_body=error.body(), status_code=error.status_code)

    async def _openai_embedded(self, rpc: str, texts: list[str]) -> Embedded:
        """A text the embedding model refuses (too long) is the client's error: HTTP 400."""
        try:
            return await self._embedded(rpc, texts)
        except GRPCError as error:
            if error.status is Status.INVALID_ARGUMENT:
                raise OpenAIError(error.message or "invalid input") from None
            raise

    def _embedding_model_id(self) -> str:
        return self.ctx.ready_engine().info.embedding_model_id or ""

    # ── administration ──────────────────────────────────────────────────────────────────────

    async def start_profile(self, message: rt.StartProfileRequest) -> rt.StartProfileResponse:
        """Records the scheduler process (where the engine steps) with torch.profiler; without
        ``output_dir`` the trace goes to the temporary folder ($TMPDIR, else /tmp), as SGLang's
        goes to /tmp by default."""
        started = await self.admin.start_profile(message.output_dir or tempfile.gettempdir())
        return rt.StartProfileResponse(message=started.message)

    async def stop_profile(self, message: rt.StopProfileRequest) -> rt.StopProfileResponse:
        return rt.StopProfileResponse(message=(await self.admin.stop_profile()).message)

    async def update_weights_from_disk(self, message: rt.UpdateWeightsRequest) -> rt.UpdateWeightsResponse:
        """Reloads the weights in the scheduler between two engine steps; streams in flight go
        on. As in SGLang, a load that cannot happen is an answer, not a status: ``success =
        false`` and the reason in ``message`` (no path, no such path, not a loadable model,
        another shape, a load_format this server does not read), the weights served unchanged."""
        try:
            path = message.model_path
            if not path:
                raise GRPCError(
                    Status.INVALID_ARGUMENT, "model_path='' must name a .gguf file or a model directory"
                )
            check_load_format(message.load_format, path)
            loaded = await self.admin.update_weights(path)
        except GRPCError as error:
            if error.status not in WEIGHT_REFUSALS:
                raise
            return rt.UpdateWeightsResponse(success=False, message=error.message or error.status.name)
        return rt.UpdateWeightsResponse(success=True, message=loaded.message)


def check_load_format(load_format: str | None, path: str) -> None:
    """``auto`` (or none) takes either kind of checkpoint; ``gguf`` and ``safetensors`` must
    match the path's kind; SGLang's other formats are not read by this server."""
    if load_format in (None, "", "auto"):
        return
    if load_format not in LOAD_FORMATS:
        raise unimplemented(f"load_format={load_format!r}", f"this server reads {', '.join(LOAD_FORMATS)}")
    is_gguf = path.endswith(".gguf")
    if (load_format == "gguf") != is_gguf:
        kind = "a .gguf file" if load_format == "gguf" else "a Hugging Face directory of *.safetensors"
        raise GRPCError(Status.INVALID_ARGUMENT, f"load_format={load_format!r} needs {kind}, not {path!r}")


def _no_text(token_id: int) -> None:
    return None


def _ok(body: object) -> rt.OpenAiResponse:
    return rt.OpenAiResponse(json_body=json.dumps(body).encode(), status_code=200)


def _renamed_error(error: GRPCError, names: tuple[tuple[str, str], ...]) -> GRPCError:
    return GRPCError(error.status, rename_fields(error.message or "", names), error.details)


def _own_port(config: ServerConfig) -> int | None:
    return config.sglang_runtime_port


def _enabled(config: ServerConfig) -> bool:
    return config.sglang_runtime_port is not None


SGLANG_RUNTIME = Dialect(
    name="sglang-runtime",
    grpc_service=SERVICE,
    service=SglangRuntimeService,
    admin_rpcs=(
        "FlushCache",
        "PauseGeneration",
        "ContinueGeneration",
        "StartProfile",
        "StopProfile",
        "UpdateWeightsFromDisk",
    ),
    enabled=_enabled,
    own_port=_own_port,
)
