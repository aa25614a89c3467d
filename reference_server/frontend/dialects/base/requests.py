"""What the dialects' request translators share: refusals that name the field, the one
data-parallel rank, and the lmrpc.v1 request a dialect's Generate becomes.

A dialect's gateway tokenizes and detokenizes: the lmrpc.v1 request asks for token ids and no
text. Options the server cannot honour answer UNIMPLEMENTED naming the field, never silently
ignored; what lmrpc.v1 checks itself is left to its validation behind the dialect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Protocol

import betterproto2
from grpclib import GRPCError, Status

from lmrpc.v1 import (
    Choices,
    Constraint,
    GenerateRequest,
    JsonObject,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
)


class DialectSampling(Protocol):
    """A dialect's sampling message with a ``logit_bias`` map (keyed by token id, as an int or a
    string, depending on the dialect; only its emptiness matters)."""

    @property
    def logit_bias(self) -> Sized: ...


def unimplemented(field: str, why: str) -> GRPCError:
    return GRPCError(Status.UNIMPLEMENTED, f"{field} is not supported by this server: {why}")


def refuse_logit_bias(params: DialectSampling) -> None:
    if params.logit_bias:
        raise unimplemented("sampling_params.logit_bias", "no logit bias")


def constraint_of(params: betterproto2.Message, kinds: Mapping[str, str]) -> Constraint | None:
    """lmrpc.v1's constraint for a dialect's ``constraint`` oneof; ``kinds`` maps the dialect's member
    names to lmrpc's kinds. A member lmrpc has no kind for (``structural_tag``) is UNIMPLEMENTED; a
    ``json_object`` flag that is false is no constraint."""
    member, value = betterproto2.which_one_of(params, "constraint")
    if not member:
        return None
    kind = kinds.get(member)
    if kind is None:
        raise unimplemented(
            f"sampling_params.{member}", "constraints are JSON schema, JSON object, regex, EBNF or choice"
        )
    if kind == "json_object":
        return Constraint(json_object=JsonObject()) if value else None
    if kind == "choice":
        return Constraint(choice=Choices(list(getattr(value, "choices", []))))
    return Constraint(**{kind: value})


def check_one_data_parallel_rank(field: str, rank: int | None) -> None:
    if rank not in (None, 0):
        raise GRPCError(
            Status.INVALID_ARGUMENT, f"{field}={rank}: this server has one data-parallel rank (0)"
        )


def stopping(
    max_tokens: int | None,
    min_tokens: int,
    stop_strings: list[str],
    stop_token_ids: list[int],
    *,
    ignore_eos: bool,
    include_stop_in_output: bool,
) -> StoppingCriteria:
    """lmrpc's stopping criteria; a ``min_tokens`` of 0 means unset in every dialect."""
    return StoppingCriteria(
        max_tokens=max_tokens,
        min_tokens=min_tokens or None,
        stop_strings=list(stop_strings),
        stop_token_ids=list(stop_token_ids),
        ignore_eos=ignore_eos,
        include_stop_in_output=include_stop_in_output,
    )


def token_ids_request(
    request_id: str,
    sampling: SamplingParams | None,
    stopping: StoppingCriteria | None,
    *,
    return_logprobs: bool,
    top_logprobs: int,
    skip_special_tokens: bool | None,
    stream: bool,
) -> GenerateRequest:
    """The lmrpc.v1 request of a dialect's Generate, its input not set yet: token ids (and
    logprobs when asked) out, no text (the gateway detokenizes)."""
    return GenerateRequest(
        request_id=request_id,
        sampling=sampling,
        stopping=stopping,
        response=ResponseOptions(
            return_text=False,
            return_token_ids=True,
            return_logprobs=return_logprobs,
            top_logprobs=top_logprobs,
            skip_special_tokens=skip_special_tokens,
            final_only=not stream,
        ),
    )
