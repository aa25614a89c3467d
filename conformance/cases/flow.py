"""Clients that do not read (FLOW-1, FLOW-2). A stalled client is an HTTP/2 connection whose receive
window is small and never reopened; the server can send it only that many bytes, so what it
generated beyond that waits in the server, which the clause bounds."""

from __future__ import annotations

import asyncio
import time

from grpclib.const import Status

from conformance.cases._helpers import need_running, ok
from conformance.harness.context import Ctx
from conformance.harness.load import expect_released, quiet_load
from conformance.harness.requests import long_tokens, request
from conformance.spec.registry import case
from conformance.stream.h2call import H2Call, frame
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import AbortRequest, AbortStatus, FinishReason, GenerateResponse, RequestIds, ServerLimits

GENERATE = "/lmrpc.v1.InferenceService/Generate"
WINDOW = 256  # bytes the stalled client lets through before it stops reading
SLACK_TOKENS = 64  # a step or two that was already on its way when the server stopped
SHOWN_AT = 1.5  # a server that ignores the stall generates this many times the bound while FLOW-1 waits


async def _stalled(ctx: Ctx, request_id: str, max_tokens: int) -> H2Call:
    endpoint = ctx.session.target.endpoint
    call = H2Call(endpoint.host, endpoint.port, window=WINDOW, tls=endpoint.ssl_context())
    await call.__aenter__()
    call.read_data = False
    token = endpoint.credentials.token
    call.start(GENERATE, metadata={"authorization": f"Bearer {token}"} if token else {})
    body = request(ctx, "Once upon a time", max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    body.request_id = request_id
    call.send(frame(bytes(body)), end=True)
    ctx.note(f"opened {request_id!r} with a {WINDOW}-byte window that is never reopened")
    return call


def _messages(call: H2Call) -> list[GenerateResponse]:
    return [GenerateResponse.parse(m) for m in call.result.messages()]


async def _tokens_per_second(ctx: Ctx) -> float:
    started = time.monotonic()
    record = ok(ctx, await ctx.generate(request(ctx, max_tokens=32, ignore_eos=True, temperature=0.0)))
    tokens = sum(len(v.token_ids) for v in record.outputs().values())
    return tokens / max(time.monotonic() - started, 1e-3)


def _bound(limits: ServerLimits) -> int:
    """The most tokens FLOW-1 lets a server generate for a client that reads nothing."""
    return 2 * int(limits.max_parked_tokens) + WINDOW + SLACK_TOKENS


@case("FLOW-1", exclusive=True, budget=2.0)
async def stalled_client_is_held(ctx: Ctx) -> None:
    """A client that stops reading costs at most max_parked_tokens beyond its window; others run on."""
    limits = ctx.info.server.limits
    if limits is None or not limits.max_parked_tokens:
        raise CaseSkipped("the server reports no ServerInfo.limits.max_parked_tokens (contract revision 1)")
    bound = _bound(limits)
    max_tokens = long_tokens(ctx)
    if max_tokens < 2 * bound:  # room for SHOWN_AT x the bound and what runs on before the abort
        raise CaseSkipped(
            f"a request can run {max_tokens} tokens; proving a bound of {bound} needs {2 * bound}"
        )
    rate = await _tokens_per_second(ctx)
    wait_s = SHOWN_AT * bound / rate  # sized by the measured rate: long enough to see a breach, no longer
    if wait_s > ctx.budgets.case_s(2.0) / 2:
        raise CaseSkipped(
            f"at {rate:.0f} tokens/s the server needs {wait_s:.0f} s to show the bound; run with a larger --time-scale"
        )
    stall = float(limits.stall_timeout_seconds)
    if stall and wait_s > stall * 0.8:
        raise CaseSkipped(
            f"at {rate:.0f} tokens/s showing the bound takes {wait_s:.1f} s, past the {stall:g} s stall timeout (FLOW-2)"
        )
    request_id = ctx.uid("stalled")
    baseline = await quiet_load(ctx)
    call = await _stalled(ctx, request_id, max_tokens)
    try:
        await asyncio.sleep(wait_s)  # the time the server would need to generate SHOWN_AT x the bound
        bystander = await ctx.generate(request(ctx, max_tokens=8, ignore_eos=True, temperature=0.0))
        ok(ctx, bystander, "another client's request while one client does not read")
        reply = await ctx.call(ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=[request_id])))
        ctx.check.equal(
            "Abort of the stalled request",
            [AbortStatus.ABORTED.name],
            [o.status.name for o in reply.outcomes],
        )
        call.acknowledge()
        try:
            await call.wait(ctx.budgets.stream_s)
        except TimeoutError:
            ctx.check.fail("the stalled stream once read", "ends after the abort", "no end")
            return
    finally:
        await call.__aexit__()
    finishes = [m.finished for m in _messages(call) if m.finished is not None]
    ctx.check.that(
        len(finishes) == 1 and finishes[0].reason == FinishReason.ABORTED,
        "the stalled stream's end",
        "one ABORTED finish",
        finishes,
    )
    generated = finishes[0].completion_tokens if finishes else 0
    ctx.check.that(
        generated <= bound,
        f"tokens generated for a client that read nothing for {wait_s:.1f} s",
        f"at most 2 x max_parked_tokens + {WINDOW} + {SLACK_TOKENS} = {bound}",
        generated,
    )
    await expect_released(ctx, baseline, "the stalled request ended")


