"""Abort (ABORT-1, 2, 4, 5, 6, 7): outcomes exactly as the contract lists them, prompt ends with ABORTED
finishes and a bounded tail of tokens, n>1 coverage, waiting requests, ids reused after an abort."""

from __future__ import annotations

import asyncio

from grpclib.const import Status

from conformance.cases._helpers import (
    abort,
    abort_all,
    accepted,
    first_delta,
    ok,
    paused,
    resumed,
    started,
    streams_on,
)
from conformance.harness.context import Ctx
from conformance.harness.requests import long_request, long_tokens, request
from conformance.spec.registry import Variant, case
from conformance.stream.live import LiveStream
from conformance.stream.record import End
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import AbortRequest, FinishReason, RequestIds

TAIL_TOKENS = 16  # ABORT-2: tokens an output may still deliver after the AbortResponse


def tail_allowance(ctx: Ctx) -> int | None:
    """ABORT-2's 16 tokens plus what the server may keep waiting for a client that reads slower
    than it generates (``limits.max_parked_tokens``, FLOW-1: generated before the abort, so
    delivered), doubled for what a busy machine leaves queued between engine and client, and
    scaled with --time-scale above 1. None where the protocol advertises no such limit (smg's
    engine protocols): what a server queued for a slow reader before the abort is then unbounded
    and unknown, so a tail counted at the client would measure how far behind the harness read,
    not what the server did; the stream's prompt end and its counts are judged instead."""
    limits = ctx.info.server.limits
    if ctx.session.protocol != "lmrpc" and (limits is None or not limits.max_parked_tokens):
        return None
    parked = int(limits.max_parked_tokens) if limits is not None else 0
    return int(2 * (TAIL_TOKENS + parked) * max(1.0, ctx.budgets.scale))


def _tokens(stream: LiveStream) -> dict[int, int]:
    return {i: len(v.token_ids) for i, v in stream.record.outputs().items()}


async def expect_aborted_end(
    ctx: Ctx, stream: LiveStream, n: int, what: str, at_ack: dict[int, int] | None = None
) -> None:
    """ABORT-2: the stream ends promptly; unfinished outputs end ABORTED with their delivered tokens counted
    and at most TAIL_TOKENS more after the AbortResponse (``at_ack``); the terminal message carries Usage;
    status OK."""
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
        allowance = tail_allowance(ctx)
        if at_ack is not None and allowance is not None and finish.reason == FinishReason.ABORTED:
            tail = len(view.token_ids) - at_ack.get(index, 0)
            ctx.check.that(
                tail <= allowance,
                f"{what}: output {index} tokens delivered after the AbortResponse",
                f"<= {allowance}",
                tail,
            )
    ctx.check.that(
        record.events[-1].message.usage is not None, f"{what}: Usage on the terminal message", "set", "absent"
    )


def outcomes_reported(ctx: Ctx) -> bool:
    """Whether the protocol's Abort says what it did per id (vllm-engine's answers nothing)."""
    return ctx.session.target.driver.abort_outcomes


async def abort_and_expect_end(ctx: Ctx, stream: LiveStream, n: int, what: str) -> None:
    rid = stream.record.request_id
    outcomes = await abort(ctx, rid)
    if outcomes_reported(ctx):
        ctx.check.equal(f"{what}: Abort outcomes", [(rid, "ABORTED")], outcomes)
    await expect_aborted_end(ctx, stream, n, what, _tokens(stream))


@case("ABORT-1", tag="unknown")
async def abort_unknown(ctx: Ctx) -> None:
    """Aborting ids that were never used returns OK with NOT_IN_FLIGHT for each, in order."""
    ids = [ctx.uid("never-1"), ctx.uid("never-2")]
    ctx.check.equal(
        "Abort outcomes for unknown ids", [(i, "NOT_IN_FLIGHT") for i in ids], await abort(ctx, *ids)
    )


@case("ABORT-1", tag="finished")
async def abort_finished(ctx: Ctx) -> None:
    """Aborting a finished request returns NOT_IN_FLIGHT and changes nothing."""
    done = ok(ctx, await ctx.generate(request(ctx, max_tokens=2)))
    ctx.check.equal(
        "Abort outcome for a finished request",
        [(done.request_id, "NOT_IN_FLIGHT")],
        await abort(ctx, done.request_id),
    )
    ok(ctx, await ctx.generate(request(ctx, max_tokens=2)), "a request after the no-op abort")


