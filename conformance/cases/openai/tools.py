"""Tool calls (``tools`` with ``tool_choice``): forced calls are made and well formed, their
arguments valid against the function's parameters (CONSTRAIN-1); ``none`` makes none (CAP-1); a
stream frames each call as OpenAI streams it (STREAM-2, STREAM-3), and under greedy decoding carries
the calls the body does (STREAM-2); a schema that is no schema is refused (CONSTRAIN-2).

What OpenAI documents (API reference, chat ``tools``, ``tool_choice``, ``parallel_tool_calls``;
the function-calling guide):

- ``tool_choice``: "``none`` means the model will not call any tool and instead generates a
  message. ``auto`` means the model can pick between generating a message or calling one or more
  tools. ``required`` means the model must call one or more tools. Specifying a particular tool via
  ``{"type": "function", "function": {"name": "my_function"}}`` forces the model to call that tool."
- a call is ``{"id", "type": "function", "function": {"name", "arguments"}}``; "Setting strict to
  true will ensure function calls reliably adhere to the function schema", and "Structured Outputs
  is not compatible with parallel function calls ... set parallel_tool_calls to false": so every
  function here is strict, and the requests whose arguments are judged against the schema send
  ``parallel_tool_calls: false``.
- ``finish_reason``: "``tool_calls`` if the model called a tool". A forced *named* call is the
  exception OpenAI itself makes: it answers ``stop`` there, so ``stop`` and ``tool_calls`` both pass.
  A choice cut at max_tokens ends ``length`` with arguments that are a prefix of a document.
- content beside forced calls is left open by OpenAI (``content`` is "the contents of the message",
  null or not): it is noted, never failed.
"""

from __future__ import annotations

import json
from typing import Any

from conformance.cases.openai._common import expect_refused, make, openai_case, support
from conformance.cases.openai._output import answered_ok, check_usage, send_all, taken, where
from conformance.drivers.openai.exchange import Exchange, OpenAIRequest
from conformance.drivers.openai.support import State
from conformance.harness.context import Ctx
from conformance.harness.session import Session
from conformance.spec.registry import Variant
from conformance.validators.openai import Answer
from conformance.validators.tool_calls import (
    ChoiceCalls,
    call_problems,
    calls_of,
    framing_problems,
    index_problems,
)
from conformance.vocabulary import CaseSkipped

CITY = {"type": "string", "enum": ["Paris", "London", "Tokyo"]}
PARAMETERS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {"city": CITY, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "get_time": {
        "type": "object",
        "properties": {"city": CITY, "utc": {"type": "boolean"}},
        "required": ["city", "utc"],
        "additionalProperties": False,
    },
}
DESCRIPTIONS = {"get_weather": "The weather in a city now.", "get_time": "The time in a city now."}
TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "description": DESCRIPTIONS[name], "strict": True, "parameters": schema},
    }
    for name, schema in PARAMETERS.items()
]
PROMPT = "What is the weather in Paris, and what time is it in Tokyo? Use the tools."
NAMED = "get_time"
CHOICES: dict[str, Any] = {
    "required": "required",
    "named": {"type": "function", "function": {"name": NAMED}},
    "auto": "auto",
    "none": "none",
}
TOOL_TOKENS = 64  # a call to one of these functions takes about 30 tokens in any server's format
PARALLEL_TOKENS = 96  # room for a second call to start, where the model makes two
# finish reasons a choice that called tools may end with, per tool_choice ("length": cut short)
CALLED_FINISHES = {
    "required": ("tool_calls", "length"),
    "named": ("tool_calls", "stop", "length"),
    "auto": ("tool_calls", "length"),
    "none": ("tool_calls", "length"),  # a call under none fails by itself; its finish reads as auto's
}


def tool_request(choice: str, **fields: Any) -> OpenAIRequest:
    fields = {"max_tokens": TOOL_TOKENS, "temperature": 0, "parallel_tool_calls": False, **fields}
    return make("chat", PROMPT, tools=TOOLS, tool_choice=CHOICES[choice], **fields)


def usage_option(ctx: Ctx) -> dict[str, Any]:
    honoured = support(ctx).feature("chat", "include_usage").state is State.HONOURED
    return {"stream_options": {"include_usage": True}} if honoured else {}


def case_requests(ctx: Ctx, choice: str) -> list[OpenAIRequest]:
    """Greedy streamed and not, and sampled (the constraint binds a sampled choice too), two
    choices where the server takes n (each choice is bound, not the first alone)."""
    sampled = {"n": 2} if support(ctx).has("chat", "n") else {}
    out = [tool_request(choice), tool_request(choice, temperature=1.0, seed=7, **sampled)]
    if support(ctx).has("chat", "stream"):
        out.append(tool_request(choice, stream=True, **usage_option(ctx)))
    return out


def chat_or_skip(ctx: Ctx) -> None:
    support(ctx).need("chat")


