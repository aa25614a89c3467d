"""Services, health, reflection, server info and load (SVC-*, HEALTH-*, CAP-3, LOAD-1)."""

from __future__ import annotations

import asyncio
import math

import httpx
from google.protobuf import descriptor_pb2
from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.reflection.v1 import reflection_grpc as refl_v1
from grpclib.reflection.v1 import reflection_pb2 as refl_v1_pb2
from grpclib.reflection.v1alpha import reflection_grpc as refl_v1alpha
from grpclib.reflection.v1alpha import reflection_pb2 as refl_v1alpha_pb2

from conformance.cases._helpers import (
    abort,
    accepted,
    applies_here,
    first_delta,
    ok,
    paused,
    resumed,
    started,
)
from conformance.harness.context import Ctx
from conformance.harness.load import idle_load, load_counts, quiet_load, released
from conformance.harness.requests import long_request, request
from conformance.spec.registry import case
from conformance.stream.live import LiveStream
from conformance.vocabulary import CaseSkipped
from lmrpc import CONTRACT_REVISION
from lmrpc.v1 import AbortRequest, GetLoadRequest, GetModelInfoRequest, GetServerInfoRequest, RequestIds

LMRPC_SERVICES = ("lmrpc.v1.InferenceService", "lmrpc.v1.ControlService")


@case("SVC-1")
async def both_services_served(ctx: Ctx) -> None:
    """The mandatory RPCs of both services are served (none answers UNIMPLEMENTED)."""
    control = ctx.control
    for method, outcome in (
        ("GetServerInfo", await ctx.call_status(control.get_server_info, GetServerInfoRequest())),
        ("GetModelInfo", await ctx.call_status(control.get_model_info, GetModelInfoRequest())),
        ("GetLoad", await ctx.call_status(control.get_load, GetLoadRequest())),
        (
            "Abort",
            await ctx.call_status(
                control.abort, AbortRequest(request_ids=RequestIds(ids=[ctx.uid("unknown")]))
            ),
        ),
    ):
        ctx.check.that(
            outcome.status is not Status.UNIMPLEMENTED,
            f"ControlService {method}",
            "served",
            f"UNIMPLEMENTED {outcome.message}",
        )
    ok(ctx, await ctx.generate(request(ctx, max_tokens=1)), "InferenceService Generate")


@case("SVC-2", tag="health")
async def health_served(ctx: Ctx) -> None:
    """grpc.health.v1.Health/Check is served."""
    try:
        await HealthStub(ctx.session.target.channel).Check(
            HealthCheckRequest(service=""), timeout=ctx.budgets.rpc_s
        )
    except GRPCError as exc:
        ctx.check.add("grpc.health.v1.Health/Check", "served", f"{exc.status.name} {exc.message}")


def _reflection_case(version: str) -> None:
    stub_module, pb2 = (refl_v1, refl_v1_pb2) if version == "v1" else (refl_v1alpha, refl_v1alpha_pb2)

    @case("SVC-2", tag=f"reflection-{version}")
    async def reflection(ctx: Ctx) -> None:
        """Server reflection lists both lmrpc services and resolves their descriptors."""
        stub = stub_module.ServerReflectionStub(ctx.session.target.channel)
        service = f"grpc.reflection.{version}.ServerReflection"
        try:
            async with stub.ServerReflectionInfo.open(timeout=ctx.budgets.rpc_s) as stream:
                await stream.send_message(pb2.ServerReflectionRequest(list_services=""))
                listed = await stream.recv_message()
                names = {s.name for s in listed.list_services_response.service} if listed else set()
                for wanted in LMRPC_SERVICES:
                    ctx.check.that(
                        wanted in names, f"{service} list_services", f"includes {wanted}", sorted(names)
                    )
                for symbol in LMRPC_SERVICES:
                    await stream.send_message(pb2.ServerReflectionRequest(file_containing_symbol=symbol))
                    found = await stream.recv_message()
                    services = set()
                    for blob in found.file_descriptor_response.file_descriptor_proto if found else []:
                        fd = descriptor_pb2.FileDescriptorProto.FromString(blob)
                        services |= {f"{fd.package}.{s.name}" for s in fd.service}
                    ctx.check.that(
                        symbol in services,
                        f"{service} file_containing_symbol({symbol})",
                        "a file descriptor defining it",
                        found.error_response.error_message
                        if found and found.HasField("error_response")
                        else sorted(services),
                    )
                await stream.end()
        except GRPCError as exc:
            ctx.check.add(service, "served", f"{exc.status.name} {exc.message}")


