"""Constrained decoding (CONSTRAIN-1, CONSTRAIN-3, CONSTRAIN-4): every output has the shape its
constraint asks for, judged by recognizers independent of any grammar engine (validators/shapes.py).

An output that ended by its EOS token must have the whole shape; one cut short (max_tokens, a stop
string or token) a prefix of it. Nothing here demands that a small model finishes a document within
``max_tokens``: the cases leave room and prefer small shapes, and judge what they get.
Invalid constraints (CONSTRAIN-2) are entries of search/invalid.py, so ERR-3 checks their messages too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from conformance.cases._helpers import expect_rejected, ok
from conformance.harness.context import Ctx
from conformance.harness.requests import request
from conformance.harness.session import Session
from conformance.spec.registry import case
from conformance.stream.record import OutputView, StreamRecord
from conformance.validators.shapes import Shape, shape_problem
from conformance.vocabulary import StreamHung
from lmrpc.v1 import (
    Choices,
    Constraint,
    FinishReason,
    GenerateRequest,
    JsonObject,
    ResponseOptions,
    SamplingParams,
)

CONSTRAINED = "constrained_decoding"

PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "member"],
    "additionalProperties": False,
}
# An EBNF grammar and a regular expression for the same language: the case judges by the regex.
SUM_EBNF = 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'
SUM_REGEX = r"\(([1-9][0-9]?)(\+[1-9][0-9]?)*\)"
ANSWER_REGEX = r"(yes|no), [0-9]{1,3}"
COLOURS = ("red", "green", "blue")
# Choices that regular-expression syntax reads otherwise: a server that joins the strings into a
# regex unescaped admits "abc" for "a.c", "x" for "x|y", "11" for "(1+1)", "o" for "[ok]"; the prompt
# is such a text, so an engine that echoes what the grammar allows shows it at once.
LITERAL_CHOICES = ("a.c", "x|y", "(1+1)", "[ok]", "^$")


@dataclass(frozen=True, slots=True)
class Kind:
    tag: str
    prompt: str
    constraint: Constraint
    shape: Shape
    max_tokens: int
    sends: str = ""  # its input class (spec/coverage.py); default generate.constraint.<tag>

    @property
    def input_class(self) -> str:
        return self.sends or f"generate.constraint.{self.tag}"


KINDS: tuple[Kind, ...] = (
    Kind(
        "json_schema",
        "A person as JSON:",
        Constraint(json_schema=json.dumps(PERSON_SCHEMA)),
        Shape.json_schema(PERSON_SCHEMA),
        64,
    ),
    Kind(
        "json_object", "A small JSON object:", Constraint(json_object=JsonObject()), Shape.json_object(), 48
    ),
    Kind(
        "regex",
        "Is the sky blue? Answer and rate it:",
        Constraint(regex=ANSWER_REGEX),
        Shape.regex(ANSWER_REGEX),
        16,
    ),
    Kind("ebnf", "A sum of small numbers:", Constraint(ebnf=SUM_EBNF), Shape.ebnf(SUM_REGEX), 32),
    Kind(
        "choice",
        "My favourite colour is",
        Constraint(choice=Choices(list(COLOURS))),
        Shape.choice(*COLOURS),
        8,
    ),
    Kind(
        "choice-literal",
        "abc",
        Constraint(choice=Choices(list(LITERAL_CHOICES))),
        Shape.choice(*LITERAL_CHOICES),
        8,
        sends="generate.constraint.choice",
    ),
)


def constrained(ctx: Ctx, kind: Kind, **kw: Any) -> GenerateRequest:
    req = request(ctx, kind.prompt, max_tokens=kw.pop("max_tokens", kind.max_tokens), **kw)
    req.constraint = kind.constraint
    return req


async def compiled(ctx: Ctx) -> None:
    """Each kind's constraint is sent once, side by side, before any case judges one, with a whole
    stream's budget for silence: a server may load its grammar compiler and compile a grammar when
    it first meets one (the reference: about 3 s cold, more on a busy host), which is slow, not hung.
    What these requests answer is not judged; the cases then send the same constraints warm."""
    await ctx.session.shared("constraints-compiled", lambda: _compile_each(ctx.session))


async def _compile_each(session: Session) -> None:
    warm = Ctx(session, "constraints-warm-up", {})

    async def once(kind: Kind) -> None:
        with contextlib.suppress(StreamHung, GRPCError, TimeoutError, OSError):
            req = constrained(warm, kind, max_tokens=1)
            await warm.generate(req, hung_ok=True, total_s=warm.budgets.stream_s)

    try:
        await asyncio.gather(*(once(kind) for kind in KINDS))
    finally:
        await warm.close()


def ended_complete(view: OutputView) -> bool:
    """Ended by its EOS token: the text must be whole (CONSTRAIN-1)."""
    finish = view.finish
    return (
        finish is not None
        and finish.reason == FinishReason.STOP
        and finish.stop is not None
        and finish.stop.eos_token_id is not None
    )


async def check_shapes(ctx: Ctx, kind: Kind, record: StreamRecord, what: str) -> None:
    for index, view in sorted(record.outputs().items()):
        complete = ended_complete(view)
        text = await output_text(ctx, view)
        problem = shape_problem(kind.shape, text, complete=complete)
        ctx.check.that(
            problem is None,
            f"{what}: output {index} ({'ended by EOS' if complete else 'cut short'})",
            f"{'a text' if complete else 'a prefix of a text'} the {kind.tag} constraint accepts",
            f"{text!r}: {problem}",
        )


async def output_text(ctx: Ctx, view: OutputView) -> str:
    """The output's text: on the wire, or its ids decoded as the protocol's gateway would."""
    driver = ctx.session.target.driver
    if driver.carries_text:
        return view.text
    ids = list(view.token_ids)
    stop = view.finish.stop if view.finish is not None and ended_complete(view) else None
    eos = stop.eos_token_id if stop is not None else None
    if ids and ids[-1] == eos:
        ids.pop()  # an engine protocol may return its EOS id (SGLang's does); a Detokenize may spell it
    decoded = driver.decode(ids)
    return decoded if decoded is not None else await ctx.detokenize(ids, True)


def _kind_case(kind: Kind) -> None:
    @case("CONSTRAIN-1", tag=kind.tag, requires=(CONSTRAINED,), sends=(kind.input_class,))
    async def shaped(ctx: Ctx) -> None:
        await compiled(ctx)
        record = ok(ctx, await ctx.generate(constrained(ctx, kind, temperature=0.0)))
        await check_shapes(ctx, kind, record, f"greedy {kind.tag}")
        sampled = constrained(ctx, kind)
        sampled.sampling = SamplingParams(temperature=1.0, seed=7, n=min(3, ctx.info.caps.max_outputs))
        await check_shapes(ctx, kind, ok(ctx, await ctx.generate(sampled)), f"sampled {kind.tag}")

    shaped.__doc__ = (
        f"A {kind.tag} constraint: every output, greedy and sampled, has its shape (a prefix when cut short)."
    )


for _kind in KINDS:
    _kind_case(_kind)


def kind(tag: str) -> Kind:
    return next(k for k in KINDS if k.tag == tag)


@case(
    "CONSTRAIN-3",
    tag="n=4",
    requires=(CONSTRAINED, "max_outputs>=2", "seeded_sampling"),
    sends=("generate.constraint.json_schema", "generate.n>1"),
)
async def every_output_shaped(ctx: Ctx) -> None:
    """Each of n outputs of a sampled request is bound by the constraint, streamed and final-only alike."""
    await compiled(ctx)
    shape = kind("json_schema")
    n = min(4, ctx.info.caps.max_outputs)
    req = constrained(ctx, shape, temperature=1.2, seed=11, n=n)
    record = ok(ctx, await ctx.generate(req))
    ctx.check.equal("outputs of a constrained request", list(range(n)), sorted(record.outputs()))
    await check_shapes(ctx, shape, record, f"n={n}")
    if ctx.info.has("final_only"):
        final = constrained(
            ctx, shape, temperature=1.2, seed=12, n=n, response=ResponseOptions(final_only=True)
        )
        whole = await ctx.generate(final, total_s=ctx.budgets.stream_s)  # silent until every output is done
        await check_shapes(ctx, shape, ok(ctx, whole), f"n={n}, final_only")


@case(
    "CONSTRAIN-3",
    tag="greedy",
    requires=(CONSTRAINED, "deterministic_greedy"),
    sends=("generate.constraint.regex", "generate.temperature=0"),
)
async def greedy_constrained_is_deterministic(ctx: Ctx) -> None:
    """A greedy constrained request gives the same tokens every time, alone and beside others."""
    await compiled(ctx)
    shape = kind("regex")
    alone = ok(ctx, await ctx.generate(constrained(ctx, shape, temperature=0.0)))
    beside = [
        constrained(ctx, shape, temperature=0.0),
        constrained(ctx, kind("choice"), temperature=1.0, seed=3),
    ]
    records = await asyncio.gather(*(ctx.generate(r) for r in beside))
    ctx.check.equal(
        "greedy constrained tokens, run again beside another constrained request",
        alone.outputs()[0].token_ids,
        ok(ctx, records[0]).outputs()[0].token_ids,
    )


@case(
    "CONSTRAIN-3",
    tag="seeded",
    requires=(CONSTRAINED, "seeded_sampling"),
    sends=("generate.constraint.json_object", "generate.seed"),
)
async def seeded_constrained_reproduces(ctx: Ctx) -> None:
    """A seeded constrained request gives the same tokens every time."""
    await compiled(ctx)
    shape = kind("json_object")
    runs = [ok(ctx, await ctx.generate(constrained(ctx, shape, temperature=1.0, seed=99))) for _ in range(2)]
    first, second = runs
    ctx.check.equal(
        "seeded constrained tokens, run twice",
        first.outputs()[0].token_ids,
        second.outputs()[0].token_ids,
    )


@case(
    "CONSTRAIN-3",
    tag="ignore_eos",
    requires=(CONSTRAINED,),
    sends=("generate.constraint.choice", "generate.ignore_eos", "generate.min_tokens"),
)
async def complete_text_ends(ctx: Ctx) -> None:
    """A text that is complete and admits no further token ends STOP by its EOS, even with ignore_eos and
    a min_tokens it has not reached: the constraint wins over both."""
    await compiled(ctx)
    shape = kind("choice")
    req = constrained(ctx, shape, temperature=0.0, ignore_eos=True, min_tokens=6, max_tokens=16)
    view = ok(ctx, await ctx.generate(req)).outputs()[0]
    text = await output_text(ctx, view)
    ctx.check.that(
        ended_complete(view) and text in COLOURS,
        "a choice output with ignore_eos and min_tokens=6",
        f"one of {list(COLOURS)}, ended STOP by its EOS",
        f"{text!r}, {view.finish.reason.name if view.finish else 'no finish'}",
    )


@case(
    "CONSTRAIN-3",
    tag="stop-string",
    requires=(CONSTRAINED, "stop_strings"),
    sends=("generate.constraint.choice", "generate.stop_strings=1"),
)
async def stop_string_still_ends(ctx: Ctx) -> None:
    """Stop strings still apply under a constraint: every choice contains the stop string, so every output
    ends STOP at it with the text before it."""
    await compiled(ctx)
    pairs = ("alpha beta", "gamma delta")
    req = request(ctx, "Two words:", max_tokens=16, stop_strings=[" "], temperature=0.0)
    req.constraint = Constraint(choice=Choices(list(pairs)))
    view = ok(ctx, await ctx.generate(req)).outputs()[0]
    stop = view.finish.stop if view.finish else None
    text = await output_text(ctx, view)  # decoded ids go on past the cut where the protocol carries no text
    ctx.check.that(
        stop is not None and stop.stop_string == " " and text.partition(" ")[0] in ("alpha", "gamma"),
        "a choice of two-word texts with stop string ' '",
        "ends STOP at ' ' after the first word",
        f"{text!r}, {stop}",
    )


@case("CONSTRAIN-4", tag="remote-ref", requires=(CONSTRAINED,), sends=("generate.constraint.json_schema",))
async def unenforceable_schema_refused(ctx: Ctx) -> None:
    """A schema that refers to another document (a remote $ref) cannot be enforced: INVALID_ARGUMENT."""
    schema = {"type": "object", "properties": {"x": {"$ref": "https://example.invalid/other.json"}}}
    req = request(ctx, "JSON:", max_tokens=8)
    req.constraint = Constraint(json_schema=json.dumps(schema))
    expect_rejected(ctx, await ctx.answer(req), (Status.INVALID_ARGUMENT,), "Generate with a remote $ref")
