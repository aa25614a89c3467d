"""lmrpc.v1.InferenceService: Generate, Embed, and Score and Rerank by the embedding model."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import msgspec
from grpclib import GRPCError, Status

from lmrpc.v1 import (
    Embedding,
    EmbedRequest,
    EmbedResponse,
    GenerateRequest,
    GenerateResponse,
    InferenceServiceBase,
    PromptInfo,
    RankedDocument,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
    Usage,
)
from reference_server import ipc
from reference_server.frontend.context import EngineFacts, FrontendContext
from reference_server.frontend.edge.call import current_call
from reference_server.frontend.engine_link import WorkerUnavailableError
from reference_server.frontend.grpc_hooks import StreamingDiscipline
from reference_server.frontend.prompts import encode_prompt
from reference_server.frontend.ranking import best_first, scores_against
from reference_server.frontend.requests import DuplicateRequestError, RequestState
from reference_server.frontend.streaming import StreamAssembler
from reference_server.frontend.validation import (
    GeneratePlan,
    check_prompt_size,
    check_request_id,
    invalid,
    plan_generate,
    stopping_for_prompt,
)


class InferenceService(StreamingDiscipline, InferenceServiceBase):
    def __init__(self, context: FrontendContext) -> None:
        self.ctx = context

    async def generate(
        self, message: GenerateRequest, *, whole_token_text: bool = False
    ) -> AsyncIterator[GenerateResponse]:
        """``whole_token_text``: a dialect's choice (DetokenizeConfig); lmrpc.v1 matches stop
        strings character by character."""
        engine = self.ctx.serving_engine()
        plan = plan_generate(
            message,
            engine.capabilities,
            self.ctx.config.limits,
            engine.info,
            whole_token_text=whole_token_text,
        )
        check_prompt_size(message, engine.tokenizer.max_token_chars, engine.info)
        table = self.ctx.table
        if len(table) >= self.ctx.config.limits.max_waiting_requests:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "too many requests in flight; retry later")
        call = current_call()
        request_id = plan.request_id or table.new_request_id()
        try:
            state = table.register(call.principal.name, request_id, plan.num_outputs)
        except DuplicateRequestError:
            raise GRPCError(
                Status.ALREADY_EXISTS, f"request_id={request_id!r} is already in flight"
            ) from None
        call.on_stall = lambda: self._stall(state)
        self.ctx.idle.clear()
        tracing, trace_parent = self.ctx.tracing, call.traceparent
        if tracing is not None:
            attributes = {"lmrpc.request_id": request_id, "lmrpc.num_outputs": plan.num_outputs}
            trace_parent = tracing.start(state.rid, call.method.lstrip("/"), call.traceparent, 1, attributes)
        try:
            async for response in self._run(message, plan, state, engine, trace_parent):
                yield response
        finally:
            if state.submitted and not state.complete:
                self.ctx.link.abort([state.rid])  # client cancel or deadline (CANCEL-1, CANCEL-2)
            if tracing is not None:
                tracing.end(state.rid, **{"lmrpc.completed": state.complete})
            table.unregister(state)
            if not len(table):
                self.ctx.idle.set()

    async def _run(
        self,
        message: GenerateRequest,
        plan: GeneratePlan,
        state: RequestState,
        engine: EngineFacts,
        trace_parent: str,
    ) -> AsyncIterator[GenerateResponse]:
        if plan.constraint is not None:
            await engine.constraints.check(plan.constraint)
        prompt_ids = await asyncio.to_thread(_tokenize, message, plan, engine)
        stopping = stopping_for_prompt(plan, prompt_ids, self.ctx.config.limits, engine.info)
        submit = _encode_checked(
            ipc.SubmitRequest(
                rid=state.rid,
                prompt_ids=prompt_ids,
                num_outputs=plan.num_outputs,
                sampling=plan.sampling,
                stopping=stopping,
                top_logprobs=plan.top_logprobs,
                detokenize=plan.detokenize,
                token_credit=state.granted,
                trace_parent=trace_parent,
                constraint=plan.constraint,
            )
        )
        stream = StreamAssembler(
            request_id=state.request_id,
            num_outputs=plan.num_outputs,
            prompt_tokens=len(prompt_ids),
            return_token_ids=plan.return_token_ids,
            return_logprobs=plan.top_logprobs is not None,
            final_only=plan.final_only,
        )
        yield GenerateResponse(  # accepted: from here on, failures travel in-stream (ERR-2)
            request_id=state.request_id,
            prompt_info=PromptInfo(
                prompt_tokens=len(prompt_ids),
                prompt_token_ids=prompt_ids if plan.return_prompt_token_ids else [],
                seed=plan.sampling.seed,
                num_outputs=plan.num_outputs,
            ),
        )
        if state.abort_requested:
            for response in stream.abort_all():
                yield response
            state.complete = True
            return
        try:
            self.ctx.link.send_encoded(submit)
        except WorkerUnavailableError as exc:
            state.fail(Status.UNAVAILABLE.value, str(exc))
        else:
            self.ctx.table.mark_submitted(state, len(prompt_ids))
        while not stream.done:
            events = await state.next_events()
            if state.failure is not None and not events:
                code, text = state.failure
                state.complete = True
                yield stream.error(code, text, retryable=code == Status.UNAVAILABLE.value)
                return
            responses = list(stream.add(events))
            state.complete = stream.done
            for response in responses:
                yield response

    def _stall(self, state: RequestState) -> None:
        """The client has not read a response for the stall timeout: stop generating for it and
        end its stream with a RequestError after what it already has (FLOW-2)."""
        if state.complete or state.failure is not None:
            return
        timeout = self.ctx.config.limits.stall_timeout_s
        state.abort_requested = True
        if state.submitted:
            self.ctx.link.abort([state.rid])
        state.fail(
            Status.RESOURCE_EXHAUSTED.value,
            f"the client read nothing for {timeout:g} s; the request was aborted (FLOW-2)",
            discard_pending=True,
        )

    async def embed(self, message: EmbedRequest) -> EmbedResponse:
        self._require("embed", "Embed")
        request_id = check_request_id(message.request_id)  # EMBED-3
        if not message.texts:
            raise invalid("texts must not be empty")
        vectors, tokens = await self._embedded(list(message.texts))
        return EmbedResponse(
            request_id=request_id or self.ctx.table.new_request_id(),
            embeddings=[Embedding(values=v) for v in vectors],
            usage=Usage(prompt_tokens=tokens),
        )

    async def score(self, message: ScoreRequest) -> ScoreResponse:
        """Each item's cosine similarity to the query under the embedding model (SCORE-1)."""
        self._require("score", "Score")
        request_id = check_request_id(message.request_id)
        scores, tokens = await self._scores(message.query, list(message.items), "items")
        return ScoreResponse(
            request_id=request_id or self.ctx.table.new_request_id(),
            scores=scores,
            usage=Usage(prompt_tokens=tokens),
        )

    async def rerank(self, message: RerankRequest) -> RerankResponse:
        """The documents by their Score, best first (SCORE-2)."""
        self._require("score", "Rerank")
        request_id = check_request_id(message.request_id)
        if message.top_n == 0:
            raise invalid("top_n=0 must be >= 1 (leave it unset for every document)")
        scores, tokens = await self._scores(message.query, list(message.documents), "documents")
        return RerankResponse(
            request_id=request_id or self.ctx.table.new_request_id(),
            results=[RankedDocument(index=i, score=s) for i, s in best_first(scores, message.top_n)],
            usage=Usage(prompt_tokens=tokens),
        )

    def _require(self, capability: str, rpc: str) -> None:
        if not getattr(self.ctx.serving_engine().capabilities, capability):
            raise GRPCError(
                Status.UNIMPLEMENTED, f"{rpc} is not served by this server (it runs no embedding model)"
            )

    async def _scores(self, query: str, texts: list[str], field: str) -> tuple[list[float], int]:
        if not query:
            raise invalid("query must not be empty")
        if not texts:
            raise invalid(f"{field} must not be empty")
        for i, text in enumerate(texts):
            if not text:
                raise invalid(f"{field}[{i}] must not be empty")
        try:
            (query_vector, *vectors), tokens = await self._embedded([query, *texts])
        except GRPCError as error:  # the embedding model's texts[0] is the query, texts[i] the (i-1)-th text
            raise GRPCError(error.status, _scored_field(error.message or "", field)) from None
        return scores_against(query_vector, vectors), tokens

    async def _embedded(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """The embedding model's vectors of the texts, and the tokens they took in all."""
        try:
            reply = await self.ctx.link.query(lambda qid: ipc.EmbedTexts(qid, texts))
        except WorkerUnavailableError as exc:
            raise GRPCError(Status.UNAVAILABLE, str(exc)) from None
        assert isinstance(reply, ipc.EmbedReply)
        if reply.error is not None:
            raise invalid(reply.error)
        return reply.vectors, sum(reply.token_counts)


def _scored_field(message: str, field: str) -> str:
    def rename(found: re.Match[str]) -> str:
        i = int(found.group(1))
        return "query" if i == 0 else f"{field}[{i - 1}]"

    return re.sub(r"texts\[(\d+)\]", rename, message)


def _encode_checked(request: ipc.SubmitRequest) -> bytes:
    """The request as the scheduler will read it. Decoding it here first means the frontend
    never forwards a message the scheduler cannot decode (the workers check too)."""
    frame = ipc.encode(request)
    try:
        ipc.scheduler_decoder.decode(frame)
    except msgspec.DecodeError as exc:
        raise GRPCError(Status.INTERNAL, f"the request could not be encoded for the engine: {exc}") from None
    return frame


def _tokenize(message: GenerateRequest, plan: GeneratePlan, engine: EngineFacts) -> list[int]:
    if plan.input_kind == "token_ids":
        assert message.token_ids is not None
        return list(message.token_ids.ids)
    prompt = message.text or "" if plan.input_kind == "text" else message.chat
    assert prompt is not None
    return encode_prompt(engine.tokenizer, prompt, message.parse_special_tokens)
