"""lmrpc.v1 Generate facts as the smg engine dialects spell them (finish strings, matched stops,
logprob messages, errors as a status): the parts their response translators share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from grpclib import GRPCError, Status

from lmrpc.v1 import FinishReason, RequestError, StopMatch, TokenLogprob

FINISH_REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.ABORTED: "abort"}


def finish_reason(reason: FinishReason) -> str:
    return FINISH_REASONS.get(reason, "error")


def matched_stop(stop: StopMatch | None) -> tuple[str | None, int | None]:
    """``(matched_stop_str, matched_token_id)``: at most one set. The dialects have one
    ``matched_token_id`` for an EOS token and a requested stop token alike."""
    if stop is None:
        return None, None
    if stop.stop_string is not None:
        return stop.stop_string, None
    if stop.stop_token_id is not None:
        return None, stop.stop_token_id
    return None, stop.eos_token_id


def status_of(error: RequestError) -> GRPCError:
    """A failure after acceptance ends the call with its status: the dialects have no in-band
    error (SGLang removed its ``GenerateError``: errors use gRPC status)."""
    try:
        status = Status(error.code)
    except ValueError:
        status = Status.INTERNAL
    if status is Status.OK:
        status = Status.INTERNAL
    return GRPCError(status, error.message)


L = TypeVar("L")


def logprobs_message(
    output: Callable[..., L], top: Callable[..., Any], logprobs: list[TokenLogprob]
) -> L | None:
    """``OutputLogProbs{token_logprobs, token_ids, top_logprobs}`` of a dialect; ``rank`` has no
    place there."""
    if not logprobs:
        return None
    return output(
        token_logprobs=[lp.logprob for lp in logprobs],
        token_ids=[lp.token_id for lp in logprobs],
        top_logprobs=[
            top(values=[c.logprob for c in lp.top], token_ids=[c.token_id for c in lp.top]) for lp in logprobs
        ],
    )
