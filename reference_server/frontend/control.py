"""lmrpc.v1.ControlService: discovery, load, abort, tokenization and administration."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import betterproto2
import msgspec
from grpclib import GRPCError, Status

from lmrpc.v1 import (
    AbortOutcome,
    AbortRequest,
    AbortResponse,
    AbortStatus,
    ControlServiceBase,
    DetokenizeRequest,
    DetokenizeResponse,
    FlushCacheRequest,
    FlushCacheResponse,
    GetLoadRequest,
    GetLoadResponse,
    GetModelInfoRequest,
    GetModelInfoResponse,
    GetServerInfoRequest,
    GetServerInfoResponse,
    Load,
    PauseGenerationRequest,
    PauseGenerationResponse,
    ResumeGenerationRequest,
    ResumeGenerationResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from reference_server import ipc
from reference_server.frontend.context import FrontendContext, model_info_for
from reference_server.frontend.engine_link import Reply, WorkerUnavailableError
from reference_server.frontend.validation import invalid


class ControlService(ControlServiceBase):
    def __init__(self, context: FrontendContext) -> None:
        self.ctx = context

    async def get_server_info(self, message: GetServerInfoRequest) -> GetServerInfoResponse:
        return GetServerInfoResponse(server=self.ctx.server_info())

    async def get_model_info(self, message: GetModelInfoRequest) -> GetModelInfoResponse:
        model, embedding = model_info_for(self.ctx.ready_engine(), self.ctx.config)
        return GetModelInfoResponse(model=model, embedding_model=embedding)

    async def get_load(self, message: GetLoadRequest) -> GetLoadResponse:
        self.ctx.ready_engine()
        reply = await self._query(ipc.QueryLoad)
        assert isinstance(reply, ipc.LoadReply)
        engine = reply.load
        return GetLoadResponse(
            current=Load(
                active_requests=len(self.ctx.table),
                running_sequences=engine.running_sequences,
                waiting_sequences=engine.waiting_sequences,
                kv_tokens_in_use=engine.kv_tokens_in_use,
                kv_tokens_total=engine.kv_tokens_total,
                kv_tokens_cached=engine.kv_tokens_cached,
                paused=engine.paused,
            )
        )

    async def abort(self, message: AbortRequest) -> AbortResponse:
        target, _ = betterproto2.which_one_of(message, "target")
        table = self.ctx.table
        if target == "all":
            request_ids = [state.request_id for state in table.states()]
        elif target == "request_ids" and message.request_ids is not None and message.request_ids.ids:
            request_ids = list(dict.fromkeys(message.request_ids.ids))
        else:
            raise invalid("target: set request_ids (with at least one id) or all")
        outcomes, rids = [], []
        for request_id in request_ids:
            state = table.get(request_id)
            if state is None or state.complete:
                table.remember_abort(request_id)  # a Generate arriving soon with this id loses (ABORT-6)
                outcomes.append(AbortOutcome(request_id=request_id, status=AbortStatus.NOT_IN_FLIGHT))
                continue
            if state.submitted:
                rids.append(state.rid)
            else:
                state.abort_requested = True
            outcomes.append(AbortOutcome(request_id=request_id, status=AbortStatus.ABORTED))
        self.ctx.link.abort(rids)
        return AbortResponse(outcomes=outcomes)

    async def tokenize(self, message: TokenizeRequest) -> TokenizeResponse:
        engine = self.ctx.ready_engine()
        kind, _ = betterproto2.which_one_of(message, "input")
        tokenizer = engine.tokenizer
        parse = message.parse_special_tokens  # as Generate does (REQ-8, TOK-1)
        if kind == "text":
            ids = await asyncio.to_thread(
                tokenizer.encode, message.text or "", parse_special_tokens=parse is not False
            )
        elif kind == "chat":
            if not engine.capabilities.chat_input:
                raise GRPCError(Status.UNIMPLEMENTED, "chat input is not supported by this server")
            assert message.chat is not None
            if not message.chat.messages:
                raise invalid("chat.messages must not be empty")
            messages = [{"role": m.role, "content": m.content} for m in message.chat.messages]
            add_prompt = message.chat.add_generation_prompt
            try:
                ids = await asyncio.to_thread(
                    tokenizer.encode_chat,
                    messages,
                    add_generation_prompt=add_prompt is not False,
                    parse_special_tokens=parse is True,
                )
            except Exception as exc:
                raise invalid(f"chat: the model's chat template rejected the messages: {exc}") from None
        else:
            raise invalid("input: exactly one of text or chat must be set")
        return TokenizeResponse(token_ids=ids)

    async def detokenize(self, message: DetokenizeRequest) -> DetokenizeResponse:
        engine = self.ctx.ready_engine()
        vocab_size = engine.info.vocab_size
        for i, token_id in enumerate(message.token_ids):
            if token_id >= vocab_size:
                raise invalid(f"token_ids[{i}]={token_id} must be < vocab_size={vocab_size}")
        skip = message.skip_special_tokens is not False
        text = await asyncio.to_thread(
            engine.tokenizer.decode, list(message.token_ids), skip_special_tokens=skip
        )
        return DetokenizeResponse(text=text)

    async def flush_cache(self, message: FlushCacheRequest) -> FlushCacheResponse:
        self.ctx.ready_engine()
        reply = await self._query(ipc.FlushCache)
        assert isinstance(reply, ipc.FlushReply)
        return FlushCacheResponse(released_tokens=reply.released_tokens)

    async def pause_generation(self, message: PauseGenerationRequest) -> PauseGenerationResponse:
        self.ctx.ready_engine()
        await self._query(lambda qid: ipc.SetPaused(qid, True))
        return PauseGenerationResponse()

    async def resume_generation(self, message: ResumeGenerationRequest) -> ResumeGenerationResponse:
        self.ctx.ready_engine()
        await self._query(lambda qid: ipc.SetPaused(qid, False))
        return ResumeGenerationResponse()

    async def _query(self, make: Callable[[int], msgspec.Struct]) -> Reply:
        try:
            return await self.ctx.link.query(make)
        except WorkerUnavailableError as exc:
            raise GRPCError(Status.UNAVAILABLE, str(exc)) from None
