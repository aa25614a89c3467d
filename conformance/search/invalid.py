"""Every invalid Generate input docs/contract.md names, with the status code it must get.

Each entry builds a request from a valid base and says which field the status message must name
(ERR-3). Entries only use options whose capability the target advertises: with the capability off
the answer would be UNIMPLEMENTED instead (CAP-1), which is a different case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grpclib.const import Status

from conformance.vocabulary import TargetInfo
from lmrpc.v1 import (
    ChatInput,
    Choices,
    Constraint,
    GenerateRequest,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
    TokenIds,
)

IA = Status.INVALID_ARGUMENT
Build = Callable[[TargetInfo, str], GenerateRequest]


@dataclass(frozen=True, slots=True)
class Invalid:
    label: str  # the permutation tag, e.g. "temperature=-1"
    clause: str
    field: str  # must appear in the status message (ERR-3)
    build: Build
    codes: tuple[Status, ...] = (IA,)
    requires: tuple[str, ...] = ()
    value: str = ""  # must also appear in the status message, when set
    sends: tuple[str, ...] = ()  # input classes (spec/coverage.py) only this entry sends


def _text(
    rid: str,
    *,
    sampling: SamplingParams | None = None,
    stopping: StoppingCriteria | None = None,
    response: ResponseOptions | None = None,
) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid,
        text="Hello",
        sampling=sampling,
        stopping=stopping or StoppingCriteria(max_tokens=4),
        response=response,
    )


def _sampling(**kw: float | int) -> Build:
    return lambda info, rid: _text(rid, sampling=SamplingParams(**kw))  # type: ignore[arg-type]


def _stopping(**kw: object) -> Build:
    return lambda info, rid: _text(rid, stopping=StoppingCriteria(**kw))  # type: ignore[arg-type]


def _response(**kw: object) -> Build:
    return lambda info, rid: _text(rid, response=ResponseOptions(**kw))  # type: ignore[arg-type]


def _constrained(constraint: Constraint) -> Build:
    def build(info: TargetInfo, rid: str) -> GenerateRequest:
        request = _text(rid)
        request.constraint = constraint
        return request

    return build


def _max_plus_one(name: str) -> Callable[[TargetInfo], int]:
    return lambda info: int(getattr(info.caps, name)) + 1


INVALID: tuple[Invalid, ...] = (
    Invalid("temperature=-1", "SAMPLE-5", "temperature", _sampling(temperature=-1.0), value="-1"),
    Invalid("temperature=nan", "SAMPLE-5", "temperature", _sampling(temperature=float("nan")), value="nan"),
    Invalid("temperature=inf", "SAMPLE-5", "temperature", _sampling(temperature=float("inf")), value="inf"),
    Invalid("top_p=0", "SAMPLE-5", "top_p", _sampling(top_p=0.0), requires=("truncation_sampling",)),
    Invalid(
        "top_p=1.5", "SAMPLE-5", "top_p", _sampling(top_p=1.5), requires=("truncation_sampling",), value="1.5"
    ),
    Invalid(
        "min_p=-0.5",
        "SAMPLE-5",
        "min_p",
        _sampling(min_p=-0.5),
        requires=("truncation_sampling",),
        value="-0.5",
    ),
    Invalid(
        "min_p=1.5", "SAMPLE-5", "min_p", _sampling(min_p=1.5), requires=("truncation_sampling",), value="1.5"
    ),
    Invalid(
        "frequency_penalty=2.5",
        "SAMPLE-5",
        "frequency_penalty",
        _sampling(frequency_penalty=2.5),
        requires=("penalties",),
        value="2.5",
    ),
    Invalid(
        "presence_penalty=-2.5",
        "SAMPLE-5",
        "presence_penalty",
        _sampling(presence_penalty=-2.5),
        requires=("penalties",),
        value="-2.5",
    ),
    Invalid(
        "repetition_penalty=0",
        "SAMPLE-5",
        "repetition_penalty",
        _sampling(repetition_penalty=0.0),
        requires=("penalties",),
    ),
    Invalid(
        "repetition_penalty=11",
        "SAMPLE-5",
        "repetition_penalty",
        _sampling(repetition_penalty=11.0),
        requires=("penalties",),
        value="11",
    ),
    Invalid("n=0", "SAMPLE-5", "n", _sampling(n=0)),
    # Beyond a numeric limit of a feature the server has: INVALID_ARGUMENT. A server with
    # max_outputs = 1 lacks n > 1 entirely, which CAP-1[max_outputs] checks (UNIMPLEMENTED).
    Invalid(
        "n=max+1",
        "SAMPLE-5",
        "n",
        lambda info, rid: _text(rid, sampling=SamplingParams(n=_max_plus_one("max_outputs")(info))),
        requires=("max_outputs>=2",),
    ),
    Invalid("max_tokens=0", "SAMPLE-5", "max_tokens", _stopping(max_tokens=0)),
    Invalid("min_tokens>max_tokens", "SAMPLE-5", "min_tokens", _stopping(max_tokens=3, min_tokens=5)),
    Invalid(
        "top_logprobs=max+1",
        "SAMPLE-5",
        "top_logprobs",
        lambda info, rid: _text(
            rid,
            response=ResponseOptions(
                return_logprobs=True, top_logprobs=_max_plus_one("max_top_logprobs")(info)
            ),
        ),
        requires=("logprobs",),
    ),
    Invalid(
        "top_logprobs-without-return_logprobs",
        "SAMPLE-5",
        "top_logprobs",
        _response(return_logprobs=False, top_logprobs=1),
        requires=("logprobs",),
        sends=("generate.top_logprobs-without-return_logprobs",),
    ),
    Invalid(
        "stop_string=empty",
        "SAMPLE-5",
        "stop_strings",
        _stopping(max_tokens=4, stop_strings=[""]),
        requires=("stop_strings",),
    ),
    Invalid(
        "stop_strings=max+1",
        "SAMPLE-5",
        "stop_strings",
        lambda info, rid: _text(
            rid,
            stopping=StoppingCriteria(
                max_tokens=4, stop_strings=[f"s{i}" for i in range(_max_plus_one("max_stop_strings")(info))]
            ),
        ),
        requires=("stop_strings",),
    ),
    Invalid(
        "return_text=return_token_ids=false",
        "SAMPLE-5",
        "return_",
        _response(return_text=False, return_token_ids=False),
    ),
    Invalid(
        "no-input",
        "REQ-1",
        "input",
        lambda info, rid: GenerateRequest(request_id=rid, stopping=StoppingCriteria(max_tokens=4)),
    ),
    Invalid(
        "empty-text",
        "REQ-1",
        "",
        lambda info, rid: GenerateRequest(request_id=rid, text="", stopping=StoppingCriteria(max_tokens=4)),
    ),
    Invalid(
        "empty-token-ids",
        "REQ-1",
        "",
        lambda info, rid: GenerateRequest(
            request_id=rid, token_ids=TokenIds(ids=[]), stopping=StoppingCriteria(max_tokens=4)
        ),
        requires=("token_ids_input",),
    ),
    Invalid(
        "empty-chat",
        "REQ-1",
        "",
        lambda info, rid: GenerateRequest(
            request_id=rid, chat=ChatInput(messages=[]), stopping=StoppingCriteria(max_tokens=4)
        ),
        requires=("chat_input",),
    ),
    *(
        Invalid(
            f"constraint.{label}",
            "CONSTRAIN-2",
            field,
            _constrained(constraint),
            requires=("constrained_decoding",),
            value=value,
            sends=sends,
        )
        for label, field, constraint, value, sends in (
            ("none-set", "constraint", Constraint(), "", ("generate.constraint.none-set",)),
            ("json_schema=not-json", "json_schema", Constraint(json_schema="{not json"), "", ()),
            ("regex=unbalanced", "regex", Constraint(regex="(ab"), "", ()),
            ("ebnf=no-root", "ebnf", Constraint(ebnf='start ::= "a"'), "root", ()),
            ("ebnf=unterminated", "ebnf", Constraint(ebnf='root ::= "a'), "", ()),
            ("choice=none", "choice", Constraint(choice=Choices([])), "", ()),
            ("choice=empty-string", "choice", Constraint(choice=Choices(["a", ""])), "", ()),
        )
    ),
    Invalid("id-space", "REQ-4", "request_id", lambda info, rid: _text(rid + " x")),
    Invalid("id-non-ascii", "REQ-4", "request_id", lambda info, rid: _text(rid + "-é")),
    Invalid("id-129-bytes", "REQ-4", "request_id", lambda info, rid: _text((rid + "-" + "x" * 129)[:129])),
    Invalid("id-bang", "REQ-4", "request_id", lambda info, rid: _text(rid + "!")),
    Invalid(
        "token-id=vocab_size",
        "REQ-5",
        "token",
        lambda info, rid: GenerateRequest(
            request_id=rid,
            token_ids=TokenIds(ids=[1, info.vocab_size]),
            stopping=StoppingCriteria(max_tokens=4),
        ),
        requires=("token_ids_input",),
    ),
    Invalid(
        "stop-token-id=vocab_size",
        "ERR-1",
        "stop_token_ids",
        lambda info, rid: _text(
            rid, stopping=StoppingCriteria(max_tokens=4, stop_token_ids=[info.vocab_size])
        ),
        requires=("stop_token_ids",),
    ),
    Invalid(
        "max_tokens=window",
        "REQ-6",
        "max_tokens",
        lambda info, rid: _text(rid, stopping=StoppingCriteria(max_tokens=info.max_context)),
    ),
    Invalid(
        "prompt=window",
        "REQ-6",
        "",
        lambda info, rid: GenerateRequest(request_id=rid, token_ids=TokenIds(ids=[1] * info.max_context)),
        requires=("token_ids_input",),
    ),
)


def applicable(info: TargetInfo) -> list[Invalid]:
    return [i for i in INVALID if all(info.has(r) for r in i.requires)]
