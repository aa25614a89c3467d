"""Administrative RPCs (LIFE-3): pause stalls without failing, resume continues, flush never hurts."""

from __future__ import annotations

import asyncio

from conformance.cases._helpers import abort, first_delta, ok
from conformance.harness.context import Ctx
from conformance.harness.requests import long_request, request
from conformance.spec.registry import case
from lmrpc.v1 import FlushCacheRequest, PauseGenerationRequest, ResumeGenerationRequest


@case("LIFE-3", tag="pause", requires=("admin",), exclusive=True, sends=("admin.pause",))
async def pause_and_resume(ctx: Ctx) -> None:
    """While paused, new requests are accepted and wait and open streams stall; resume continues both."""
    running = ctx.open(long_request(ctx))
    await first_delta(ctx, running)
    await ctx.call(ctx.control.pause_generation, PauseGenerationRequest())
    try:
        settle = 0.3 * ctx.budgets.scale
        await asyncio.sleep(settle)  # tokens already on their way may still arrive
        load = await ctx.load()
        ctx.check.that(load.paused, "Load.paused after PauseGeneration", "true", load.paused)
        before = len(running.events)
        waiting = ctx.open(request(ctx, "Hello", max_tokens=2))
        await asyncio.sleep(2 * settle)
        ctx.check.that(
            len(running.events) == before,
            "an open stream while paused",
            "stalled (no new message)",
            f"{len(running.events) - before} new messages",
        )
        deltas = [e for e in waiting.events if e.kind == "delta"]
        ctx.check.that(
            not waiting.done.is_set() and not deltas,
            "a request sent while paused",
            "accepted and waiting (no tokens, not failed)",
            waiting.record.summary(),
        )
    finally:
        await ctx.call(ctx.control.resume_generation, ResumeGenerationRequest())
    ok(ctx, await waiting.finish(ctx.budgets.stream_s), "the request sent while paused, after resume")
    stalled = len(running.events)
    await running.read_until(lambda e: e.seq >= stalled, ctx.budgets.prompt_s)
    ctx.check.that(
        len(running.events) > stalled,
        "the open stream after resume",
        "streaming again",
        running.record.summary(),
    )
    await abort(ctx, running.record.request_id)
    await running.finish(ctx.budgets.release_s)


@case("LIFE-3", tag="flush", requires=("admin",), sends=("admin.flush",))
async def flush_is_harmless(ctx: Ctx) -> None:
    """FlushCache succeeds and never affects a running request."""
    req = request(ctx, "Once upon a time", temperature=0.0, max_tokens=ctx.tuning.max_tokens * 2)
    stream = ctx.open(req)
    await first_delta(ctx, stream)
    await ctx.call(ctx.control.flush_cache, FlushCacheRequest())
    ok(ctx, await stream.finish(ctx.budgets.stream_s), "a request running across FlushCache")
