"""TextGenerate and Generate requests as lmrpc.v1 requests.

SGLang's runtime protocol marks every sampling value ``optional``: a value sent is taken as sent
(``temperature = 0`` is greedy), one left out gets SGLang's default, which is lmrpc's too except
``max_new_tokens`` (128 in SGLang, sent explicitly). ``top_k = -1`` disables top-k, as in SGLang.

SGLang 0.5.23's own checks of the constraint fields come first, worded as its server words them
(INVALID_ARGUMENT): ``guided_decoding`` without a constraint or with an empty one, an empty legacy
``json_schema`` or ``regex``, a legacy constraint beside ``guided_decoding``.

``guided_decoding`` (or a legacy ``json_schema`` or ``regex``) becomes lmrpc's constraint. Options
the server cannot honour answer UNIMPLEMENTED naming the field: a ``structural_tag``, ``lora_path`` (no LoRA adapters),
prompt logprobs (``logprob_start_len >= 0`` with ``return_logprob``), ``max_new_tokens = 0`` (a
prefill-only request), ``session_id`` (no sessions), ``disaggregated_params`` (no
prefill/decode disaggregation), ``kv_hints`` (no KV-hint actions), ``require_reasoning`` and
``max_thinking_tokens`` (no reasoning parser, no thinking budget), ``image_data``,
``video_data`` and ``audio_data`` (a text-only model). Accepted without effect: ``routing_key``
(one worker: nothing to route), ``trace_headers`` (no tracing), ``priority`` (SGLang ignores it
too unless started with ``--enable-priority-scheduling``), ``top_logprobs_num`` without
``return_logprob`` (SGLang reads it only with logprobs on). ``seed`` is lmrpc's seed. lmrpc.v1's
validation checks the rest, and its messages are renamed to this protocol's fields
(``renamed``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TypeVar

import betterproto2
from grpclib import GRPCError, Status

from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import (
    Choices,
    Constraint,
    GenerateRequest,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
    TokenIds,
)
from reference_server.frontend.dialects.base.requests import check_one_data_parallel_rank, unimplemented

R = TypeVar("R")

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128
TOP_K_DISABLED = -1
UINT64 = 1 << 64
MEDIA_FIELDS = ("image_data", "video_data", "audio_data")

#: lmrpc.v1's field names in its validation messages, and this protocol's (first match wins)
NATIVE_FIELD_NAMES = (
    ("stopping.max_tokens", "sampling_params.max_new_tokens"),
    ("the effective max_tokens", "the effective max_new_tokens"),
    ("stopping.min_tokens", "sampling_params.min_new_tokens"),
    ("stopping.stop_strings", "sampling_params.stop"),
    ("stopping.stop_token_ids", "sampling_params.stop_token_ids"),
    ("sampling.", "sampling_params."),
    ("token_ids.ids", "input_ids"),
    ("response.top_logprobs", "top_logprobs_num"),
    ("request_id", "rid"),
)


@dataclass(frozen=True, slots=True)
class LogprobRequest:
    """What a generate request asked of logprobs (None in ``GenerateOptions``: none)."""

    top: int
    with_text: bool


@dataclass(frozen=True, slots=True)
class GenerateOptions:
    """The lmrpc.v1 request, and what the responses need to know about the original."""

    request: GenerateRequest
    stream: bool
    logprobs: LogprobRequest | None
    return_text: bool = False  # Generate: the text too, in GenerateResponse.text


def text_generate_options(message: rt.TextGenerateRequest) -> GenerateOptions:
    if not message.text:
        raise GRPCError(Status.INVALID_ARGUMENT, "text must not be empty")
    _refuse_unsupported(message, message.sampling_params)
    logprobs = _logprobs(message.return_logprob, message.top_logprobs_num, message.logprob_start_len)
    if logprobs is not None and message.return_text_in_logprobs:
        logprobs = LogprobRequest(logprobs.top, with_text=True)
    request = _lmrpc_request(message.rid, message.sampling_params, message.stream, logprobs)
    request.text = message.text
    return GenerateOptions(request, bool(message.stream), logprobs)


def generate_options(message: rt.GenerateRequest, vocab_size: int) -> GenerateOptions:
    ids = list(message.input_ids)
    if not ids:
        raise GRPCError(Status.INVALID_ARGUMENT, "input_ids must not be empty")
    for i, token_id in enumerate(ids):
        if not 0 <= token_id < vocab_size:
            raise GRPCError(
                Status.INVALID_ARGUMENT, f"input_ids[{i}]={token_id} must be in [0, {vocab_size})"
            )
    _refuse_unsupported(message, message.sampling_params)
    for name in MEDIA_FIELDS:
        media: list[str] = getattr(message, name)
        if media:
            raise unimplemented(f"{name} ({len(media)} item(s))", "a text-only model")
    logprobs = _logprobs(message.return_logprob, message.top_logprobs_num, message.logprob_start_len)
    request = _lmrpc_request(message.rid, message.sampling_params, message.stream, logprobs)
    request.token_ids = TokenIds(ids=ids)
    return GenerateOptions(request, bool(message.stream), logprobs, return_text=bool(message.return_text))


async def renamed(responses: AsyncGenerator[R], names: tuple[tuple[str, str], ...]) -> AsyncGenerator[R]:
    """``responses`` (closed with this generator), with lmrpc.v1's field names in an error's
    message replaced by ``names``."""
    async with contextlib.aclosing(responses):
        try:
            async for response in responses:
                yield response
        except GRPCError as error:
            raise GRPCError(error.status, rename_fields(error.message or "", names), error.details) from None


def rename_fields(message: str, names: tuple[tuple[str, str], ...]) -> str:
    for lmrpc_name, own_name in names:
        message = message.replace(lmrpc_name, own_name)
    return message


def _lmrpc_request(
    rid: str | None, params: rt.SamplingParams | None, stream: bool | None, logprobs: LogprobRequest | None
) -> GenerateRequest:
    params = params or rt.SamplingParams()
    return GenerateRequest(
        request_id=rid or "",
        sampling=_sampling(params),
        stopping=_stopping(params),
        response=ResponseOptions(
            return_text=True,
            return_token_ids=True,
            return_logprobs=logprobs is not None,
            top_logprobs=0 if logprobs is None else logprobs.top,
            final_only=not stream,
        ),
        constraint=runtime_constraint(params),
    )


def _sampling(p: rt.SamplingParams) -> SamplingParams:
    top_k = p.top_k
    if top_k is not None and (top_k < TOP_K_DISABLED or top_k == 0):
        raise GRPCError(
            Status.INVALID_ARGUMENT, f"sampling_params.top_k={top_k} must be -1 (disabled) or >= 1"
        )
    return SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=None if top_k is None else max(top_k, 0),  # -1 is lmrpc's 0: disabled
        min_p=p.min_p,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        repetition_penalty=p.repetition_penalty,
        seed=None if p.seed is None else p.seed % UINT64,  # an int64 here, a uint64 in lmrpc.v1
        n=p.n,
    )


def _stopping(p: rt.SamplingParams) -> StoppingCriteria:
    max_new_tokens = SGLANG_DEFAULT_MAX_NEW_TOKENS if p.max_new_tokens is None else p.max_new_tokens
    if max_new_tokens == 0:
        raise unimplemented("sampling_params.max_new_tokens=0", "no prefill-only requests")
    if p.min_new_tokens is not None and p.min_new_tokens < 0:
        raise GRPCError(
            Status.INVALID_ARGUMENT, f"sampling_params.min_new_tokens={p.min_new_tokens} must be >= 0"
        )
    for i, token_id in enumerate(p.stop_token_ids):
        if token_id < 0:
            raise GRPCError(
                Status.INVALID_ARGUMENT, f"sampling_params.stop_token_ids[{i}]={token_id} must be >= 0"
            )
    return StoppingCriteria(
        max_tokens=max_new_tokens,
        min_tokens=p.min_new_tokens or None,
        stop_strings=list(p.stop),
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=bool(p.ignore_eos),
    )


def _logprobs(
    return_logprob: bool | None, top_logprobs_num: int | None, logprob_start_len: int | None
) -> LogprobRequest | None:
    if not return_logprob:
        return None
    if logprob_start_len is not None and logprob_start_len >= 0:
        raise unimplemented(
            f"logprob_start_len={logprob_start_len}", "no prompt logprobs; send -1 or leave it unset"
        )
    top = top_logprobs_num or 0
    if top < 0:
        raise GRPCError(Status.INVALID_ARGUMENT, f"top_logprobs_num={top} must be >= 0")
    return LogprobRequest(top, with_text=False)


def _refuse_unsupported(
    message: rt.GenerateRequest | rt.TextGenerateRequest, params: rt.SamplingParams | None
) -> None:
    if params is not None:
        check_constraints(params)
    if message.lora_path:
        raise unimplemented(f"lora_path={message.lora_path!r}", "no LoRA adapters")
    check_one_data_parallel_rank("routed_dp_rank", message.routed_dp_rank)
    if message.session_id:
        raise unimplemented(f"session_id={message.session_id!r}", "no sessions")
    if message.disaggregated_params is not None:
        raise unimplemented("disaggregated_params", "no prefill/decode disaggregation")
    if message.kv_hints is not None:
        raise unimplemented("kv_hints", "no KV-hint actions")
    if message.require_reasoning:
        raise unimplemented("require_reasoning", "no reasoning parser")
    if message.max_thinking_tokens is not None:
        raise unimplemented(f"max_thinking_tokens={message.max_thinking_tokens}", "no thinking budget")


def check_constraints(params: rt.SamplingParams) -> None:
    """SGLang 0.5.23's checks of the constraint fields, in its order and its words (its server
    refuses these with INVALID_ARGUMENT before anything runs)."""
    guided = params.guided_decoding
    if guided is not None:
        kind, value = betterproto2.which_one_of(guided, "constraint")
        if not kind:
            raise GRPCError(Status.INVALID_ARGUMENT, "guided decoding constraint must be specified")
        if isinstance(value, rt.ChoiceConstraint):
            if not value.values or not all(value.values):
                raise GRPCError(Status.INVALID_ARGUMENT, "guided choice must contain only non-empty values")
        elif not value:
            raise GRPCError(Status.INVALID_ARGUMENT, "guided decoding constraint must not be empty")
    if params.json_schema == "":
        raise GRPCError(Status.INVALID_ARGUMENT, "legacy json_schema must not be empty")
    if params.regex == "":
        raise GRPCError(Status.INVALID_ARGUMENT, "legacy regex must not be empty")
    if guided is not None and (params.json_schema is not None or params.regex is not None):
        raise GRPCError(
            Status.INVALID_ARGUMENT, "legacy json_schema/regex cannot be combined with guided_decoding"
        )


def runtime_constraint(params: rt.SamplingParams) -> Constraint | None:
    """lmrpc's constraint for ``guided_decoding`` or a legacy ``json_schema`` / ``regex`` (checked
    by ``check_constraints`` first). ``structural_tag`` has no lmrpc kind: UNIMPLEMENTED."""
    if params.guided_decoding is not None:
        kind, value = betterproto2.which_one_of(params.guided_decoding, "constraint")
        if isinstance(value, rt.ChoiceConstraint):
            return Constraint(choice=Choices(list(value.values)))
        if kind == "structural_tag":
            raise unimplemented("sampling_params.guided_decoding.structural_tag", "no structural tags")
        return Constraint(**{kind: value})
    if params.json_schema is not None:
        return Constraint(json_schema=params.json_schema)
    if params.regex is not None:
        return Constraint(regex=params.regex)
    return None
