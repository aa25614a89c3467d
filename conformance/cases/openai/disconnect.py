"""Clients that go away or stop reading: a closed connection frees the server (CANCEL-1) and changes
no other stream (CANCEL-3); an unread stream delays no other request (FLOW-1).

Every time limit here is measured on the server in the same case, never a constant: "promptly" is
"as fast as the same burst just before", with a margin far below what the abandoned work would
cost, so a busy machine slows both sides alike and a correct server is never blamed for it.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from conformance.cases.openai._common import (
    LONG_PROMPT,
    answered,
    apis,
    common_prefix,
    make,
    openai_case,
    refused,
)
from conformance.drivers.openai.exchange import Api, End, OpenAIRequest
from conformance.harness.context import Ctx
from conformance.vocabulary import CaseSkipped

SHORT_TOKENS = 8
ABANDONED_TOKENS = 1024  # what each abandoned stream asked for: ~128x a short request's work
EVENTS_BEFORE_LEAVING = 3
FILL_BYTES = 128 * 1024  # what an unread stream must have been written before others are timed
FILL_CAP_S = 15.0
RATE_TOKENS = 64
SHORT_AFTER_FILL = 3
MEASUREMENTS = 2  # a delay whose cause does not show is measured once more (CANCEL-1, FLOW-1)


async def long_request(ctx: Ctx, api: Api) -> OpenAIRequest:
    """A streamed request for ABANDONED_TOKENS tokens the server accepts (halved until it does), with
    ``ignore_eos`` where the server takes that extension (so it would really run that long)."""
    tokens = ABANDONED_TOKENS
    while tokens >= 64:
        for extra in ({"ignore_eos": True}, {}):
            request = make(api, LONG_PROMPT, max_tokens=tokens, temperature=0, stream=True, **extra)
            probe = await ctx.http.send(request.with_body(max_tokens=1, stream=None))
            if probe.status == 200:
                return request
            if refused(probe) is not None:
                break
        tokens //= 2
    raise CaseSkipped(f"the server refuses every streamed {api} request of 64 tokens or more")


async def burst(ctx: Ctx, api: Api, count: int) -> float:
    """Seconds for ``count`` short requests sent at once to be answered."""
    started = time.monotonic()
    await asyncio.gather(
        *(
            answered(ctx, make(api, max_tokens=SHORT_TOKENS, temperature=0), "a short request")
            for _ in range(count)
        )
    )
    return time.monotonic() - started


@openai_case("CANCEL-1", exclusive=True, budget=4.0)
async def disconnect_frees(ctx: Ctx) -> None:
    """Streams whose clients close their connections mid-stream stop: a burst at the server's
    parallelism right after is answered about as fast as the same burst before, not after the
    abandoned streams' length. A slow burst is measured again: a server that still holds abandoned
    streams is slow both times, a host that paused once is not."""
    api = apis(ctx, "stream")[0]
    width = ctx.http.target.parallel
    request = await long_request(ctx, api)
    factor = math.sqrt(request.max_tokens / SHORT_TOKENS if request.max_tokens else 1)
    before = math.inf
    for measurement in range(1, MEASUREMENTS + 1):
        # the quicker of the measurements' bursts before: a server still busy with the first
        # measurement's abandoned streams cannot widen the second's limit
        before = min(before, max([await burst(ctx, api, width) for _ in range(2)]))
        leave = await asyncio.gather(
            *(ctx.http.send(request, disconnect_after=EVENTS_BEFORE_LEAVING) for _ in range(width))
        )
        broken = [e.summary() for e in leave if e.status != 200 or e.end is not End.CANCELLED]
        if not ctx.check.that(
            not broken,
            f"{width} long streams, left after {EVENTS_BEFORE_LEAVING} events",
            "HTTP 200 streams",
            broken,
        ):
            return
        limit = max(before * factor, before + 0.5 * ctx.budgets.scale)
        started = time.monotonic()
        try:
            async with asyncio.timeout(limit):
                await burst(ctx, api, width)
        except TimeoutError:
            after = time.monotonic() - started
            ctx.note(f"measurement {measurement}: the burst after the disconnects ran past {limit:.2f}s")
            if measurement < MEASUREMENTS:
                continue
            ctx.check.add(
                f"a burst of {width} short requests right after {width} clients left their "
                f"{request.max_tokens}-token streams",
                f"answered within {limit:.2f}s ({factor:.1f}x the {before:.2f}s the same burst took before)",
                f"still running after {after:.2f}s, in each of {MEASUREMENTS} measurements: the abandoned "
                "streams still hold the server",
            )
            return
        ctx.note(
            f"burst before: {before:.2f}s, after the disconnects: {time.monotonic() - started:.2f}s (limit {limit:.2f}s)"
        )
        return


@openai_case("CANCEL-3", exclusive=True, budget=2.0)
async def disconnect_changes_no_other(ctx: Ctx) -> None:
    """A stream closed by its client while another runs leaves the other one whole: it ends normally,
    with its own text."""
    api = apis(ctx, "stream")[0]
    request = await long_request(ctx, api)
    other = make(
        api, "The capital of France is", temperature=0, max_tokens=max(ctx.tuning.max_tokens, 16), stream=True
    )
    alone = (await answered(ctx, other, "the other request alone")).view.texts().get(0, "")
    leaving = asyncio.ensure_future(ctx.http.send(request, disconnect_after=EVENTS_BEFORE_LEAVING))
    together = await answered(ctx, other, "the other request beside a stream its client leaves")
    await leaving
    choice = together.view.choices.get(0)
    ctx.check.that(
        choice is not None and bool(choice.finishes),
        "the other stream's end",
        "its choice finished",
        together.exchange.summary(),
    )
    text = choice.text if choice else ""
    if text != alone:
        shared = common_prefix(text, alone)
        ctx.check.that(shared > 0 or not alone, "the other stream's text", f"its own text {alone!r}", text)
        ctx.note(f"the other stream's text differs after {shared} characters (batch variance?)")


@openai_case("FLOW-1", exclusive=True, budget=3.0)
async def unread_stream_delays_nobody(ctx: Ctx) -> None:
    """While a client leaves a long stream unread, another request is answered about as fast as
    before it: the server never waits on the slow reader. A short request that misses its limit
    is blamed on the unread stream only when the stream's close is what ends the delay, or when
    the delay comes back in a second measurement: a server that stalls for everyone, and stays
    stalled after the stream closed (a paused host), is measured again once it answers."""
    if ctx.http.target.parallel < 2:
        raise CaseSkipped(
            f"the server runs one request at a time ({ctx.http.target.parallel_source}): any stream, read "
            "or not, holds every other request, so an unread one cannot be told apart"
        )
    api = apis(ctx, "stream")[0]
    request = await long_request(ctx, api)
    short = make(api, max_tokens=SHORT_TOKENS, temperature=0)
    for measurement in range(1, MEASUREMENTS + 1):
        delay = await delay_beside_unread(ctx, request, short)
        if delay is None:
            return
        label = f"short request {delay.attempt} while another client leaves its stream unread"
        want = f"answered within {delay.limit:.2f}s (10x the {delay.alone:.2f}s it took alone)"
        if delay.after_close_s is not None:
            ctx.check.add(
                label,
                want,
                f"{delay.got}; answered in {delay.after_close_s:.2f}s once that stream closed",
            )
            return
        if measurement == MEASUREMENTS:
            ctx.check.add(label, want, f"{delay.got}, in each of {MEASUREMENTS} measurements")
            return
        recovered_s = await answering_again(ctx, short, ctx.budgets.stream_s)
        if recovered_s is None:
            ctx.check.add(
                label,
                want,
                f"{delay.got}; still unanswered {ctx.budgets.stream_s:.0f}s after that stream closed",
            )
            return
        ctx.note(
            f"measurement {measurement}: {delay.got}, and as slow after the unread stream closed "
            f"(answering again {recovered_s:.2f}s later): a stall of the server, not the stream's; measured again"
        )


@dataclass(frozen=True, slots=True)
class Delay:
    """A short request that missed its limit beside an unread stream."""

    attempt: int
    alone: float
    limit: float
    got: str
    after_close_s: float | None  # the same request's time once the stream closed, if within the limit


async def delay_beside_unread(ctx: Ctx, request: OpenAIRequest, short: OpenAIRequest) -> Delay | None:
    """One measurement: ``short`` alone, then SHORT_AFTER_FILL times while ``request``'s stream is
    left unread past what the connection holds; None when every one was answered in time."""
    before = []
    for _ in range(2):
        started = time.monotonic()
        await answered(ctx, short, "a short request alone")
        before.append(time.monotonic() - started)
    alone = max(before)
    limit = max(10 * alone, alone + 1.0 * ctx.budgets.scale)
    fill_s = await time_to_fill(ctx, request)
    took: list[float] = []
    missed = ""
    async with ctx.http.unread(request) as held:
        if held.status != 200:
            raise CaseSkipped(f"the long stream was not accepted: {held.summary()}")
        await asyncio.sleep(fill_s)  # the server has written more than the connection holds by now
        for _ in range(SHORT_AFTER_FILL):
            started = time.monotonic()
            exchange = await ctx.http.send(short, total_s=limit)
            took.append(time.monotonic() - started)
            if not (exchange.status == 200 and exchange.end is End.OK):
                missed = f"{exchange.summary()} after {took[-1]:.2f}s"
                break
    ctx.note(
        f"alone: {alone:.2f}s; unread for {fill_s:.2f}s first; then: {', '.join(f'{t:.2f}s' for t in took)}"
    )
    if not missed:
        return None
    started = time.monotonic()
    exchange = await ctx.http.send(short, total_s=limit)
    after_close = time.monotonic() - started if exchange.status == 200 and exchange.end is End.OK else None
    return Delay(len(took), alone, limit, missed, after_close)


async def answering_again(ctx: Ctx, short: OpenAIRequest, bound_s: float) -> float | None:
    """Seconds until ``short`` is answered again (tried back to back), or None past ``bound_s``."""
    started = time.monotonic()
    while (left := bound_s - (time.monotonic() - started)) > 0:
        exchange = await ctx.http.send(short, total_s=left)
        if exchange.status == 200 and exchange.end is End.OK:
            return time.monotonic() - started
        await asyncio.sleep(min(0.5, max(left, 0.0)))
    return None


async def time_to_fill(ctx: Ctx, request: OpenAIRequest) -> float:
    """How long the server takes to write FILL_BYTES of ``request``'s stream, from the rate one
    read stream of it shows (capped by the case's budget: a slower server is judged on less)."""
    exchange = await ctx.http.send(request.with_body(max_tokens=RATE_TOKENS), total_s=ctx.budgets.stream_s)
    written = sum(len(e.data) + 8 for e in exchange.events)
    rate = written / max(exchange.duration_s, 1e-3)
    return min(max(0.5, FILL_BYTES / max(rate, 1.0)), FILL_CAP_S * ctx.budgets.scale)
