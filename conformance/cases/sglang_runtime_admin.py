"""SGLang's administration on its native service, read as SGLang reads it (LIFE-3, ADMIN-1, ADMIN-2).

SGLang answers these RPCs with ``success``/``message`` fields more than with statuses:

- ``FlushCache`` answers ``success``: true with nothing in flight; with requests running SGLang
  refuses (``success`` false, "pending requests") and a server may flush what they do not use
  instead; either way the requests go on (LIFE-3[native-flush]);
- ``PauseGeneration``'s modes: ``abort`` ends every request in flight, each output "abort", and
  pauses; ``retract`` pauses with the running requests sent back to the queue, recomputed on
  ``ContinueGeneration``; ``in_place`` keeps them where they are (LIFE-3[pause], through the
  driver). Requests sent while paused wait for ``ContinueGeneration``;
- ``StartProfile`` and ``StopProfile`` answer a ``message`` (the trace is written on the server's
  host, named nowhere); a second start while recording and a stop with none fail with a status
  (SGLang's: INTERNAL, with its profiler's message) (ADMIN-1[native]);
- ``UpdateWeightsFromDisk`` answers ``success`` and ``message``: a path that does not exist or holds
  no model is refused, SGLang's way ``success`` false with the reason in ``message`` (a status naming
  ``model_path`` reads as a refusal too) and changes nothing; the served checkpoint
  (``--weights-path``) loads (ADMIN-2[native-refused], ADMIN-2[native-reload]).

The administration RPCs go on the admin token's channel where one is given (AUTH-2).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from grpclib import GRPCError, Status

from conformance.cases._helpers import NO_SUCH_PATH, first_delta, ok, outputs_tokens, streams_on
from conformance.cases._learned import DETERMINISTIC
from conformance.cases.abort import expect_aborted_end
from conformance.cases.sglang_runtime import runtime
from conformance.harness.context import Ctx
from conformance.harness.requests import long_request, request
from conformance.spec.registry import case
from conformance.stream.live import LiveStream
from conformance.vocabulary import CaseFailed, CaseSkipped, Mismatch
from lmrpc._gen.sglang.runtime import v1 as rt

RUNTIME = ("sglang-runtime",)
NOT_A_MODEL = "/dev/null"  # a path every POSIX host has, that holds no model
GREEDY_TEXT = "The capital of France is"
CACHED_PROMPT = "A prompt long enough to fill a few blocks of any prefix cache: " + "one two three four " * 8


def admin(ctx: Ctx) -> rt.SglangServiceStub:
    """The native stub on the admin token's channel (where one is given)."""
    target = ctx.session.target
    return runtime(ctx).stub(target.admin_channel or target.channel)


async def greedy_tokens(ctx: Ctx) -> list[list[int]] | None:
    """A greedy run's tokens, where the server promises they repeat; None otherwise."""
    if not ctx.info.has(DETERMINISTIC):
        return None
    req = request(ctx, GREEDY_TEXT, temperature=0.0, max_tokens=ctx.tuning.max_tokens)
    return outputs_tokens(ok(ctx, await ctx.generate(req), "a greedy request"))


async def as_alone(ctx: Ctx, stream: LiveStream, what: str) -> None:
    """With deterministic greedy decoding: the tokens a (cancelled) greedy ``long_request(GREEDY_TEXT)``
    streamed are those of a greedy run alone."""
    if not ctx.info.has(DETERMINISTIC):
        return
    got = stream.record.outputs()[0].token_ids if stream.record.outputs() else []
    alone = request(ctx, GREEDY_TEXT, temperature=0.0, max_tokens=max(len(got), 1), ignore_eos=True)
    want = outputs_tokens(ok(ctx, await ctx.generate(alone), "a greedy request alone"))[0]
    ctx.check.equal(f"the {len(got)} tokens of {what}", want, got)


async def cached_tokens(ctx: Ctx, text: str) -> int | None:
    record = ok(ctx, await ctx.generate(request(ctx, text, temperature=0.0, max_tokens=2)))
    return record.usage.cached_prompt_tokens if record.usage else None


# ── FlushCache ───────────────────────────────────────────────
@case("LIFE-3", tag="native-flush", requires=("admin",), exclusive=True, protocols=RUNTIME)
async def native_flush(ctx: Ctx) -> None:
    """FlushCache with nothing in flight answers success = true (and, where the server promises a
    prefix cache, a prompt served twice before it is served from an empty cache after it:
    cached_tokens 0); with a greedy request in flight it may refuse (success = false, SGLang's
    answer while requests run) or flush, and the request streams on to the tokens it gets alone."""
    stub = admin(ctx)
    warm = None
    if ctx.info.has("prefix_cache"):
        await cached_tokens(ctx, CACHED_PROMPT)
        warm = await cached_tokens(ctx, CACHED_PROMPT)
    idle = await stub.flush_cache(rt.FlushCacheRequest(), timeout=ctx.budgets.rpc_s)
    ctx.check.that(idle.success, "FlushCache with nothing in flight: success", "true",
                   f"{idle.success} ({idle.message!r})")  # fmt: skip
    if warm:  # 0: the repeated prompt was not found again (USAGE-6's business), nothing to compare
        ctx.check.equal("cached_tokens of a prompt served twice before FlushCache, after it",
                        0, await cached_tokens(ctx, CACHED_PROMPT))  # fmt: skip
    running = ctx.open(long_request(ctx, GREEDY_TEXT))
    try:
        await first_delta(ctx, running)
        busy = await stub.flush_cache(rt.FlushCacheRequest(), timeout=ctx.budgets.rpc_s)
        ctx.note(f"FlushCache with a request in flight: success = {busy.success} ({busy.message!r})")
        await streams_on(ctx, running, "a greedy request in flight across FlushCache")
    finally:
        await ctx.cancel(running)  # not an Abort: this case judges the flush
    await as_alone(ctx, running, "a greedy request across FlushCache")


