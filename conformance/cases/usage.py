"""Token counts and limits (USAGE-2, USAGE-6, N-1, REQ-6, REQ-7) that need a setup of their own."""

from __future__ import annotations

import asyncio
import math
import random
import time

from grpclib.const import Status

from conformance.cases._helpers import (
    abort,
    accepted,
    expect_rejected,
    first_delta,
    ok,
    outputs_tokens,
    paused,
    resumed,
)
from conformance.harness.context import Ctx
from conformance.harness.load import idle_load
from conformance.harness.requests import request, sampled_for
from conformance.spec.registry import Variant, case
from conformance.stream.record import End, StreamRecord
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import FlushCacheRequest, GenerateRequest, SamplingParams, StoppingCriteria, TokenIds

TEXTS = (
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "日本語のテキスト",
    "🙂 emoji 🚀",
    "  spaces  ",
)
LONG_PROMPT = (
    "In the beginning the universe was created. This has made a lot of people very angry and been "
    "widely regarded as a bad move. Many were increasingly of the opinion that they had all made a big "
    "mistake in coming down from the trees in the first place."
)


@case("USAGE-2", tag="tokenize", requires=("tokenize",))
async def prompt_tokens_match_tokenize(ctx: Ctx) -> None:
    """prompt_tokens equals the number of ids Tokenize returns for the same text, once whatever n is."""
    n = min(ctx.info.caps.max_outputs, 3)
    records = await asyncio.gather(
        *(
            ctx.generate(request(ctx, t, max_tokens=1, n=n if i % 2 else None, temperature=sampled_for(n)))
            for i, t in enumerate(TEXTS)
        )
    )
    for text, record in zip(TEXTS, records, strict=True):
        ok(ctx, record)
        want = len(await ctx.tokenize(text))
        usage = record.usage
        ctx.check.equal(
            f"Usage.prompt_tokens for {text!r} (n={record.n})", want, usage.prompt_tokens if usage else None
        )


PAST_BLOCK = 16  # prompt tokens beyond a whole cache block: a block fills, and the last token is spare
LONGEST_PROBE = 1024  # where the protocol does not say how its cache keeps prompts, the longest tried


async def _sent_twice(ctx: Ctx, text: str) -> tuple[StreamRecord, StreamRecord, int, int]:
    """The same greedy request twice, one after the other: both records, the prompt's tokens and the
    cached tokens the second time."""
    first = ok(ctx, await ctx.generate(request(ctx, text, temperature=0.0, max_tokens=4)))
    again = ok(ctx, await ctx.generate(request(ctx, text, temperature=0.0, max_tokens=4)))
    usage = again.usage
    return first, again, usage.prompt_tokens if usage else 0, usage.cached_prompt_tokens if usage else 0


