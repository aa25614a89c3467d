"""TextGenerate and Generate requests as lmrpc.v1 requests.

SGLang's runtime protocol marks every sampling value ``optional``: a value sent is taken as sent
(``temperature = 0`` is greedy), one left out gets SGLang's default, which is lmrpc's too except
``max_new_tokens`` (128 in SGLang, sent explicitly). ``top_k = -1`` disables top-k, as in SGLang.

Options the server cannot honour answer UNIMPLEMENTED naming the field: ``json_schema`` and
``regex`` (no structured output), ``lora_path`` (no LoRA adapters), prompt logprobs
(``logprob_start_len >= 0`` with ``return_logprob``) and ``max_new_tokens = 0`` (a prefill-only
request). Accepted without effect: ``routing_key`` (one worker: nothing to route),
``trace_headers`` (no tracing), ``top_logprobs_num`` without ``return_logprob`` (SGLang reads it
only with logprobs on). lmrpc.v1's validation checks the rest, and its messages are renamed to
this protocol's fields (``renamed``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TypeVar

from grpclib import GRPCError, Status

from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import GenerateRequest, ResponseOptions, SamplingParams, StoppingCriteria, TokenIds
from reference_server.frontend.dialects.base.requests import check_one_data_parallel_rank, unimplemented

R = TypeVar("R")

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128
TOP_K_DISABLED = -1

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


def text_generate_options(message: rt.TextGenerateRequest) -> GenerateOptions:
    if not message.text:
        raise GRPCError(Status.INVALID_ARGUMENT, "text must not be empty")
    _refuse_unsupported(message.lora_path, message.routed_dp_rank, message.sampling_params)
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
    _refuse_unsupported(message.lora_path, message.routed_dp_rank, message.sampling_params)
    logprobs = _logprobs(message.return_logprob, message.top_logprobs_num, message.logprob_start_len)
    request = _lmrpc_request(message.rid, message.sampling_params, message.stream, logprobs)
    request.token_ids = TokenIds(ids=ids)
    return GenerateOptions(request, bool(message.stream), logprobs)


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
    lora_path: str | None, routed_dp_rank: int | None, params: rt.SamplingParams | None
) -> None:
    if lora_path:
        raise unimplemented(f"lora_path={lora_path!r}", "no LoRA adapters")
    check_one_data_parallel_rank("routed_dp_rank", routed_dp_rank)
    if params is not None:
        for name, value in (("json_schema", params.json_schema), ("regex", params.regex)):
            if value is not None:
                raise unimplemented(f"sampling_params.{name}", "no structured-output constraints")