@case("FLOW-1", tag="resumes", budget=2.0)
async def held_request_resumes(ctx: Ctx) -> None:
    """A request longer than max_parked_tokens, read as it comes, runs to its max_tokens: the server
    holds a request only while its client does not read, and gives it more room as it does."""
    limits = ctx.info.server.limits
    if limits is None or not limits.max_parked_tokens:
        raise CaseSkipped("the server reports no ServerInfo.limits.max_parked_tokens (contract revision 1)")
    max_tokens = _bound(limits) + int(limits.max_parked_tokens)  # past what a server may run unread
    if max_tokens > long_tokens(ctx):
        raise CaseSkipped(f"a request can run {long_tokens(ctx)} tokens; this case needs {max_tokens}")
    rate = await _tokens_per_second(ctx)
    if max_tokens / rate > ctx.budgets.case_s(2.0) / 2:
        raise CaseSkipped(
            f"at {rate:.0f} tokens/s {max_tokens} tokens take {max_tokens / rate:.0f} s; run with a larger --time-scale"
        )
    long = request(ctx, max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    record = ok(ctx, await ctx.generate(long, total_s=max(ctx.budgets.stream_s, 2 * max_tokens / rate)))
    view = record.outputs().get(0)
    finish = view.finish if view is not None else None
    tokens = len(view.token_ids) if view is not None else 0
    ctx.check.that(
        finish is not None and finish.reason == FinishReason.LENGTH and tokens == max_tokens,
        f"a request of {max_tokens} tokens (past the FLOW-1 bound) read as it comes",
        f"LENGTH after {max_tokens} tokens",
        f"{finish.reason.name if finish else 'no finish'} after {tokens} tokens",
    )


@case("FLOW-1", tag="pause-then-read", exclusive=True, budget=2.0)
async def paused_reader_gets_it_all(ctx: Ctx) -> None:
    """A client that stops reading until the server holds its request (well inside the stall timeout),
    then reads again, gets the whole output: however many held tokens it reads at once, the server gives
    the request room again."""
    limits = ctx.info.server.limits
    if limits is None or not limits.max_parked_tokens:
        raise CaseSkipped("the server reports no ServerInfo.limits.max_parked_tokens (contract revision 1)")
    bound = _bound(limits)
    max_tokens = bound + int(limits.max_parked_tokens)  # past what a server may run unread
    if max_tokens > long_tokens(ctx):
        raise CaseSkipped(f"a request can run {long_tokens(ctx)} tokens; this case needs {max_tokens}")
    rate = await _tokens_per_second(ctx)
    pause_s = SHOWN_AT * bound / rate  # long enough for the server to run into its bound and hold
    stall = float(limits.stall_timeout_seconds)
    if stall and pause_s > stall * 0.8:
        raise CaseSkipped(
            f"at {rate:.0f} tokens/s holding takes {pause_s:.1f} s, past the {stall:g} s stall timeout (FLOW-2)"
        )
    if pause_s + 2 * max_tokens / rate > ctx.budgets.case_s(2.0) / 2:
        raise CaseSkipped(f"at {rate:.0f} tokens/s this case needs more time; run with a larger --time-scale")
    call = await _stalled(ctx, ctx.uid("pause-then-read"), max_tokens)
    try:
        await asyncio.sleep(pause_s)
        call.acknowledge()  # reads everything from now on
        try:
            await call.wait(max(ctx.budgets.stream_s, 2 * max_tokens / rate))
        except TimeoutError:
            ctx.check.fail(
                f"a request of {max_tokens} tokens whose client paused {pause_s:.1f} s, then read",
                f"LENGTH after {max_tokens} tokens",
                f"no end ({len(call.result.messages())} messages so far)",
            )
    finally:
        await call.__aexit__()
    finishes = [m.finished for m in _messages(call) if m.finished is not None]
    ctx.check.equal(
        f"the end of a request of {max_tokens} tokens whose client paused {pause_s:.1f} s, then read",
        [("LENGTH", max_tokens)],
        [(f.reason.name, f.completion_tokens) for f in finishes],
    )


@case("FLOW-2", exclusive=True, budget=2.0)
async def stalled_client_is_given_up(ctx: Ctx) -> None:
    """After the stall timeout the request is aborted and ends with RESOURCE_EXHAUSTED; later, a reset."""
    limits = ctx.info.server.limits
    stall = float(limits.stall_timeout_seconds) if limits is not None else 0.0
    if not stall:
        raise CaseSkipped("the server reports no stall timeout (ServerInfo.limits.stall_timeout_seconds = 0)")
    if 2 * stall + ctx.budgets.release_s > ctx.budgets.case_s(2.0) / 2:
        raise CaseSkipped(f"a stall timeout of {stall:g} s does not fit the case budget; raise --time-scale")
    need_running(ctx, 2, "a stream read after the stall timeout beside one never read again")
    baseline = await quiet_load(ctx)
    max_tokens = long_tokens(ctx)
    reads_later = await _stalled(ctx, ctx.uid("stall-read"), max_tokens)
    never_reads = await _stalled(ctx, ctx.uid("stall-never"), max_tokens)
    try:
        await asyncio.sleep(1.5 * stall)  # past the stall timeout, before the reset that follows it
        reads_later.acknowledge()
        try:
            await reads_later.wait(ctx.budgets.stream_s)
        except TimeoutError:
            ctx.check.fail("a stream read after the stall timeout", "ends", "no end")
        last = _messages(reads_later)[-1] if reads_later.result.messages() else None
        error = last.error if last is not None else None
        ctx.check.that(
            last is not None
            and error is not None
            and error.code == Status.RESOURCE_EXHAUSTED.value
            and not error.retryable
            and last.usage is not None,
            "the terminal message of a stream stalled past the timeout",
            "RequestError(RESOURCE_EXHAUSTED, not retryable) with Usage",
            last,
        )
        ctx.check.equal(
            "its status", "OK", reads_later.result.status.name if reads_later.result.status else None
        )
        try:
            result = await never_reads.wait(stall + ctx.budgets.release_s)
            ctx.check.that(result.reset is not None, "a client that never reads again", "RST_STREAM", result)
        except TimeoutError:
            ctx.check.fail("a client that never reads again", f"reset within {2 * stall:g} s", "still open")
    finally:
        await reads_later.__aexit__()
        await never_reads.__aexit__()
    await expect_released(ctx, baseline, "the stalled request ended")
