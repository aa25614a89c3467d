"""Checks a GenerateRequest against the contract and resolves every default.

Every failure is a GRPCError with the exact code docs/contract.md names and a message that
names the field and its value (ERR-3).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Literal

import betterproto2
from grpclib import GRPCError, Status

from lmrpc.v1 import Capabilities, GenerateRequest, ResponseOptions, SamplingParams, StoppingCriteria
from reference_server.config import Limits
from reference_server.ipc import Constraint, DetokenizeConfig, EngineInfo, SamplingConfig, StoppingConfig

REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
SHOWN_VALUE_CHARS = 80  # of a constraint's definition, in an error message

InputKind = Literal["text", "token_ids", "chat"]


def invalid(message: str) -> GRPCError:
    return GRPCError(Status.INVALID_ARGUMENT, message)


def unimplemented(message: str) -> GRPCError:
    return GRPCError(Status.UNIMPLEMENTED, message)


@dataclass(frozen=True, slots=True)
class GeneratePlan:
    """A request that passed every check that does not need the prompt's tokens."""

    request_id: str | None  # None: the server assigns one
    input_kind: InputKind
    num_outputs: int
    sampling: SamplingConfig
    max_tokens: int | None  # None: the default, lowered to what the context leaves
    min_tokens: int
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    detokenize: DetokenizeConfig
    top_logprobs: int | None
    return_token_ids: bool
    return_prompt_token_ids: bool
    final_only: bool
    constraint: Constraint | None  # checked for its shape; whether it compiles is checked next


def check_request_id(request_id: str) -> str | None:
    if not request_id:
        return None
    if not REQUEST_ID_PATTERN.fullmatch(request_id) or len(request_id.encode()) > 128:
        raise invalid(f"request_id={request_id[:140]!r} must be 1-128 characters of [A-Za-z0-9._:/-]")
    return request_id


def plan_generate(
    request: GenerateRequest,
    caps: Capabilities,
    limits: Limits,
    engine: EngineInfo,
    *,
    whole_token_text: bool = False,
) -> GeneratePlan:
    request_id = check_request_id(request.request_id)
    input_kind = _input_kind(request, caps)
    sampling = request.sampling or SamplingParams()
    stopping = request.stopping or StoppingCriteria()
    response = request.response or ResponseOptions()
    num_outputs = _num_outputs(sampling.n, caps)
    resolved = _sampling(sampling, limits)
    max_tokens = stopping.max_tokens
    if max_tokens is not None and max_tokens < 1:
        raise invalid(f"stopping.max_tokens={max_tokens} must be >= 1")
    min_tokens = stopping.min_tokens or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise invalid(f"stopping.min_tokens={min_tokens} must be <= stopping.max_tokens={max_tokens}")
    stop_strings = tuple(stopping.stop_strings)
    if stop_strings and not caps.stop_strings:
        raise unimplemented("stopping.stop_strings is not supported by this server")
    if len(stop_strings) > caps.max_stop_strings:
        raise invalid(
            f"stopping.stop_strings has {len(stop_strings)} entries; at most {caps.max_stop_strings}"
        )
    for i, stop in enumerate(stop_strings):
        if not stop:
            raise invalid(f"stopping.stop_strings[{i}]='' must not be empty")
        if len(stop.encode()) > limits.max_stop_string_bytes:
            raise invalid(
                f"stopping.stop_strings[{i}] is {len(stop.encode())} bytes; "
                f"at most {limits.max_stop_string_bytes} (limits.max_stop_string_bytes)"
            )
    stop_ids = tuple(stopping.stop_token_ids)
    if stop_ids and not caps.stop_token_ids:
        raise unimplemented("stopping.stop_token_ids is not supported by this server")
    for i, token_id in enumerate(stop_ids):
        if token_id >= engine.vocab_size:
            raise invalid(f"stopping.stop_token_ids[{i}]={token_id} must be < vocab_size={engine.vocab_size}")
    return_text = True if response.return_text is None else response.return_text
    return_ids = True if response.return_token_ids is None else response.return_token_ids
    if not return_text and not return_ids:
        raise invalid("response.return_text=false and response.return_token_ids=false: nothing to return")
    top_logprobs = _top_logprobs(response, caps)
    if response.final_only and not caps.final_only:
        raise unimplemented("response.final_only is not supported by this server")
    skip_special = True if response.skip_special_tokens is None else response.skip_special_tokens
    constraint = _constraint(request, caps)
    return GeneratePlan(
        request_id=request_id,
        input_kind=input_kind,
        num_outputs=num_outputs,
        sampling=resolved,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_token_ids=stop_ids,
        ignore_eos=stopping.ignore_eos,
        detokenize=DetokenizeConfig(
            return_text=return_text,
            skip_special_tokens=skip_special,
            stop_strings=stop_strings,
            include_stop_in_output=stopping.include_stop_in_output,
            min_tokens=min_tokens,
            whole_token_text=whole_token_text,
        ),
        top_logprobs=top_logprobs,
        return_token_ids=return_ids,
        return_prompt_token_ids=response.return_prompt_token_ids,
        final_only=response.final_only,
        constraint=constraint,
    )


