"""Stop tokens and EOS (STOP-1, STOP-3, STOP-4, STOP-5, STOP-7, FINISH-5, FINISH-6, SAMPLE-8): learn a
reproducible output first, then stop it at a token known to occur and check where and how it ends."""

from __future__ import annotations

from conformance.cases._helpers import ok
from conformance.cases._learned import (
    DETERMINISTIC,
    PROMPT,
    find_eos,
    learn,
    learned_length,
    pick_stop_token,
    pin,
    prompted,
    rerun,
    stop_of,
)
from conformance.harness.context import Ctx
from conformance.harness.requests import request
from conformance.spec.registry import case
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import FinishReason, ResponseOptions, SamplingParams


@case(
    "STOP-1",
    tag="stop-token",
    requires=("stop_token_ids", "tokenize", DETERMINISTIC),
    sends=(
        "generate.skip_special_tokens=false",
        "detokenize.skip_special_tokens=false",
    ),
)
async def stop_token_hidden(ctx: Ctx) -> None:
    """The matched stop token's text is not in the output text; its id is (token ids are never removed)."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    _, view = await rerun(
        ctx, stop_token_ids=[token], ignore_eos=True, response=ResponseOptions(skip_special_tokens=False)
    )
    want = await ctx.detokenize(learned.token_ids[:k], False)
    ctx.check.equal(f"text of an output stopped by token {token}", want, view.text)
    ctx.check.equal("its token ids (the stop token included)", learned.token_ids[: k + 1], view.token_ids)


@case("STOP-3", requires=("stop_token_ids", DETERMINISTIC), sends=("generate.stop_token_ids",))
async def stop_token_ends(ctx: Ctx) -> None:
    """The output ends at the first generated token that is a stop token."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    _, view = await rerun(ctx, stop_token_ids=[token], ignore_eos=True)
    stop = stop_of(view)
    ctx.check.equal("token ids of an output with a stop token", learned.token_ids[: k + 1], view.token_ids)
    ctx.check.equal("StopMatch.stop_token_id", token, stop.stop_token_id if stop else None)


@case(
    "STOP-3",
    tag="n=2",
    requires=("stop_token_ids", "deterministic_greedy", "truncation_sampling", "max_outputs>=2"),
    sends=("generate.stop_token_ids", "generate.n>1"),
)
async def stop_token_ends_every_output(ctx: Ctx) -> None:
    """Each of n outputs ends at its first stop token: n = 2 with top_k = 1, whose tokens are the greedy
    ones (SAMPLE-7) at a temperature that servers refusing several greedy outputs still take."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    req = prompted(ctx, PROMPT, max_tokens=learned_length(ctx), ignore_eos=True, stop_token_ids=[token])
    req.sampling = SamplingParams(n=2, temperature=1.0, top_k=1)
    record = ok(ctx, await ctx.generate(req))
    for index in range(2):
        view = record.outputs().get(index)
        stop = stop_of(view) if view else None
        ctx.check.equal(
            f"output {index}: token ids with stop token {token}",
            learned.token_ids[: k + 1],
            view and view.token_ids,
        )
        ctx.check.equal(
            f"output {index}: StopMatch.stop_token_id", token, stop.stop_token_id if stop else None
        )


@case("STOP-4", tag="eos", requires=(DETERMINISTIC,))
async def eos_ends(ctx: Ctx) -> None:
    """Without ignore_eos an output ends at the first EOS token, reported as eos_token_id."""
    run = await find_eos(ctx)
    learned, k = run.learned, run.position
    _, view = await rerun(ctx, run.prompt, run.seed, response=ResponseOptions(skip_special_tokens=False))
    stop = stop_of(view)
    ctx.check.equal("token ids up to the first EOS", learned.token_ids[: k + 1], view.token_ids)
    ctx.check.equal("StopMatch.eos_token_id", learned.token_ids[k], stop.eos_token_id if stop else None)
    eos_text = await ctx.detokenize([learned.token_ids[k]], False) if ctx.info.has("tokenize") else ""
    if eos_text:
        ctx.check.that(
            eos_text not in view.text,
            "text of an output ended by EOS (STOP-1)",
            f"without {eos_text!r}",
            view.text,
        )


@case("STOP-4", tag="ignore_eos", requires=(DETERMINISTIC,))
async def ignore_eos_continues(ctx: Ctx) -> None:
    """With ignore_eos an EOS token never ends an output."""
    run = await find_eos(ctx)
    learned, k = run.learned, run.position
    ctx.check.that(
        len(learned.token_ids) == learned_length(ctx)
        and learned.finish is not None
        and learned.finish.reason == FinishReason.LENGTH,
        f"an ignore_eos output with an EOS at position {k}",
        f"LENGTH after {learned_length(ctx)} tokens",
        f"{learned.finish.reason.name if learned.finish else '-'} after {len(learned.token_ids)}",
    )


@case("FINISH-5", tag="stop-token-is-eos", requires=("stop_token_ids", DETERMINISTIC))
async def stop_token_wins_over_eos(ctx: Ctx) -> None:
    """A token that is both a requested stop token and an EOS token reports stop_token_id."""
    run = await find_eos(ctx)
    token = run.learned.token_ids[run.position]
    _, view = await rerun(ctx, run.prompt, run.seed, stop_token_ids=[token])
    stop = stop_of(view)
    ctx.check.that(
        stop is not None and stop.stop_token_id == token,
        "StopMatch of an EOS that is also a stop token",
        f"stop_token_id={token}",
        stop,
    )


@case("STOP-5", requires=("stop_token_ids", DETERMINISTIC), sends=("generate.min_tokens",))
async def min_tokens_first(ctx: Ctx) -> None:
    """No stop condition ends an output before it has min_tokens tokens."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    minimum = min(k + 3, learned_length(ctx))
    _, view = await rerun(ctx, stop_token_ids=[token], min_tokens=minimum, ignore_eos=True)
    ctx.check.that(
        len(view.token_ids) >= minimum,
        f"tokens of an output with min_tokens={minimum} and a stop token at {k}",
        f">= {minimum}",
        len(view.token_ids),
    )
    ctx.check.that(  # suppressed, not merely ignored: it is never sampled before min_tokens
        token not in view.token_ids[:minimum],
        f"the first {minimum} tokens (min_tokens) of an output with stop token {token}",
        f"without {token}",
        view.token_ids[:minimum],
    )