_reflection_case("v1")
_reflection_case("v1alpha")


@case("SVC-3")
async def contract_revision(ctx: Ctx) -> None:
    """ServerInfo.contract_revision is the revision the harness checks."""
    ctx.check.equal("ServerInfo.contract_revision", CONTRACT_REVISION, ctx.info.server.contract_revision)


def _in(lo: float, hi: float, value: float, *, lo_open: bool = False) -> bool:
    return math.isfinite(value) and (lo < value if lo_open else lo <= value) and value <= hi


@case("CAP-3")
async def info_consistent(ctx: Ctx) -> None:
    """GetServerInfo and GetModelInfo agree with each other and with the SAMPLE-5 ranges."""
    info, caps, chk = ctx.info, ctx.info.caps, ctx.check
    model = info.model
    chk.that(model.vocab_size > 0, "ModelInfo.vocab_size", "> 0", model.vocab_size)
    chk.that(model.max_context_tokens > 0, "ModelInfo.max_context_tokens", "> 0", model.max_context_tokens)
    chk.that(
        all(e < model.vocab_size for e in model.eos_token_ids),
        "ModelInfo.eos_token_ids",
        "each < vocab_size",
        list(model.eos_token_ids),
    )
    chk.that(caps.max_outputs >= 1, "Capabilities.max_outputs", ">= 1", caps.max_outputs)
    d = model.defaults
    if chk.that(d is not None, "ModelInfo.defaults", "present", None) and d is not None:
        for name, good in (
            ("temperature", d.temperature >= 0 and math.isfinite(d.temperature)),
            ("top_p", _in(0, 1, d.top_p, lo_open=True)),
            ("min_p", _in(0, 1, d.min_p)),
            ("frequency_penalty", _in(-2, 2, d.frequency_penalty)),
            ("presence_penalty", _in(-2, 2, d.presence_penalty)),
            ("repetition_penalty", _in(0, 10, d.repetition_penalty, lo_open=True)),
            ("n", 1 <= d.n <= caps.max_outputs),
            ("max_tokens", d.max_tokens >= 1),
        ):
            chk.that(good, f"ModelInfo.defaults.{name}", "within the SAMPLE-5 range", getattr(d, name))
    chk.that(
        (info.embedding is not None) == caps.embed,
        "GetModelInfoResponse.embedding_model",
        "present exactly when Capabilities.embed",
        f"embed={caps.embed}, embedding_model={info.embedding}",
    )
    if caps.chat_input:
        chk.that(model.has_chat_template, "ModelInfo.has_chat_template", "true (chat_input is)", False)


@case("HEALTH-1")
async def health_per_service(ctx: Ctx) -> None:
    """Check answers SERVING for "", both lmrpc services; NOT_FOUND for an unknown service."""
    stub = HealthStub(ctx.session.target.channel)
    for service in ("", *LMRPC_SERVICES):
        try:
            reply = await stub.Check(HealthCheckRequest(service=service), timeout=ctx.budgets.rpc_s)
            ctx.check.equal(
                f"Health.Check({service!r})", "SERVING", HealthCheckResponse.ServingStatus.Name(reply.status)
            )
        except GRPCError as exc:
            ctx.check.add(f"Health.Check({service!r})", "SERVING", f"{exc.status.name} {exc.message}")
    try:
        reply = await stub.Check(HealthCheckRequest(service="no.such.Service"), timeout=ctx.budgets.rpc_s)
        ctx.check.add(
            "Health.Check('no.such.Service')",
            "NOT_FOUND",
            f"OK {HealthCheckResponse.ServingStatus.Name(reply.status)}",
        )
    except GRPCError as exc:
        ctx.check.equal("Health.Check('no.such.Service')", Status.NOT_FOUND.name, exc.status.name)