def stopping_for_prompt(
    plan: GeneratePlan, prompt_ids: list[int], limits: Limits, engine: EngineInfo
) -> StoppingConfig:
    """The checks that need the prompt (REQ-1, REQ-5, REQ-6, REQ-7) and the final stop config."""
    if not prompt_ids:
        raise invalid("the prompt is empty after tokenization")
    room = engine.max_context_tokens - len(prompt_ids)
    if room < 1:
        raise invalid(
            f"prompt of {len(prompt_ids)} tokens leaves no room in the {engine.max_context_tokens}-token context"
        )
    if max(prompt_ids) >= engine.vocab_size:  # max() runs in C; the loop only finds the culprit
        i, token_id = next((i, t) for i, t in enumerate(prompt_ids) if t >= engine.vocab_size)
        raise invalid(f"token_ids.ids[{i}]={token_id} must be < vocab_size={engine.vocab_size}")
    if plan.max_tokens is None:
        max_tokens = min(limits.default_max_tokens, room)
    elif plan.max_tokens > room:
        raise invalid(
            f"stopping.max_tokens={plan.max_tokens} plus the {len(prompt_ids)}-token prompt exceeds "
            f"max_context_tokens={engine.max_context_tokens}"
        )
    else:
        max_tokens = plan.max_tokens
    if plan.min_tokens > max_tokens:
        raise invalid(
            f"stopping.min_tokens={plan.min_tokens} must be <= the effective max_tokens={max_tokens}"
        )
    needed = len(prompt_ids) + plan.num_outputs * max_tokens
    if needed > engine.kv_tokens_total:
        raise GRPCError(
            Status.RESOURCE_EXHAUSTED,
            f"the request needs {needed} KV-cache tokens (prompt + n*max_tokens); "
            f"the server has {engine.kv_tokens_total} in total",
        )
    return StoppingConfig(
        max_tokens=max_tokens,
        min_tokens=plan.min_tokens,
        stop_token_ids=plan.stop_token_ids,
        ignore_eos=plan.ignore_eos,
    )


def check_prompt_size(request: GenerateRequest, max_token_chars: int | None, engine: EngineInfo) -> None:
    """Refuse, before tokenizing it, text that cannot fit the context whatever its tokens are.

    No token covers more than ``max_token_chars`` characters, so text longer than the context
    times that is more tokens than the context holds (REQ-6); tokenizing megabytes only to say so
    would cost seconds. ``max_token_chars`` is None when the tokenizer normalizes text, which
    can make it shorter, so no such bound holds."""
    if max_token_chars is None:
        return
    kind, _ = betterproto2.which_one_of(request, "input")
    if kind == "text":
        chars = len(request.text or "")
    elif kind == "chat" and request.chat is not None:
        chars = sum(len(m.content) for m in request.chat.messages)
    else:
        return
    bound = engine.max_context_tokens * max_token_chars
    if chars > bound:
        raise invalid(
            f"{kind} of {chars} characters cannot fit the {engine.max_context_tokens}-token context "
            f"(no token covers more than {max_token_chars} characters)"
        )


def _input_kind(request: GenerateRequest, caps: Capabilities) -> InputKind:
    kind, _ = betterproto2.which_one_of(request, "input")
    if kind == "text":
        if not caps.text_input:
            raise unimplemented("text input is not supported by this server")
        return "text"
    if kind == "token_ids":
        if not caps.token_ids_input:
            raise unimplemented("token_ids input is not supported by this server")
        return "token_ids"
    if kind == "chat":
        if not caps.chat_input:
            raise unimplemented("chat input is not supported by this server (the model has no chat template)")
        if request.chat is None or not request.chat.messages:
            raise invalid("chat.messages must not be empty")
        return "chat"
    raise invalid("input: exactly one of text, token_ids or chat must be set")


