"""What the smg gateway relies on in its engine protocols (SMG-1..4, contract §14): the tokenizer
bundle, model facts that match behaviour, loads that return to idle, and the HealthCheck its
probe order and health polls read. These cases run through an engine-protocol driver only."""

from __future__ import annotations

import time

from grpclib import GRPCError, Status
from grpclib.const import Cardinality

from conformance.cases._helpers import abort, first_delta, ok, started
from conformance.drivers.bundle import BundleError
from conformance.drivers.smg import SmgDriver
from conformance.harness.context import Ctx
from conformance.harness.load import load_counts
from conformance.harness.requests import long_request, request
from conformance.spec.registry import Variant, case
from conformance.stream.live import RawMessage
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import AbortRequest, FinishReason, Load, RequestIds

SAMPLE_TEXT = "Prices rose 12.5% in 2024 — naïve café 東京 🙂 <|im_end|>"
EOS_PROMPTS = ("Say hi.", "Once upon a time", "1, 2, 3,", "The capital of France is", "Hello")


def smg_driver(ctx: Ctx) -> SmgDriver:
    driver = ctx.session.target.driver
    if not isinstance(driver, SmgDriver):
        raise CaseSkipped(f"{driver.protocol} is not an engine protocol")
    return driver


@case("SMG-1")
async def tokenizer_bundle(ctx: Ctx) -> None:
    """GetTokenizer streams a zip whose SHA-256 (on the last chunk) matches its bytes, that smg can
    open, and whose tokenizer.json loads and encodes below GetModelInfo.vocab_size."""
    driver = smg_driver(ctx)
    bundle = await driver.bundle(ctx.session.target.channel, ctx.budgets.rpc_s)
    ctx.note(f"{len(bundle.chunks)} chunks, {len(bundle.data)} bytes, sha256 {bundle.sha256}")
    for problem in bundle.problems():
        ctx.check.add("the GetTokenizer bundle", "what smg accepts (tokenizer_bundle.rs)", problem)
    if ctx.check:
        ids = bundle.tokenizer().encode(SAMPLE_TEXT, add_special_tokens=False).ids
        ctx.check.that(
            all(i < ctx.info.vocab_size for i in ids),
            f"ids the bundle's tokenizer encodes {SAMPLE_TEXT!r} to",
            f"< vocab_size={ctx.info.vocab_size}",
            ids,
        )


@case("SMG-2", tag="eos", sends=("generate.temperature>0",))
async def eos_ids_end_outputs(ctx: Ctx) -> None:
    """GetModelInfo.eos_token_ids are the bundle's end-of-sequence ids and the tokens that end an
    output at EOS (without ignore_eos or stop conditions)."""
    driver = smg_driver(ctx)
    bundle = await driver.bundle(ctx.session.target.channel, ctx.budgets.rpc_s)
    try:
        bundled = bundle.eos_ids()
    except BundleError as exc:  # one cause, one verdict
        raise CaseSkipped(f"the GetTokenizer bundle does not load ({exc}): SMG-1 holds the finding") from None
    ctx.check.equal(
        "end-of-sequence ids of the tokenizer bundle (generation_config.json / config.json)",
        sorted(ctx.info.eos_ids),
        sorted(bundled),
    )
    ended_at_eos = 0
    for text in EOS_PROMPTS:
        record = ok(
            ctx, await ctx.generate(request(ctx, text, temperature=1.0, max_tokens=4 * ctx.tuning.max_tokens))
        )
        for view in record.outputs().values():
            finish = view.finish
            if finish is None or finish.reason != FinishReason.STOP:
                continue
            ended_at_eos += 1
            last = view.token_ids[-1] if view.token_ids else None
            ctx.check.that(
                last in ctx.info.eos_ids,
                f'last token of an output of {text!r} that ended "stop" with no stop condition',
                f"one of GetModelInfo.eos_token_ids {ctx.info.eos_ids}",
                last,
            )
    ctx.note(f"{ended_at_eos} outputs ended at EOS")


def _idle(load: Load) -> bool:
    return not any(load_counts(load).values())