def _prefix_case(tag: str, text: str) -> None:
    @case("USAGE-6", tag=tag, requires=("prefix_cache",))
    async def cached(ctx: Ctx) -> None:
        """The same prompt sent again after the first request finished reports cached_prompt_tokens > 0."""
        block = ctx.info.cache_block_tokens
        first, again, prompt, hits = await _sent_twice(ctx, text)
        if prompt < 2:
            raise CaseSkipped(f"the prompt {text!r} is {prompt} token(s); the clause needs at least 2")
        if block > 1 and prompt <= block:  # the protocol says its cache keeps whole blocks
            if tag == "short":
                raise CaseSkipped(
                    f"the server's prefix cache keeps whole blocks of {block} tokens (GetServerInfo."
                    f"block_size): a {prompt}-token prompt fills none"
                )
            copies = -(-(block + PAST_BLOCK) // prompt)
            first, again, prompt, hits = await _sent_twice(ctx, " ".join([text] * copies))
        elif not hits and not block and ctx.session.protocol != "lmrpc":
            # the protocol does not say how its cache keeps prompts: learn whether it keeps whole blocks
            longer = await _shortest_cached(ctx, text, prompt)
            if longer is not None:
                raise CaseSkipped(
                    f"a repeated {prompt}-token prompt is not served from the cache and a {longer}-token one "
                    "is: the cache keeps whole blocks, which the protocol does not say the size of"
                )
        ctx.check.that(
            hits > 0,
            f"cached_prompt_tokens of a repeated {prompt}-token prompt",
            "> 0",
            hits if again.usage else None,
        )
        if ctx.info.has("deterministic_greedy"):
            ctx.check.equal(
                "tokens of the repeated greedy request", outputs_tokens(first), outputs_tokens(again)
            )

    cached.__doc__ = f"A repeated {tag} prompt is served from the prefix cache (cached_prompt_tokens > 0)."


async def _shortest_cached(ctx: Ctx, text: str, tokens: int) -> int | None:
    """The length of the shortest repeat of ``text`` served from the cache when sent twice (growing it
    fourfold up to LONGEST_PROBE tokens), or None when none was."""
    copies = 4
    while tokens * copies <= LONGEST_PROBE:
        _, _, prompt, hits = await _sent_twice(ctx, " ".join([text] * copies))
        if hits:
            return prompt
        copies *= 4
    return None


_prefix_case("long", LONG_PROMPT)
_prefix_case("short", "Hi there")


@case(
    "N-1",
    variants=[
        Variant({"n": 2}, requires=("max_outputs>=2",), sends=("generate.n>1",)),
        Variant({"n": 4}, requires=("max_outputs>=4",), sends=("generate.n>1",)),
    ],
)
async def n_outputs(ctx: Ctx) -> None:
    """An n-output request yields deltas and exactly one OutputFinished for each index 0..n-1, and no others."""
    n = int(ctx.params["n"])
    record = ok(ctx, await ctx.generate(request(ctx, "Once upon a time", n=n, temperature=1.0)))
    outputs = record.outputs()
    ctx.check.equal("output indices", list(range(n)), list(outputs))
    for index, view in outputs.items():
        ctx.check.equal(f"OutputFinished messages of output {index}", 1, len(view.finishes))
        ctx.check.that(bool(view.deltas), f"TokenDeltas of output {index}", ">= 1", 0)


async def _prefill_s(ctx: Ctx, tokens: int, first_id: int) -> float:
    """Seconds a ``tokens``-long prompt takes to its first (only) token; distinct ids defeat prefix caching."""
    ids = [first_id + i % 512 for i in range(tokens)]
    req = GenerateRequest(
        request_id=ctx.uid("prefill"), token_ids=TokenIds(ids=ids), stopping=StoppingCriteria(max_tokens=1)
    )
    started = time.monotonic()
    ok(ctx, await ctx.generate(req, total_s=2 * ctx.budgets.stream_s), f"a {tokens}-token prompt")
    return time.monotonic() - started


@case("REQ-6", tag="default-lowered", requires=("token_ids_input",), budget=3.0, exclusive=True)
async def default_max_tokens_lowered(ctx: Ctx) -> None:
    """Without max_tokens, a prompt one token short of the window is accepted and generates at most 1 token.
    Prefilling a whole window is the most expensive request the harness makes: it runs alone, sized from
    the prefill rate measured at 1/8 and 1/4 of the window on this machine, now: it runs when twice the
    predicted time fits what is left of the case's budget (and may then use all of it), else SKIP,
    naming the --time-scale that would include it."""
    started = time.monotonic()
    window = ctx.info.max_context
    budget = ctx.budgets.case_s(3.0) - 2 * ctx.budgets.rpc_s  # this case's budget, less a margin to report
    low = random.randrange(max(ctx.info.vocab_size - 700, 1))  # a fresh prompt: a prefix cache must not help
    t8 = await _prefill_s(ctx, window // 8, low)
    t4 = await _prefill_s(ctx, window // 4, low + 50)
    growth = 2 ** max(1.0, math.log2(max(t4, 1e-3) / max(t8, 1e-3)))
    predicted = 2 * t4 * growth**2  # growth per doubling only rises with length: a margin of 2
    left = budget - (time.monotonic() - started)
    if 2 * predicted > left:  # another 2x for a machine that gets busier while it runs
        needed = ctx.budgets.scale * (2 * predicted + (budget - left)) / budget
        raise CaseSkipped(
            f"a {window - 1}-token prompt would take ~{predicted:.0f}s to prefill here (1/8 window: {t8:.1f}s, "
            f"1/4: {t4:.1f}s); --time-scale {needed:.1f} or more includes this case"
        )
    prompt = [low + 100 + i % 512 for i in range(window - 1)]  # one token of room: the boundary
    req = GenerateRequest(
        request_id=ctx.uid(), token_ids=TokenIds(ids=prompt), sampling=SamplingParams(temperature=0.0)
    )
    record = ok(ctx, await ctx.generate(req, total_s=left), f"a {window - 1}-token prompt without max_tokens")
    ctx.note(f"prefill predicted ~{predicted:.0f}s, took {record.duration_s:.0f}s (allowed {left:.0f}s)")
    generated = len(record.outputs()[0].token_ids) if 0 in record.outputs() else 0
    ctx.check.that(generated <= 1, "tokens generated", "<= 1 (what the window leaves)", generated)


@case("REQ-7", requires=("token_ids_input",))
async def never_fits(ctx: Ctx) -> None:
    """A request whose n outputs can never fit the KV cache fails with RESOURCE_EXHAUSTED."""
    total = (await ctx.load()).kv_tokens_total
    n, window = ctx.info.caps.max_outputs, ctx.info.max_context
    prompt = 8
    need = prompt + n * (window - prompt)
    if not total or need <= total:
        raise CaseSkipped(f"every request fits: n={n} x window={window} needs {need} of {total} KV slots")
    req = GenerateRequest(
        request_id=ctx.uid(),
        token_ids=TokenIds(ids=[1] * prompt),
        sampling=SamplingParams(n=n, temperature=sampled_for(n)),
        stopping=StoppingCriteria(max_tokens=window - prompt, ignore_eos=True),
    )
    expect_rejected(
        ctx, await ctx.answer(req), (Status.RESOURCE_EXHAUSTED,), f"n={n} outputs of {window} tokens"
    )


@case("USAGE-7", tag="after-flush", requires=("admin", "prefix_cache"), exclusive=True)
async def cold_prompt_uncached(ctx: Ctx) -> None:
    """The first request after FlushCache (nothing in flight) reports cached_prompt_tokens = 0."""
    await ctx.call(ctx.control.flush_cache, FlushCacheRequest())
    record = ok(ctx, await ctx.generate(request(ctx, LONG_PROMPT, temperature=0.0, max_tokens=2)))
    usage = record.usage
    ctx.check.equal(
        "Usage.cached_prompt_tokens of the first prompt after FlushCache",
        0,
        usage.cached_prompt_tokens if usage else None,
    )


FRESH_DRAWS = 3  # a correct server reports cached tokens for all three with odds of about 1e-6


@case("USAGE-7", tag="fresh-prompt", requires=("prefix_cache", "token_ids_input"))
async def fresh_prompt_uncached(ctx: Ctx) -> None:
    """A prompt of random token ids from the middle of the vocabulary reports cached_prompt_tokens = 0,
    without any FlushCache (and no admin role). An earlier prompt may share its first token by chance
    (about 1 in 100 here, token by token caches): of three fresh prompts, one must report 0."""
    draw = random.Random(ctx.uid())
    reported: list[tuple[int, int | None]] = []
    for _ in range(FRESH_DRAWS):
        req = _fresh_prompt(ctx, draw)
        usage = ok(ctx, await ctx.generate(req)).usage
        first = req.token_ids.ids[0] if req.token_ids else -1
        reported.append((first, usage.cached_prompt_tokens if usage else None))
        if reported[-1][1] == 0:
            return
    ctx.check.fail(
        f"Usage.cached_prompt_tokens of {FRESH_DRAWS} fresh random prompts",
        "0 for at least one",
        "; ".join(f"{cached} (first token {first})" for first, cached in reported),
    )


def _fresh_prompt(ctx: Ctx, draw: random.Random) -> GenerateRequest:
    """32 random token ids from the middle of the vocabulary: a prompt no cache holds (USAGE-7)."""
    vocab = ctx.info.vocab_size
    ids = [draw.randrange(vocab // 4, max(3 * vocab // 4, vocab // 4 + 1)) for _ in range(32)]
    return GenerateRequest(
        request_id=ctx.uid(),
        token_ids=TokenIds(ids=ids),
        sampling=SamplingParams(temperature=0.0),
        stopping=StoppingCriteria(max_tokens=2),
    )


@case(
    "USAGE-7",
    tag="never-ran",
    requires=("admin", "prefix_cache", "token_ids_input"),
    exclusive=True,
    sends=("scenario.abort-all-while-waiting",),
)
async def fresh_prompt_aborted_while_waiting(ctx: Ctx) -> None:
    """Fresh prompts aborted while generation is paused (they never ran a step) report
    cached_prompt_tokens = 0 too: the rule holds for requests that end before their first token, not
    only for those that ran. Of three, one must report 0, as in USAGE-7[fresh-prompt]."""
    draw = random.Random(ctx.uid())
    await paused(ctx)
    try:
        streams = [ctx.open(_fresh_prompt(ctx, draw)) for _ in range(FRESH_DRAWS)]
        for stream in streams:
            await accepted(ctx, stream)
        await abort(ctx, *(s.record.request_id for s in streams))
    finally:
        await resumed(ctx)
    reported = []
    for stream in streams:
        record = await stream.finish(ctx.budgets.release_s)
        if not record.ended_ok or record.usage is None:
            continue  # how an aborted request ends is ABORT-2's business
        reported.append(record.usage.cached_prompt_tokens)
    if reported and 0 not in reported:
        ctx.check.fail(
            f"Usage.cached_prompt_tokens of {len(reported)} fresh random prompts aborted before they ran",
            "0 for at least one",
            ", ".join(map(str, reported)),
        )


def _window_request(ctx: Ctx, extra: int) -> GenerateRequest:
    prompt = [ctx.info.vocab_size - 1 - i for i in range(4)]
    return GenerateRequest(
        request_id=ctx.uid(),
        token_ids=TokenIds(ids=prompt),
        stopping=StoppingCriteria(max_tokens=ctx.info.max_context - len(prompt) + extra, ignore_eos=True),
    )


@case("REQ-6", tag="exact-fit", requires=("token_ids_input",), sends=("generate.token_ids",))
async def window_exact_fit(ctx: Ctx) -> None:
    """A 4-token prompt with max_tokens = max_context_tokens - 4 fits exactly and is accepted."""
    if ctx.info.kv_tokens_total and ctx.info.kv_tokens_total < ctx.info.max_context:
        raise CaseSkipped(
            f"a whole window ({ctx.info.max_context}) exceeds the KV cache ({ctx.info.kv_tokens_total})"
        )
    stream = ctx.open(_window_request(ctx, 0))
    event = await stream.next(ctx.budgets.prompt_s)
    ctx.check.that(
        event is not None and event.kind == "prompt_info",
        "a request that fills the context window exactly",
        "accepted (a PromptInfo)",
        stream.record.summary(),
    )
    await ctx.cancel(stream)


@case("REQ-6", tag="one-over", requires=("token_ids_input",))
async def window_one_over(ctx: Ctx) -> None:
    """A 4-token prompt with max_tokens = max_context_tokens - 3 is INVALID_ARGUMENT."""
    expect_rejected(
        ctx,
        await ctx.answer(_window_request(ctx, 1)),
        (Status.INVALID_ARGUMENT,),
        "one token over the window",
    )


@case(
    "REQ-7",
    tag="waits-for-capacity",
    requires=("token_ids_input", "max_outputs>=2"),
    exclusive=True,
    sends=("scenario.wait-for-capacity",),
)
async def waits_for_capacity(ctx: Ctx) -> None:
    """Two requests that each need more than half of the KV cache: the second is accepted and waits (it
    never fails for that reason), and runs once the first is aborted."""
    total, window = ctx.info.kv_tokens_total, ctx.info.max_context
    max_tokens = window - 8
    n = math.ceil(0.6 * total / max_tokens) if total else 0
    if not total or n > ctx.info.caps.max_outputs or 8 + n * max_tokens > total:
        raise CaseSkipped(f"cannot size a request to 60% of {total} KV tokens with windows of {window}")
    await idle_load(ctx)

    def big(tag: str) -> GenerateRequest:
        prompt = [ctx.info.vocab_size - 10 - i for i in range(8)]
        return GenerateRequest(
            request_id=ctx.uid(tag),
            token_ids=TokenIds(ids=prompt),
            sampling=SamplingParams(n=n, temperature=sampled_for(n)),
            stopping=StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        )

    first = ctx.open(big("first"))
    await first_delta(ctx, first)
    second = ctx.open(big("second"))
    await accepted(ctx, second)
    ctx.check.that(
        second.record.end is End.OPEN,
        f"a request needing {8 + n * max_tokens} of {total} KV tokens while another holds as much",
        "accepted and waiting",
        second.record.summary(),
    )
    await abort(ctx, first.record.request_id)
    await first.finish(ctx.budgets.release_s)
    await first_delta(ctx, second)  # it runs once the capacity is free
    await abort(ctx, second.record.request_id)
    await second.finish(ctx.budgets.release_s)
