"""What clients of SGLang's native service rely on (SRT-1..4, contract §15): cumulative streams,
``meta_info``'s keys and types, one finish per output, and Abort by ``rid`` and ``abort_all``.

Generate goes through the driver (``drivers/sglang_runtime.py``), which files every break of these
rules it sees in the native responses as a finding; each case here sends the requests that make
those breaks visible (n > 1, logprobs, stop strings, final-only, aborts) and reports them, and
checks what only a comparison of two calls shows. ``TextGenerate`` is called natively: its text is
what SRT-1[text] reads.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from conformance.cases._helpers import first_delta, ok, outputs_tokens, still_streaming
from conformance.cases._learned import DETERMINISTIC
from conformance.cases.abort import expect_aborted_end
from conformance.drivers.sglang_runtime import SglangRuntimeDriver
from conformance.harness.context import Ctx
from conformance.harness.requests import long_request, request
from conformance.spec.registry import case
from conformance.stream.record import StreamRecord
from conformance.vocabulary import CaseSkipped
from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import AbortRequest, AllRequests, ResponseOptions

PROMPT = "Once upon a time"
FINAL_ONLY = ResponseOptions(final_only=True)
META_KEYS = ("id", "index", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason")


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


def _meta(response: rt.TextGenerateResponse) -> dict[str, Any]:
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
        meta = _meta(response)
        for key in META_KEYS:
            ctx.check.that(key in meta, f"TextGenerate meta_info[{key!r}]", "present, JSON text",
                           response.meta_info.get(key, "missing"))  # fmt: skip
        index = meta.get("index", 0)
        texts.setdefault(index if isinstance(index, int) else 0, []).append(response.text)
    return texts


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
        await still_streaming(ctx, bystander, "the other request after Abort(rid) of the first")
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
