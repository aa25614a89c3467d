"""Cases that compare answers with each other: a stream with the same request not streamed (STREAM-2,
FINISH-2, STREAM-5), concurrent streams with their requests alone (STREAM-6), and the sampling
clauses (SAMPLE-1, 2, 3, 6).

Comparing two calls needs greedy decoding to repeat. OpenAI's API does not promise that, so these
cases run only where the harness saw it repeat when it connected (or ``--assume
deterministic_greedy``), and they run alone, one call after the other, so that no other request
shares a batch with them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from hypothesis import Phase

from conformance.cases.openai._common import (
    answered,
    answered_unless_refused,
    apis,
    common_prefix,
    make,
    openai_case,
    support,
)
from conformance.cases.openai.pool import request_repro
from conformance.drivers.openai.exchange import Api, OpenAIRequest
from conformance.drivers.openai.support import Support
from conformance.harness.context import Ctx
from conformance.harness.session import Session
from conformance.search.openai import openai_requests
from conformance.search.property import profile, run_property, search
from conformance.spec.clauses import SHOULD
from conformance.validators.openai import LOGPROB_SLACK, Answer
from conformance.vocabulary import CaseFailed, CaseSkipped, Mismatch, mismatch

PAIRS = "openai-pairs"
MULTIBYTE = ("日本語で答えてください。", "Emoji test 🙂🚀", "Ελληνικά κείμενα", "Réponds en français :")
# Options a server streams through another path (a logprob per token, a stop-string holdback, a
# tool or format parser, several choices): each is asked on purpose, over prompts whose characters
# span tokens, so text lost on one path alone is found by design, not by a drawn request's luck.
STREAMING_PATHS = ("logprobs", "top_logprobs", "stop", "tools", "response_format")
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
DISTINCT = ("1, 2, 3, 4,", "The capital of France is", "def add(a, b):", "Once upon a time", "Dear Sir,")


@dataclass(frozen=True, slots=True)
class Pair:
    whole: Answer  # not streamed
    streamed: Answer


def difference(stream: str, whole: str) -> str:
    """How a stream's text differs from the non-streamed one: ``equal``; ``lost-tail`` (a proper
    prefix: its last tokens lost, FINISH-2); ``split-character`` (a character broken into U+FFFD
    across chunks, STREAM-5); ``differs`` (anything else: a repeat, a cumulative text, STREAM-2)."""
    if stream == whole:
        return "equal"
    if whole.startswith(stream):
        return "lost-tail"
    if "\ufffd" in stream and "\ufffd" not in whole:
        return "split-character"
    return "differs"


JUDGED = {"STREAM-2": "differs", "FINISH-2": "lost-tail", "STREAM-5": "split-character"}


def path_options(request: OpenAIRequest) -> str:
    """The options of ``request`` that change a server's streaming path (``STREAMING_PATHS``), as
    a label: a finding says which path lost the text."""
    body = request.body
    found = [name for name in STREAMING_PATHS if body.get(name) not in (None, False, [], {})]
    return f" ({', '.join(found)})" if found else ""


def judge_pair(pair: Pair, clause: str) -> list[Mismatch]:
    out = []
    request = pair.whole.request
    whole, streamed = pair.whole.view.texts(), pair.streamed.view.texts()
    for index in sorted(set(whole) | set(streamed)):
        found = difference(streamed.get(index, ""), whole.get(index, ""))
        if found == JUDGED[clause]:
            out.append(
                mismatch(
                    f"{request.api} n={request.n}{path_options(request)}: choice {index} streamed ({found}) "
                    "vs not streamed",
                    repr(whole.get(index, "")),  # quoted: the fingerprint blanks the model's text
                    repr(streamed.get(index, "")),
                )
            )
    return out


async def pair_of(ctx: Ctx, request: OpenAIRequest) -> Pair | None:
    """The request not streamed and streamed; None when the server refuses either."""
    plain = request.with_body(stream=None, stream_options=None)
    optional = any(request.body.get(option) is not None for option in STREAMING_PATHS)
    whole = await answered_unless_refused(ctx, plain, "the request not streamed", unimplemented=optional)
    if whole is None:
        return None
    streamed = await answered_unless_refused(
        ctx, request.with_body(stream=True), "the request streamed", unimplemented=optional
    )
    return Pair(whole, streamed) if streamed is not None else None


def pair_requests(session: Session) -> list[OpenAIRequest]:
    found = session.http.support
    out = []
    for api in found.apis():
        if not found.has(api, "stream"):
            continue
        n = 2 if found.has(api, "greedy_n") else None
        for prompt in MULTIBYTE:
            out.append(make(api, prompt, temperature=0, max_tokens=session.tuning.max_tokens, n=n))
        if found.has(api, "stop"):
            out.append(
                make(
                    api,
                    "Once upon a time",
                    temperature=0,
                    max_tokens=session.tuning.max_tokens,
                    stop=[" the", "."],
                )
            )
        out += path_requests(found, api, session.tuning.max_tokens)
    if any(found.has(api, "stream") for api in found.apis()):
        drawn: list[OpenAIRequest] = []
        strategy = openai_requests(found, session.tuning.max_tokens, greedy=True)
        config = profile(session.profile, session.tuning.examples, phases=[Phase.generate])
        run_property(strategy, drawn.append, config, session.seed)
        out += [r for r in drawn if found.has(r.api, "stream")]
    return out


def path_requests(found: Support, api: Api, max_tokens: int) -> list[OpenAIRequest]:
    """Each streaming path's option (``STREAMING_PATHS``) once, on a prompt whose characters span
    tokens (the first two of ``MULTIBYTE`` in turn, so each script meets several paths), where the
    server takes it (one it refuses is skipped by the pair, never judged)."""
    options: list[dict[str, Any]] = []
    if found.has(api, "logprobs"):
        options += [{"logprobs": True} if api == "chat" else {"logprobs": 0}]
        options += [{"logprobs": True, "top_logprobs": 3} if api == "chat" else {"logprobs": 3}]
    if found.has(api, "stop"):
        options.append({"stop": ["\n\n\n"]})  # never met: only the holdback path is exercised
    if api == "chat":
        options.append({"tools": [WEATHER_TOOL], "tool_choice": "none"})  # text through the tool parser
        options.append({"response_format": {"type": "json_object"}})
    n = 2 if found.has(api, "greedy_n") else None
    return [
        make(api, MULTIBYTE[i % 2], temperature=0, max_tokens=max_tokens, n=n, **option)
        for i, option in enumerate(options)
    ]


async def build_pairs(session: Session) -> list[Pair]:
    ctx = Ctx(session, PAIRS, {})
    try:
        requests = await asyncio.to_thread(pair_requests, session)
        pairs = [await pair_of(ctx, r) for r in requests]  # one at a time: nothing shares their batch
        return [p for p in pairs if p is not None]
    finally:
        await ctx.close()


def _pair_case(clause: str) -> None:
    async def body(ctx: Ctx) -> None:
        support(ctx).need_determinism()
        apis(ctx, "stream")
        pairs: list[Pair] = await ctx.session.shared(PAIRS, lambda: build_pairs(ctx.session))
        failures = [(p, found) for p in pairs if (found := judge_pair(p, clause))]
        ctx.note(f"{len(pairs)} greedy requests compared streamed and not, {len(failures)} violate {clause}")
        if not failures:
            return

        async def example(request: OpenAIRequest) -> list[Mismatch]:
            pair = await pair_of(ctx, request) if support(ctx).has(request.api, "stream") else None
            return judge_pair(pair, clause) if pair is not None else []

        strategy = openai_requests(support(ctx), ctx.tuning.max_tokens, greedy=True)
        outcome = await search(ctx, strategy, example)
        pair, found = failures[0]
        shown = outcome.last_failing if not outcome.passed else pair.whole.request
        mismatches = outcome.mismatches if not outcome.passed else found
        assert isinstance(shown, OpenAIRequest)
        ctx.repro = request_repro(
            ctx, [shown.with_body(stream=None), shown.with_body(stream=True)], mismatches, repr(shown)
        )
        raise CaseFailed(mismatches)

    body.__doc__ = (
        "Greedy requests (generated, and multi-byte prompts) give the same text per choice streamed and "
        f"not; {clause} judges a difference of kind {JUDGED[clause]!r}."
    )
    body.__module__ = __name__
    openai_case(clause, tag="greedy", exclusive=True, budget=3.0)(body)


for _clause in JUDGED:
    _pair_case(_clause)


@openai_case("STREAM-6", exclusive=True, budget=2.0)
async def no_cross_talk(ctx: Ctx) -> None:
    """Concurrent greedy streams each carry their own request's text under ids of their own: each is
    what its request gives alone, or at least closer to that than to any other's."""
    support(ctx).need_determinism()
    api = "completions" if "completions" in apis(ctx, "stream") else apis(ctx, "stream")[0]
    count = max(2, min(ctx.http.target.parallel, len(DISTINCT)))
    requests = [make(api, p, temperature=0, max_tokens=ctx.tuning.max_tokens) for p in DISTINCT[:count]]
    alone = [(await answered(ctx, r, "alone")).view.texts().get(0, "") for r in requests]
    together = await asyncio.gather(
        *(answered(ctx, r.with_body(stream=True), "concurrently") for r in requests)
    )
    ids = [a.view.ids[0] if a.view.ids else None for a in together]
    ctx.check.that(len(set(map(repr, ids))) == len(ids), "ids of the concurrent streams", "distinct", ids)
    for i, answer in enumerate(together):
        text = answer.view.texts().get(0, "")
        if text == alone[i]:
            continue
        own = common_prefix(text, alone[i])
        closer = [j for j in range(len(requests)) if j != i and common_prefix(text, alone[j]) > own]
        if closer:
            ctx.check.add(
                f"stream {i} ({requests[i].body.get('prompt', '')!r}) run concurrently",
                f"its own text {alone[i]!r}",
                f"{text!r}, closer to request {closer[0]}'s {alone[closer[0]]!r}",
            )
        else:
            ctx.note(f"stream {i} differs from its text alone after {own} characters (batch variance?)")


