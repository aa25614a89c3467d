"""Releasing resources (ABORT-3, CANCEL-1..3): after an abort, a client cancel or a deadline, GetLoad
returns to its baseline; other requests never notice. Load-watching cases run alone."""

from __future__ import annotations

import asyncio

from grpclib.const import Status

from conformance.cases._helpers import abort, first_delta, ok, outputs_tokens, paused, resumed, started
from conformance.harness.context import Ctx
from conformance.harness.load import expect_released, quiet_load
from conformance.harness.requests import long_request, request
from conformance.spec.registry import case
from conformance.stream.record import End
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import FinishReason


@case("ABORT-3", tag="abort", exclusive=True)
async def released_after_abort(ctx: Ctx) -> None:
    """After an abort the load returns to what it was before the request."""
    baseline = await quiet_load(ctx)
    stream = ctx.open(long_request(ctx, n=min(ctx.info.caps.max_outputs, 2)))
    await first_delta(ctx, stream)
    await abort(ctx, stream.record.request_id)
    await expect_released(ctx, baseline, "an abort")  # the stream is left open: the abort alone must free it


@case("CANCEL-1", tag="after-begin", exclusive=True, sends=("scenario.cancel-after-begin",))
async def cancel_after_begin(ctx: Ctx) -> None:
    """The client resets the call right after sending it: the server releases the request."""
    baseline = await quiet_load(ctx)
    stream = ctx.open(long_request(ctx))
    await asyncio.sleep(0.01)
    await ctx.cancel(stream)
    await expect_released(ctx, baseline, "a cancel right after the call began")


@case("CANCEL-1", tag="after-first-response", exclusive=True, sends=("scenario.cancel-after-first-token",))
async def cancel_after_first_response(ctx: Ctx) -> None:
    """The client resets the call after its first token: the server stops and releases the request."""
    baseline = await quiet_load(ctx)
    stream = ctx.open(long_request(ctx, n=min(ctx.info.caps.max_outputs, 2)))
    await first_delta(ctx, stream)
    await ctx.cancel(stream)
    await expect_released(ctx, baseline, "a cancel after the first token")


@case("CANCEL-2", tag="deadline", exclusive=True, sends=("scenario.deadline",))
async def deadline_expires(ctx: Ctx) -> None:
    """A deadline on a long generation: the client sees DEADLINE_EXCEEDED (or CANCELLED); the server releases it."""
    baseline = await quiet_load(ctx)
    deadline_s = 0.25 * ctx.budgets.scale
    stream = ctx.open(long_request(ctx), deadline_s=deadline_s)
    record = await stream.finish()
    reasons = [v.finish.reason for v in record.outputs().values() if v.finish is not None]
    aborted = record.ended_ok and FinishReason.ABORTED in reasons
    if aborted and ctx.session.protocol == "lmrpc":
        ctx.check.add(  # the cause of an ABORTED finish must be an abort (FINISH-7), never the deadline
            f"a {deadline_s:.1f}s deadline on a long generation",
            "DEADLINE_EXCEEDED or CANCELLED (a deadline is not a finish reason)",
            f"status OK with an ABORTED finish after {record.duration_s:.2f}s",
        )
    elif record.ended_ok and not aborted and record.duration_s < deadline_s:
        raise CaseSkipped(
            f"the longest generation the window allows finished in {record.duration_s:.2f}s, "
            f"before a {deadline_s:.2f}s deadline could expire"
        )
    expired = record.end is End.DEADLINE or (
        record.end is End.STATUS and record.status in (Status.DEADLINE_EXCEEDED, Status.CANCELLED)
    )
    ctx.check.that(
        expired or aborted,  # in lmrpc.v1 an ABORTED finish is reported above; elsewhere it ends the call
        f"a {deadline_s:.1f}s deadline on a long generation",
        "DEADLINE_EXCEEDED or CANCELLED",
        record.summary(),
    )
    await expect_released(ctx, baseline, "the deadline expired")


@case("CANCEL-2", tag="held", requires=("admin",), exclusive=True, sends=("scenario.deadline",))
async def deadline_expires_while_held(ctx: Ctx) -> None:
    """A deadline that expires while the request waits behind a pause (it cannot finish first): the client
    sees DEADLINE_EXCEEDED (or CANCELLED), never an ABORTED finish, and after resume the request is gone."""
    baseline = await quiet_load(ctx)
    deadline_s = 0.25 * ctx.budgets.scale
    await paused(ctx)
    try:
        stream = ctx.open(long_request(ctx, n=min(ctx.info.caps.max_outputs, 2)), deadline_s=deadline_s)
        record = await stream.finish()
    finally:
        await resumed(ctx)
    reasons = [v.finish.reason.name for v in record.outputs().values() if v.finish is not None]
    expired = record.end is End.DEADLINE or (
        record.end is End.STATUS and record.status in (Status.DEADLINE_EXCEEDED, Status.CANCELLED)
    )
    ctx.check.that(
        expired and not reasons,
        f"a {deadline_s:.1f}s deadline on a request held behind a pause",
        "DEADLINE_EXCEEDED or CANCELLED, no finish (a deadline is not a finish reason)",
        f"{record.summary()}; finishes {reasons}",
    )
    await expect_released(ctx, baseline, "the deadline of a held request expired")


@case("CANCEL-3", requires=("deterministic_greedy",))
async def others_unaffected(ctx: Ctx) -> None:
    """Cancelling and aborting requests never disturbs a request running beside them."""
    solo = ok(
        ctx,
        await ctx.generate(
            request(ctx, "The capital of France is", temperature=0.0, max_tokens=ctx.tuning.max_tokens * 2)
        ),
    )
    victims = [ctx.open(long_request(ctx)), ctx.open(long_request(ctx))]
    bystander = ctx.open(
        request(ctx, "The capital of France is", temperature=0.0, max_tokens=ctx.tuning.max_tokens * 2)
    )
    await started(ctx, *victims)
    await ctx.cancel(victims[0])
    await abort(ctx, victims[1].record.request_id)
    record = ok(ctx, await bystander.finish(), "the request beside them")
    ctx.check.equal(
        "tokens of a request while others were cancelled and aborted",
        outputs_tokens(solo),
        outputs_tokens(record),
    )
    await victims[1].finish(ctx.budgets.release_s)


@case(
    "CANCEL-3",
    tag="shared-prefix",
    requires=("deterministic_greedy",),
    sends=("scenario.cancel-twin-shares-prompt",),
)
async def shared_prompt_unaffected(ctx: Ctx) -> None:
    """Cancelling a request never disturbs a request beside it with the same prompt (whose prefix-cache
    entries it may share)."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    tokens = ctx.tuning.max_tokens * 2
    solo = ok(ctx, await ctx.generate(request(ctx, prompt, temperature=0.0, max_tokens=tokens)))
    victim = ctx.open(long_request(ctx, prompt))
    await first_delta(ctx, victim)
    bystander = ctx.open(request(ctx, prompt, temperature=0.0, max_tokens=tokens))
    await started(ctx, victim, bystander)
    await ctx.cancel(victim)
    record = ok(ctx, await bystander.finish(), "the request beside the cancelled one")
    ctx.check.equal(
        "tokens of a request whose twin (same prompt) was cancelled",
        outputs_tokens(solo),
        outputs_tokens(record),
    )