@case("HEALTH-2", tag="watch")
async def health_watch(ctx: Ctx) -> None:
    """Watch streams the current status (SERVING) first, then stays open for the next transition."""
    stub = HealthStub(ctx.session.target.channel)
    first: HealthCheckResponse | None = None
    still_open = False
    try:
        async with stub.Watch.open(timeout=ctx.budgets.rpc_s) as stream:
            await stream.send_message(HealthCheckRequest(service=""), end=True)
            first = await stream.recv_message()
            if first is not None:
                try:
                    ended = await asyncio.wait_for(stream.recv_message(), 0.5 * ctx.budgets.scale) is None
                    still_open = not ended
                except TimeoutError:
                    still_open = True  # no transition while it ran, and not closed: as it should be
            if still_open:  # a stream the server already closed cannot be cancelled
                await stream.cancel()
    except (GRPCError, StreamTerminatedError, ProtocolError) as exc:
        ctx.check.add("Health.Watch('')", "an open stream", f"{type(exc).__name__}: {exc}")
        return
    ctx.check.equal(
        "first Health.Watch('') message",
        "SERVING",
        HealthCheckResponse.ServingStatus.Name(first.status) if first else "no message",
    )
    if first is not None:
        ctx.check.that(still_open, "Health.Watch('') after its first message", "still open", "closed")


@case("HEALTH-1", tag="paused", requires=("admin",), exclusive=True, sends=("scenario.health-while-paused",))
async def health_while_paused(ctx: Ctx) -> None:
    """A paused server accepts requests, so it is SERVING, also with a request waiting behind the pause."""
    stub = HealthStub(ctx.session.target.channel)
    await paused(ctx)
    try:
        alone = await stub.Check(HealthCheckRequest(service=""), timeout=ctx.budgets.rpc_s)
        waiting = ctx.open(long_request(ctx))
        await accepted(ctx, waiting)
        behind = await stub.Check(HealthCheckRequest(service=""), timeout=ctx.budgets.rpc_s)
    finally:
        await resumed(ctx)
    for what, reply in (("while paused", alone), ("while paused with a request waiting", behind)):
        ctx.check.equal(
            f"Health.Check('') {what}", "SERVING", HealthCheckResponse.ServingStatus.Name(reply.status)
        )
    await abort(ctx, waiting.record.request_id)
    await waiting.finish(ctx.budgets.release_s)


@case("HEALTH-1", tag="in-flight", exclusive=True, sends=("scenario.health-while-streaming",))
async def health_while_streaming(ctx: Ctx) -> None:
    """A server busy with requests still accepts more, so every service it names is SERVING."""
    stub = HealthStub(ctx.session.target.channel)
    streams = [ctx.open(long_request(ctx)) for _ in range(2)]
    try:
        await started(ctx, *streams)
        for service in ("", *LMRPC_SERVICES):
            reply = await stub.Check(HealthCheckRequest(service=service), timeout=ctx.budgets.rpc_s)
            ctx.check.equal(
                f"Health.Check({service!r}) with two requests streaming",
                "SERVING",
                HealthCheckResponse.ServingStatus.Name(reply.status),
            )
    finally:
        await abort(ctx, *(s.record.request_id for s in streams))
    for stream in streams:
        await stream.finish(ctx.budgets.release_s)


