"""Abort (ABORT-1, 2, 4, 5, 6, 7): statuses, prompt ends with ABORTED finishes, n>1 coverage."""

from __future__ import annotations

from grpclib.const import Status

from conformance.cases._helpers import accepted, first_delta, ok
from conformance.harness.context import Ctx
from conformance.harness.requests import long_request, long_tokens, request
from conformance.spec.registry import Variant, case
from conformance.stream.live import LiveStream
from conformance.stream.record import End
from lmrpc.v1 import AbortRequest, AllRequests, FinishReason, RequestIds


async def abort(ctx: Ctx, *ids: str) -> dict[str, str]:
    response = await ctx.call(ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=list(ids))))
    return {o.request_id: o.status.name for o in response.outcomes}


async def expect_aborted_end(ctx: Ctx, stream: LiveStream, n: int, what: str) -> None:
    """ABORT-2: the stream ends promptly; unfinished outputs end ABORTED with their delivered tokens counted;
    the terminal message carries Usage; status OK."""
    record = await stream.finish(ctx.budgets.release_s)
    if not ctx.check.that(
        record.ended_ok,
        f"{what}: the stream's end within {ctx.budgets.release_s:.1f}s",
        "status OK",
        record.summary(),
    ):
        return
    outputs = record.outputs()
    for index in range(n):
        view = outputs.get(index)
        finish = view.finish if view else None
        if not ctx.check.that(finish is not None, f"{what}: output {index}", "an OutputFinished", "none"):
            continue
        assert view is not None and finish is not None
        if finish.reason != FinishReason.ABORTED and finish.completion_tokens < long_tokens(ctx):
            ctx.check.add(f"{what}: output {index} reason", "ABORTED", finish.reason.name)
        ctx.check.equal(
            f"{what}: output {index} completion_tokens (tokens delivered before the abort)",
            len(view.token_ids),
            finish.completion_tokens,
        )
    ctx.check.that(
        record.events[-1].message.usage is not None, f"{what}: Usage on the terminal message", "set", "absent"
    )


@case("ABORT-1", tag="unknown")
async def abort_unknown(ctx: Ctx) -> None:
    """Aborting ids that were never used returns OK with NOT_IN_FLIGHT for each."""
    ids = [ctx.uid("never-1"), ctx.uid("never-2")]
    ctx.check.equal(
        "Abort outcomes for unknown ids", {i: "NOT_IN_FLIGHT" for i in ids}, await abort(ctx, *ids)
    )


@case("ABORT-1", tag="finished")
async def abort_finished(ctx: Ctx) -> None:
    """Aborting a finished request returns NOT_IN_FLIGHT and changes nothing."""
    done = ok(ctx, await ctx.generate(request(ctx, max_tokens=2)))
    ctx.check.equal(
        "Abort outcome for a finished request",
        {done.request_id: "NOT_IN_FLIGHT"},
        await abort(ctx, done.request_id),
    )
    ok(ctx, await ctx.generate(request(ctx, max_tokens=2)), "a request after the no-op abort")


@case("ABORT-1", tag="twice")
async def abort_twice(ctx: Ctx) -> None:
    """The first Abort of a request in flight says ABORTED, the second NOT_IN_FLIGHT."""
    stream = ctx.open(long_request(ctx))
    await first_delta(ctx, stream)
    rid = stream.record.request_id
    ctx.check.equal("first Abort", {rid: "ABORTED"}, await abort(ctx, rid))
    await stream.finish(ctx.budgets.release_s)
    ctx.check.equal("second Abort of the same id", {rid: "NOT_IN_FLIGHT"}, await abort(ctx, rid))


@case("ABORT-2", tag="mid-stream")
async def abort_mid_stream(ctx: Ctx) -> None:
    """Abort while tokens stream: ABORTED finish with the tokens so far, Usage, status OK, promptly."""
    stream = ctx.open(long_request(ctx))
    await first_delta(ctx, stream)
    ctx.check.equal(
        "Abort outcome", {stream.record.request_id: "ABORTED"}, await abort(ctx, stream.record.request_id)
    )
    await expect_aborted_end(ctx, stream, 1, "aborted mid-stream")


