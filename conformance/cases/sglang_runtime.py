"""What clients of SGLang's native service rely on (SRT-1..4, contract §15): cumulative streams,
``meta_info``'s keys and types, one finish per output, and Abort by ``rid`` and ``abort_all``; and
stop strings on its text path (STOP-1, STOP-2, FINISH-5 read through ``TextGenerate``).

Generate goes through the driver (``drivers/sglang_runtime.py``), which files every break of these
rules it sees in the native responses as a finding; each case here sends the requests that make
those breaks visible (n > 1, logprobs, stop strings, final-only, aborts) and reports them, and
checks what only a comparison of two calls shows. ``TextGenerate`` is called natively: its text is
what SRT-1[text] and the ``[text-generate]`` stop cases read. SGLang matches stop strings on the
output's text and, unless ``no_stop_trim`` (not a field of this service), trims the matched one:
the text ends where the match starts, and ``finish_reason.matched`` is the stop string.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from conformance.cases._helpers import first_delta, ok, outputs_tokens, streams_on
from conformance.cases._learned import DETERMINISTIC, MULTIBYTE_PROMPT, stop_before_multibyte
from conformance.cases.abort import expect_aborted_end
from conformance.drivers.sglang_runtime import SglangRuntimeDriver
from conformance.harness.context import Ctx
from conformance.harness.requests import long_request, request
from conformance.spec.registry import case
from conformance.stream.record import StreamRecord
from conformance.vocabulary import CaseFailed, CaseSkipped, Mismatch
from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import AbortRequest, AllRequests, ResponseOptions

PROMPT = "Once upon a time"
FINAL_ONLY = ResponseOptions(final_only=True)
META_KEYS = ("id", "index", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason")
STOP_LENGTHS = (4, 3, 5, 6)  # the lengths of the stop strings tried, in this order
GREEDY = "deterministic_greedy"  # the text path's stop cases learn an output and stop it again
RUNTIME = ("sglang-runtime",)  # cases of lmrpc.v1's clauses read through this protocol's own RPCs


def runtime(ctx: Ctx) -> SglangRuntimeDriver:
    driver = ctx.session.target.driver
    if not isinstance(driver, SglangRuntimeDriver):
        raise CaseSkipped(f"{driver.protocol} is not sglang.runtime.v1")
    return driver


def report(ctx: Ctx, record: StreamRecord, *clauses: str) -> None:
    """The driver's findings of ``clauses`` on one call, as this case's mismatches."""
    for finding in record.findings:
        if finding.clause in clauses:
            ctx.check.add(
                f"{record.request_id or 'a request without rid'}: {finding.what}", finding.want, finding.got
            )


def meta_info(response: rt.TextGenerateResponse) -> dict[str, Any]:
    """meta_info's values decoded; a value that is not JSON is left out (and so reported missing)."""
    values: dict[str, Any] = {}
    for key, text in response.meta_info.items():
        try:
            values[key] = json.loads(text)
        except ValueError:
            continue
    return values


async def text_generate(ctx: Ctx, *, stream: bool, n: int) -> dict[int, list[str]]:
    """One greedy TextGenerate call: each output's texts, one per response, in order."""
    driver = runtime(ctx)
    call = rt.TextGenerateRequest(
        text=PROMPT,
        sampling_params=rt.SamplingParams(
            temperature=0.0, max_new_tokens=ctx.tuning.max_tokens, n=n, ignore_eos=True
        ),
        stream=stream,
        rid=ctx.uid("text"),
    )
    texts: dict[int, list[str]] = {}
    stub = driver.stub(ctx.session.target.channel)
    async for response in stub.text_generate(call, timeout=ctx.budgets.case_s()):
        meta = meta_info(response)
        for key in META_KEYS:
            ctx.check.that(key in meta, f"TextGenerate meta_info[{key!r}]", "present, JSON text",
                           response.meta_info.get(key, "missing"))  # fmt: skip
        index = meta.get("index", 0)
        texts.setdefault(index if isinstance(index, int) else 0, []).append(response.text)
    return texts


@dataclass(frozen=True, slots=True)
class TextResponse:
    """One TextGenerate response of output 0: its text, meta_info decoded, and its finished flag."""

    text: str
    meta: dict[str, Any]
    finished: bool

    @property
    def finish_reason(self) -> object:
        return self.meta.get("finish_reason")


