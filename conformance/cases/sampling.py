"""Sampling options (SAMPLE-1..4, 6, 7): defaults, greedy and seeded determinism, n>1 streams.

Exact token comparisons only run where a capability promises determinism (deterministic_greedy,
seeded_sampling); everything else a nondeterministic server may legitimately vary.
"""

from __future__ import annotations

import asyncio

from hypothesis import strategies as st

from conformance.cases._helpers import ok, outputs_tokens
from conformance.harness.context import Ctx
from conformance.harness.requests import request
from conformance.search.pool import copy_request
from conformance.search.property import raise_outcome, search
from conformance.search.strategies import deterministic_requests, prompt_texts
from conformance.spec.registry import case
from conformance.vocabulary import GREEDY_N, CaseSkipped, Mismatch
from lmrpc.v1 import GenerateRequest, SamplingParams, StoppingCriteria


@case("SAMPLE-1", tag="temperature=0", requires=("deterministic_greedy",), sends=("generate.temperature=0",))
async def explicit_zero_is_greedy(ctx: Ctx) -> None:
    """temperature=0 is greedy (never read as "unset"): different seeds give the same tokens."""
    seeds = (1, 2) if ctx.info.has("seeded_sampling") else (None, None)
    runs = await asyncio.gather(
        *(
            ctx.generate(request(ctx, "Once upon a time", temperature=0.0, seed=s, ignore_eos=True))
            for s in seeds
        )
    )
    a, b = (ok(ctx, r) for r in runs)
    ctx.check.equal(
        "tokens of temperature=0 requests with seeds 1 and 2", outputs_tokens(a), outputs_tokens(b)
    )
    defaults = ctx.info.model.defaults
    if defaults is not None and defaults.temperature == 0:
        ctx.note("the default temperature is 0 too, so 0-versus-unset confusion would be invisible here")


@case("SAMPLE-1", tag="n-absent")
async def n_absent_is_one(ctx: Ctx) -> None:
    """A request without n has exactly one output."""
    record = ok(ctx, await ctx.generate(request(ctx, max_tokens=2)))
    prompt = record.prompt_info
    ctx.check.equal("PromptInfo.num_outputs without n", 1, prompt.num_outputs if prompt else None)
    ctx.check.equal("output indices without n", [0], list(record.outputs()))


@case(
    "SAMPLE-1",
    tag="defaults",
    requires=("seeded_sampling",),
    sends=(
        "generate.temperature=absent",
        "generate.top_p",
        "generate.top_k",
        "generate.min_p",
    ),
)
async def absent_equals_defaults(ctx: Ctx) -> None:
    """Absent options behave exactly like ModelInfo.defaults sent explicitly (same seed, same tokens)."""
    d = ctx.info.model.defaults
    if d is None:
        ctx.check.fail("ModelInfo.defaults", "present", None)
        return
    explicit = SamplingParams(temperature=d.temperature, seed=11)
    if ctx.info.has("truncation_sampling"):
        explicit.top_p, explicit.top_k, explicit.min_p = d.top_p, d.top_k, d.min_p
    if ctx.info.has("penalties"):
        explicit.frequency_penalty, explicit.presence_penalty = d.frequency_penalty, d.presence_penalty
        explicit.repetition_penalty = d.repetition_penalty
    stopping = StoppingCriteria(max_tokens=ctx.tuning.max_tokens, ignore_eos=True)
    absent = GenerateRequest(
        request_id=ctx.uid("absent"),
        text="Once upon a time",
        sampling=SamplingParams(seed=11),
        stopping=stopping,
    )
    given = GenerateRequest(
        request_id=ctx.uid("explicit"), text="Once upon a time", sampling=explicit, stopping=stopping
    )
    a, b = (ok(ctx, r) for r in await asyncio.gather(ctx.generate(absent), ctx.generate(given)))
    ctx.check.equal(
        "tokens with options absent vs ModelInfo.defaults sent explicitly",
        outputs_tokens(a),
        outputs_tokens(b),
    )