def judge_calls(ctx: Ctx, choice_name: str, answer: Answer) -> None:
    for index, choice in sorted(calls_of(answer.exchange).items()):
        what = f"{where(answer)} tool_choice {choice_name}: choice {index}"
        for problem in choice.malformed:
            ctx.check.add(f"{what}: tool_calls", "a list of call objects", problem)
        complete = choice.finish not in (None, "length")
        if choice_name in ("required", "named") and not choice.called:
            if complete:
                ctx.check.add(
                    f"{what}: tool_calls (finish_reason {choice.finish})",
                    "one call or more",
                    f"none; content {choice.content!r:.200}",
                )
            else:
                ctx.note(f"{what}: cut short ({choice.finish}) before any call")
            continue
        named = NAMED if choice_name == "named" else None
        for call in choice.calls:
            for field, want, got in call_problems(call, PARAMETERS, named=named, complete=complete):
                ctx.check.add(f"{what}: call {call.position} {field}", want, got)
        judge_finish(ctx, what, choice_name, choice)
        if choice.called and choice.content.strip():
            ctx.note(f"{what}: content beside the calls (OpenAI leaves it open): {choice.content!r:.120}")


def judge_finish(ctx: Ctx, what: str, choice_name: str, choice: ChoiceCalls) -> None:
    if choice.called:
        allowed = CALLED_FINISHES[choice_name]
        ctx.check.that(
            choice.finish in allowed,
            f"{what}: finish_reason after its calls",
            " or ".join(allowed),
            choice.finish,
        )
    else:
        ctx.check.that(
            choice.finish != "tool_calls",
            f"{what}: finish_reason without a call",
            "not tool_calls",
            choice.finish,
        )


@openai_case(
    "CONSTRAIN-1",
    variants=[Variant({"choice": c}, tag=f"tool_choice={c}") for c in ("required", "named", "auto")],
    budget=2.0,
)
async def tool_calls_shaped(ctx: Ctx) -> None:
    """tools with tool_choice required (one call or more), a named function (a call of that one) or
    auto (calls or none): every call has an id, type function, the name of an offered function and
    arguments that are JSON valid against its strict parameters (a prefix when cut at max_tokens);
    finish_reason tool_calls after calls (stop too for a named call, as OpenAI answers it), never
    tool_calls without one; usage adds up. Streamed and not, greedy and sampled (n = 2)."""
    chat_or_skip(ctx)
    choice_name = str(ctx.params["choice"])
    for answer in await taken(ctx, case_requests(ctx, choice_name), f"tools with tool_choice {choice_name}"):
        if answered_ok(ctx, answer, f"{where(answer)} tool_choice {choice_name}"):
            judge_calls(ctx, choice_name, answer)
            check_usage(ctx, answer, f"{where(answer)} tool_choice {choice_name}")


@openai_case("CAP-1", tag="tool_choice=none")
async def no_calls_under_none(ctx: Ctx) -> None:
    """tool_choice none with tools offered: the model "will not call any tool and instead generates
    a message": no tool_calls, and no tool_calls finish, streamed and not."""
    chat_or_skip(ctx)
    requests = [tool_request("none")]
    if support(ctx).has("chat", "stream"):
        requests.append(tool_request("none", stream=True))
    for answer in await taken(ctx, requests, "tools with tool_choice none"):
        if not answered_ok(ctx, answer, f"{where(answer)} tool_choice none"):
            continue
        for index, choice in sorted(calls_of(answer.exchange).items()):
            what = f"{where(answer)} tool_choice none: choice {index}"
            calls = [(c.name, c.arguments) for c in choice.calls]
            ctx.check.that(
                not calls and not choice.malformed, f"{what}: tool_calls", "none", calls or choice.malformed
            )
            judge_finish(ctx, what, "none", choice)


STREAMS = "openai-tool-streams"


async def forced_streams(ctx: Ctx) -> list[Exchange]:
    """Streamed forced calls, shared by the framing cases: required with parallel calls allowed
    (several calls, where the model makes them), and a named call."""
    support(ctx).need("chat", "stream")
    found: list[Exchange] = await ctx.session.shared(STREAMS, lambda: _stream_forced(ctx.session))
    if not found:
        raise CaseSkipped("the server refuses streamed forced tool calls")
    if not any(c.called for e in found for c in calls_of(e).values()):
        raise CaseSkipped(
            "no streamed forced call made a call, so no framing to judge "
            "(CONSTRAIN-1[openai,tool_choice=required] judges the missing calls)"
        )
    return found


async def _stream_forced(session: Session) -> list[Exchange]:
    ctx = Ctx(session, STREAMS, {})
    prompt = "Call get_weather for Paris and get_time for Tokyo, both at once."
    requests = [
        make(
            "chat",
            prompt,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=True,
            max_tokens=PARALLEL_TOKENS,
            temperature=0,
            stream=True,
        ),
        tool_request("named", stream=True),
    ]
    try:
        exchanges = await send_all(ctx, requests)
    finally:
        await ctx.close()
    return [e for e in exchanges if e.status == 200 and e.is_event_stream]


