"""Administrative RPCs: pause stalls without failing, resume continues, flush never hurts (LIFE-3);
the profiler records without changing what is generated (ADMIN-1); a refused weight update changes
nothing, and a checkpoint of the served weights loads without failing a stream (ADMIN-2)."""

from __future__ import annotations

import asyncio

from grpclib.const import Status
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from conformance.cases._helpers import NO_SUCH_PATH, abort, first_delta, ok, outputs_tokens, streams_on
from conformance.harness.context import Ctx
from conformance.harness.requests import long_request, request
from conformance.spec.registry import case
from conformance.stream.live import LiveStream
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import (
    FlushCacheRequest,
    GetModelInfoRequest,
    PauseGenerationRequest,
    ResumeGenerationRequest,
    StartProfileRequest,
    StopProfileRequest,
    UpdateWeightsRequest,
)

NOT_A_MODEL = "/dev/null"  # a path every POSIX host has, that holds no model


@case("LIFE-3", tag="pause", requires=("admin",), exclusive=True, sends=("admin.pause",))
async def pause_and_resume(ctx: Ctx) -> None:
    """While paused, new requests are accepted and wait, open streams stall, and (lmrpc.v1) health stays
    SERVING; resume continues both."""
    running = ctx.open(long_request(ctx))
    await first_delta(ctx, running)
    await ctx.call(ctx.control.pause_generation, PauseGenerationRequest())
    try:
        settle = 0.3 * ctx.budgets.scale
        await asyncio.sleep(settle)  # tokens already on their way may still arrive
        load = await ctx.load()
        ctx.check.that(load.paused, "Load.paused after PauseGeneration", "true", load.paused)
        if ctx.session.protocol == "lmrpc":  # paused, it still accepts requests: SERVING (HEALTH-1)
            health = await HealthStub(ctx.session.target.channel).Check(
                HealthCheckRequest(service=""), timeout=ctx.budgets.rpc_s
            )
            ctx.check.equal(
                "Health.Check('') while paused with a stream stalled",
                "SERVING",
                HealthCheckResponse.ServingStatus.Name(health.status),
            )
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
    ok(ctx, await waiting.finish(), "the request sent while paused, after resume")
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
    ok(ctx, await stream.finish(), "a request running across FlushCache")


async def _greedy_tokens(ctx: Ctx) -> list[list[int]] | None:
    """A greedy run's tokens, where the server promises they repeat; None otherwise."""
    if not ctx.info.has("deterministic_greedy"):
        return None
    req = request(ctx, "The capital of France is", temperature=0.0, max_tokens=ctx.tuning.max_tokens)
    return outputs_tokens(ok(ctx, await ctx.generate(req), "a greedy request"))


@case("ADMIN-1", requires=("profiler",))
async def profile_recorded(ctx: Ctx) -> None:
    """StartProfile answers a folder; a second start and a stop with nothing recording are
    FAILED_PRECONDITION; StopProfile lists trace files inside the folder; greedy tokens are the same
    while recording."""
    before = await _greedy_tokens(ctx)
    left = await ctx.call_status(ctx.control.stop_profile, StopProfileRequest())
    if left.code == "OK":  # a recording an earlier client left running; the checks below need none
        ctx.note("StopProfile before the case ended a recording that was running")
    started = await ctx.call(ctx.control.start_profile, StartProfileRequest())
    try:
        ctx.check.that(bool(started.output_dir), "StartProfileResponse.output_dir", "non-empty", "''")
        twice = await ctx.call_status(ctx.control.start_profile, StartProfileRequest())
        ctx.check.equal("StartProfile while recording", Status.FAILED_PRECONDITION.name, twice.code)
        during = await _greedy_tokens(ctx)
    finally:
        stopped = await ctx.call(ctx.control.stop_profile, StopProfileRequest())
    folder = started.output_dir.rstrip("/") + "/"
    traces = list(stopped.trace_files)
    ctx.check.that(
        bool(traces) and all(t.startswith(folder) for t in traces),
        "StopProfileResponse.trace_files",
        f"at least one, each inside {started.output_dir!r}",
        traces,
    )
    idle = await ctx.call_status(ctx.control.stop_profile, StopProfileRequest())
    ctx.check.equal("StopProfile with nothing recording", Status.FAILED_PRECONDITION.name, idle.code)
    ctx.check.equal("greedy tokens while recording", before, during)