@case("ABORT-1", tag="finished-then-reused", sends=("scenario.abort-then-reuse",))
async def abort_finished_then_reused(ctx: Ctx) -> None:
    """An Abort for a finished request does not affect a later request that reuses its id (REQ-3)."""
    rid = ctx.uid("reused")
    ok(ctx, await ctx.generate(request(ctx, max_tokens=2, request_id=rid)), "the first request")
    ctx.check.equal("Abort outcome for a finished request", [(rid, "NOT_IN_FLIGHT")], await abort(ctx, rid))
    again = ok(
        ctx, await ctx.generate(request(ctx, max_tokens=2, request_id=rid)), "a request reusing the id"
    )
    reasons = [v.finish.reason.name if v.finish else "-" for v in again.outputs().values()]
    ctx.check.that(
        "ABORTED" not in reasons,
        "finish of a request reusing an id aborted after it finished",
        "not ABORTED",
        reasons,
    )


@case("ABORT-1", tag="twice")
async def abort_twice(ctx: Ctx) -> None:
    """The first Abort of a request in flight says ABORTED, a second one after its end NOT_IN_FLIGHT."""
    stream = ctx.open(long_request(ctx))
    await first_delta(ctx, stream)
    rid = stream.record.request_id
    ctx.check.equal("first Abort", [(rid, "ABORTED")], await abort(ctx, rid))
    await stream.finish(ctx.budgets.release_s)
    ctx.check.equal("second Abort of the same id", [(rid, "NOT_IN_FLIGHT")], await abort(ctx, rid))


@case("ABORT-1", tag="twice-while-ending", sends=("scenario.abort-twice-at-once",))
async def abort_twice_while_ending(ctx: Ctx) -> None:
    """Two Aborts of one request sent together: one covers it (ABORTED), the other, arriving while the
    request is still ending, is NOT_IN_FLIGHT."""
    stream = ctx.open(long_request(ctx))
    await first_delta(ctx, stream)
    rid = stream.record.request_id
    both = await asyncio.gather(abort(ctx, rid), abort(ctx, rid))
    ctx.check.equal(
        "the outcomes of two concurrent Aborts of one request in flight",
        [[(rid, "ABORTED")], [(rid, "NOT_IN_FLIGHT")]],
        sorted(both),
    )
    await stream.finish(ctx.budgets.release_s)


@case("ABORT-1", tag="mixed", sends=("scenario.abort-live-and-unknown",))
async def abort_mixed(ctx: Ctx) -> None:
    """One Abort naming an unknown id and a request in flight: NOT_IN_FLIGHT and ABORTED, in that order;
    the request in flight ends ABORTED."""
    stream = ctx.open(long_request(ctx))
    await first_delta(ctx, stream)
    rid, unknown = stream.record.request_id, ctx.uid("never")
    ctx.check.equal(
        "Abort outcomes for [unknown, in flight]",
        [(unknown, "NOT_IN_FLIGHT"), (rid, "ABORTED")],
        await abort(ctx, unknown, rid),
    )
    await expect_aborted_end(ctx, stream, 1, "the request in flight, aborted beside an unknown id")


@case("ABORT-1", tag="duplicate-ids", sends=("abort.duplicate-ids",))
async def abort_duplicates(ctx: Ctx) -> None:
    """An Abort naming ids more than once answers each distinct id once, in order of first appearance."""
    stream = ctx.open(long_request(ctx))
    await first_delta(ctx, stream)
    rid, unknown = stream.record.request_id, ctx.uid("never")
    ctx.check.equal(
        "Abort outcomes for [live, live, unknown, live, unknown]",
        [(rid, "ABORTED"), (unknown, "NOT_IN_FLIGHT")],
        await abort(ctx, rid, rid, unknown, rid, unknown),
    )
    await stream.finish(ctx.budgets.release_s)


@case("ABORT-2", tag="mid-stream", sends=("abort.ids=1",))
async def abort_mid_stream(ctx: Ctx) -> None:
    """Abort while tokens stream: ABORTED finish with the tokens so far (at most 16 after the
    AbortResponse), Usage, status OK, promptly."""
    stream = ctx.open(long_request(ctx))
    await first_delta(ctx, stream)
    await abort_and_expect_end(ctx, stream, 1, "aborted mid-stream")