def _repeat_case(clause: str, requirement: str) -> None:
    @case(clause, requires=(requirement,))
    async def repeat(ctx: Ctx) -> None:
        """The same request gives the same tokens, also while other requests run."""
        greedy = clause == "SAMPLE-2"

        async def body(req: GenerateRequest) -> list[Mismatch]:
            req = copy_request(req)
            sampling = req.sampling or SamplingParams()
            if greedy:
                sampling.temperature = 0.0
            else:
                sampling.temperature = sampling.temperature or 0.9
                sampling.seed = sampling.seed if sampling.seed is not None else 5
            req.sampling = sampling
            first, again = copy_request(req), copy_request(req)
            first.request_id, again.request_id = ctx.uid("a"), ctx.uid("b")
            noise = request(ctx, "Noise: unrelated prompt", temperature=1.0)
            a = await ctx.generate(first)
            b, _ = await asyncio.gather(ctx.generate(again), ctx.generate(noise))
            if not (a.ended_ok and b.ended_ok):
                return [Mismatch("both runs", "status OK", f"{a.summary()} / {b.summary()}")]
            if outputs_tokens(a) != outputs_tokens(b):
                return [
                    Mismatch("tokens of a repeated request", repr(outputs_tokens(a)), repr(outputs_tokens(b)))
                ]
            return []

        strategy = deterministic_requests(ctx.info, max_tokens=ctx.tuning.max_tokens)
        raise_outcome(ctx, await search(ctx, strategy, body, examples=max(2, ctx.tuning.examples // 2)))


_repeat_case("SAMPLE-2", "deterministic_greedy")
_repeat_case("SAMPLE-3", "seeded_sampling")


@case("SAMPLE-2", tag="n", requires=("deterministic_greedy", "max_outputs>=2"))
async def greedy_outputs_identical(ctx: Ctx) -> None:
    """The n outputs of a greedy request are identical."""
    if GREEDY_N in ctx.info.refusals:
        raise CaseSkipped(f"the server refuses {GREEDY_N} by design: {ctx.info.refusals[GREEDY_N]}")
    n = min(ctx.info.caps.max_outputs, 4)
    record = ok(
        ctx, await ctx.generate(request(ctx, "Once upon a time", temperature=0.0, n=n, ignore_eos=True))
    )
    tokens = outputs_tokens(record)
    ctx.check.that(
        len(tokens) == n and all(t == tokens[0] for t in tokens),
        f"the {n} outputs of a greedy request",
        "identical",
        tokens,
    )


@case("SAMPLE-3", tag="per-output", requires=("seeded_sampling", "max_outputs>=3"), sends=("generate.seed",))
async def output_streams_per_index(ctx: Ctx) -> None:
    """Output i samples from (seed, i): outputs 0 and 1 of n=3 equal those of n=2 with the same seed."""
    runs = await asyncio.gather(
        *(
            ctx.generate(request(ctx, "Once upon a time", temperature=1.0, seed=99, n=n, ignore_eos=True))
            for n in (2, 3)
        )
    )
    two, three = (outputs_tokens(ok(ctx, r)) for r in runs)
    ctx.check.equal("outputs 0 and 1 of n=3 vs n=2 (same seed)", two, three[:2])


@case("SAMPLE-3", tag="first-of-n", requires=("seeded_sampling", "max_outputs>=2"), sends=("generate.seed",))
async def first_output_is_the_single_one(ctx: Ctx) -> None:
    """Generated prompts, seeds and n: output 0 of an n>1 request samples what the n=1 request with
    the same seed samples, since both draw from the stream of (seed, 0)."""
    largest = min(ctx.info.caps.max_outputs, 4)
    drawn = st.tuples(prompt_texts(), st.integers(0, 2**31 - 1), st.integers(2, largest))

    async def body(drawn: tuple[str, int, int]) -> list[Mismatch]:
        text, seed, n = drawn
        runs = await asyncio.gather(
            *(
                ctx.generate(
                    request(ctx, text, temperature=1.0, seed=seed, n=k, max_tokens=ctx.tuning.max_tokens)
                )
                for k in (1, n)
            )
        )
        if not all(r.ended_ok and r.error is None for r in runs):
            return [
                Mismatch(
                    f"{text!r} with seed {seed}, n=1 and n={n}",
                    "status OK",
                    "/".join(r.summary() for r in runs),
                )
            ]
        single, several = (outputs_tokens(r) for r in runs)
        if several[:1] != single:
            return [
                Mismatch(
                    f"{text!r} with seed {seed}: output 0 of n={n} vs n=1", repr(single), repr(several[:1])
                )
            ]
        return []

    explicit = [("Once upon a time", 7, largest)]
    raise_outcome(
        ctx, await search(ctx, drawn, body, examples=max(2, ctx.tuning.examples // 2), explicit=explicit)
    )


@case("SAMPLE-4", tag="picked", requires=("seeded_sampling",))
async def picked_seed_reproduces(ctx: Ctx) -> None:
    """Without a seed the server picks one, reports it, and sending it back reproduces the tokens."""
    first = ok(ctx, await ctx.generate(request(ctx, "Once upon a time", temperature=1.0, ignore_eos=True)))
    seed = first.prompt_info.seed if first.prompt_info else 0
    again = ok(
        ctx, await ctx.generate(request(ctx, "Once upon a time", temperature=1.0, seed=seed, ignore_eos=True))
    )
    ctx.check.equal(
        f"tokens with the reported seed {seed} sent back", outputs_tokens(first), outputs_tokens(again)
    )


@case(
    "SAMPLE-4",
    tag="picked-n",
    requires=("seeded_sampling", "max_outputs>=2"),
    sends=("generate.temperature>0",),
)
async def picked_seed_reproduces_every_output(ctx: Ctx) -> None:
    """The seed the server picks for an n>1 request without one is the request's: sent back, it reproduces
    every output, not only the first."""
    n = min(ctx.info.caps.max_outputs, 3)
    prompt = "Write a story:"
    first = ok(ctx, await ctx.generate(request(ctx, prompt, temperature=1.0, n=n, ignore_eos=True)))
    seed = first.prompt_info.seed if first.prompt_info else 0
    again = ok(
        ctx, await ctx.generate(request(ctx, prompt, temperature=1.0, seed=seed, n=n, ignore_eos=True))
    )
    ctx.check.equal(
        f"the {n} outputs with the reported seed {seed} sent back",
        outputs_tokens(first),
        outputs_tokens(again),
    )


@case("SAMPLE-6", requires=("seeded_sampling", "max_outputs>=2"), sends=("generate.temperature>0",))
async def seeded_outputs_differ(ctx: Ctx) -> None:
    """With temperature > 0 and a seed the n outputs differ from each other."""
    n = min(ctx.info.caps.max_outputs, 4)
    record = ok(
        ctx,
        await ctx.generate(
            request(
                ctx,
                "Write a story:",
                temperature=1.2,
                seed=3,
                n=n,
                ignore_eos=True,
                max_tokens=max(ctx.tuning.max_tokens, 8),
            )
        ),
    )
    tokens = [tuple(t) for t in outputs_tokens(record)]
    ctx.check.that(
        len(set(tokens)) == n,
        f"the {n} outputs of a seeded request at temperature 1.2",
        "pairwise different",
        tokens,
    )


@case("SAMPLE-7", requires=("truncation_sampling", "deterministic_greedy"))
async def top_k_one_is_greedy(ctx: Ctx) -> None:
    """top_k=1 gives the greedy tokens at any temperature."""
    greedy = request(ctx, "The capital of France is", temperature=0.0, ignore_eos=True)
    top1 = request(ctx, "The capital of France is", temperature=1.5, ignore_eos=True)
    assert top1.sampling is not None
    top1.sampling.top_k = 1
    a, b = (ok(ctx, r) for r in await asyncio.gather(ctx.generate(greedy), ctx.generate(top1)))
    ctx.check.equal("tokens of top_k=1 at temperature 1.5 vs greedy", outputs_tokens(a), outputs_tokens(b))


@case(
    "SAMPLE-7",
    tag="seeded-n",
    requires=("truncation_sampling", "deterministic_greedy", "seeded_sampling"),
    sends=("generate.temperature>0",),
)
async def top_k_one_is_greedy_for_every_output(ctx: Ctx) -> None:
    """top_k=1 gives the greedy tokens in every output of an n>1 request, whatever its seed and
    temperature (other outputs than the first, and seeded sampling, take no other path)."""
    n = min(ctx.info.caps.max_outputs, 3)
    prompt = "Write a story:"
    greedy = outputs_tokens(
        ok(ctx, await ctx.generate(request(ctx, prompt, temperature=0.0, ignore_eos=True)))
    )
    for seed, temperature in ((7, 0.7), (1234, 2.0)):
        top1 = request(ctx, prompt, temperature=temperature, seed=seed, n=n, ignore_eos=True)
        assert top1.sampling is not None
        top1.sampling.top_k = 1
        got = outputs_tokens(ok(ctx, await ctx.generate(top1)))
        ctx.check.equal(
            f"the {n} outputs of top_k=1 at temperature {temperature}, seed {seed} vs greedy", greedy * n, got
        )


@case("SAMPLE-1", tag="max_tokens-default", sends=("generate.max_tokens=absent",))
async def max_tokens_default(ctx: Ctx) -> None:
    """Without max_tokens (and with ignore_eos) an output has exactly ModelInfo.defaults.max_tokens tokens."""
    defaults = ctx.info.model.defaults
    if defaults is None or not defaults.max_tokens:
        ctx.check.fail("ModelInfo.defaults.max_tokens", "present", None)
        return
    req = request(ctx, "Once upon a time", temperature=0.0, ignore_eos=True)
    assert req.stopping is not None
    req.stopping.max_tokens = None
    record = ok(ctx, await ctx.generate(req, total_s=4 * ctx.budgets.stream_s))
    for view in record.outputs().values():
        finish = view.finish
        ctx.check.equal(
            f"output {view.index}: (finish, completion_tokens) without max_tokens",
            ("LENGTH", defaults.max_tokens),
            (finish.reason.name, finish.completion_tokens) if finish else None,
        )