@case("LOAD-1", tag="idle", exclusive=True)
async def load_idle(ctx: Ctx) -> None:
    """With nothing in flight every in-flight count of GetLoad is 0."""
    _, load = await ctx.wait_for(
        ctx.load, lambda lo: not any(load_counts(lo).values()), ctx.budgets.release_s
    )
    for name in ("active_requests", "running_sequences", "waiting_sequences", "kv_tokens_in_use"):
        ctx.check.equal(f"idle Load.{name}", 0, getattr(load, name))


@case("LOAD-1", tag="active", exclusive=True)
async def load_counts_open_stream(ctx: Ctx) -> None:
    """While a stream is open its request is counted in active_requests."""
    baseline = await quiet_load(ctx)
    stream = ctx.open(long_request(ctx))
    await first_delta(ctx, stream)
    load = await ctx.load()
    ctx.check.that(
        load.active_requests >= baseline.active_requests + 1,
        "Load.active_requests with a stream open",
        f">= {baseline.active_requests + 1}",
        load.active_requests,
    )
    await ctx.cancel(stream)


# The gauges the Kubernetes inference gateway's endpoint picker reads by default, and what GetLoad
# says they hold (LOAD-2).
GATEWAY_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")


GROUND_RUNNING, GROUND_WAITING = 2, 3  # LOAD-1[ground-truth]: requests generating, and waiting behind a pause


@case("LOAD-1", tag="ground-truth", exclusive=True, sends=("scenario.load-while-waiting",))
async def load_matches_ground_truth(ctx: Ctx) -> None:
    """With two requests generating and, where the server pauses, three more waiting behind the
    pause, GetLoad counts them apart (running 2, waiting 3, active 5) and reports at least the KV
    tokens they generated; then it reads idle again."""
    baseline = await idle_load(ctx)
    if any(load_counts(baseline).values()):
        raise CaseSkipped(f"the server never read idle ({load_counts(baseline)}): LOAD-1[idle]'s business")
    running = [ctx.open(long_request(ctx)) for _ in range(min(GROUND_RUNNING, ctx.session.parallel))]
    waiting: list[LiveStream] = []
    pauses = ctx.info.has("admin") and applies_here(ctx, "LOAD-1[waiting]")  # it can hold one waiting
    try:
        for stream in running:
            await first_delta(ctx, stream)
        if pauses:
            await paused(ctx)
            waiting = [ctx.open(long_request(ctx)) for _ in range(GROUND_WAITING)]
            for stream in waiting:
                await accepted(ctx, stream)
        want = {"running_sequences": len(running), "waiting_sequences": len(waiting)}
        want["active_requests"] = len(running) + len(waiting)
        # a lower bound of the tokens generated, counted before GetLoad answers: one per delta that
        # carried any (a stream that misstates its ids is STREAM-2's business, not this case's)
        generated = sum(
            1 for s in running for o in s.record.outputs().values() for d in o.deltas if d.token_ids
        )
        # and their prompt, held once at least (the same text: a prefix cache may share it)
        prompt = max((s.record.prompt_info.prompt_tokens for s in running if s.record.prompt_info), default=0)
        held = prompt + generated - len(running)
        settled, load = await ctx.wait_for(
            ctx.load, lambda lo: all(getattr(lo, k) == v for k, v in want.items()), ctx.budgets.release_s
        )
        what = f"{len(running)} generating" + (f", {len(waiting)} waiting behind a pause" if pauses else "")
        for name, value in want.items():
            ctx.check.equal(f"Load.{name} with {what}", value, getattr(load, name))
        ctx.check.that(
            load.kv_tokens_in_use >= held,
            f"Load.kv_tokens_in_use with {what}",
            f">= {held} (their prompt and at least the tokens they streamed before that answer)",
            load.kv_tokens_in_use,
        )
        if load.kv_tokens_total:
            ctx.check.that(
                load.kv_tokens_in_use <= load.kv_tokens_total,
                "Load.kv_tokens_in_use",
                f"<= kv_tokens_total {load.kv_tokens_total}",
                load.kv_tokens_in_use,
            )
        if not settled:
            ctx.note(f"GetLoad never read {want} within {ctx.budgets.release_s:.0f}s")
    finally:
        if pauses:
            await resumed(ctx)
        streams = [*running, *waiting]
        await abort(ctx, *(s.record.request_id for s in streams))
        for stream in streams:
            await stream.finish(ctx.budgets.release_s)
    idle, load = await released(ctx, baseline)
    ctx.check.that(
        idle, "GetLoad after every request ended", f"idle ({load_counts(baseline)})", load_counts(load)
    )


