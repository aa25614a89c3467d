"""Every message that crosses a process boundary, grouped by the process that receives it.

Wire format: msgspec msgpack with an explicit tag per message type, so renaming a class never
changes the wire and an unknown tag is a decode error. Each receiver decodes with its own closed
union (``*_INBOX``).

    frontend ──Submit/Abort/queries──▶ scheduler ──Register/StepOutputs──▶ detokenizer
        ▲                                 │  ▲                                   │
        └──────────── Ready/replies ──────┘  └──────── FinishOutput ──────────────┤
        ▲                                                                         │
        └───────────────────────────── OutputBatch ───────────────────────────────┘
"""

from __future__ import annotations

from typing import Literal

import msgspec

# ── shared value types ──────────────────────────────────────────────────────────────────────


class SamplingConfig(msgspec.Struct, frozen=True):
    """Resolved sampling options: every default already applied."""

    temperature: float  # 0 = greedy
    top_p: float  # 1 = disabled
    top_k: int  # 0 = disabled
    min_p: float  # 0 = disabled
    frequency_penalty: float
    presence_penalty: float
    repetition_penalty: float  # 1 = disabled
    seed: int  # base seed; output i samples from a generator seeded with engine/seeds.derive_seed(seed, i)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


class StoppingConfig(msgspec.Struct, frozen=True):
    """Token-level stop conditions, applied by the engine. Stop strings live in DetokenizeConfig."""

    max_tokens: int  # >= 1, and prompt + max_tokens <= context window
    min_tokens: int  # EOS and stop_token_ids are masked out until this many tokens exist
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool


class DetokenizeConfig(msgspec.Struct, frozen=True):
    """Text-level options, applied by the detokenizer."""

    return_text: bool
    skip_special_tokens: bool
    stop_strings: tuple[str, ...]
    include_stop_in_output: bool
    min_tokens: int  # a stop string only matches once the output has at least this many tokens
    # Text released a whole token at a time, as vLLM's detokenizer does: a token that ends inside a
    # character holds all its text until the character completes. A dialect whose gateway decodes
    # the ids (vllm-engine) then ends an output where the ids hold the whole stop string.
    whole_token_text: bool = False


ConstraintKind = Literal["json_schema", "json_object", "regex", "ebnf", "choice"]


class Constraint(msgspec.Struct, frozen=True):
    """What every output of a request must be (CONSTRAIN-1), as the client gave it; the frontend
    checked that it compiles. Hashable: the compiled grammar cache is keyed by it."""

    kind: ConstraintKind
    definition: str = ""  # json_schema: the schema's JSON text; regex; ebnf; else empty
    choices: tuple[str, ...] = ()  # choice: the strings, none empty


FinishReasonName = Literal["stop", "length", "aborted"]


class Finish(msgspec.Struct, frozen=True):
    """Why an output ended. For reason "stop" exactly one of the three match fields is set."""

    reason: FinishReasonName
    eos_token_id: int | None = None
    stop_token_id: int | None = None
    stop_string: str | None = None


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    token_id: int
    logprob: float
    rank: int  # 1-based
    top: list[tuple[int, float]]  # (token_id, logprob), best first


class SequenceOutput(msgspec.Struct, array_like=True):
    """What one step produced for one output of one request."""

    rid: str
    output_index: int
    token_ids: list[int]  # new tokens only; empty for a finish without a token (abort)
    logprobs: list[TokenLogprob] | None = None  # one per new token when requested
    finish: Finish | None = None
    cached_prompt_tokens: int | None = None  # set once per request, on its first output


# ── frontend → scheduler ────────────────────────────────────────────────────────────────────


class SubmitRequest(msgspec.Struct, frozen=True, tag="submit"):
    """A validated, tokenized request with ``num_outputs`` outputs sharing one prompt."""

    rid: str
    prompt_ids: list[int]  # never empty, every id < vocab size
    num_outputs: int  # n >= 1; admitted all-or-nothing
    sampling: SamplingConfig
    stopping: StoppingConfig
    top_logprobs: int | None  # None: no logprobs; k >= 0: logprobs with k candidates
    detokenize: DetokenizeConfig
    token_credit: int = 0  # tokens its outputs may produce in all before a GrantTokens; 0: no limit
    trace_parent: str = ""  # W3C traceparent of the frontend's span of the call, when tracing (TRACE-1)
    constraint: Constraint | None = None  # None: unconstrained


class AbortRequests(msgspec.Struct, frozen=True, tag="abort"):
    """End these requests. Unknown rids are ignored. Unfinished outputs finish as aborted."""

    rids: list[str]


