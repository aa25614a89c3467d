"""The server's life as a router sees it: which instance it is (SVC-4), across a restart the user's
``--restart-hook`` makes, and its drain when the user's ``--drain-hook`` begins a shutdown (LIFE-1,
and SMG-5 on the engine protocols). The hook cases run after every other case (``Stage``)."""

from __future__ import annotations

import asyncio
import time

from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from conformance.cases._helpers import expect_rejected, first_delta
from conformance.drivers.smg import SmgDriver
from conformance.harness.context import Ctx
from conformance.harness.hooks import run_hook
from conformance.harness.requests import long_tokens, request
from conformance.spec.registry import Stage, case
from conformance.stream.live import LiveStream
from conformance.vocabulary import CaseFailed, CaseSkipped, Mismatch
from lmrpc.v1 import FinishReason, GetServerInfoRequest, ServerInfo

DRAINED_TOKENS = 24  # a request that finishes within the drain, in flight when it begins
OUTLIVING_TOKENS = 2048  # a request that outlives a drain of seconds (capped by the window)
CLOCK_SLACK_S = 0.5  # uptime read on the server against the harness's clock


async def server_info(ctx: Ctx) -> ServerInfo:
    response = await ctx.call(ctx.control.get_server_info, GetServerInfoRequest())
    return response.server or ServerInfo()


def _instance_field(ctx: Ctx) -> str:
    return ctx.session.target.driver.instance_field


INSTANCE_CALLS = 6


@case("SVC-4")
async def instance_is_stable(ctx: Ctx) -> None:
    """While the server runs, GetServerInfo names one instance on every call and its uptime grows.
    Several calls, not two: an instance recomputed per call (a start time taken as now minus the
    uptime) may differ from one call to the next only by a microsecond's rounding."""
    first = await server_info(ctx)
    later = []
    for _ in range(INSTANCE_CALLS - 1):
        await asyncio.sleep(0.05)
        later.append(await server_info(ctx))
    field = _instance_field(ctx)
    if field:
        ctx.check.that(
            bool(first.instance_id), f"{field} while serving", "non-empty", repr(first.instance_id)
        )
        ctx.check.equal(
            f"{field} on {INSTANCE_CALLS - 1} more calls",
            [first.instance_id] * len(later),
            [info.instance_id for info in later],
        )
    ctx.check.that(
        later[-1].uptime_seconds > first.uptime_seconds,
        f"uptime_seconds {0.05 * len(later):.1f} s later",
        f"> {first.uptime_seconds:.3f}",
        f"{later[-1].uptime_seconds:.3f}",
    )


