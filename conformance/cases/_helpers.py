"""Small building blocks shared by the case modules."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from grpclib.const import Status

from conformance.harness.context import Ctx
from conformance.spec.profiles import PROFILES
from conformance.spec.registry import REGISTRY
from conformance.stream.live import LiveStream
from conformance.stream.record import End, StreamRecord
from conformance.vocabulary import CaseFailed, CaseSkipped, Mismatch
from lmrpc.v1 import (
    AbortRequest,
    AllRequests,
    FinishReason,
    PauseGenerationRequest,
    RequestIds,
    ResumeGenerationRequest,
)

NO_SUCH_PATH = "/nonexistent/lmrpc-conformance/weights"  # a path no server host has


def applies_here(ctx: Ctx, case_id: str) -> bool:
    """Whether the case ``case_id`` applies in the protocol the run speaks (spec/profiles/)."""
    case = REGISTRY.get(case_id)
    return case is None or PROFILES[ctx.session.target.driver.protocol].case(case).applies


def ok(ctx: Ctx, record: StreamRecord, what: str = "the stream") -> StreamRecord:
    """Fail the case unless the call was accepted and ended with status OK and no RequestError."""
    if record.ended_ok and record.events and record.error is None:
        return record
    detail = record.summary() + (f" error={record.error}" if record.error else "")
    raise CaseFailed([*ctx.check.mismatches, Mismatch(what, "accepted, then status OK", detail)])


def status_of(record: StreamRecord) -> str:
    if record.end is End.STATUS and record.status is not None:
        return f"{record.status.name} after {len(record.events)} messages"
    return record.summary()


def expect_rejected(ctx: Ctx, record: StreamRecord, codes: Iterable[Status], what: str) -> bool:
    """A request the contract rejects: a non-OK status with one of ``codes`` and no messages (ERR-1)."""
    codes = tuple(codes)
    names = " or ".join(c.name for c in codes)
    good = record.end is End.STATUS and record.status in codes and not record.events
    return ctx.check.that(good, what, f"{names} and no messages", status_of(record))


def outputs_tokens(record: StreamRecord) -> list[list[int]]:
    return [v.token_ids for v in record.outputs().values()]


async def first_delta(ctx: Ctx, stream: LiveStream) -> None:
    """Read until the stream delivered a token (the request is certainly running)."""
    event = await stream.read_until(
        lambda e: (
            e.kind == "delta"
            and bool(e.message.delta and (e.message.delta.token_ids or e.message.delta.text))
        ),
        ctx.budgets.prompt_s,
    )
    if event is None:
        raise CaseFailed(
            [
                *ctx.check.mismatches,
                Mismatch("a long request", "in flight with tokens streaming", stream.record.summary()),
            ]
        )


async def started(ctx: Ctx, *streams: LiveStream) -> None:
    """Each stream is in flight: as many as the server runs at once generating (a first token), the
    others, which it keeps waiting behind them, accepted (a first message, where the protocol sends
    one before any token; where it sends none, a waiting request is silent and nothing is awaited)."""
    for i, stream in enumerate(streams):
        if i < ctx.session.parallel:
            await first_delta(ctx, stream)
        elif ctx.session.target.driver.announces_acceptance:
            await accepted(ctx, stream)


def need_running(ctx: Ctx, count: int, why: str) -> None:
    """Skip unless the server runs ``count`` requests at once (harness/pace.py measured fewer)."""
    if ctx.session.parallel < count:
        raise CaseSkipped(
            f"{why}: needs {count} requests running at once, and the server runs {ctx.session.parallel} "
            "(measured before the cases)"
        )


SETTLE_BASE_S = 0.5  # how long a stream is watched after an action that must leave it alone ...
SETTLE_MESSAGES = 256  # ... or how many more messages, whichever comes first (a fast server's)


async def streams_on(ctx: Ctx, stream: LiveStream, what: str) -> bool:
    """``stream`` (a ``long_request``) goes on across an action that must leave it alone. It is watched
    for a while first (or for a fast server's many more messages), so that an end the server sent
    because of the action arrives, behind the tokens that were already on their way: then it is
    still streaming, with one more message and no error, or it ended as it would have ended anyway
    (status OK, every output finished "length" at its max_tokens: a fast server may finish it
    meanwhile). True while it is still streaming: what comes next in the case needs it in flight."""
    seen = len(stream.events)
    with contextlib.suppress(TimeoutError):
        watched = stream.read_until(lambda e: e.seq >= seen + SETTLE_MESSAGES)
        await asyncio.wait_for(watched, SETTLE_BASE_S * ctx.budgets.scale)
    await stream.read_until(lambda e: e.seq >= seen, ctx.budgets.prompt_s)
    if not stream.done.is_set():
        return ctx.check.that(len(stream.events) > seen and stream.record.error is None, what,
                              "still streaming", stream.record.summary())  # fmt: skip
    record = stream.record
    limit = record.request.stopping.max_tokens if record.request.stopping else None
    ends = _ends(record)
    ctx.check.that(
        ran_to_its_end(record),
        f"{what}: it ended meanwhile",
        f'as it would have: status OK, each of {record.n} outputs "length" at {limit} tokens',
        f"{record.summary()}, outputs (tokens, finish): {ends}",
    )  # fmt: skip
    ctx.note(f"{what}: it ended meanwhile (status OK, finish length at {limit} tokens)")
    return False


def _ends(record: StreamRecord) -> list[tuple[int, str | None]]:
    return [(len(v.token_ids), v.finish.reason.name if v.finish else None) for v in record.outputs().values()]


def ran_to_its_end(record: StreamRecord) -> bool:
    """A ``long_request`` that ended as it would have with nothing done to it: status OK, each output
    finished "length" at its max_tokens (a fast server's, or a busy client's, may end before an
    action meant for it in flight arrives)."""
    limit = record.request.stopping.max_tokens if record.request.stopping else None
    ends = _ends(record)
    return (
        record.ended_ok and record.error is None and len(ends) == record.n
        and all(end == (limit, FinishReason.LENGTH.name) for end in ends)
    )  # fmt: skip


async def accepted(ctx: Ctx, stream: LiveStream) -> None:
    event = await stream.next(ctx.budgets.prompt_s)
    if event is None:
        raise CaseFailed(
            [
                *ctx.check.mismatches,
                Mismatch("the request", "accepted (a first message)", stream.record.summary()),
            ]
        )


async def abort(ctx: Ctx, *ids: str) -> list[tuple[str, str]]:
    """Abort ``ids``; the outcomes exactly as sent, in order (duplicates are ABORT-1's business)."""
    response = await ctx.call(ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=list(ids))))
    return [(o.request_id, o.status.name) for o in response.outcomes]


async def abort_all(ctx: Ctx) -> list[tuple[str, str]]:
    response = await ctx.call(ctx.control.abort, AbortRequest(all=AllRequests()))
    return [(o.request_id, o.status.name) for o in response.outcomes]


async def paused(ctx: Ctx) -> None:
    await ctx.call(ctx.control.pause_generation, PauseGenerationRequest())


async def resumed(ctx: Ctx) -> None:
    await ctx.call(ctx.control.resume_generation, ResumeGenerationRequest())
