"""Authentication and ownership (AUTH-1..3), against servers that advertise
``Capabilities.authentication``. The harness's ``--token`` must have the client role; AUTH-2 and
AUTH-3 also need ``--admin-token`` (an admin is a second principal)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from conformance.cases._helpers import NO_SUCH_PATH, abort, first_delta, ok, started, streams_on
from conformance.harness.context import Ctx
from conformance.harness.requests import long_request, request
from conformance.spec.registry import case
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import (
    AbortRequest,
    AbortStatus,
    AllRequests,
    ControlServiceStub,
    DetokenizeRequest,
    EmbedRequest,
    FinishReason,
    FlushCacheRequest,
    GetLoadRequest,
    GetModelInfoRequest,
    GetServerInfoRequest,
    InferenceServiceStub,
    ListModelsRequest,
    PauseGenerationRequest,
    RequestIds,
    RerankRequest,
    ResumeGenerationRequest,
    ScoreRequest,
    StartProfileRequest,
    StopProfileRequest,
    TokenizeRequest,
    UpdateWeightsRequest,
)


def _tokens(ctx: Ctx, *, admin: bool) -> None:
    credentials = ctx.session.target.endpoint.credentials
    if not credentials.token:
        raise CaseSkipped("no client token: run with --token")
    if admin and not credentials.admin_token:
        raise CaseSkipped("no admin token: run with --admin-token (a second principal)")


async def _status(call: object) -> str:
    try:
        await call  # type: ignore[misc]
    except GRPCError as exc:
        return exc.status.name
    return "OK"


@case("AUTH-1", requires=("authentication",))
async def calls_need_credentials(ctx: Ctx) -> None:
    """Without credentials, or with unknown ones, calls are UNAUTHENTICATED; health stays open."""
    for label, token in (("no credentials", None), ("an unknown bearer token", "not-a-token-of-this-server")):
        channel = ctx.session.target.fresh_channel(token=token)
        ctx.note(f"calls with {label}")
        control, inference = ControlServiceStub(channel), InferenceServiceStub(channel)
        ctx.check.equal(
            f"GetLoad with {label}", "UNAUTHENTICATED", await _status(control.get_load(GetLoadRequest()))
        )
        generate = inference.generate(request(ctx, max_tokens=1))
        ctx.check.equal(f"Generate with {label}", "UNAUTHENTICATED", await _status(_drain(generate)))
        health = await HealthStub(channel).Check(HealthCheckRequest(), timeout=ctx.budgets.rpc_s)
        ctx.check.equal(f"health Check with {label}", HealthCheckResponse.SERVING, health.status)


def _revision_3_admin_calls(ctx: Ctx, stub: ControlServiceStub) -> list[tuple[str, Awaitable[object]]]:
    """Administrative calls of contract revision 3 that change nothing when let through: a stop
    with nothing recording, an update from a path that does not exist."""
    calls: list[tuple[str, Awaitable[object]]] = []
    if ctx.info.has("profiler"):
        calls.append(("StopProfile", stub.stop_profile(StopProfileRequest())))
    if ctx.info.has("weight_updates"):
        update = UpdateWeightsRequest(model_path=NO_SUCH_PATH)
        calls.append(("UpdateWeights", stub.update_weights(update)))
    return calls


async def _drain(stream: object) -> None:
    async for _ in stream:  # type: ignore[attr-defined]
        pass


@case("AUTH-2", requires=("authentication",), exclusive=True)
async def admin_rpcs_need_the_admin_role(ctx: Ctx) -> None:
    """Pause, resume, flush, Abort of all and (where served) the profiler and weight updates are
    PERMISSION_DENIED for a client, allowed to an admin."""
    _tokens(ctx, admin=False)
    client = ctx.session.target.control  # the --token channel, whatever the call
    for label, call in (
        ("PauseGeneration", client.pause_generation(PauseGenerationRequest())),
        ("ResumeGeneration", client.resume_generation(ResumeGenerationRequest())),
        ("FlushCache", client.flush_cache(FlushCacheRequest())),
        ("Abort of all requests", client.abort(AbortRequest(all=AllRequests()))),
        *_revision_3_admin_calls(ctx, client),
    ):
        ctx.check.equal(f"{label} with the client token", Status.PERMISSION_DENIED.name, await _status(call))
    ok(ctx, await ctx.generate(request(ctx, max_tokens=2)), "a Generate after the refused pause")
    if ctx.session.target.endpoint.credentials.admin_token:
        admin = ctx.session.target.admin
        for label, call in _revision_3_admin_calls(ctx, admin):  # nothing recording, no such path
            ctx.check.that(
                await _status(call) not in ("PERMISSION_DENIED", "UNAUTHENTICATED"),
                f"{label} with the admin token",
                "let through (a refusal of its own, not of the role)",
                "refused for the role",
            )
        ctx.check.equal(
            "PauseGeneration with the admin token",
            "OK",
            await _status(admin.pause_generation(PauseGenerationRequest())),
        )
        ctx.check.equal(
            "ResumeGeneration with the admin token",
            "OK",
            await _status(admin.resume_generation(ResumeGenerationRequest())),
        )


def _every_rpc(ctx: Ctx, channel: Channel) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
    """One call of each unary RPC the server serves (the mandatory ones and those it advertises),
    with a request that changes the server or reads from it when let through."""
    control, inference = ControlServiceStub(channel), InferenceServiceStub(channel)
    calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("GetServerInfo", lambda: control.get_server_info(GetServerInfoRequest())),
        ("GetModelInfo", lambda: control.get_model_info(GetModelInfoRequest())),
        ("GetLoad", lambda: control.get_load(GetLoadRequest())),
        ("Abort of all requests", lambda: control.abort(AbortRequest(all=AllRequests()))),
    ]
    Call = tuple[str, Callable[[], Awaitable[object]]]
    served: dict[str, list[Call]] = {
        "tokenize": [
            ("Tokenize", lambda: control.tokenize(TokenizeRequest(text="Hello"))),
            ("Detokenize", lambda: control.detokenize(DetokenizeRequest(token_ids=[1, 2]))),
        ],
        "admin": [
            ("PauseGeneration", lambda: control.pause_generation(PauseGenerationRequest())),
            ("FlushCache", lambda: control.flush_cache(FlushCacheRequest())),
        ],
        "list_models": [("ListModels", lambda: control.list_models(ListModelsRequest()))],
        "embed": [("Embed", lambda: inference.embed(EmbedRequest(texts=["Hello"])))],
        "score": [
            ("Score", lambda: inference.score(ScoreRequest(query="sea", items=["boat"]))),
            ("Rerank", lambda: inference.rerank(RerankRequest(query="sea", documents=["boat"]))),
        ],
        "profiler": [("StartProfile", lambda: control.start_profile(StartProfileRequest()))],
        "weight_updates": [
            ("UpdateWeights", lambda: control.update_weights(UpdateWeightsRequest(model_path=NO_SUCH_PATH)))
        ],
    }
    for capability, more in served.items():
        if ctx.info.has(capability):
            calls.extend(more)
    return calls


@case("AUTH-1", tag="every-rpc", requires=("authentication",), exclusive=True)
async def every_rpc_needs_credentials(ctx: Ctx) -> None:
    """Each RPC the server serves, called without credentials while a request streams, is
    UNAUTHENTICATED and changes nothing: the stream goes on (no pause, no abort) and nothing new is
    in flight."""
    _tokens(ctx, admin=False)
    running = ctx.open(long_request(ctx))
    await first_delta(ctx, running)
    stranger = ctx.session.target.fresh_channel(token=None)
    try:
        for label, call in _every_rpc(ctx, stranger):
            ctx.check.equal(f"{label} without credentials", "UNAUTHENTICATED", await _status(call()))
        generate = InferenceServiceStub(stranger).generate(request(ctx, max_tokens=1))
        ctx.check.equal("Generate without credentials", "UNAUTHENTICATED", await _status(_drain(generate)))
        going = await streams_on(ctx, running, "a request in flight after those calls")
        load = await ctx.load()
        ctx.check.that(
            not load.paused, "Load.paused after a PauseGeneration without credentials", "false", load.paused
        )
        ctx.check.equal("requests in flight (the one stream)", int(going), load.active_requests)
    finally:
        await abort(ctx, running.record.request_id)
    await running.finish(ctx.budgets.release_s)


@case("AUTH-2", tag="in-flight", requires=("authentication", "admin"), exclusive=True)
async def a_client_cannot_stop_others(ctx: Ctx) -> None:
    """A client's PauseGeneration, FlushCache and Abort of all requests, while an admin's request
    streams, are PERMISSION_DENIED and have no effect: the admin's request streams on, unpaused and
    not aborted, until the admin ends it."""
    _tokens(ctx, admin=True)
    admin_channel = ctx.session.target.admin_channel
    assert admin_channel is not None
    theirs = ctx.open(long_request(ctx), channel=admin_channel)
    await first_delta(ctx, theirs)
    client = ctx.session.target.control
    try:
        for label, call in (
            ("PauseGeneration", lambda: client.pause_generation(PauseGenerationRequest())),
            ("Abort of all requests", lambda: client.abort(AbortRequest(all=AllRequests()))),
            ("FlushCache", lambda: client.flush_cache(FlushCacheRequest())),
        ):
            ctx.check.equal(
                f"{label} with the client token", Status.PERMISSION_DENIED.name, await _status(call())
            )
            await streams_on(ctx, theirs, f"an admin's request after a client's {label}")
    finally:
        admin = ctx.session.target.admin
        # a server that let the client's pause through is paused: the cases after this one need it resumed
        await admin.resume_generation(ResumeGenerationRequest(), timeout=ctx.budgets.rpc_s)
        await admin.abort(
            AbortRequest(request_ids=RequestIds(ids=[theirs.record.request_id])), timeout=ctx.budgets.rpc_s
        )
    await theirs.finish(ctx.budgets.release_s)


@case("AUTH-3", requires=("authentication",), budget=2.0, exclusive=True)  # ends with an Abort of all
async def requests_belong_to_their_principal(ctx: Ctx) -> None:
    """Abort by id reaches only the caller's requests: ids are per principal, others' are NOT_IN_FLIGHT."""
    _tokens(ctx, admin=True)
    admin_channel = ctx.session.target.admin_channel
    assert admin_channel is not None
    shared, theirs_only = ctx.uid("shared"), ctx.uid("theirs")
    theirs = [ctx.open(long_request(ctx, request_id=i), channel=admin_channel) for i in (shared, theirs_only)]
    mine = ctx.open(long_request(ctx, request_id=shared))  # the same id, another owner: no clash
    await started(ctx, *theirs, mine)
    reply = await ctx.call(ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=[shared, theirs_only])))
    ctx.check.equal(
        "a client's Abort of [its own id, an admin's id]",
        [AbortStatus.ABORTED.name, AbortStatus.NOT_IN_FLIGHT.name],
        [o.status.name for o in reply.outcomes],
    )
    mine_end = await mine.finish(ctx.budgets.release_s)
    ctx.check.equal(
        "the client's request",
        [FinishReason.ABORTED],
        [v.finish.reason for v in mine_end.outputs().values() if v.finish],
    )
    for stream in theirs:
        await streams_on(ctx, stream, "the admin's request after a client aborted its id")
    pre = ctx.uid("pre")
    early = await ctx.call(ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=[pre])))
    ctx.check.equal(
        "a client's Abort of an id not yet in flight",
        [AbortStatus.NOT_IN_FLIGHT.name],
        [o.status.name for o in early.outcomes],
    )
    record = await ctx.open(
        request(ctx, max_tokens=2, ignore_eos=True, request_id=pre), channel=admin_channel
    ).finish()
    ctx.check.that(
        bool(record.outputs())
        and all(
            v.finish is not None and v.finish.reason == FinishReason.LENGTH for v in record.outputs().values()
        ),
        "an admin's Generate with an id a client aborted in advance",
        "not aborted (LENGTH)",
        record.summary(),
    )
    clients = ctx.uid("clients")
    client_stream = ctx.open(long_request(ctx, request_id=clients))
    await first_delta(ctx, client_stream)
    by_admin = await ctx.session.target.admin.abort(
        AbortRequest(request_ids=RequestIds(ids=[clients])), timeout=ctx.budgets.rpc_s
    )
    ctx.check.equal(
        "an admin's Abort of a client's request by id",
        [AbortStatus.ABORTED.name],
        [o.status.name for o in by_admin.outcomes],
    )
    await client_stream.finish(ctx.budgets.release_s)
    everything = await ctx.call(ctx.control.abort, AbortRequest(all=AllRequests()))  # routed to the admin
    listed = sorted(o.request_id for o in everything.outcomes)
    ctx.check.equal("an admin's Abort of all requests lists", sorted([shared, theirs_only]), listed)
    for stream in theirs:
        await stream.finish(ctx.budgets.release_s)


@case("AUTH-3", tag="in-flight-id", requires=("authentication",), exclusive=True)
async def ids_in_flight_are_per_principal(ctx: Ctx) -> None:
    """An id in flight for one principal is free for another: the admin's Generate with a client's
    in-flight id is accepted and streams, and the client's Abort of that id ends only its own."""
    _tokens(ctx, admin=True)
    admin_channel = ctx.session.target.admin_channel
    assert admin_channel is not None
    shared = ctx.uid("twin")
    mine = ctx.open(long_request(ctx, request_id=shared))
    await first_delta(ctx, mine)
    theirs = ctx.open(long_request(ctx, request_id=shared), channel=admin_channel)  # strictly after
    try:
        await first_delta(ctx, theirs)
        mine_aborted = await ctx.call(ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=[shared])))
        ctx.check.equal(
            "a client's Abort of its id, which an admin's request also has",
            [AbortStatus.ABORTED.name],
            [o.status.name for o in mine_aborted.outcomes],
        )
        await mine.finish(ctx.budgets.release_s)
        await streams_on(ctx, theirs, "the admin's request after a client aborted its id")
    finally:
        await ctx.session.target.admin.abort(
            AbortRequest(request_ids=RequestIds(ids=[shared])), timeout=ctx.budgets.rpc_s
        )
    await theirs.finish(ctx.budgets.release_s)