async def text_responses(
    ctx: Ctx, *, stop: list[str], stream: bool, prompt: str = PROMPT
) -> list[TextResponse]:
    """One greedy TextGenerate call of ``prompt`` (EOS ignored) with ``stop``: its responses, in order."""
    driver = runtime(ctx)
    call = rt.TextGenerateRequest(
        text=prompt,
        sampling_params=rt.SamplingParams(
            temperature=0.0,
            max_new_tokens=max(2 * ctx.tuning.max_tokens, 16),
            ignore_eos=True,
            stop=stop,
        ),
        stream=stream,
        rid=ctx.uid("text"),
    )
    stub = driver.stub(ctx.session.target.channel)
    return [
        TextResponse(response.text, meta_info(response), response.finished)
        async for response in stub.text_generate(call, timeout=ctx.budgets.stream_s)
    ]


def final_text(ctx: Ctx, responses: list[TextResponse], what: str) -> str:
    """The text of the finished response (the whole output, cumulative or not); fails the case
    when there is none."""
    finished = [r for r in responses if r.finished]
    if not finished:
        got = f"{len(responses)} responses, none finished"
        raise CaseFailed([*ctx.check.mismatches, Mismatch(what, "a finished response", got)])
    driver = runtime(ctx)
    return "".join(r.text for r in responses) if driver.incremental else finished[-1].text


async def learned_text(ctx: Ctx, prompt: str = PROMPT) -> str:
    """The greedy text of ``prompt`` with no stop string: what the stop cases cut."""
    return final_text(
        ctx, await text_responses(ctx, stop=[], stream=False, prompt=prompt), "TextGenerate without stop"
    )