@case(
    "SMG-3",
    variants=[
        Variant({"end": "cancel"}, tag="cancel", sends=("scenario.cancel-after-first-token",)),
        Variant({"end": "abort"}, tag="abort", sends=("abort.ids=1",)),
    ],
    exclusive=True,
)
async def loads_back_to_idle(ctx: Ctx) -> None:
    """GetLoads counts an open stream and is back to 0 on every count once the request was
    cancelled or aborted and nothing else is in flight."""
    smg_driver(ctx)
    was_idle, before = await ctx.wait_for(ctx.load, _idle, ctx.budgets.release_s)
    ctx.check.that(was_idle, "GetLoads with nothing in flight", "every count 0", load_counts(before))
    stream = ctx.open(long_request(ctx, n=min(ctx.info.caps.max_outputs, 2)))
    await first_delta(ctx, stream)
    during = await ctx.load()
    ctx.check.that(
        during.active_requests >= 1, "GetLoads with a stream open", "it is counted", load_counts(during)
    )
    if ctx.params["end"] == "cancel":
        await ctx.cancel(stream)
    else:
        await ctx.call(
            ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=[stream.record.request_id]))
        )
    idle, after = await ctx.wait_for(ctx.load, _idle, ctx.budgets.release_s)
    ctx.check.that(
        idle,
        f"GetLoads {ctx.budgets.release_s:.1f}s after the request was {ctx.params['end']}ed",
        "every count back to 0",
        load_counts(after),
    )
    await stream.finish(ctx.budgets.release_s)


@case("SMG-4")
async def health_check(ctx: Ctx) -> None:
    """HealthCheck answers OK with healthy=true while serving, and the HealthCheck of every engine
    protocol smg probes before this one answers a non-OK status on the same port."""
    driver = smg_driver(ctx)
    channel = ctx.session.target.channel
    try:
        started = time.monotonic()
        healthy, message = await driver.health(channel, ctx.budgets.rpc_s)
        took = time.monotonic() - started
        ctx.check.equal("HealthCheck.healthy while the server serves", True, healthy)
        ctx.check.that(
            took <= ctx.session.promptly_s,
            "HealthCheck's answer",
            f"at once: within {ctx.session.promptly_s:.2f}s (1 s and an engine step)",
            f"after {took:.2f}s",
        )
        ctx.note(f"HealthCheck: healthy={healthy} message={message!r}")
    except GRPCError as exc:
        ctx.check.add("HealthCheck", "status OK", f"{exc.status.name} {exc.message}")
    for service in driver.probed_before:
        status = await _health_status(ctx, service)
        ctx.check.that(
            status != Status.OK.name,
            f"{service}/HealthCheck on a {driver.protocol} port (smg probes it first)",
            "a non-OK status",
            status,
        )


@case("SMG-4", tag="in-flight", exclusive=True, sends=("scenario.health-while-streaming",))
async def health_check_while_streaming(ctx: Ctx) -> None:
    """HealthCheck answers healthy while requests stream: a busy server still accepts requests (a
    worker that says unhealthy whenever it is busy is dropped by smg when it has the most to do)."""
    driver = smg_driver(ctx)
    streams = [ctx.open(long_request(ctx)) for _ in range(2)]
    try:
        await started(ctx, *streams)
        asked = time.monotonic()
        healthy, message = await driver.health(ctx.session.target.channel, ctx.budgets.rpc_s)
        took = time.monotonic() - asked
        ctx.check.equal("HealthCheck.healthy with two requests streaming", True, healthy)
        ctx.check.that(
            took <= ctx.session.promptly_s,
            "HealthCheck's answer with two requests streaming",
            f"at once: within {ctx.session.promptly_s:.2f}s (1 s and an engine step)",
            f"after {took:.2f}s",
        )
        ctx.note(f"HealthCheck: healthy={healthy} message={message!r}")
    except GRPCError as exc:
        ctx.check.add(
            "HealthCheck with two requests streaming", "status OK", f"{exc.status.name} {exc.message}"
        )
    finally:
        await abort(ctx, *(s.record.request_id for s in streams))
    for stream in streams:
        await stream.finish(ctx.budgets.release_s)


async def _health_status(ctx: Ctx, service: str) -> str:
    try:
        async with ctx.session.target.channel.request(
            f"/{service}/HealthCheck",
            Cardinality.UNARY_UNARY,
            RawMessage,
            RawMessage,
            timeout=ctx.budgets.rpc_s,
        ) as stream:
            await stream.send_message(RawMessage(b""), end=True)
            await stream.recv_message()
            await stream.recv_trailing_metadata()
    except GRPCError as exc:
        return exc.status.name
    return Status.OK.name