@case(
    "ADMIN-1", tag="output_dir", requires=("profiler", "deterministic_greedy"), exclusive=True
)  # one recording at a time
async def profile_into_a_given_folder(ctx: Ctx) -> None:
    """StartProfile with an output_dir answers that folder, and StopProfile lists trace files inside it (a
    second StartProfile into another folder meanwhile is FAILED_PRECONDITION and moves nothing); a greedy
    request in flight when the recording starts and still in flight when it stops gets the
    tokens a greedy run alone gets."""
    folder = f"/tmp/{ctx.uid('lmrpc-profile')}"  # a folder a POSIX host can create
    text = "The capital of France is"
    left = await ctx.call_status(ctx.control.stop_profile, StopProfileRequest())
    if left.code == "OK":
        ctx.note("StopProfile before the case ended a recording that was running")
    spanning = ctx.open(long_request(ctx, text))
    try:
        await first_delta(ctx, spanning)
        started = await ctx.call(ctx.control.start_profile, StartProfileRequest(output_dir=folder))
        try:
            ctx.check.equal(
                "StartProfileResponse.output_dir for the output_dir sent", folder, started.output_dir
            )
            elsewhere = StartProfileRequest(output_dir=f"{folder}-elsewhere")
            twice = await ctx.call_status(ctx.control.start_profile, elsewhere)
            ctx.check.equal(
                "StartProfile into another folder while recording",
                Status.FAILED_PRECONDITION.name,
                twice.code,
            )
            await streams_on(ctx, spanning, "a greedy request in flight while recording")
        finally:
            stopped = await ctx.call(ctx.control.stop_profile, StopProfileRequest())
        traces = list(stopped.trace_files)
        ctx.check.that(
            bool(traces) and all(t.startswith(folder + "/") for t in traces),
            "StopProfileResponse.trace_files",
            f"at least one, each inside {folder!r}",
            traces,
        )
        await streams_on(ctx, spanning, "a greedy request in flight after StopProfile")
    finally:
        await ctx.cancel(spanning)  # not an Abort: this case judges the profiler, not ABORT-*
    await _as_alone(ctx, text, spanning, "a greedy request across StartProfile and StopProfile")


@case("ADMIN-2", tag="refused", requires=("weight_updates",))
async def refused_update_changes_nothing(ctx: Ctx) -> None:
    """A model_path that does not exist is NOT_FOUND, one that holds no model INVALID_ARGUMENT, each
    naming the path; neither changes ModelInfo.weights_version or the greedy tokens."""
    version = await _weights_version(ctx)
    before = await _greedy_tokens(ctx)
    for path, status in ((NO_SUCH_PATH, Status.NOT_FOUND), (NOT_A_MODEL, Status.INVALID_ARGUMENT)):
        outcome = await ctx.call_status(ctx.control.update_weights, UpdateWeightsRequest(model_path=path))
        ctx.check.equal(f"UpdateWeights of {path!r}: status", status.name, outcome.code)
        ctx.check.that(
            path in outcome.message, f"UpdateWeights of {path!r}: message", "names the path", outcome.message
        )
    ctx.check.equal(
        "ModelInfo.weights_version after the refused updates", version, await _weights_version(ctx)
    )
    ctx.check.equal("greedy tokens after the refused updates", before, await _greedy_tokens(ctx))