def stop_candidates(text: str) -> list[tuple[str, int]]:
    """Stop strings taken from ``text`` (from its middle on), each with the index of its first
    occurrence, which is where the output must end: none at 0 (nothing would be left), none blank
    or holding U+FFFD (an incomplete character is no text to match)."""
    found: dict[str, int] = {}
    for length in STOP_LENGTHS:
        for start in range(len(text) // 3, len(text) - length + 1):
            piece = text[start : start + length]
            first = text.find(piece)
            if first >= 1 and piece.strip() and "\ufffd" not in piece:
                found.setdefault(piece, first)
    return list(found.items())


def one_stop(text: str) -> tuple[str, int]:
    candidates = stop_candidates(text)
    if not candidates:
        raise CaseSkipped(f"no usable stop string in the learned text {text[:60]!r}")
    return candidates[0]


def two_stops(text: str) -> tuple[tuple[str, int], tuple[str, int]] | None:
    """Two stop strings whose first occurrences do not overlap, the later one first in the list to
    send: (the one that ends later, the one that ends first)."""
    candidates = sorted(stop_candidates(text), key=lambda c: c[1])
    for early, at in candidates:
        for late, late_at in reversed(candidates):
            if late_at >= at + len(early) and early not in late and late not in early:
                return (late, late_at), (early, at)
    return None


@case("STOP-1", tag="text-generate", requires=(GREEDY, "stop_strings"), protocols=RUNTIME)
async def text_stop_trimmed(ctx: Ctx) -> None:
    """Through TextGenerate (SGLang matches stop strings on text): a stop string taken from the middle
    of a greedy output never appears in any response's text, streamed or not, and the text ends where
    its first occurrence starts (no_stop_trim is not a field: SGLang trims the stop string)."""
    text = await learned_text(ctx)
    stop, at = one_stop(text)
    for stream in (True, False):
        what = f"TextGenerate {'streamed' if stream else 'stream unset'} with stop {stop!r}"
        responses = await text_responses(ctx, stop=[stop], stream=stream)
        for i, response in enumerate(responses):
            if stop in response.text:
                ctx.check.add(f"{what}: response {i}'s text", f"without {stop!r}", response.text[-60:])
                break
        ctx.check.equal(f"{what}: the output's text (the learned text cut where {stop!r} starts)",
                        text[:at], final_text(ctx, responses, what))  # fmt: skip


@case("STOP-2", tag="text-generate", requires=(GREEDY, "stop_strings"), protocols=RUNTIME)
async def text_stop_first_to_end(ctx: Ctx) -> None:
    """Through TextGenerate with two stop strings, the later entry of the list occurring first in the
    greedy output: the output ends at that one, whatever its place in the list."""
    text = await learned_text(ctx)
    pair = two_stops(text)
    if pair is None:
        raise CaseSkipped(f"no two separate stop strings in the learned text {text[:60]!r}")
    (late, _), (early, at) = pair
    what = f"TextGenerate with stop [{late!r}, {early!r}]"
    responses = await text_responses(ctx, stop=[late, early], stream=False)
    ctx.check.equal(f"{what}: the output's text (the learned text cut where {early!r} starts)", text[:at],
                    final_text(ctx, responses, what))  # fmt: skip


@case("STOP-2", tag="text-generate-before-multibyte", requires=(GREEDY, "stop_strings"), protocols=RUNTIME)
async def text_stop_before_multibyte(ctx: Ctx) -> None:
    """Through TextGenerate, streamed and not: a stop string that ends where a multi-byte character
    starts (its last character shares a token with that character's first bytes) ends the output
    where it starts, as any other does."""
    text = await learned_text(ctx, MULTIBYTE_PROMPT)
    found = stop_before_multibyte(text)
    if found is None:
        raise CaseSkipped(f"no stop string ends where a multi-byte character starts in {text[:60]!r}")
    stop, at = found
    for stream in (True, False):
        what = f"TextGenerate {'streamed' if stream else 'stream unset'} with stop {stop!r}"
        responses = await text_responses(ctx, stop=[stop], stream=stream, prompt=MULTIBYTE_PROMPT)
        ctx.check.equal(f"{what}: the output's text (the learned text cut where {stop!r} starts)", text[:at],
                        final_text(ctx, responses, what))  # fmt: skip


@case("FINISH-5", tag="text-generate", requires=(GREEDY, "stop_strings"), protocols=RUNTIME)
async def text_stop_matched(ctx: Ctx) -> None:
    """Through TextGenerate, streamed and not: the output that a stop string ends has finish_reason
    {"type": "stop", "matched": <that stop string, verbatim>} on its finished response, and no
    finish reason before it."""
    text = await learned_text(ctx)
    stop, _ = one_stop(text)
    for stream in (True, False):
        what = f"TextGenerate {'streamed' if stream else 'stream unset'} with stop {stop!r}"
        responses = await text_responses(ctx, stop=[stop], stream=stream)
        reasons = [r.finish_reason for r in responses if r.finish_reason is not None]
        ctx.check.equal(f"{what}: finish reasons (type, matched)", [("stop", stop)],
                        [(r.get("type"), r.get("matched")) if isinstance(r, dict) else r for r in reasons])  # fmt: skip


@case("SRT-1", tag="ids", requires=("max_outputs>=2",))
async def cumulative_ids(ctx: Ctx) -> None:
    """Each streamed Generate response of an output carries all of its ids so far, extending the last
    (n = 1 and n = 2); with deterministic greedy decoding the last equals the non-streamed output."""
    runtime(ctx)
    for n in (1, 2):
        asked = request(ctx, PROMPT, temperature=0.0, n=n, ignore_eos=True)
        streamed = ok(ctx, await ctx.generate(asked))
        report(ctx, streamed, "SRT-1")
        if not ctx.info.has(DETERMINISTIC):
            continue
        final = ok(ctx, await ctx.generate(request(ctx, PROMPT, temperature=0.0, n=n, ignore_eos=True,
                                                   response=FINAL_ONLY)))  # fmt: skip
        ctx.check.equal(f"n={n}: the streamed outputs' ids (read as cumulative)", outputs_tokens(final),
                        outputs_tokens(streamed))  # fmt: skip


@case("SRT-1", tag="text", requires=("max_outputs>=2",))
async def cumulative_text(ctx: Ctx) -> None:
    """Each streamed TextGenerate response of an output carries all of its text so far, extending the
    last; with deterministic greedy decoding the last equals the non-streamed text."""
    driver = runtime(ctx)
    streamed = await text_generate(ctx, stream=True, n=2)
    whole: dict[int, str] = {}
    for index, texts in sorted(streamed.items()):
        if driver.incremental:
            whole[index] = "".join(texts)
            continue
        for before, after in itertools.pairwise(texts):
            if not after.startswith(before):
                ctx.check.add(f"TextGenerate output {index}: a response's text",
                              f"extends the previous one ({before[-30:]!r})", after[-40:])  # fmt: skip
                break
        whole[index] = texts[-1] if texts else ""
    ctx.check.equal("TextGenerate outputs streamed", [0, 1], sorted(streamed))
    if ctx.info.has(DETERMINISTIC):
        final = await text_generate(ctx, stream=False, n=2)
        ctx.check.equal("the streamed texts (whole) vs stream unset",
                        {i: t[-1] for i, t in sorted(final.items()) if t}, dict(sorted(whole.items())))  # fmt: skip


@case("SRT-2", requires=("max_outputs>=2", "logprobs", "stop_strings"))
async def meta_info_keys(ctx: Ctx) -> None:
    """meta_info on every response: JSON text under id, prompt_tokens, completion_tokens,
    cached_tokens, finish_reason (and index with n > 1), with the right types and values, over
    streamed and final-only calls, n = 2, logprobs, a stop string and a request without rid."""
    runtime(ctx)
    top = min(2, ctx.info.caps.max_top_logprobs)
    calls = [
        request(ctx, PROMPT, temperature=0.0, n=2, ignore_eos=True),
        request(
            ctx, PROMPT, temperature=0.0, response=ResponseOptions(return_logprobs=True, top_logprobs=top)
        ),
        request(ctx, PROMPT, temperature=1.0, n=2, response=FINAL_ONLY),
        request(ctx, "1, 2, 3,", temperature=0.0, stop_strings=[","], max_tokens=2 * ctx.tuning.max_tokens),
        request(ctx, PROMPT, temperature=0.0, request_id=""),
    ]
    for asked in calls:
        record = ok(ctx, await ctx.generate(asked))
        report(ctx, record, "SRT-2", "USAGE-2", "USAGE-4", "USAGE-5")


@case("SRT-3", requires=("max_outputs>=3",))
async def one_finish_per_output(ctx: Ctx) -> None:
    """Every output's finish reason is on exactly one response, its last, which says finished; for
    n = 1 and n = 3 streamed and n = 2 final-only."""
    runtime(ctx)
    calls = [
        request(ctx, PROMPT, temperature=0.0),
        request(ctx, PROMPT, temperature=1.0, n=3),
        request(ctx, PROMPT, temperature=1.0, n=2, response=FINAL_ONLY),
    ]
    for asked in calls:
        record = ok(ctx, await ctx.generate(asked))
        report(ctx, record, "SRT-3")
        n = (asked.sampling.n if asked.sampling else None) or 1
        finishes = {i: len(view.finishes) for i, view in record.outputs().items()}
        ctx.check.equal(f"{record.request_id}: finishes per output", dict.fromkeys(range(n), 1), finishes)


@case("SRT-4", tag="rid", requires=("max_outputs>=2",))
async def abort_by_rid(ctx: Ctx) -> None:
    """Abort(rid) of an n = 2 request in flight answers success and ends both outputs "abort"."""
    driver = runtime(ctx)
    stream = ctx.open(long_request(ctx, n=2))
    await first_delta(ctx, stream)
    reply = await driver.stub(ctx.session.target.channel).abort(
        rt.AbortRequest(rid=stream.record.request_id), timeout=ctx.budgets.rpc_s
    )
    ctx.check.that(reply.success, "Abort(rid) of a request in flight", "success = true", reply.success)
    await expect_aborted_end(ctx, stream, 2, "the aborted request")
    report(ctx, stream.record, "SRT-2", "SRT-3")


@case("SRT-4", tag="one-of-two")
async def abort_one_rid_of_two(ctx: Ctx) -> None:
    """Abort(rid) with two requests in flight answers success for that rid and ends that request alone:
    the other streams on."""
    driver = runtime(ctx)
    target, bystander = ctx.open(long_request(ctx)), ctx.open(long_request(ctx))
    try:
        for stream in (target, bystander):
            await first_delta(ctx, stream)
        reply = await driver.stub(ctx.session.target.channel).abort(
            rt.AbortRequest(rid=target.record.request_id), timeout=ctx.budgets.rpc_s
        )
        ctx.check.that(
            reply.success, "Abort(rid) of one of two requests in flight", "success = true", reply.success
        )
        await expect_aborted_end(ctx, target, 1, "the aborted request")
        await streams_on(ctx, bystander, "the other request after Abort(rid) of the first")
    finally:
        await ctx.cancel(bystander)
    report(ctx, target.record, "SRT-2", "SRT-3")


@case("SRT-4", tag="abort_all", requires=("admin", "max_outputs>=2"), exclusive=True)
async def abort_all_then_serve(ctx: Ctx) -> None:
    """abort_all ends every request in flight (n = 1 and n = 2), each output "abort"; the next
    request is served."""
    runtime(ctx)
    streams = [ctx.open(long_request(ctx, n=k)) for k in (1, 2)]
    for stream in streams:
        await first_delta(ctx, stream)
    await ctx.call(ctx.control.abort, AbortRequest(all=AllRequests()))  # the admin channel under auth
    for stream, k in zip(streams, (1, 2), strict=True):
        await expect_aborted_end(ctx, stream, k, f"{stream.record.request_id} after abort_all")
    after = await ctx.generate(request(ctx, PROMPT, temperature=0.0))
    ok(ctx, after, "a request after abort_all")
    report(ctx, after, "SRT-2", "SRT-3")