@case("ABORT-2", tag="before-first-token")
async def abort_before_tokens(ctx: Ctx) -> None:
    """Abort as soon as the request is accepted (before its first token, usually)."""
    stream = ctx.open(long_request(ctx))
    await accepted(ctx, stream)
    ctx.check.equal(
        "Abort outcome", {stream.record.request_id: "ABORTED"}, await abort(ctx, stream.record.request_id)
    )
    await expect_aborted_end(ctx, stream, 1, "aborted at acceptance")


@case(
    "ABORT-4",
    variants=[
        Variant({"n": 2}, requires=("max_outputs>=2",)),
        Variant({"n": 4}, requires=("max_outputs>=4",)),
    ],
)
async def abort_covers_outputs(ctx: Ctx) -> None:
    """Aborting an n>1 request ends every one of its outputs."""
    n = int(ctx.params["n"])
    stream = ctx.open(long_request(ctx, n=n))
    await first_delta(ctx, stream)
    ctx.check.equal(
        "Abort outcome", {stream.record.request_id: "ABORTED"}, await abort(ctx, stream.record.request_id)
    )
    await expect_aborted_end(ctx, stream, n, f"aborted n={n} request")


@case("ABORT-5", exclusive=True)
async def abort_all(ctx: Ctx) -> None:
    """Abort(all) aborts every request in flight and reports each ABORTED."""
    n = min(ctx.info.caps.max_outputs, 2)
    streams = [ctx.open(long_request(ctx, n=k)) for k in (None, n, None)]
    for stream in streams:
        await first_delta(ctx, stream)
    response = await ctx.call(ctx.control.abort, AbortRequest(all=AllRequests()))
    outcomes = {o.request_id: o.status.name for o in response.outcomes}
    for stream in streams:
        ctx.check.equal(
            f"Abort(all) outcome for {stream.record.request_id}",
            "ABORTED",
            outcomes.get(stream.record.request_id, "missing"),
        )
    for stream, k in zip(streams, (1, n, 1), strict=True):
        await expect_aborted_end(ctx, stream, k, f"{stream.record.request_id} after Abort(all)")


@case("ABORT-6", budget=1.5)
async def abort_before_arrival(ctx: Ctx) -> None:
    """An Abort that races ahead of its Generate wins: the Generate is accepted and ends ABORTED at once."""
    rid = ctx.uid("early")
    ctx.check.equal("Abort of an id not yet in flight", {rid: "NOT_IN_FLIGHT"}, await abort(ctx, rid))
    stream = ctx.open(long_request(ctx, request_id=rid))
    record = await stream.finish(ctx.budgets.release_s)
    outputs = record.outputs()
    reason = outputs[0].finish.reason.name if 0 in outputs and outputs[0].finish else "none"
    ctx.check.that(
        record.ended_ok and reason == "ABORTED",
        "Generate arriving after its Abort",
        "accepted, then ABORTED at once",
        f"{record.summary()}, reason={reason}",
    )
    if record.end is End.OPEN or record.end is End.HUNG:
        await ctx.cancel(stream)


@case(
    "ABORT-7",
    variants=[Variant({"empty": False}, tag="no-target"), Variant({"empty": True}, tag="empty-ids")],
)
async def abort_without_target(ctx: Ctx) -> None:
    """Abort with no target, or with an empty id list, is INVALID_ARGUMENT."""
    message = AbortRequest(request_ids=RequestIds(ids=[])) if ctx.params["empty"] else AbortRequest()
    outcome = await ctx.call_status(ctx.control.abort, message)
    ctx.check.equal(f"Abort({message!r})", Status.INVALID_ARGUMENT.name, outcome.code)