@case("STOP-5", tag="eos", requires=(DETERMINISTIC,), sends=("generate.min_tokens",))
async def min_tokens_suppresses_eos(ctx: Ctx) -> None:
    """Without ignore_eos, min_tokens suppresses the EOS tokens too: an output whose reproducible run ends
    at EOS after k tokens, rerun with min_tokens=k+3, samples no EOS token before its (k+3)th."""
    run = await find_eos(ctx)
    minimum = min(run.position + 3, learned_length(ctx))
    _, view = await rerun(ctx, run.prompt, run.seed, min_tokens=minimum)
    ctx.check.that(
        len(view.token_ids) >= minimum,
        f"tokens of an output with min_tokens={minimum} whose run without it ends at EOS after {run.position}",
        f">= {minimum}",
        len(view.token_ids),
    )
    eos = set(ctx.info.eos_ids)
    early = [(i, t) for i, t in enumerate(view.token_ids[:minimum]) if t in eos]
    ctx.check.that(
        not early,
        f"the first {minimum} tokens (min_tokens) of an output without ignore_eos",
        f"no EOS token of {sorted(eos)}",
        f"EOS at (position, id) {early}",
    )


@case("FINISH-6", tag="ignore_eos", sends=("generate.ignore_eos",))
async def length_after_max_tokens(ctx: Ctx) -> None:
    """With ignore_eos and no stop conditions every output ends LENGTH after exactly max_tokens tokens."""
    n = min(ctx.info.caps.max_outputs, 2)
    record = ok(ctx, await ctx.generate(request(ctx, PROMPT, ignore_eos=True, n=n, temperature=1.0)))
    for view in record.outputs().values():
        finish = view.finish
        ctx.check.that(
            finish is not None
            and finish.reason == FinishReason.LENGTH
            and finish.completion_tokens == ctx.tuning.max_tokens,
            f"output {view.index}",
            f"LENGTH after max_tokens={ctx.tuning.max_tokens}",
            f"{finish.reason.name} after {finish.completion_tokens}" if finish else "no finish",
        )


@case(
    "STOP-5",
    tag="no-max-tokens",
    requires=("stop_token_ids", DETERMINISTIC),
    sends=("generate.min_tokens-without-max_tokens",),
)
async def min_tokens_without_max_tokens(ctx: Ctx) -> None:
    """min_tokens holds also when max_tokens is absent (the default applies to max_tokens only)."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    minimum = k + 3
    req = pin(ctx, request(ctx, PROMPT, stop_token_ids=[token], min_tokens=minimum, ignore_eos=True))
    assert req.stopping is not None
    req.stopping.max_tokens = None
    view = ok(ctx, await ctx.generate(req, total_s=4 * ctx.budgets.stream_s)).outputs()[0]
    ctx.check.that(
        len(view.token_ids) >= minimum,
        f"tokens of an output with min_tokens={minimum}, no max_tokens, and a stop token at {k}",
        f">= {minimum}",
        len(view.token_ids),
    )


@case(
    "STOP-7",
    tag="stop-token",
    requires=("stop_token_ids", "tokenize", DETERMINISTIC),
    sends=("generate.include_stop+stop_token_ids",),
)
async def stop_token_included(ctx: Ctx) -> None:
    """With include_stop_in_output a stop token's text is in the output text, as Detokenize renders it."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    _, view = await rerun(ctx, stop_token_ids=[token], ignore_eos=True, include_stop=True)
    want = await ctx.detokenize(learned.token_ids[: k + 1])
    ctx.check.equal(f"text of an output stopped by token {token}, included", want, view.text)