@openai_case("SAMPLE-1", tag="greedy-is-argmax")
async def greedy_is_argmax(ctx: Ctx) -> None:
    """With temperature 0 every chosen token is the most likely one: its logprob is the first and
    highest of its top_logprobs."""
    for api in apis(ctx, "logprobs"):
        top = {"logprobs": True, "top_logprobs": 3} if api == "chat" else {"logprobs": 3}
        answer = await answered(ctx, make(api, temperature=0, max_tokens=ctx.tuning.max_tokens, **top))
        for index, choice in sorted(answer.view.choices.items()):
            for position, entry in enumerate(choice.entries):
                best = max((v for _, v in entry.top), default=None)
                if best is not None and entry.logprob is not None and entry.logprob < best - LOGPROB_SLACK:
                    ctx.check.add(
                        f"{api} temperature=0: choice {index} token {position} {entry.token!r}",
                        f"the most likely token (logprob {best})",
                        f"logprob {entry.logprob}, alternatives {entry.top}",
                    )
                    break


async def _same_every_time(ctx: Ctx, request: OpenAIRequest, runs: int, what: str) -> None:
    texts = [(await answered(ctx, request)).view.texts() for _ in range(runs)]
    ctx.check.that(all(t == texts[0] for t in texts), what, f"the same text {runs} times", texts)