# ── PauseGeneration's modes ──────────────────────────────────
async def pause(ctx: Ctx, mode: str) -> None:
    reply = await admin(ctx).pause_generation(rt.PauseGenerationRequest(mode=mode), timeout=ctx.budgets.rpc_s)
    ctx.note(f"PauseGeneration(mode={mode!r}): {reply.message!r}")


async def resume(ctx: Ctx) -> None:
    await admin(ctx).continue_generation(rt.ContinueGenerationRequest(), timeout=ctx.budgets.rpc_s)


async def held_while_paused(ctx: Ctx, mode: str) -> LiveStream:
    """A request sent while paused: accepted and waiting, no token and no end (the case resumes)."""
    waiting = ctx.open(request(ctx, "Hello", max_tokens=2))
    await asyncio.sleep(0.6 * ctx.budgets.scale)
    deltas = [e for e in waiting.events if e.kind == "delta"]
    ctx.check.that(not waiting.done.is_set() and not deltas, f"a request sent while paused (mode={mode!r})",
                   "waiting (no tokens, not ended)", waiting.record.summary())  # fmt: skip
    return waiting


@case("LIFE-3", tag="pause-abort", requires=("admin", "max_outputs>=2"), exclusive=True, protocols=RUNTIME)
async def pause_mode_abort(ctx: Ctx) -> None:
    """PauseGeneration(mode="abort") ends an n = 2 request in flight, each output "abort", then status
    OK; a request sent while paused waits, and is served after ContinueGeneration."""
    running = ctx.open(long_request(ctx, n=2))
    await first_delta(ctx, running)
    waiting: LiveStream | None = None
    try:
        await pause(ctx, "abort")
        await expect_aborted_end(ctx, running, 2, "a request in flight at PauseGeneration(mode='abort')")
        waiting = await held_while_paused(ctx, "abort")
    finally:
        await resume(ctx)
    if waiting is not None:
        ok(ctx, await waiting.finish(), "the request sent while paused, after ContinueGeneration")


@case("LIFE-3", tag="pause-retract", requires=("admin",), exclusive=True, protocols=RUNTIME)
async def pause_mode_retract(ctx: Ctx) -> None:
    """PauseGeneration(mode="retract") stalls a greedy request in flight without ending it, and a request
    sent while paused waits; after ContinueGeneration both go on, the retracted one to the tokens a
    greedy run alone gets (recomputed, none lost or repeated)."""
    running = ctx.open(long_request(ctx, GREEDY_TEXT))
    await first_delta(ctx, running)
    waiting: LiveStream | None = None
    try:
        await pause(ctx, "retract")
        await asyncio.sleep(0.3 * ctx.budgets.scale)  # tokens already on their way may still arrive
        before = len(running.events)
        waiting = await held_while_paused(ctx, "retract")
        ctx.check.that(len(running.events) == before and not running.done.is_set(),
                       "a request in flight while paused (mode='retract')", "stalled, not ended",
                       running.record.summary())  # fmt: skip
    finally:
        await resume(ctx)
    try:
        if waiting is not None:
            ok(ctx, await waiting.finish(), "the request sent while paused, after ContinueGeneration")
        await streams_on(ctx, running, "the retracted request after ContinueGeneration")
    finally:
        await ctx.cancel(running)
    await as_alone(ctx, running, "a greedy request retracted and continued")


# ── StartProfile, StopProfile ────────────────────────────────
async def status_of(call: Any) -> tuple[str, Any]:
    """(status name, reply): "OK" and the reply, or the status's name and its message."""
    try:
        return "OK", await call
    except GRPCError as exc:
        return exc.status.name, exc.message


