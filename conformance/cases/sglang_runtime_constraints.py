"""Every way SGLang's native service carries a constraint, not only ``guided_decoding`` on Generate:
the same constraint through ``TextGenerate`` (its text judged), the deprecated ``regex`` and
``json_schema`` fields the proto still carries, and a legacy field beside ``guided_decoding``, which
must be refused (INVALID_ARGUMENT) rather than one of the two silently winning."""

from __future__ import annotations

import json

from grpclib import GRPCError, Status

from conformance.cases.constraints import ANSWER_REGEX, CONSTRAINED, PERSON_SCHEMA
from conformance.cases.sglang_runtime import RUNTIME, TextResponse, final_text, meta_info, runtime
from conformance.harness.context import Ctx
from conformance.spec.registry import case
from conformance.validators.shapes import Shape, shape_problem
from conformance.vocabulary import CaseFailed, Mismatch
from lmrpc._gen.sglang.runtime import v1 as rt

ANSWER_PROMPT = "Is the sky blue? Answer and rate it:"
PERSON_PROMPT = "A person as JSON:"
MAX_NEW_TOKENS = 64


async def constrained_text(ctx: Ctx, prompt: str, params: rt.SamplingParams, what: str) -> tuple[str, bool]:
    """One greedy TextGenerate with ``params``: the output's text, and whether it ended by EOS
    (a whole text of the constraint) rather than at its token limit (a prefix of one)."""
    call = rt.TextGenerateRequest(
        text=prompt, sampling_params=params, stream=False, rid=ctx.uid("constrained")
    )
    stub = runtime(ctx).stub(ctx.session.target.channel)
    responses = [
        TextResponse(r.text, meta_info(r), r.finished)
        async for r in stub.text_generate(call, timeout=ctx.budgets.stream_s)
    ]
    text = final_text(ctx, responses, what)
    reason = responses[-1].finish_reason
    ended_by_eos = isinstance(reason, dict) and reason.get("type") == "stop"
    return text, ended_by_eos


def judge(ctx: Ctx, shape: Shape, text: str, complete: bool, what: str) -> None:
    problem = shape_problem(shape, text, complete=complete)
    ctx.check.that(
        problem is None,
        f"{what} ({'ended by EOS' if complete else 'cut short'})",
        f"{'a text' if complete else 'a prefix of a text'} the constraint accepts",
        f"{text!r}: {problem}",
    )


def _params(**constraint: object) -> rt.SamplingParams:
    return rt.SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS, **constraint)  # type: ignore[arg-type]


@case("CONSTRAIN-1", tag="text-generate", requires=(CONSTRAINED,), protocols=RUNTIME)
async def text_generate_is_constrained(ctx: Ctx) -> None:
    """A guided_decoding regex through TextGenerate: the text it returns has the regex's shape."""
    params = _params(guided_decoding=rt.GuidedDecoding(regex=ANSWER_REGEX))
    what = "TextGenerate with guided_decoding.regex"
    judge(ctx, Shape.regex(ANSWER_REGEX), *await constrained_text(ctx, ANSWER_PROMPT, params, what), what)


@case("CONSTRAIN-1", tag="legacy-fields", requires=(CONSTRAINED,), protocols=RUNTIME)
async def legacy_fields_are_constraints(ctx: Ctx) -> None:
    """The deprecated sampling_params.regex and sampling_params.json_schema still constrain: each
    text has its shape."""
    cases = (
        ("regex", ANSWER_PROMPT, _params(regex=ANSWER_REGEX), Shape.regex(ANSWER_REGEX)),
        (
            "json_schema",
            PERSON_PROMPT,
            _params(json_schema=json.dumps(PERSON_SCHEMA)),
            Shape.json_schema(PERSON_SCHEMA),
        ),
    )
    for field, prompt, params, shape in cases:
        what = f"TextGenerate with the legacy sampling_params.{field}"
        judge(ctx, shape, *await constrained_text(ctx, prompt, params, what), what)


@case("CONSTRAIN-2", tag="legacy-with-guided", requires=(CONSTRAINED,), protocols=RUNTIME)
async def legacy_beside_guided_is_refused(ctx: Ctx) -> None:
    """A legacy regex beside guided_decoding is two constraints: INVALID_ARGUMENT, never one of them
    run and the other dropped."""
    params = _params(regex="[0-9]+", guided_decoding=rt.GuidedDecoding(regex=ANSWER_REGEX))
    what = "TextGenerate with sampling_params.regex and guided_decoding"
    try:
        text, _ = await constrained_text(ctx, ANSWER_PROMPT, params, what)
    except GRPCError as exc:
        ctx.check.equal(f"{what}: status", Status.INVALID_ARGUMENT.name, exc.status.name)
        return
    raise CaseFailed([Mismatch(what, "INVALID_ARGUMENT", f"answered {text!r}")])
