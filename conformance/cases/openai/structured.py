"""Structured output (``response_format``): every choice's content has the shape asked for, a
prefix of one when it was cut short (CONSTRAIN-1); a schema that is no schema is refused
(CONSTRAIN-2); a greedy stream carries the text the body does (STREAM-2).

What OpenAI documents (API reference, chat ``response_format``; the Structured Outputs and JSON
mode guides):

- ``json_schema`` "enables Structured Outputs which ensures the model will match your supplied JSON
  schema"; ``strict``: "If set to true, the model will always follow the exact schema defined in
  the schema field". Without ``strict`` the schema is best effort: such content must be JSON, and
  how it departs from the schema is noted, not failed.
- ``json_object`` "enables the older JSON mode, which ensures the message the model generates is
  valid JSON"; "you must also instruct the model to produce JSON yourself via a system or user
  message" (OpenAI refuses a request that does not), so every prompt here says JSON. Valid JSON is
  what is promised; that it is an object only the type's name says (vLLM's and llama.cpp's JSON
  mode grammars take any JSON value), so a JSON value that is no object is noted, not failed.
- "the message content may be partially cut off if finish_reason="length"": a choice that ended
  ``length`` (or without a finish) is judged as a prefix of such a document, one that ended
  ``stop`` as a whole one (validators/shapes.py, independent of any grammar engine).

OpenAI's legacy completions have no ``response_format``; a server that takes it there (vLLM does)
is judged there too, one that ignores it there is not (an unknown parameter, MALFORMED-2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conformance.cases.openai._common import (
    expect_refused,
    make,
    openai_case,
    support,
)
from conformance.cases.openai._output import answered_ok, check_usage, cut_text, declined, taken, where
from conformance.drivers.openai.exchange import Api, OpenAIRequest
from conformance.drivers.openai.support import State
from conformance.harness.context import Ctx
from conformance.harness.session import Session
from conformance.spec.registry import Variant
from conformance.validators.openai import Answer
from conformance.validators.shapes import Shape, shape_problem
from conformance.vocabulary import CaseSkipped

PERSON_SCHEMA: dict[str, Any] = {  # what OpenAI's strict mode takes: every property required, no others
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "member"],
    "additionalProperties": False,
}
PROMPT = {
    "chat": "Describe a person as a JSON object with their name, age and whether they are a member.",
    "completions": "A person described in JSON, with name, age and member:\n",
}
FORMAT_TOKENS = 48  # a person's three fields take about 20 tokens; a model that pads with whitespace is cut
CUT_TOKENS = 4  # a choice this short ends "length" inside its document: a prefix is judged
PROBE_PROMPT = "Once upon a time"  # what no server continues with "{" unless it honours JSON mode


@dataclass(frozen=True, slots=True)
class Format:
    tag: str
    response_format: dict[str, Any]
    shape: Shape  # what a choice must have
    noted: Shape | None = None  # what it should have, noted where it has not
    why_noted: str = ""  # why a departure from ``noted`` is only noted


def json_schema(strict: bool) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": strict},
    }


FORMATS = {
    f.tag: f
    for f in (
        Format("json_schema", json_schema(True), Shape.json_schema(PERSON_SCHEMA)),
        Format(
            "json_schema-nonstrict",
            json_schema(False),
            Shape.json_schema({}),
            Shape.json_schema(PERSON_SCHEMA),
            "off the schema, which strict false makes best effort",
        ),
        Format(
            "json_object",
            {"type": "json_object"},
            Shape.json_schema({}),
            Shape.json_object(),
            "not an object: OpenAI promises valid JSON, the object only its name says",
        ),
    )
}


async def judged_apis(ctx: Ctx) -> list[Api]:
    """The endpoints whose response_format is judged: chat unless declined (a 4xx or 501 skips), and
    completions where the server visibly honours it there (learned once per run)."""
    learned: dict[Api, str] = await ctx.session.shared("openai-response_format", lambda: learn(ctx.session))
    found = [api for api, verdict in learned.items() if verdict == "judged"]
    for api, verdict in learned.items():
        if verdict != "judged":
            ctx.note(f"{api} response_format: {verdict}")
    if not found:
        raise CaseSkipped(f"the server takes response_format on no endpoint: {learned}")
    return found


async def learn(session: Session) -> dict[Api, str]:
    ctx = Ctx(session, "openai-response_format", {})
    out: dict[Api, str] = {}
    try:
        for api in session.http.support.apis():
            prompt = PROBE_PROMPT + (" Answer in JSON." if api == "chat" else "")
            probe = make(api, prompt, max_tokens=8, temperature=0, response_format={"type": "json_object"})
            exchange = await ctx.http.send(probe)
            if declined(exchange):
                out[api] = f"refused: HTTP {exchange.status}: {exchange.text[:200]}"
            elif api == "chat":
                out[api] = "judged"  # accepted: honoured or not, the cases judge it
            elif exchange.status != 200:
                out[api] = f"not an OpenAI parameter here, and answered {exchange.summary()}: not judged"
            else:
                text = Answer.of(exchange).view.texts().get(0, "")
                honoured = shape_problem(Shape.json_schema({}), cut_text(text, False), complete=False) is None
                out[api] = (
                    "judged"
                    if honoured
                    else f"accepted and ignored (not an OpenAI parameter here): {text!r:.80}"
                )
    finally:
        await ctx.close()
    return out


def format_requests(ctx: Ctx, api: Api, fmt: Format) -> list[OpenAIRequest]:
    """Greedy and sampled, one choice and two, streamed and not, and one cut short."""
    base = make(
        api, PROMPT[api], max_tokens=FORMAT_TOKENS, temperature=0, response_format=fmt.response_format
    )
    out = [base, base.with_body(max_tokens=CUT_TOKENS)]
    if support(ctx).has(api, "n"):
        out.append(base.with_body(n=2, temperature=1.0, seed=7))
    if support(ctx).has(api, "stream"):
        usage = {"stream_options": {"include_usage": True}} if _usage_streams(ctx, api) else {}
        out.append(base.with_body(stream=True, **usage))
        if support(ctx).has(api, "n"):
            out.append(base.with_body(stream=True, n=2, temperature=1.0, seed=7))
    return out


def _usage_streams(ctx: Ctx, api: Api) -> bool:
    return support(ctx).feature(api, "include_usage").state is State.HONOURED


def check_shape(ctx: Ctx, fmt: Format, answer: Answer) -> None:
    for index, choice in sorted(answer.view.choices.items()):
        complete = choice.finish == "stop"
        text = cut_text(choice.text, complete)
        what = f"{where(answer)} response_format {fmt.tag}: choice {index} (finish_reason {choice.finish})"
        problem = shape_problem(fmt.shape, text, complete=complete)
        want = f"{'content' if complete else 'a prefix of content'} the {fmt.tag} response_format accepts"
        ctx.check.that(problem is None, what, want, f"{text!r:.300}: {problem}")
        if (
            problem is None
            and fmt.noted is not None
            and (off := shape_problem(fmt.noted, text, complete=complete))
        ):
            ctx.note(f"{what}: {fmt.why_noted}: {off}")


@openai_case("CONSTRAIN-1", variants=[Variant({"format": tag}, tag=tag) for tag in FORMATS], budget=2.0)
async def shaped_content(ctx: Ctx) -> None:
    """Every choice's content has the shape response_format asks (strict json_schema: valid against
    the schema; strict false: JSON; json_object: JSON, an object noted): the whole shape when it ended
    ``stop``, a prefix when cut at max_tokens; greedy and sampled, n = 1 and 2, streamed and not."""
    fmt = FORMATS[str(ctx.params["format"])]
    for api in await judged_apis(ctx):
        answers = await taken(ctx, format_requests(ctx, api, fmt), f"{api} response_format {fmt.tag}")
        for answer in answers:
            if answered_ok(ctx, answer, f"{where(answer)} response_format {fmt.tag}"):
                check_shape(ctx, fmt, answer)
                if answer.request.n == 1:
                    check_usage(ctx, answer, f"{where(answer)} response_format {fmt.tag}")


INVALID_SCHEMAS: dict[str, Any] = {
    "a type no JSON Schema has": {"type": "object", "properties": {"name": {"type": "no-such-type"}}},
    "a string, not a schema object": "not a schema",
}


@openai_case("CONSTRAIN-2", tag="response_format")
async def bad_schema_refused(ctx: Ctx) -> None:
    """A response_format whose schema is no JSON Schema (a type that does not exist; a string) is
    a 4xx with an error object, as OpenAI answers it: never a 5xx, nor an answer that ignores it."""
    for api in await judged_apis(ctx):
        for what, schema in INVALID_SCHEMAS.items():
            bad = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
            exchange = await ctx.http.send(
                make(api, PROMPT[api], max_tokens=8, temperature=0, response_format=bad)
            )
            expect_refused(ctx, exchange, f"{api} response_format json_schema with {what}")


@openai_case("STREAM-2", tag="response_format", exclusive=True)
async def shaped_stream_is_the_body(ctx: Ctx) -> None:
    """A greedy (temperature 0, seeded) strict json_schema request gives each choice the same
    content streamed and not: the constraint changes no delta."""
    support(ctx).need_determinism()
    for api in await judged_apis(ctx):
        if not support(ctx).has(api, "stream"):
            continue
        request = make(
            api,
            PROMPT[api],
            max_tokens=FORMAT_TOKENS,
            temperature=0,
            seed=1234,
            response_format=json_schema(True),
        )
        answers = await taken(
            ctx, [request, request.with_body(stream=True)], f"{api} response_format json_schema"
        )
        if len(answers) < 2 or not all(answered_ok(ctx, a, f"{where(a)} response_format") for a in answers):
            continue
        whole, streamed = answers
        ctx.check.equal(
            f"{api} greedy response_format json_schema: content streamed vs not",
            whole.view.texts(),
            streamed.view.texts(),
        )