@openai_case("SAMPLE-2", exclusive=True, level=SHOULD)
async def greedy_repeats(ctx: Ctx) -> None:
    """The same greedy request gives the same text every time, and the n choices of a greedy request
    are equal (OpenAI's API leaves determinism open: SHOULD)."""
    for api in support(ctx).apis():
        await _same_every_time(
            ctx, make(api, temperature=0, max_tokens=ctx.tuning.max_tokens), 3, f"{api} greedy"
        )
        if support(ctx).has(api, "greedy_n"):
            texts = (
                await answered(ctx, make(api, temperature=0, max_tokens=ctx.tuning.max_tokens, n=2))
            ).view.texts()
            ctx.check.that(len(set(texts.values())) == 1, f"{api} greedy n=2 choices", "equal", texts)


@openai_case("SAMPLE-3", exclusive=True, level=SHOULD)
async def seed_repeats(ctx: Ctx) -> None:
    """The same seed gives the same text (``seed`` is best effort in OpenAI's API: SHOULD)."""
    for api in apis(ctx, "seed"):
        request = make(api, "Once upon a time", temperature=1.0, seed=1234, max_tokens=ctx.tuning.max_tokens)
        await _same_every_time(ctx, request, 2, f"{api} temperature=1 seed=1234")


@openai_case("SAMPLE-6", level=SHOULD)
async def choices_differ(ctx: Ctx) -> None:
    """With temperature 1 the n choices of a request differ (for at least one of three prompts)."""
    for api in apis(ctx, "n"):
        seen = []
        for prompt in ("Once upon a time", "Write a poem about the sea.", "My favourite food is"):
            request = make(api, prompt, temperature=1.0, n=2, max_tokens=max(ctx.tuning.max_tokens, 16))
            texts = (await answered(ctx, request)).view.texts()
            seen.append(texts)
            if len(set(texts.values())) > 1:
                break
        else:
            ctx.check.add(f"{api} temperature=1 n=2 choices", "different for some prompt", seen)


@openai_case("FINISH-6", tag="continues")
async def cut_short_reads_length(ctx: Ctx) -> None:
    """A greedy choice that the same request with a larger max_tokens carries on past ended at
    max_tokens, not at a stop: its finish_reason is "length" (for every prompt and endpoint tried)."""
    support(ctx).need_determinism()
    short = ctx.tuning.max_tokens
    judged = 0
    for api in support(ctx).apis():
        for prompt in ("Once upon a time", "Count from one to ten in words:"):
            cut = (await answered(ctx, make(api, prompt, temperature=0, max_tokens=short))).view
            whole = (await answered(ctx, make(api, prompt, temperature=0, max_tokens=4 * short))).view
            cut_choice, whole_choice = cut.choices.get(0), whole.choices.get(0)
            if cut_choice is None or whole_choice is None:
                continue
            if not whole_choice.text.startswith(cut_choice.text) or whole_choice.text == cut_choice.text:
                continue  # the cut answer ended for good (or greedy decoding did not repeat): nothing to judge
            judged += 1
            ctx.check.equal(
                f"{api} finish_reason of {prompt!r} at max_tokens={short}, which max_tokens={4 * short} carries on",
                "length",
                cut_choice.finish,
            )
    if not judged:
        raise CaseSkipped(f"every greedy answer ended within {short} tokens: no cut answer to judge")
