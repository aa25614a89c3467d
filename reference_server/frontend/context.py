"""State shared by the frontend's services: lifecycle phase, health, engine facts, tokenizer."""

from __future__ import annotations

import asyncio
import enum
import time
import uuid
from dataclasses import dataclass, field

from grpclib import GRPCError, Status
from grpclib.health.check import ServiceStatus

from lmrpc import CONTRACT_REVISION
from lmrpc.v1 import Capabilities, EffectiveDefaults, EmbeddingModelInfo, ModelInfo, ServerInfo, ServerLimits
from reference_server.config import ServerConfig
from reference_server.frontend.constraints import ConstraintChecker
from reference_server.frontend.engine_link import EngineLink
from reference_server.frontend.requests import RequestTable
from reference_server.ipc import EngineInfo
from reference_server.models.tokenizer import TokenizerBundle
from reference_server.tracing import Tracing

SERVER_NAME = "lmrpc-reference"
INITIAL_WEIGHTS = "initial"  # the weights the workers loaded at start (a restart loads them again)


class Phase(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    RECOVERING = "recovering"  # a worker died: in-flight requests failed, fresh workers starting
    DRAINING = "draining"
    FAILED = "failed"  # a worker died and no restart is left: the process is about to exit


@dataclass
class EngineFacts:
    """What the workers reported once ready."""

    info: EngineInfo
    tokenizer: TokenizerBundle
    capabilities: Capabilities
    weights_version: str = INITIAL_WEIGHTS  # ModelInfo.weights_version (ADMIN-2)
    updates: int = 0  # UpdateWeights these workers took
    instance_id: str = field(
        default_factory=lambda: uuid.uuid4().hex
    )  # new with every set of workers (SVC-4)
    constraints: ConstraintChecker = field(init=False)  # compiles constraints to check them (CONSTRAIN-2)

    def __post_init__(self) -> None:
        self.constraints = ConstraintChecker(self.tokenizer, self.info.vocab_size)


@dataclass
class FrontendContext:
    config: ServerConfig
    table: RequestTable
    link: EngineLink
    health: ServiceStatus = field(default_factory=ServiceStatus)
    phase: Phase = Phase.STARTING
    engine: EngineFacts | None = None
    failure: str | None = None
    started_at: float = field(default_factory=time.monotonic)
    started_at_unix: float = field(default_factory=time.time)  # the same instant, for clocks across hosts
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set when no request is in flight
    tracing: Tracing | None = None  # --otlp-endpoint: spans of the calls it serves (TRACE-1)

    def __post_init__(self) -> None:
        self.health.set(False)
        self.idle.set()

    def set_phase(self, phase: Phase) -> None:
        if self.phase is Phase.FAILED:
            return
        self.phase = phase
        self.health.set(phase is Phase.SERVING)

    def serving_engine(self) -> EngineFacts:
        """The engine, if the server accepts requests now; UNAVAILABLE otherwise (ERR-1)."""
        if self.phase is Phase.SERVING and self.engine is not None:
            return self.engine
        reason = {
            Phase.STARTING: "the server is starting",
            Phase.RECOVERING: f"the server is restarting its workers after a failure: {self.failure}",
            Phase.DRAINING: "the server is shutting down",
            Phase.FAILED: f"the server has failed: {self.failure}",
        }.get(self.phase, "the server is not ready")
        raise GRPCError(Status.UNAVAILABLE, reason)

    def ready_engine(self) -> EngineFacts:
        """The engine for read-only RPCs, which keep working while draining."""
        if self.engine is None or self.phase in (Phase.FAILED, Phase.RECOVERING):
            return self.serving_engine()
        return self.engine

    def server_info(self) -> ServerInfo:
        from lmrpc import __version__

        limits = self.config.limits
        return ServerInfo(
            server_name=SERVER_NAME,
            server_version=__version__,
            contract_revision=CONTRACT_REVISION,
            capabilities=self.engine.capabilities if self.engine else Capabilities(),
            uptime_seconds=time.monotonic() - self.started_at,
            instance_id=self.engine.instance_id if self.engine else "",
            limits=ServerLimits(
                max_message_bytes=limits.max_message_bytes,
                abort_grace_seconds=limits.abort_grace_s,
                max_parked_tokens=limits.max_parked_tokens,
                stall_timeout_seconds=limits.stall_timeout_s,
                max_abort_request_ids=limits.max_abort_request_ids,
                max_stop_string_bytes=limits.max_stop_string_bytes,
                max_waiting_requests=limits.max_waiting_requests,
                drain_timeout_seconds=self.config.drain_timeout_s,
            ),
        )


def capabilities_for(info: EngineInfo, tokenizer: TokenizerBundle, config: ServerConfig) -> Capabilities:
    limits = config.limits
    return Capabilities(
        text_input=True,
        token_ids_input=True,
        chat_input=tokenizer.chat_template is not None,
        max_outputs=min(limits.max_outputs, info.max_running_sequences),
        truncation_sampling=True,
        penalties=True,
        seeded_sampling=info.deterministic_greedy,  # batch-invariant numerics give both, or neither
        deterministic_greedy=info.deterministic_greedy,
        stop_strings=True,
        stop_token_ids=True,
        logprobs=True,
        max_top_logprobs=limits.max_top_logprobs,
        prefix_cache=info.prefix_cache,
        embed=info.embedding_model_id is not None,
        tokenize=True,
        admin=True,
        final_only=True,
        max_stop_strings=limits.max_stop_strings,
        authentication=config.auth_file is not None,
        special_token_parsing=True,
        list_models=True,
        score=info.embedding_model_id is not None,
        profiler=True,
        weight_updates=True,
        constrained_decoding=info.constrained_decoding,
    )


def model_info_for(engine: EngineFacts, config: ServerConfig) -> tuple[ModelInfo, EmbeddingModelInfo | None]:
    info, limits = engine.info, config.limits
    model = ModelInfo(
        model_id=info.model_id,
        architecture=info.architecture,
        vocab_size=info.vocab_size,
        max_context_tokens=info.max_context_tokens,
        eos_token_ids=list(info.eos_token_ids),
        bos_token_id=info.bos_token_id,
        defaults=EffectiveDefaults(
            temperature=limits.default_temperature,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            frequency_penalty=0.0,
            presence_penalty=0.0,
            repetition_penalty=1.0,
            n=1,
            max_tokens=min(limits.default_max_tokens, info.max_context_tokens - 1),
            min_tokens=0,
        ),
        has_chat_template=engine.tokenizer.chat_template is not None,
        weights_version=engine.weights_version,
    )
    embedding = None
    if info.embedding_model_id is not None:
        embedding = EmbeddingModelInfo(
            model_id=info.embedding_model_id,
            dimensions=info.embedding_dimensions,
            max_input_tokens=info.embedding_max_tokens,
        )
    return model, embedding
