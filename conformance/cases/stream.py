"""The stream clauses (STREAM-*, FINISH-*, USAGE-1..5, N-1/2, REQ-2, ERR-2, SAMPLE-4, TOK-1): each
validated on the shared stream pool, plus dedicated cases where a clause needs a setup of its own."""

from __future__ import annotations

import asyncio

from conformance.cases._helpers import accepted, ok
from conformance.cases._learned import DETERMINISTIC, learn, rerun, sendable, token_starts
from conformance.harness.context import Ctx
from conformance.harness.facts import gather_facts
from conformance.harness.requests import long_request, request, sampled_for
from conformance.search.pool import check_on_pool, copy_request
from conformance.search.property import raise_outcome, search
from conformance.search.strategies import deterministic_requests
from conformance.spec.registry import case
from conformance.stream.record import StreamRecord
from conformance.validators import STREAM_CLAUSES, validate
from conformance.vocabulary import CaseSkipped, Mismatch
from lmrpc.v1 import GenerateRequest, ResponseOptions, SamplingParams

POOL_SENDS = {  # what the pool's fixed sentinels send, declared on the clause that needs it
    "STREAM-7": ("generate.return_logprobs", "generate.logprobs-without-token_ids"),
    "STREAM-8": ("generate.final_only",),
    "STREAM-10": ("generate.return_text=false", "generate.return_token_ids=false"),
}
POOL_REQUIRES = {
    "STREAM-4": ("tokenize",),
    "STREAM-7": ("logprobs",),
    "STREAM-8": ("final_only",),
    "TOK-1": ("tokenize",),
}


def _pool_case(clause: str) -> None:
    async def body(ctx: Ctx) -> None:
        await check_on_pool(ctx, clause)

    body.__doc__ = f"Every stream of the pool (generated requests, run concurrently) satisfies {clause}."
    body.__module__ = __name__
    case(clause, requires=POOL_REQUIRES.get(clause, ()), budget=1.5, sends=POOL_SENDS.get(clause, ()))(body)


for _clause in STREAM_CLAUSES:
    _pool_case(_clause)


def _outcome(record: StreamRecord) -> list[tuple[list[int], str, str]]:
    return [
        (v.token_ids, v.text, v.finish.reason.name if v.finish else "-") for v in record.outputs().values()
    ]