async def _serving_again(ctx: Ctx, budget_s: float) -> ServerInfo:
    """Poll until the restarted server answers GetServerInfo and generates a token."""
    give_up = time.monotonic() + budget_s
    last = "no answer yet"
    while time.monotonic() < give_up:
        try:
            record = await ctx.generate(request(ctx, max_tokens=1))
            if record.ended_ok and record.error is None:
                return await server_info(ctx)  # after a token: from the server that serves
            last = record.summary()
        except (TimeoutError, GRPCError, OSError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(0.2)
    raise CaseFailed(
        [
            *ctx.check.mismatches,
            Mismatch("the server after --restart-hook", f"serving within {budget_s:.0f}s", last),
        ]
    )


@case("SVC-4", tag="restart", stage=Stage.RESTARTS, budget=4.0, sends=("scenario.restart",))
async def instance_changes_on_restart(ctx: Ctx) -> None:
    """With --restart-hook: after the server restarts it names a new instance and its uptime starts
    again, so a router drops what it kept about the old one; the new instance is stable in turn."""
    hook = ctx.session.access.restart_hook
    if not hook:
        raise CaseSkipped("no --restart-hook: the harness does not restart the server")
    before = await server_info(ctx)
    started = time.monotonic()
    await run_hook("--restart-hook", hook, ctx.budgets.case_s())
    after = await _serving_again(ctx, ctx.budgets.case_s(2.0))
    since = time.monotonic() - started
    ctx.note(f"restarted and serving {since:.1f}s after the hook began; uptime {after.uptime_seconds:.1f}s")
    field = _instance_field(ctx)
    if field:
        ctx.check.that(
            bool(after.instance_id) and after.instance_id != before.instance_id,
            f"{field} after a restart",
            f"new and non-empty (was {before.instance_id!r})",
            repr(after.instance_id),
        )
    ctx.check.that(
        after.uptime_seconds <= since + CLOCK_SLACK_S,
        "uptime_seconds after a restart",
        f"<= {since:.1f}s (the restart began then)",
        f"{after.uptime_seconds:.1f}s",
    )
    again = await server_info(ctx)
    if field:
        ctx.check.equal(
            f"{field} of the restarted server on a later call", after.instance_id, again.instance_id
        )


async def _serving(ctx: Ctx) -> tuple[bool, str]:
    """Whether the server says it serves: the engine HealthCheck on an engine protocol (SMG-5), else
    grpc.health.v1 for the whole server (HEALTH-2)."""
    driver = ctx.session.target.driver
    channel = ctx.session.target.channel
    if isinstance(driver, SmgDriver):
        healthy, message = await driver.health(channel, ctx.budgets.rpc_s)
        return healthy, f"HealthCheck healthy={healthy} message={message!r}"
    reply = await HealthStub(channel).Check(HealthCheckRequest(service=""), timeout=ctx.budgets.rpc_s)
    return reply.status == HealthCheckResponse.SERVING, HealthCheckResponse.ServingStatus.Name(reply.status)


def _drain_streams(ctx: Ctx) -> tuple[LiveStream, LiveStream]:
    """One request that ends within any drain, and one that keeps the server draining until its drain
    time (its output must then end ABORTED with usage, not be cut off)."""
    short = request(ctx, "Drain me", max_tokens=DRAINED_TOKENS, ignore_eos=True, temperature=0.0)
    long = request(ctx, max_tokens=min(long_tokens(ctx), OUTLIVING_TOKENS), ignore_eos=True, temperature=0.0)
    return ctx.open(short), ctx.open(long)


async def _judge_drained(ctx: Ctx, stream: LiveStream, drain_s: float, began: float) -> None:
    record = await stream.finish(ctx.budgets.stream_s + drain_s)
    what = f"stream {record.request_id!r} in flight when the drain began"
    if not (record.ended_ok and record.error is None):
        ctx.check.add(what, "ends with its finish and usage, then status OK", record.summary())
        return
    ctx.check.that(record.usage is not None, f"{what}: Usage", "present", "absent")
    for index, output in record.outputs().items():
        finish = output.finish
        if finish is None:
            ctx.check.add(f"{what}: output {index}", "a finish", "none")
            continue
        if finish.reason == FinishReason.ABORTED and drain_s > 0:
            seq = output.finishes[0][0]
            ended = stream.started_at + record.events[seq].t_s - began  # seconds into the drain
            ctx.check.that(
                ended >= drain_s - CLOCK_SLACK_S,
                f"{what}: output {index} ABORTED",
                f"only past limits.drain_timeout_seconds={drain_s:g}",
                f"{ended:.1f}s into the drain",
            )


@case("LIFE-1", tag="drain", stage=Stage.ENDS, budget=3.0, sends=("scenario.drain",))
@case("SMG-5", tag="drain", stage=Stage.ENDS, budget=3.0, sends=("scenario.drain",))
async def drain_as_a_router_sees_it(ctx: Ctx) -> None:
    """With --drain-hook: once the shutdown begins the server says it is not serving while the
    streams in flight keep its listener open, refuses a new Generate with UNAVAILABLE, and ends each
    stream in flight with its finish and usage (ABORTED only past its drain time)."""
    hook = ctx.session.access.drain_hook
    if not hook:
        raise CaseSkipped("no --drain-hook: the harness does not shut the server down")
    drain_s = ctx.info.server.limits.drain_timeout_seconds if ctx.info.server.limits else 0.0
    short, long = _drain_streams(ctx)
    for stream in (short, long):
        await first_delta(ctx, stream)
    began = time.monotonic()
    await run_hook("--drain-hook", hook, ctx.budgets.rpc_s)
    serving, said, judged = True, "", False
    while serving and not long.done.is_set() and time.monotonic() - began < ctx.budgets.release_s:
        try:
            serving, said = await _serving(ctx)
        except (GRPCError, OSError, StreamTerminatedError) as exc:
            if long.done.is_set():
                break  # the drain ended and the server with it while the check was under way
            serving, said = True, f"no health answer: {type(exc).__name__}: {exc}"
            judged = True
            break
        judged = judged or not long.done.is_set()
        await asyncio.sleep(0.05 if serving else 0)
    if judged:
        ctx.check.that(not serving, "health while the server drains, a stream in flight", "not serving", said)
    else:
        ctx.note("the long stream ended before the first health check: health not judged")
    if not long.done.is_set():
        refused = await ctx.answer(request(ctx, "Too late", max_tokens=2))
        expect_rejected(ctx, refused, [Status.UNAVAILABLE], "a Generate while the server drains")
    for stream in (short, long):
        await _judge_drained(ctx, stream, drain_s, began)