@case("ADMIN-2", tag="refused-in-flight", requires=("weight_updates", "deterministic_greedy"))
async def refused_update_leaves_a_stream_alone(ctx: Ctx) -> None:
    """A refused UpdateWeights while a greedy request streams changes nothing for it: it streams on with
    the tokens a greedy run alone gets, and ModelInfo.weights_version stays."""
    version = await _weights_version(ctx)
    text = "The capital of France is"
    running = ctx.open(long_request(ctx, text))
    try:
        await first_delta(ctx, running)
        outcome = await ctx.call_status(
            ctx.control.update_weights, UpdateWeightsRequest(model_path=NO_SUCH_PATH)
        )
        ctx.check.equal(
            f"UpdateWeights of {NO_SUCH_PATH!r} while a request streams", "NOT_FOUND", outcome.code
        )
        await streams_on(ctx, running, "a stream in flight across a refused UpdateWeights")
    finally:
        await ctx.cancel(running)  # not an Abort: this case judges the update, not ABORT-*
    await _as_alone(ctx, text, running, "a greedy request across a refused update")
    ctx.check.equal(
        "ModelInfo.weights_version after the refused update", version, await _weights_version(ctx)
    )


async def _as_alone(ctx: Ctx, text: str, stream: LiveStream, what: str) -> None:
    """The tokens a (cancelled) greedy ``long_request(text)`` streamed are those of a greedy run alone."""
    got = stream.record.outputs()[0].token_ids
    alone = request(ctx, text, temperature=0.0, max_tokens=max(len(got), 1), ignore_eos=True)
    want = outputs_tokens(ok(ctx, await ctx.generate(alone), "a greedy request alone"))[0]
    ctx.check.equal(f"the {len(got)} tokens of {what}", want, got)


async def _weights_version(ctx: Ctx) -> str:
    reply = await ctx.call(ctx.control.get_model_info, GetModelInfoRequest())
    return reply.model.weights_version if reply.model is not None else ""


@case("ADMIN-2", tag="reload", requires=("weight_updates",), exclusive=True)  # retires the prefix cache
async def reloaded_weights(ctx: Ctx) -> None:
    """With --weights-path (a checkpoint of the weights served): UpdateWeights loads it without
    failing a stream in flight across it, ModelInfo.weights_version becomes the name sent, and greedy
    tokens stay what they were (the same weights)."""
    path = ctx.session.access.weights_path
    if not path:
        raise CaseSkipped("no --weights-path: the harness knows no checkpoint on the server's host")
    before = await _greedy_tokens(ctx)
    running = ctx.open(long_request(ctx))
    await first_delta(ctx, running)
    name = ctx.uid("weights")
    update = UpdateWeightsRequest(model_path=path, weights_version=name)
    reply = await ctx.call(ctx.control.update_weights, update, timeout_s=ctx.budgets.stream_s)
    ctx.check.equal("UpdateWeightsResponse.weights_version", name, reply.weights_version)
    await streams_on(ctx, running, "a stream in flight across UpdateWeights")
    await ctx.cancel(running)  # not an Abort: this case judges the update, not ABORT-*
    ctx.check.equal("ModelInfo.weights_version after UpdateWeights", name, await _weights_version(ctx))
    ctx.check.equal("greedy tokens after reloading the same weights", before, await _greedy_tokens(ctx))


@case(
    "ADMIN-2", tag="reload-unnamed", requires=("weight_updates",), exclusive=True
)  # retires the prefix cache
async def reloaded_weights_unnamed(ctx: Ctx) -> None:
    """With --weights-path: UpdateWeights without a weights_version, while n=2 outputs stream, fails
    neither output, answers a non-empty weights_version of the server's choosing, and GetModelInfo
    reports exactly that one from then on."""
    path = ctx.session.access.weights_path
    if not path:
        raise CaseSkipped("no --weights-path: the harness knows no checkpoint on the server's host")
    running = ctx.open(long_request(ctx, n=min(ctx.info.caps.max_outputs, 2)))
    await first_delta(ctx, running)
    reply = await ctx.call(
        ctx.control.update_weights, UpdateWeightsRequest(model_path=path), timeout_s=ctx.budgets.stream_s
    )
    ctx.check.that(
        bool(reply.weights_version), "UpdateWeightsResponse.weights_version, none sent", "non-empty", "''"
    )
    await streams_on(ctx, running, "an n=2 stream in flight across UpdateWeights")
    await ctx.cancel(running)  # not an Abort: this case judges the update, not ABORT-*
    ctx.check.equal(
        "ModelInfo.weights_version after an unnamed UpdateWeights",
        reply.weights_version,
        await _weights_version(ctx),
    )