def _final_only_equal(kind: str) -> None:
    @case(
        "STREAM-8",
        tag=kind,
        requires=("final_only", "deterministic_greedy" if kind == "greedy" else "seeded_sampling"),
    )
    async def equal(ctx: Ctx) -> None:
        """A final_only request gives exactly the streamed request's outputs (greedy or seeded)."""

        async def body(req: GenerateRequest) -> list[Mismatch]:
            req = copy_request(req)
            sampling = req.sampling or SamplingParams()
            if kind == "greedy":
                sampling.temperature, sampling.seed = 0.0, None
            elif sampling.seed is None:
                sampling.seed = 7
            req.sampling = sampling
            streamed = copy_request(req)
            streamed.request_id = ctx.uid("streamed")
            streamed.response = streamed.response or ResponseOptions()
            streamed.response.final_only = False
            final = copy_request(streamed)
            final.request_id = ctx.uid("final")
            final.response = final.response or ResponseOptions()
            final.response.final_only = True
            a, b = await asyncio.gather(ctx.generate(streamed), ctx.generate(final))
            if not (a.ended_ok and b.ended_ok):
                return [Mismatch("both calls", "status OK", f"{a.summary()} / {b.summary()}")]
            if _outcome(a) != _outcome(b):
                return [
                    Mismatch("final_only outputs (ids, text, reason)", repr(_outcome(a)), repr(_outcome(b)))
                ]
            return []

        strategy = deterministic_requests(ctx.info, max_tokens=ctx.tuning.max_tokens)
        raise_outcome(ctx, await search(ctx, strategy, body, examples=max(2, ctx.tuning.examples // 2)))


_final_only_equal("greedy")
_final_only_equal("seeded")


@case("STREAM-5", tag="multibyte", requires=("tokenize",))
async def multibyte_text(ctx: Ctx) -> None:
    """Prompts in scripts with multi-byte characters: every text delta is well-formed UTF-8, and no delta
    holds back more than an incomplete character (or the longest end of the text that could begin a
    stop string)."""
    prompts = [
        "日本語で長い文章を書いてください。",
        "🙂🚀🎉 emoji story:",
        "Ελληνικά: γράψε μια ιστορία",
        "한국어로 대답해 주세요",
    ]
    # Greedy first: at temperature 1 a small model often emits byte sequences that are not UTF-8 at all,
    # and a U+FFFD that Detokenize also shows proves nothing about holding incomplete characters back.
    greedy = ctx.info.has("deterministic_greedy")
    seeded = ctx.info.has("seeded_sampling")
    records = await asyncio.gather(
        *(
            ctx.generate(
                request(
                    ctx,
                    p,
                    temperature=0.0 if greedy and i < 3 else 1.0,
                    seed=i if seeded else None,
                    max_tokens=ctx.tuning.max_tokens * 2,
                )
            )
            for i, p in enumerate(prompts)
        )
    )
    for record in records:
        ctx.check.extend(validate(ok(ctx, record), await gather_facts(ctx, record), ["STREAM-5"]))
        # holding whole characters back is the fault multi-byte text invites (STREAM-11)
        ctx.check.extend((await holdback_mismatches(ctx, record, []))[0])


def _every_utf8_byte() -> list[str]:
    """Short texts that together hold every byte a UTF-8 text can hold beyond ASCII: each continuation
    byte (0x80-0xBF, as the second byte of U+0100-U+013F) and each lead byte (0xC2-0xF4)."""
    continuation = "".join(chr(0x100 + k) for k in range(64))
    two_byte_leads = "".join(chr(((lead - 0xC0) << 6) | 0x21) for lead in range(0xC2, 0xE0))
    three_byte_leads = "अက€あ一字文空語道가나어한\ue000！"  # lead bytes 0xE0-0xEF, in order
    four_byte_leads = "🙂\U00040000\U00080000\U000e0041\U00100000"  # lead bytes 0xF0-0xF4
    text = continuation + two_byte_leads + three_byte_leads + four_byte_leads
    return [text[i : i + 12] for i in range(0, len(text), 12)]


@case("STREAM-5", tag="every-byte", requires=("tokenize",))
async def every_utf8_byte(ctx: Ctx) -> None:
    """Prompts holding every non-ASCII byte UTF-8 allows: the text of each output is its tokens' text, byte
    for byte (a model that echoes its prompt, like most do at temperature 0, sends each of them back)."""
    greedy = 0.0 if ctx.info.has("deterministic_greedy") else None
    texts = _every_utf8_byte()
    records = await asyncio.gather(
        *(ctx.generate(request(ctx, t, temperature=greedy, ignore_eos=True, max_tokens=48)) for t in texts)
    )
    for record in records:
        ctx.check.extend(validate(ok(ctx, record), await gather_facts(ctx, record), ["STREAM-4", "STREAM-5"]))


@case("STREAM-6", tag="concurrent", requires=("deterministic_greedy",))
async def no_cross_talk(ctx: Ctx) -> None:
    """Greedy requests run concurrently give exactly what each gives alone: no event crosses streams."""
    prompts = [
        "Hello",
        "The capital of France is",
        "def add(a, b):",
        "1, 2, 3,",
        "Once upon a time",
        "Réponds :",
    ]
    alone = [ok(ctx, await ctx.generate(request(ctx, p, temperature=0.0))) for p in prompts[:3]]
    n = min(ctx.info.caps.max_outputs, 2)
    together = await asyncio.gather(
        *(ctx.generate(request(ctx, p, temperature=0.0)) for p in prompts[:3]),
        # beside them, requests of several outputs: sampled, their ids still cross no stream
        *(ctx.generate(request(ctx, p, n=n, temperature=sampled_for(n))) for p in prompts[3:]),
    )
    for i, record in enumerate(together[:3]):
        ok(ctx, record)
        want = alone[i].outputs()[0].token_ids
        for view in record.outputs().values():
            ctx.check.equal(
                f"tokens of {prompts[i]!r} (output {view.index}) run concurrently vs alone",
                want,
                view.token_ids,
            )
    ids = {r.request_id for r in together}
    for record in together:
        ctx.check.extend(
            validate(record, await gather_facts(ctx, record, ids - {record.request_id}), ["STREAM-6"])
        )


@case("REQ-2", tag="server-assigned", sends=("generate.request_id=empty",))
async def server_assigned_ids(ctx: Ctx) -> None:
    """Empty request ids: the server assigns one per request, unique among those in flight, on every message."""
    streams = [ctx.open(long_request(ctx, request_id="")) for _ in range(3)]
    for stream in streams:
        await accepted(ctx, stream)
    assigned = [s.events[0].message.request_id for s in streams]
    ctx.check.that(all(assigned), "server-assigned request ids", "non-empty", assigned)
    ctx.check.that(
        len(set(assigned)) == len(assigned), "ids of 3 requests in flight together", "distinct", assigned
    )
    for stream in streams:
        for _ in range(3):
            await stream.next(ctx.budgets.prompt_s)
        await ctx.cancel(stream)
        seen = sorted({e.message.request_id for e in stream.events})
        ctx.check.that(
            len(seen) == 1 and seen[0] != "", "ids on one stream", "one non-empty id on every message", seen
        )


NEVER_MATCHES = "§ never §"  # a stop string no model writes: only its first character may be held back


def _needless_holdback(text_so_far: str, tokens_text: str, stops: list[str]) -> str | None:
    """What a delta kept back beyond STREAM-11's allowance (None: nothing). ``tokens_text`` is
    Detokenize of the output's tokens so far."""
    complete = tokens_text.rstrip("\ufffd")  # an incomplete character renders as U+FFFD: may be held
    if not complete.startswith(text_so_far):
        return None  # text ahead of its tokens, or a tokenizer whose prefixes decode differently: STREAM-4's
    kept = complete[len(text_so_far) :]
    if not kept or any(len(kept) < len(stop) and stop.startswith(kept) for stop in stops):
        return None
    return kept


async def holdback_mismatches(ctx: Ctx, record: StreamRecord, stops: list[str]) -> tuple[list[Mismatch], int]:
    """STREAM-11 on one stream whose request left skip_special_tokens unset (true, SAMPLE-8): after each
    delta but the last (which may end at a stop match that cuts the text), the output's text is all its
    tokens' text but an incomplete character or a stop-string prefix. Returns the mismatches (one per
    output at most) and how many deltas were looked at."""
    found: list[Mismatch] = []
    looked = 0
    for view in record.outputs().values():
        ids: list[int] = []
        text = ""
        for delta in view.deltas[:-1]:
            ids.extend(delta.token_ids)
            text += delta.text
            kept = _needless_holdback(text, await ctx.detokenize(ids, True), stops)
            looked += 1
            if kept is not None:
                found.append(
                    Mismatch(
                        f"text of output {view.index} after {len(ids)} tokens (stop strings {stops!r})",
                        "all of its tokens' text but an incomplete character or a stop-string prefix",
                        f"{kept!r} kept back",
                    )
                )
                break
    return found, looked


@case("STREAM-11", requires=("tokenize",), sends=("generate.stop_strings>1",))
async def no_needless_holdback(ctx: Ctx) -> None:
    """Each delta brings all the text of its tokens but an incomplete character and a possible stop-string
    prefix: with no stop string, and with stop strings that keep almost nothing back."""
    greedy = 0.0 if ctx.info.has("deterministic_greedy") else None
    prompt = "Write three sentences about the sea, the wind and the boats."
    stop_lists: list[list[str]] = [[]] + (
        [[NEVER_MATCHES, "e§", " the§"]] if ctx.info.has("stop_strings") else []
    )
    records = await asyncio.gather(
        *(
            ctx.generate(
                request(
                    ctx, prompt, temperature=greedy, ignore_eos=True, stop_strings=stops,
                    max_tokens=ctx.tuning.max_tokens * 2,
                )
            )
            for stops in stop_lists
        )
    )  # fmt: skip
    checked = 0
    for stops, record in zip(stop_lists, records, strict=True):
        found, looked = await holdback_mismatches(ctx, ok(ctx, record), stops)
        ctx.check.extend(found)
        checked += looked
    if not checked:
        raise CaseSkipped(
            "every output came in one delta (the server merged them, STREAM-9): nothing held back to see"
        )


def _stop_ending_a_token(text: str, starts: list[int]) -> tuple[str, int]:
    """A 2-character stop string made of the end of token k's text (k not the last token), first found
    there, and k."""
    for k in range(1, len(starts) - 1):
        end = starts[k + 1]
        stop = text[end - 2 : end] if end >= 2 else ""
        if len(stop) == 2 and stop.strip() and sendable(stop) and text.find(stop) == end - 2:
            return stop, k
    raise CaseSkipped(f"no token of the learned output {text!r} ends with 2 characters first found there")


@case(
    "STREAM-11",
    tag="before-min-tokens",
    requires=("stop_strings", "tokenize", DETERMINISTIC),
    sends=("scenario.stop-before-min-tokens",),
)
async def no_holdback_of_an_early_occurrence(ctx: Ctx) -> None:
    """A stop-string occurrence completed before the min_tokens-th token is ordinary text (STOP-2), and no
    longer a prefix of anything to come: it is not kept back either, also when it ends exactly where its
    token's text ends. Each delta brings all its tokens' text but an incomplete character and a proper
    stop-string prefix."""
    learned = await learn(ctx)
    starts = await token_starts(ctx, learned.token_ids)
    stop, completing = _stop_ending_a_token(learned.text, starts)
    minimum = completing + 2  # the occurrence is completed by token `completing` (0-based)
    record, _ = await rerun(ctx, stop_strings=[stop], min_tokens=minimum, ignore_eos=True)
    found, looked = await holdback_mismatches(ctx, record, [stop])
    ctx.check.extend(found)
    if not looked:
        raise CaseSkipped("the output came in one delta (the server merged them, STREAM-9): nothing to see")