def _num_outputs(n: int | None, caps: Capabilities) -> int:
    if n is None:
        return 1
    if n > 1 and caps.max_outputs == 1:
        raise unimplemented(f"sampling.n={n}: this server generates one output per request")
    if not 1 <= n <= caps.max_outputs:
        raise invalid(f"sampling.n={n} must be in [1, {caps.max_outputs}]")
    return n


def _sampling(p: SamplingParams, limits: Limits) -> SamplingConfig:
    def get(
        name: str, value: float | None, default: float, low: float, high: float, *, open_low: bool
    ) -> float:
        if value is None:
            return default
        if not math.isfinite(value) or value < low or (open_low and value == low) or value > high:
            bracket = "(" if open_low else "["
            raise invalid(f"sampling.{name}={value} must be in {bracket}{low}, {high}]")
        return float(value)

    temperature = p.temperature
    if temperature is not None and (not math.isfinite(temperature) or temperature < 0):
        raise invalid(f"sampling.temperature={temperature} must be >= 0 and finite")
    return SamplingConfig(
        temperature=limits.default_temperature if temperature is None else float(temperature),
        top_p=get("top_p", p.top_p, 1.0, 0.0, 1.0, open_low=True),
        top_k=0 if p.top_k is None else int(p.top_k),
        min_p=get("min_p", p.min_p, 0.0, 0.0, 1.0, open_low=False),
        frequency_penalty=get("frequency_penalty", p.frequency_penalty, 0.0, -2.0, 2.0, open_low=False),
        presence_penalty=get("presence_penalty", p.presence_penalty, 0.0, -2.0, 2.0, open_low=False),
        repetition_penalty=get("repetition_penalty", p.repetition_penalty, 1.0, 0.0, 10.0, open_low=True),
        seed=random.getrandbits(63) if p.seed is None else int(p.seed),
    )


def _constraint(request: GenerateRequest, caps: Capabilities) -> Constraint | None:
    """The constraint's shape (CONSTRAIN-2, CAP-1); whether it compiles is ``ConstraintChecker``'s."""
    constraint = request.constraint
    if constraint is None:
        return None
    if not caps.constrained_decoding:
        raise unimplemented("constraint is not supported by this server (no constrained decoding)")
    kind, _ = betterproto2.which_one_of(constraint, "kind")
    if kind == "json_schema":
        return Constraint("json_schema", constraint.json_schema or "")
    if kind == "json_object":
        return Constraint("json_object")
    if kind == "regex":
        return Constraint("regex", constraint.regex or "")
    if kind == "ebnf":
        return Constraint("ebnf", constraint.ebnf or "")
    if kind == "choice":
        choices = tuple(constraint.choice.choices if constraint.choice is not None else ())
        if not choices:
            raise invalid("constraint.choice.choices is empty: it must hold at least one string")
        for i, choice in enumerate(choices):
            if not choice:
                raise invalid(f"constraint.choice.choices[{i}]='' must not be empty")
        return Constraint("choice", choices=choices)
    raise invalid("constraint: exactly one of json_schema, json_object, regex, ebnf or choice must be set")


def constraint_refusal(constraint: Constraint, field: str, reason: str) -> GRPCError:
    """INVALID_ARGUMENT for a constraint that does not compile, naming the field and its value."""
    shown = f"={_shorten(constraint.definition)!r}" if constraint.definition else ""
    return invalid(f"{field}{shown} {reason}")


def _shorten(text: str) -> str:
    return text if len(text) <= SHOWN_VALUE_CHARS else text[: SHOWN_VALUE_CHARS - 3] + "..."


def _top_logprobs(response: ResponseOptions, caps: Capabilities) -> int | None:
    if not response.return_logprobs:
        if response.top_logprobs:
            raise invalid(
                f"response.top_logprobs={response.top_logprobs} requires response.return_logprobs=true"
            )
        return None
    if not caps.logprobs:
        raise unimplemented("response.return_logprobs is not supported by this server")
    if response.top_logprobs > caps.max_top_logprobs:
        raise invalid(f"response.top_logprobs={response.top_logprobs} must be <= {caps.max_top_logprobs}")
    return int(response.top_logprobs)