@openai_case("STREAM-3", tag="tool-calls")
async def call_indices(ctx: Ctx) -> None:
    """A stream of forced calls gives every tool_call delta an integer index, and numbers the calls
    0, 1, … in the order they start, without gaps (parallel calls included)."""
    for exchange in await forced_streams(ctx):
        for index, choice in sorted(calls_of(exchange).items()):
            for what, want, got in index_problems(choice):
                ctx.check.add(f"{_stream_where(exchange)}: choice {index}: {what}", want, got)


@openai_case("STREAM-2", tag="tool-calls")
async def call_deltas(ctx: Ctx) -> None:
    """A stream of forced calls sends each call's id, type and function.name once, in its first
    delta, then argument fragments (strings) only; a finish_reason follows the calls."""
    for exchange in await forced_streams(ctx):
        for index, choice in sorted(calls_of(exchange).items()):
            what = f"{_stream_where(exchange)}: choice {index}"
            for rule, want, got in framing_problems(choice):
                ctx.check.add(f"{what}: {rule}", want, got)
            if choice.called:
                ctx.check.that(
                    choice.finish is not None, f"{what}: after its calls", "a finish_reason", "none"
                )
            if choice.called and choice.content_deltas:
                ctx.note(
                    f"{what}: {choice.content_deltas} content deltas beside the calls (OpenAI leaves it open)"
                )


def _stream_where(exchange: Exchange) -> str:
    request = exchange.request
    choice = request.body.get("tool_choice") if request is not None else None
    name = "named" if isinstance(choice, dict) else str(choice)
    parallel = request is not None and request.body.get("parallel_tool_calls") is True
    return f"chat stream tool_choice {name}{' (parallel calls allowed)' if parallel else ''}"


def _calls(answer: Answer) -> dict[int, list[tuple[Any, Any]]]:
    """Each choice's calls as (name, arguments); arguments that are JSON as the value they denote,
    since a server may write the body's anew (vLLM's body drops the whitespace its stream carries),
    else as the text."""
    return {
        i: [(c.name, _value(c.arguments)) for c in choice.calls]
        for i, choice in sorted(calls_of(answer.exchange).items())
    }


def _contents(answer: Answer) -> dict[int, str]:
    return {i: choice.content.strip() for i, choice in sorted(calls_of(answer.exchange).items())}


def _value(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


@openai_case("STREAM-2", tag="tool-arguments", exclusive=True)
async def streamed_calls_are_the_body(ctx: Ctx) -> None:
    """A greedy (temperature 0, seeded) forced call gives the same calls streamed and not: each
    call's name, and its argument fragments joined into the body's arguments (the same JSON value:
    the body's may be written anew, without the stream's whitespace). Content beside the calls,
    which OpenAI leaves open (a server may drop what its parser reads as markup in one and not the
    other), is compared and a difference noted."""
    support(ctx).need_determinism()
    support(ctx).need("chat", "stream")
    refusals = []
    for choice_name in ("named", "required"):
        request = tool_request(
            choice_name, seed=1234, max_tokens=2 * TOOL_TOKENS
        )  # room for a verbose format
        try:
            answers = await taken(
                ctx, [request, request.with_body(stream=True)], f"tools with tool_choice {choice_name}"
            )
        except CaseSkipped as refusal:
            refusals.append(str(refusal))
            continue
        if len(answers) < 2 or not all(
            answered_ok(ctx, a, f"{where(a)} tool_choice {choice_name}") for a in answers
        ):
            continue
        whole, streamed = answers
        cut = [where(a) for a in answers if any(c.finish == "length" for c in a.view.choices.values())]
        if cut:  # how a call cut at max_tokens is parsed (a partial call, or its text) OpenAI leaves open
            ctx.note(
                f"chat greedy tool_choice {choice_name}: cut at max_tokens ({', '.join(cut)}), not compared"
            )
            continue
        ctx.check.equal(
            f"chat greedy tool_choice {choice_name}: (name, arguments) of each call, streamed vs not",
            _calls(whole),
            _calls(streamed),
        )
        if _contents(whole) != _contents(streamed):
            ctx.note(
                f"chat greedy tool_choice {choice_name}: content beside the calls differs streamed "
                f"({_contents(streamed)!r:.120}) and not ({_contents(whole)!r:.120}); OpenAI leaves it open"
            )
    if len(refusals) == 2:
        raise CaseSkipped("; ".join(refusals))


INVALID_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "no-such-type"}},
    "required": ["city"],
}


@openai_case("CONSTRAIN-2", tag="tools")
async def bad_parameters_refused(ctx: Ctx) -> None:
    """A function whose parameters are no JSON Schema (a type that does not exist), forced with
    tool_choice required, is a 4xx with an error object, as OpenAI answers it: never a 5xx, nor an
    answer that ignores it."""
    chat_or_skip(ctx)
    await taken(ctx, [tool_request("required", max_tokens=8)], "tools with tool_choice required")
    bad = [
        {
            "type": "function",
            "function": {"name": "get_weather", "strict": True, "parameters": INVALID_PARAMETERS},
        }
    ]
    exchange = await ctx.http.send(tool_request("required", max_tokens=8).with_body(tools=bad))
    expect_refused(ctx, exchange, "chat tools with parameters of a type no JSON Schema has")