@case("ADMIN-1", tag="native", requires=("admin",), exclusive=True, protocols=RUNTIME)
async def native_profile(ctx: Ctx) -> None:
    """StartProfile answers OK; a second StartProfile while recording fails with a status; greedy tokens
    are the same while recording; StopProfile answers OK, and a second StopProfile (nothing recording)
    fails with a status."""
    stub, budget = admin(ctx), ctx.budgets.file_work_s
    before = await greedy_tokens(ctx)
    left, _ = await status_of(stub.stop_profile(rt.StopProfileRequest(), timeout=budget))
    if left == "OK":  # a recording an earlier client left running; the checks below need none
        ctx.note("StopProfile before the case ended a recording that was running")
    code, started = await status_of(stub.start_profile(rt.StartProfileRequest(), timeout=budget))
    if code != "OK":
        raise CaseFailed([Mismatch("StartProfile with nothing recording", "OK", f"{code}: {started}")])
    try:
        twice, reply = await status_of(stub.start_profile(rt.StartProfileRequest(), timeout=budget))
        ctx.check.that(
            twice != "OK", "StartProfile while recording", "a status other than OK", f"OK: {reply}"
        )
        during = await greedy_tokens(ctx)
    finally:
        stopped, reply = await status_of(stub.stop_profile(rt.StopProfileRequest(), timeout=budget))
    ctx.check.equal(
        "StopProfile of the recording", "OK", stopped if stopped == "OK" else f"{stopped}: {reply}"
    )
    idle, reply = await status_of(stub.stop_profile(rt.StopProfileRequest(), timeout=budget))
    ctx.check.that(
        idle != "OK", "StopProfile with nothing recording", "a status other than OK", f"OK: {reply}"
    )
    ctx.check.equal("greedy tokens while recording", before, during)


# ── UpdateWeightsFromDisk ────────────────────────────────────
async def model_facts(ctx: Ctx) -> dict[str, Any]:
    """GetModelInfo's model_path and JSON weight_version: what names the weights served."""
    reply = await admin(ctx).get_model_info(rt.GetModelInfoRequest(), timeout=ctx.budgets.rpc_s)
    try:
        info = json.loads(reply.json_info or "{}")
    except ValueError:
        info = {}
    version = info.get("weight_version") if isinstance(info, dict) else None
    return {"model_path": reply.model_path, "weight_version": version}


async def update(ctx: Ctx, path: str) -> tuple[str, rt.UpdateWeightsResponse | str]:
    """UpdateWeightsFromDisk of ``path``: (status name, reply or status message). UNIMPLEMENTED: SKIP."""
    call = admin(ctx).update_weights_from_disk(
        rt.UpdateWeightsRequest(model_path=path), timeout=ctx.budgets.file_work_s
    )
    code, reply = await status_of(call)
    if code == Status.UNIMPLEMENTED.name:
        raise CaseSkipped(f"UpdateWeightsFromDisk: UNIMPLEMENTED ({reply})")
    return code, reply


def check_refused(ctx: Ctx, path: str, code: str, reply: rt.UpdateWeightsResponse | str) -> None:
    """Refused SGLang's way (OK, success false, the reason in message) or with a status."""
    what = f"UpdateWeightsFromDisk of {path!r}"
    if code != "OK":
        ctx.note(f"{what}: refused with {code} ({reply})")
        return
    assert isinstance(reply, rt.UpdateWeightsResponse)
    ctx.check.that(not reply.success and bool(reply.message), what,
                   "refused: success = false, the reason in message", f"success = {reply.success}, {reply.message!r}")  # fmt: skip


@case("ADMIN-2", tag="native-refused", requires=("admin",), protocols=RUNTIME)
async def native_refused_update(ctx: Ctx) -> None:
    """UpdateWeightsFromDisk of a path that does not exist, and of one that holds no model, is refused:
    success = false with the reason in message (or a status); a greedy request in flight across it
    streams on (or ends as it would have: SGLang holds an update until the requests in flight are
    done) with the tokens it gets alone, and GetModelInfo's model_path and weight_version and the
    greedy tokens stay what they were."""
    facts = await model_facts(ctx)
    before = await greedy_tokens(ctx)
    running = ctx.open(long_request(ctx, GREEDY_TEXT))
    try:
        await first_delta(ctx, running)
        for path in (NO_SUCH_PATH, NOT_A_MODEL):
            code, reply = await update(ctx, path)
            check_refused(ctx, path, code, reply)
        await streams_on(ctx, running, "a greedy request in flight across refused updates")
    finally:
        await ctx.cancel(running)  # not an Abort: this case judges the update
    await as_alone(ctx, running, "a greedy request across refused updates")
    ctx.check.equal("GetModelInfo's model_path and weight_version after the refused updates", facts,
                    await model_facts(ctx))  # fmt: skip
    ctx.check.equal("greedy tokens after the refused updates", before, await greedy_tokens(ctx))


@case("ADMIN-2", tag="native-reload", requires=("admin",), exclusive=True, protocols=RUNTIME)
async def native_reload(ctx: Ctx) -> None:
    """With --weights-path (a checkpoint of the weights served): UpdateWeightsFromDisk loads it,
    success = true with a message, and greedy tokens stay what they were (the same weights)."""
    path = ctx.session.access.weights_path
    if not path:
        raise CaseSkipped("no --weights-path: the harness knows no checkpoint on the server's host")
    before = await greedy_tokens(ctx)
    code, reply = await update(ctx, path)
    loaded = code == "OK" and isinstance(reply, rt.UpdateWeightsResponse) and reply.success
    ctx.check.that(loaded, f"UpdateWeightsFromDisk of {path!r}", "OK, success = true", f"{code}: {reply}")
    ctx.check.equal("greedy tokens after reloading the same weights", before, await greedy_tokens(ctx))