class QueryLoad(msgspec.Struct, frozen=True, tag="query_load"):
    query_id: int


class FlushCache(msgspec.Struct, frozen=True, tag="flush_cache"):
    query_id: int


class SetPaused(msgspec.Struct, frozen=True, tag="set_paused"):
    query_id: int
    paused: bool


class EmbedTexts(msgspec.Struct, frozen=True, tag="embed"):
    query_id: int
    texts: list[str]


class StartProfile(msgspec.Struct, frozen=True, tag="start_profile"):
    """Start recording a torch.profiler trace of the scheduler process (its engine steps)."""

    query_id: int
    output_dir: str  # where StopProfile writes the trace


class StopProfile(msgspec.Struct, frozen=True, tag="stop_profile"):
    """Stop the recording and write it to the StartProfile's folder as a chrome trace (JSON)."""

    query_id: int


class UpdateWeights(msgspec.Struct, frozen=True, tag="update_weights"):
    """Replace the model's weights by those at ``model_path`` (a .gguf file or a Hugging Face
    directory of the same shape), between steps; requests in flight go on."""

    query_id: int
    model_path: str


class GrantTokens(msgspec.Struct, frozen=True, tag="grant_tokens"):
    """The request's outputs may now produce tokens until they have ``credit`` tokens in all: the
    frontend grants more as its client reads (FLOW-1). A request out of credit keeps its KV cache
    but leaves the batch until more is granted."""

    rid: str
    credit: int


class Shutdown(msgspec.Struct, frozen=True, tag="shutdown"):
    """Stop the receiving process's loop and exit."""


# ── detokenizer → scheduler ─────────────────────────────────────────────────────────────────


class FinishOutput(msgspec.Struct, frozen=True, tag="finish_output"):
    """The detokenizer ended this output (a stop string matched): free it without more output."""

    rid: str
    output_index: int


SCHEDULER_INBOX = (
    SubmitRequest
    | AbortRequests
    | FinishOutput
    | GrantTokens
    | QueryLoad
    | FlushCache
    | SetPaused
    | EmbedTexts
    | StartProfile
    | StopProfile
    | UpdateWeights
    | Shutdown
)

# ── scheduler → detokenizer ─────────────────────────────────────────────────────────────────


class RegisterRequest(msgspec.Struct, frozen=True, tag="register"):
    """Sent before any output of ``rid``: how to turn its tokens into text."""

    rid: str
    num_outputs: int
    detokenize: DetokenizeConfig


class StepOutputs(msgspec.Struct, frozen=True, tag="step_outputs"):
    outputs: list[SequenceOutput]


DETOKENIZER_INBOX = RegisterRequest | StepOutputs | Shutdown

# ── detokenizer → frontend ──────────────────────────────────────────────────────────────────


class OutputEvent(msgspec.Struct, array_like=True):
    """New tokens and text of one output, possibly with its finish."""

    rid: str
    output_index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None
    finish: Finish | None
    completion_tokens: int  # tokens of this output so far, this event's included
    cached_prompt_tokens: int | None


class OutputBatch(msgspec.Struct, frozen=True, tag="output_batch"):
    events: list[OutputEvent]


# ── scheduler (and detokenizer) → frontend ────────────────────────────────────────────────────────────────────


class EngineInfo(msgspec.Struct, frozen=True):
    """What the engine serves; the frontend validates requests against it."""

    model_id: str
    architecture: str
    vocab_size: int
    max_context_tokens: int
    eos_token_ids: list[int]
    bos_token_id: int | None
    kv_tokens_total: int  # a request needing more slots than this can never run
    max_running_sequences: int
    prefix_cache: bool
    deterministic_greedy: bool
    embedding_model_id: str | None
    embedding_dimensions: int
    embedding_max_tokens: int
    constrained_decoding: bool = False  # GenerateRequest.constraint is honoured (llguidance is installed)


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    """A worker finished starting. The scheduler's carries what its engine serves."""

    process: str  # "scheduler" or "detokenizer"
    engine: EngineInfo | None = None


class EngineLoad(msgspec.Struct, frozen=True):
    running_sequences: int
    waiting_sequences: int
    kv_tokens_in_use: int
    kv_tokens_total: int
    kv_tokens_cached: int
    paused: bool
    requests_in_engine: int  # request groups holding any engine state


class LoadReply(msgspec.Struct, frozen=True, tag="load_reply"):
    query_id: int
    load: EngineLoad