@case("LOAD-2", exclusive=True, sends=("scenario.metrics-while-busy",))
async def gateway_gauges_agree_with_load(ctx: Ctx) -> None:
    """With --metrics-url: the gauges the Kubernetes inference gateway reads say what GetLoad says,
    idle and, where the server pauses, with one request running and two waiting behind the pause."""
    url = ctx.session.access.metrics_url
    if not url:
        raise CaseSkipped("no --metrics-url: the harness knows no Prometheus endpoint of the server")
    await idle_load(ctx)
    await _gauges_agree(ctx, url, "idle")
    if not ctx.info.has("admin"):
        return
    running = ctx.open(long_request(ctx))
    await first_delta(ctx, running)
    await paused(ctx)
    waiting = [ctx.open(long_request(ctx)) for _ in range(2)]
    try:
        for stream in waiting:
            await accepted(ctx, stream)
        await asyncio.sleep(0.3 * ctx.budgets.scale)  # tokens already on their way may still arrive
        await _gauges_agree(ctx, url, "with one request running and two waiting behind a pause")
    finally:
        await resumed(ctx)
        await abort(ctx, *(s.record.request_id for s in (running, *waiting)))
    for stream in (running, *waiting):
        await stream.finish(ctx.budgets.release_s)


async def _gauges_agree(ctx: Ctx, url: str, moment: str) -> None:
    load = await ctx.load()
    try:
        async with httpx.AsyncClient(timeout=ctx.budgets.rpc_s) as http:
            reply = await http.get(url)
        reply.raise_for_status()
    except httpx.HTTPError as exc:
        ctx.check.add(f"GET {url} {moment}", "the Prometheus text format", f"{type(exc).__name__}: {exc}")
        return
    gauges = prometheus_samples(reply.text)
    usage = load.kv_tokens_in_use / load.kv_tokens_total if load.kv_tokens_total else 0.0
    want = dict(zip(GATEWAY_GAUGES, (load.waiting_sequences, load.running_sequences, usage), strict=True))
    for name, value in want.items():
        got = gauges.get(name)
        ctx.check.that(
            got is not None and math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-9),
            f"{name} {moment}",
            f"{value:g}, as GetLoad says",
            "not exported" if got is None else got,
        )


def prometheus_samples(text: str) -> dict[str, float]:
    """The unlabelled samples of a Prometheus text exposition, by name."""
    samples = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if line and not line.startswith("#") and "{" not in name:
            try:
                samples[name] = float(value.split()[0])
            except (ValueError, IndexError):
                continue
    return samples


@case("LOAD-1", tag="waiting", requires=("admin",), exclusive=True, sends=("scenario.load-while-waiting",))
async def load_counts_waiting(ctx: Ctx) -> None:
    """A request accepted while generation is paused (no tokens yet) is counted in active_requests."""
    baseline = await quiet_load(ctx)
    await paused(ctx)
    try:
        stream = ctx.open(long_request(ctx))
        await accepted(ctx, stream)
        load = await ctx.load()
    finally:
        await resumed(ctx)
    ctx.check.that(
        load.active_requests >= baseline.active_requests + 1,
        "Load.active_requests with a request waiting (accepted, no tokens)",
        f">= {baseline.active_requests + 1}",
        load.active_requests,
    )
    await abort(ctx, stream.record.request_id)
    await stream.finish(ctx.budgets.release_s)
