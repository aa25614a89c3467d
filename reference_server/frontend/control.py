"""lmrpc.v1.ControlService: discovery, load, abort, tokenization and administration."""

from __future__ import annotations

import asyncio
import tempfile
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
    ListModelsRequest,
    ListModelsResponse,
    Load,
    ModelKind,
    PauseGenerationRequest,
    PauseGenerationResponse,
    ResumeGenerationRequest,
    ResumeGenerationResponse,
    ServedModel,
    StartProfileRequest,
    StartProfileResponse,
    StopProfileRequest,
    StopProfileResponse,
    TokenizeRequest,
    TokenizeResponse,
    UpdateWeightsRequest,
    UpdateWeightsResponse,
)
from reference_server import ipc
from reference_server.frontend.context import FrontendContext, model_info_for
from reference_server.frontend.edge.call import current_call
from reference_server.frontend.engine_admin import EngineAdmin
from reference_server.frontend.engine_link import Reply, WorkerUnavailableError
from reference_server.frontend.grpc_hooks import StreamingDiscipline
from reference_server.frontend.prompts import Prompt, encode_prompt
from reference_server.frontend.requests import RequestState
from reference_server.frontend.validation import invalid

#: RPCs that need the admin role when authentication is on (AUTH-2). Abort of all requests does
#: too; that is checked in ``abort``, since Abort by id is open to every client.
ADMIN_METHODS = frozenset(
    f"/lmrpc.v1.ControlService/{name}"
    for name in (
        "FlushCache",
        "PauseGeneration",
        "ResumeGeneration",
        "StartProfile",
        "StopProfile",
        "UpdateWeights",
    )
)


class ControlService(StreamingDiscipline, ControlServiceBase):
    def __init__(self, context: FrontendContext) -> None:
        self.ctx = context
        self.admin = EngineAdmin(context)

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
        principal = current_call().principal
        target, _ = betterproto2.which_one_of(message, "target")
        table = self.ctx.table
        if target == "all":
            if not principal.is_admin:
                raise GRPCError(Status.PERMISSION_DENIED, "Abort of all requests needs the admin role")
            states = [s for s in table.states() if not s.complete and not s.abort_requested]
            outcomes = [AbortOutcome(request_id=s.request_id, status=AbortStatus.ABORTED) for s in states]
            self._abort(states)
            return AbortResponse(outcomes=outcomes)
        if target != "request_ids" or message.request_ids is None or not message.request_ids.ids:
            raise invalid("target: set request_ids (with at least one id) or all")
        limit = self.ctx.config.limits.max_abort_request_ids
        if len(message.request_ids.ids) > limit:
            raise invalid(f"request_ids.ids has {len(message.request_ids.ids)} entries; at most {limit}")
        outcomes = []
        for request_id in dict.fromkeys(message.request_ids.ids):
            visible = table.visible(principal.name, request_id, any_owner=principal.is_admin)
            live = [s for s in visible if not s.complete and not s.abort_requested]
            if not live:
                if not visible:
                    table.remember_abort(principal.name, request_id)  # ABORT-6
                outcomes.append(AbortOutcome(request_id=request_id, status=AbortStatus.NOT_IN_FLIGHT))
                continue
            self._abort(live)
            outcomes.append(AbortOutcome(request_id=request_id, status=AbortStatus.ABORTED))
        return AbortResponse(outcomes=outcomes)

    def _abort(self, states: list[RequestState]) -> None:
        """Mark requests aborted; those already in the engine get aborted there, the others end
        with aborted finishes as soon as they are accepted."""
        for state in states:
            state.abort_requested = True
        try:
            self.ctx.link.abort([s.rid for s in states if s.submitted])
        except WorkerUnavailableError as exc:
            raise GRPCError(Status.UNAVAILABLE, str(exc)) from None

    async def tokenize(self, message: TokenizeRequest) -> TokenizeResponse:
        engine = self.ctx.ready_engine()
        kind, _ = betterproto2.which_one_of(message, "input")
        prompt: Prompt
        if kind == "text":
            prompt = message.text or ""
        elif kind == "chat":
            if not engine.capabilities.chat_input:
                raise GRPCError(Status.UNIMPLEMENTED, "chat input is not supported by this server")
            assert message.chat is not None
            if not message.chat.messages:
                raise invalid("chat.messages must not be empty")
            prompt = message.chat
        else:
            raise invalid("input: exactly one of text or chat must be set")
        # as Generate encodes it (REQ-8, TOK-1)
        ids = await asyncio.to_thread(encode_prompt, engine.tokenizer, prompt, message.parse_special_tokens)
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

    async def list_models(self, message: ListModelsRequest) -> ListModelsResponse:
        """The generation model and, when it runs, the embedding model (MODELS-1); this server
        serves no adapters."""
        model, embedding = model_info_for(self.ctx.ready_engine(), self.ctx.config)
        models = [
            ServedModel(
                model_id=model.model_id,
                kind=ModelKind.GENERATION,
                max_input_tokens=model.max_context_tokens,
            )
        ]
        if embedding is not None:
            models.append(
                ServedModel(
                    model_id=embedding.model_id,
                    kind=ModelKind.EMBEDDING,
                    max_input_tokens=embedding.max_input_tokens,
                )
            )
        return ListModelsResponse(models=models)

    async def start_profile(self, message: StartProfileRequest) -> StartProfileResponse:
        """Records the scheduler process, where the engine steps (ADMIN-1); without
        ``output_dir`` the trace goes to the temporary folder ($TMPDIR, else /tmp)."""
        started = await self.admin.start_profile(message.output_dir or tempfile.gettempdir())
        return StartProfileResponse(output_dir=started.path)

    async def stop_profile(self, message: StopProfileRequest) -> StopProfileResponse:
        return StopProfileResponse(trace_files=[(await self.admin.stop_profile()).path])

    async def update_weights(self, message: UpdateWeightsRequest) -> UpdateWeightsResponse:
        """Between two engine steps; streams in flight go on (ADMIN-2). A refusal leaves the
        weights and their version as they were."""
        if not message.model_path:
            raise invalid("model_path must name a .gguf file or a model directory")
        if message.weights_version is not None and not message.weights_version:
            raise invalid("weights_version must not be empty (leave it unset for one the server names)")
        await self.admin.update_weights(message.model_path, message.weights_version)
        return UpdateWeightsResponse(weights_version=self.ctx.ready_engine().weights_version)

    async def _query(self, make: Callable[[int], msgspec.Struct]) -> Reply:
        try:
            return await self.ctx.link.query(make)
        except WorkerUnavailableError as exc:
            raise GRPCError(Status.UNAVAILABLE, str(exc)) from None