@case("STOP-7", tag="eos", requires=("tokenize", DETERMINISTIC), sends=("generate.include_stop+eos",))
async def eos_included(ctx: Ctx) -> None:
    """With include_stop_in_output an EOS token's text is included exactly as skip_special_tokens renders
    it: its text with skip_special_tokens=false, nothing with the default (true)."""
    run = await find_eos(ctx)
    ids = run.learned.token_ids[: run.position + 1]
    for skip in (False, None):
        response = ResponseOptions(skip_special_tokens=skip)
        _, view = await rerun(ctx, run.prompt, run.seed, include_stop=True, response=response)
        want = await ctx.detokenize(ids, skip)
        ctx.check.equal(
            f"text of an output ended by EOS, included, skip_special_tokens={skip}", want, view.text
        )


@case("SAMPLE-8", tag="skip_special_tokens", requires=("tokenize", DETERMINISTIC))
async def skip_special_default(ctx: Ctx) -> None:
    """skip_special_tokens absent means true: an EOS token generated under ignore_eos adds no text."""
    run = await find_eos(ctx)
    _, view = await rerun(ctx, run.prompt, run.seed, ignore_eos=True)
    ctx.check.equal(
        "text of an output with an EOS token inside, skip_special_tokens absent",
        await ctx.detokenize(view.token_ids, True),
        view.text,
    )


@case("FINISH-6", tag="stop-at-max-tokens", requires=("stop_token_ids", DETERMINISTIC))
async def stop_beats_length(ctx: Ctx) -> None:
    """A token that is a stop token and reaches max_tokens ends the output STOP, not LENGTH."""
    learned = await learn(ctx)
    token, k = pick_stop_token(learned.token_ids, ctx.info.eos_ids)
    record = ok(
        ctx,
        await ctx.generate(
            pin(ctx, request(ctx, PROMPT, max_tokens=k + 1, stop_token_ids=[token], ignore_eos=True))
        ),
    )
    view = record.outputs()[0]
    finish = view.finish
    ctx.check.equal(
        f"(reason, stop_token_id, tokens) when token {token} is the {k + 1}th and max_tokens={k + 1}",
        ("STOP", token, k + 1),
        (finish.reason.name, finish.stop.stop_token_id if finish.stop else None, finish.completion_tokens)
        if finish
        else None,
    )


@case("FINISH-6", tag="eos-at-max-tokens", requires=(DETERMINISTIC,))
async def eos_beats_length(ctx: Ctx) -> None:
    """An EOS token that is also the max_tokens-th token ends the output STOP (eos_token_id), not LENGTH."""
    run = await find_eos(ctx)
    k, token = run.position, run.learned.token_ids[run.position]
    req = pin(ctx, prompted(ctx, run.prompt, max_tokens=k + 1), run.seed)
    view = ok(ctx, await ctx.generate(req)).outputs()[0]
    finish = view.finish
    ctx.check.equal(
        f"(reason, eos_token_id, tokens) when EOS {token} is the {k + 1}th token and max_tokens={k + 1}",
        ("STOP", token, k + 1),
        (finish.reason.name, finish.stop.eos_token_id if finish.stop else None, finish.completion_tokens)
        if finish
        else None,
    )


@case("STOP-5", tag="default", requires=("stop_token_ids", DETERMINISTIC))
async def min_tokens_default(ctx: Ctx) -> None:
    """min_tokens absent is ModelInfo.defaults.min_tokens: with a default of 0, a stop token that is the
    output's first token ends it at once."""
    defaults = ctx.info.model.defaults
    minimum = defaults.min_tokens if defaults is not None else 0
    learned = await learn(ctx)
    token = learned.token_ids[0]
    if token in ctx.info.eos_ids:
        raise CaseSkipped(f"the learned output starts with an EOS token ({token})")
    _, view = await rerun(ctx, stop_token_ids=[token], ignore_eos=True)
    stop = stop_of(view)
    if minimum == 0:
        ctx.check.equal(
            f"(tokens, stop_token_id) with stop token {token}, the output's first, min_tokens absent (default 0)",
            ([token], token),
            (view.token_ids, stop.stop_token_id if stop else None),
        )
    else:
        ctx.check.that(
            len(view.token_ids) >= minimum,
            f"tokens with min_tokens absent (default {minimum})",
            f">= {minimum}",
            len(view.token_ids),
        )