class FlushReply(msgspec.Struct, frozen=True, tag="flush_reply"):
    query_id: int
    released_tokens: int


class PausedReply(msgspec.Struct, frozen=True, tag="paused_reply"):
    query_id: int
    paused: bool


class EmbedReply(msgspec.Struct, frozen=True, tag="embed_reply"):
    query_id: int
    vectors: list[list[float]]
    token_counts: list[int]
    error: str | None = None  # e.g. a text longer than the embedding model's window


#: Why an administrative command was refused, named as the gRPC status it becomes.
AdminRefusal = Literal["invalid_argument", "not_found", "failed_precondition", "internal"]


class AdminReply(msgspec.Struct, frozen=True, tag="admin_reply"):
    """The outcome of an administrative command (profiler, weight update): what was done, or why not."""

    query_id: int
    message: str
    refusal: AdminRefusal | None = None  # None: done
    path: str = ""  # StartProfile: the folder the trace goes to; StopProfile: the trace written


class WorkerFailed(msgspec.Struct, frozen=True, tag="worker_failed"):
    """A worker hit an unrecoverable error; the frontend fails in-flight streams."""

    process: str
    message: str


class RequestFailed(msgspec.Struct, frozen=True, tag="request_failed"):
    """A worker could not process one request (it holds no state for it any more); the frontend
    ends that request's stream with a RequestError and every other request goes on."""

    rid: str
    process: str
    message: str


# ── scheduler → frontend: KV-cache events ───────────────────────────────────────────────────
#
# The prefix cache as fixed-size blocks, for routers that place requests where their prefix is
# cached (smg's cache_aware policy). Block i of a cached token path covers its tokens
# [i * block_size, (i + 1) * block_size); only full blocks exist. A block's hash identifies
# its whole path (the parent's hash and its own tokens), so equal blocks under different
# prefixes differ. A parent is stored before its children and removed after them.


class KvBlock(msgspec.Struct, frozen=True, array_like=True):
    block_hash: int  # signed 64-bit
    token_ids: list[int]  # exactly block_size ids


class KvBlocksStored(msgspec.Struct, frozen=True, tag="kv_stored"):
    """Consecutive blocks of one path, now cached; the first one's parent is given (None: the
    first block of the path)."""

    parent_block_hash: int | None
    blocks: list[KvBlock]


class KvBlocksRemoved(msgspec.Struct, frozen=True, tag="kv_removed"):
    block_hashes: list[int]


class KvCacheCleared(msgspec.Struct, frozen=True, tag="kv_cleared"):
    """Every block is gone."""


KvCacheEvent = KvBlocksStored | KvBlocksRemoved | KvCacheCleared


class KvEvents(msgspec.Struct, frozen=True, tag="kv_events"):
    """What the prefix cache did since the previous KvEvents, in order."""

    block_size: int
    events: list[KvCacheEvent]


FRONTEND_INBOX = (
    OutputBatch
    | Ready
    | LoadReply
    | FlushReply
    | PausedReply
    | EmbedReply
    | AdminReply
    | WorkerFailed
    | RequestFailed
    | KvEvents
)


# ── codec ───────────────────────────────────────────────────────────────────────────────────

_encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def rid_of(frame: bytes) -> str | None:
    """The ``rid`` of a frame that its receiver's typed decoder refused, if one can be read."""
    rids = rids_of(frame)
    return rids[0] if rids else None


def rids_of(frame: bytes) -> list[str]:
    """The requests a frame that its receiver's typed decoder refused names, as far as they can be
    read: its ``rid``, or, for an OutputBatch, the ``rid`` of each of its events."""
    try:
        value = msgspec.msgpack.decode(frame)
    except msgspec.DecodeError:
        return []
    if not isinstance(value, dict):
        return []
    rid = value.get("rid")
    if isinstance(rid, str):
        return [rid]
    events = value.get("events")
    batch = OutputBatch.__struct_config__
    if batch.tag_field is None or value.get(batch.tag_field) != batch.tag or not isinstance(events, list):
        return []
    named = (event[0] for event in events if isinstance(event, list) and event)  # OutputEvent is array-like
    return list(dict.fromkeys(rid for rid in named if isinstance(rid, str)))


scheduler_decoder = msgspec.msgpack.Decoder(SCHEDULER_INBOX)
detokenizer_decoder = msgspec.msgpack.Decoder(DETOKENIZER_INBOX)
frontend_decoder = msgspec.msgpack.Decoder(FRONTEND_INBOX)