@case("ABORT-2", tag="right-after-send")
async def abort_right_after_send(ctx: Ctx) -> None:
    """An Abort sent right after a Generate with a long prompt (while the server is still tokenizing it,
    usually): whatever the Abort answers, the stream ends ABORTED promptly, with no tokens past the tail."""
    text = "Once upon a time there was a conformance test. " * max(1, min(ctx.info.max_context // 24, 300))
    req = request(ctx, text, max_tokens=long_tokens(ctx) // 2, ignore_eos=True, temperature=0.0)
    stream = ctx.open(req)
    await asyncio.sleep(0.005)
    outcomes = await abort(ctx, stream.record.request_id)
    if outcomes_reported(ctx):
        ctx.check.that(
            [status for _, status in outcomes] in (["ABORTED"], ["NOT_IN_FLIGHT"]),
            "Abort outcome right after the Generate was sent",
            "ABORTED (or NOT_IN_FLIGHT, remembered for its arrival, ABORT-6)",
            outcomes,
        )
    await expect_aborted_end(ctx, stream, 1, "aborted right after it was sent", {})


@case("ABORT-2", tag="before-first-token")
async def abort_before_tokens(ctx: Ctx) -> None:
    """Abort as soon as the request is accepted (before its first token, usually)."""
    stream = ctx.open(long_request(ctx))
    await accepted(ctx, stream)
    await abort_and_expect_end(ctx, stream, 1, "aborted at acceptance")


@case(
    "ABORT-4",
    variants=[
        Variant({"n": 2}, requires=("max_outputs>=2",)),
        Variant({"n": 4}, requires=("max_outputs>=4",)),
    ],
)
async def abort_covers_outputs(ctx: Ctx) -> None:
    """Aborting an n>1 request ends every one of its outputs."""
    n = int(str(ctx.params["n"]))
    stream = ctx.open(long_request(ctx, n=n))
    await first_delta(ctx, stream)
    await abort_and_expect_end(ctx, stream, n, f"aborted n={n} request")


def _expect_all_aborted(
    ctx: Ctx, streams: list[LiveStream], outcomes: list[tuple[str, str]], what: str
) -> None:
    """Each of ``streams`` ABORTED exactly once (requests earlier cases left ending may be listed too)."""
    if not outcomes_reported(ctx):
        return  # each stream's aborted end is checked by the caller
    ours = {s.record.request_id for s in streams}
    ctx.check.equal(
        f"Abort(all) outcomes for {what}",
        sorted((rid, "ABORTED") for rid in ours),
        sorted(o for o in outcomes if o[0] in ours),
    )
    ids = [rid for rid, _ in outcomes]
    ctx.check.that(len(ids) == len(set(ids)), "Abort(all) outcomes", "one per request", outcomes)


@case("ABORT-5", exclusive=True, sends=("abort.all",))
async def abort_everything(ctx: Ctx) -> None:
    """Abort(all) aborts every request in flight and reports each ABORTED, once."""
    n = min(ctx.info.caps.max_outputs, 2)
    streams = [ctx.open(long_request(ctx, n=k)) for k in (None, n, None)]
    await started(ctx, *streams)
    _expect_all_aborted(ctx, streams, await abort_all(ctx), "the requests in flight")
    for stream, k in zip(streams, (1, n, 1), strict=True):
        await expect_aborted_end(ctx, stream, k, f"{stream.record.request_id} after Abort(all)")


@case(
    "ABORT-5", tag="waiting", requires=("admin",), exclusive=True, sends=("scenario.abort-all-while-waiting",)
)
async def abort_everything_waiting(ctx: Ctx) -> None:
    """Abort(all) also covers requests accepted while generation is paused (waiting, no tokens yet)."""
    await paused(ctx)
    try:
        streams = [ctx.open(long_request(ctx)) for _ in range(2)]
        for stream in streams:
            await accepted(ctx, stream)
        outcomes = await abort_all(ctx)
    finally:
        await resumed(ctx)
    _expect_all_aborted(ctx, streams, outcomes, "waiting requests")
    for stream in streams:
        await expect_aborted_end(ctx, stream, 1, f"waiting {stream.record.request_id} after Abort(all)")


@case("ABORT-6", budget=1.5, sends=("scenario.abort-before-arrival",))
async def abort_before_arrival(ctx: Ctx) -> None:
    """An Abort that races ahead of its Generate wins: the Generate is accepted and ends ABORTED at once."""
    rid = ctx.uid("early")
    outcomes = await abort(ctx, rid)
    if outcomes_reported(ctx):
        ctx.check.equal("Abort of an id not yet in flight", [(rid, "NOT_IN_FLIGHT")], outcomes)
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


@case("ABORT-6", tag="after-expiry", budget=1.5)
async def abort_memory_expires(ctx: Ctx) -> None:
    """An Abort's memory lasts limits.abort_grace_seconds: a Generate with an id aborted longer ago runs
    normally, while ids remembered since still win, also after older ones expired."""
    limits = ctx.info.server.limits
    grace = float(getattr(limits, "abort_grace_seconds", 0.0) or 0.0)
    if not grace or grace > 10:
        raise CaseSkipped(f"limits.abort_grace_seconds={grace}: not reported, or too long to wait out")
    old, fresh, newer = ctx.uid("old"), ctx.uid("fresh"), ctx.uid("newer")
    await abort(ctx, old)
    await asyncio.sleep(grace + 0.5)
    await abort(ctx, fresh)
    await abort(ctx, newer)  # remembering it must not drop `fresh` while the expired `old` is evicted
    late = ok(
        ctx,
        await ctx.generate(request(ctx, max_tokens=2, request_id=old)),
        "a Generate after its Abort expired",
    )
    reasons = [v.finish.reason.name if v.finish else "-" for v in late.outputs().values()]
    ctx.check.that(
        "ABORTED" not in reasons,
        f"finish of {old!r}, aborted {grace + 0.5:.1f}s before",
        "not ABORTED",
        reasons,
    )
    record = await ctx.generate(long_request(ctx, request_id=fresh), total_s=ctx.budgets.release_s)
    early = [v.finish.reason.name if v.finish else "-" for v in record.outputs().values()]
    ctx.check.equal(f"finish of {fresh!r}, aborted just before it arrived", ["ABORTED"], early)


@case(
    "ABORT-7",
    variants=[
        Variant({"empty": False}, tag="no-target", sends=("abort.no-target",)),
        Variant({"empty": True}, tag="empty-ids", sends=("abort.empty-ids",)),
    ],
)
async def abort_without_target(ctx: Ctx) -> None:
    """Abort with no target, or with an empty id list, is INVALID_ARGUMENT."""
    message = AbortRequest(request_ids=RequestIds(ids=[])) if ctx.params["empty"] else AbortRequest()
    outcome = await ctx.call_status(ctx.control.abort, message)
    ctx.check.equal(f"Abort({message!r})", Status.INVALID_ARGUMENT.name, outcome.code)


@case("ABORT-2", tag="several-ids", sends=("abort.ids>1",))
async def several_ids_in_one_abort(ctx: Ctx) -> None:
    """One Abort naming several requests in flight ends every one of them (a protocol whose Abort
    takes a list, as vLLM's does, is sent them all in one call), in whatever order it names them."""
    streams = [ctx.open(long_request(ctx, request_id=ctx.uid(f"many-{i}"))) for i in range(3)]
    await started(ctx, *streams)
    at_ack = {s.record.request_id: _tokens(s) for s in streams}
    ids = [s.record.request_id for s in reversed(streams)]
    outcomes = await abort(ctx, *ids)
    if outcomes_reported(ctx):
        ctx.check.equal(
            "the outcomes of one Abort naming three requests in flight",
            [(i, "ABORTED") for i in ids],
            outcomes,
        )
    for stream in streams:
        rid = stream.record.request_id
        await expect_aborted_end(ctx, stream, 1, f"{rid}, one of three in one Abort", at_ack[rid])


@case("ABORT-1", tag="prefix-id", sends=("scenario.abort-prefix-id",))
async def abort_of_a_prefix_id(ctx: Ctx) -> None:
    """An Abort names ids exactly: one that is a proper prefix of a request in flight, or that the
    request's id is a prefix of, covers nothing (NOT_IN_FLIGHT where outcomes are reported) and the
    request streams on (SGLang matched request ids by prefix)."""
    base = ctx.uid("prefix")
    stream = ctx.open(long_request(ctx, request_id=f"{base}-tail"))
    await first_delta(ctx, stream)
    for near in (base, f"{base}-tail-more"):
        outcomes = await abort(ctx, near)
        if outcomes_reported(ctx):
            ctx.check.equal(
                f"Abort of {near!r} while {base + '-tail'!r} is in flight",
                [(near, "NOT_IN_FLIGHT")],
                outcomes,
            )
        going = await streams_on(ctx, stream, f"{base}-tail after an Abort of {near!r}")
    if going:  # not where it ended meanwhile (a fast server)
        await abort_and_expect_end(ctx, stream, 1, f"{base}-tail, then aborted by its own id")
