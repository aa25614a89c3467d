"""Invalid input and error codes (SAMPLE-5, REQ-1/3/4/5/6, ERR-1/3/4/5): the exact status, no messages,
never UNKNOWN or INTERNAL, a status message that names the field, and a server that keeps serving."""

from __future__ import annotations

import asyncio
from typing import Any

from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from conformance.cases._helpers import applies_here, expect_rejected, ok, status_of, streams_on
from conformance.harness.context import Ctx, RpcOutcome
from conformance.harness.load import quiet_load, released
from conformance.harness.requests import long_request, request
from conformance.search.invalid import INVALID, Invalid, applicable
from conformance.search.pool import copy_request
from conformance.search.property import raise_outcome, search
from conformance.search.strategies import invalid_requests
from conformance.spec.registry import case
from conformance.stream.live import RawMessage
from conformance.stream.record import End
from conformance.vocabulary import CaseSkipped, Mismatch, TargetInfo
from lmrpc.v1 import (
    DetokenizeRequest,
    EmbedRequest,
    FinishReason,
    GenerateRequest,
    RerankRequest,
    SamplingParams,
    ScoreRequest,
    StoppingCriteria,
    TokenizeRequest,
)


def _invalid_case(entry: Invalid) -> None:
    @case(entry.clause, tag=entry.label, requires=entry.requires, sends=entry.sends)
    async def rejected(ctx: Ctx) -> None:
        """The request fails with the code the contract gives it, and no messages."""
        record = await ctx.answer(entry.build(ctx.info, ctx.uid()))
        expect_rejected(ctx, record, entry.codes, f"Generate with {entry.label}")

    rejected.__doc__ = (
        f"Generate with {entry.label} fails with {'/'.join(c.name for c in entry.codes)}, no messages."
    )


for _entry in INVALID:
    _invalid_case(_entry)


@case("ERR-1", tag="generated")
async def generated_invalid(ctx: Ctx) -> None:
    """Generated requests with one value out of range: INVALID_ARGUMENT and no messages, never UNKNOWN/INTERNAL."""

    async def body(drawn: tuple[GenerateRequest, str]) -> list[Mismatch]:
        req, label = drawn
        req = copy_request(req)
        if not label.startswith("request_id"):
            req.request_id = ctx.uid()
        record = await ctx.answer(req)
        if record.end is End.STATUS and record.status is Status.INVALID_ARGUMENT and not record.events:
            return []
        return [Mismatch(f"Generate with {label}", "INVALID_ARGUMENT and no messages", status_of(record))]

    strategy = invalid_requests(ctx.info, max_tokens=ctx.tuning.max_tokens)
    raise_outcome(ctx, await search(ctx, strategy, body, examples=ctx.tuning.examples * 2))


@case("ERR-1", tag="control", requires=("tokenize",), sends=("tokenize.no-input",))
async def control_invalid(ctx: Ctx) -> None:
    """Tokenize without input and Detokenize with an id >= vocab_size are INVALID_ARGUMENT."""
    for what, outcome in (
        ("Tokenize without input", await ctx.call_status(ctx.control.tokenize, TokenizeRequest())),
        (
            f"Detokenize([1, {ctx.info.vocab_size}])",
            await ctx.call_status(
                ctx.control.detokenize, DetokenizeRequest(token_ids=[1, ctx.info.vocab_size])
            ),
        ),
    ):
        ctx.check.equal(f"{what}: status", Status.INVALID_ARGUMENT.name, outcome.code)


@case("ERR-1", tag="embed", requires=("embed",), sends=("embed.no-texts",))
async def embed_invalid(ctx: Ctx) -> None:
    """Embed with no texts, or a text longer than max_input_tokens, is INVALID_ARGUMENT."""
    limit = ctx.info.embedding.max_input_tokens if ctx.info.embedding else 512
    for label, texts in (("no texts", []), ("a text too long", ["word " * (limit + 16)])):
        outcome = await ctx.call_status(ctx.inference.embed, EmbedRequest(request_id=ctx.uid(), texts=texts))
        ctx.check.equal(f"Embed with {label}", Status.INVALID_ARGUMENT.name, outcome.code)


@case("ERR-3")
async def status_names_field(ctx: Ctx) -> None:
    """The status message of an invalid request names the offending field (and value)."""
    named = ctx.session.target.driver.names_constraint_fields
    entries = [
        e
        for e in applicable(ctx.info)
        if e.field
        and e.codes == (Status.INVALID_ARGUMENT,)
        and applies_here(ctx, f"{e.clause}[{e.label}]")
        and (named or e.clause != "CONSTRAIN-2")
    ]
    records = await asyncio.gather(*(ctx.answer(e.build(ctx.info, ctx.uid())) for e in entries))
    aliases = ctx.session.target.driver.field_names
    for entry, record in zip(entries, records, strict=True):
        message = record.status_message.lower()
        if record.end is not End.STATUS:
            continue  # the wrong code is ERR-1's and SAMPLE-5's failure, not this clause's
        names = {entry.field.lower(), aliases.get(entry.field, entry.field).lower()}  # the protocol's name
        ctx.check.that(
            any(name in message for name in names),
            f"status message for {entry.label}",
            f"names the field {' or '.join(repr(n) for n in sorted(names))}",
            record.status_message,
        )
        if entry.value:
            ctx.check.that(
                entry.value.lower() in message,
                f"status message for {entry.label}",
                f"names the value {entry.value!r}",
                record.status_message,
            )


@case("ERR-3", tag="score", requires=("score",))
async def score_names_the_long_text(ctx: Ctx) -> None:
    """A Score query or item, or a Rerank document, longer than the embedding model takes (refused
    as Embed refuses one, ERR-1[embed]) is named as the client sent it: `query`, `items[i]`,
    `documents[i]`, never by its place in the server's own batch of texts."""
    limit = ctx.info.embedding.max_input_tokens if ctx.info.embedding else 512
    long = "word " * (limit + 16)
    scores = {
        "query": ScoreRequest(query=long, items=["a pear", "a plum"]),
        "items[0]": ScoreRequest(query="fruit", items=[long, "a plum"]),
        "items[1]": ScoreRequest(query="fruit", items=["a pear", long]),
    }
    outcomes: dict[str, RpcOutcome[Any]] = {
        field: await ctx.call_status(ctx.inference.score, m) for field, m in scores.items()
    }
    rerank = RerankRequest(query="fruit", documents=[long, "a plum"])
    outcomes["documents[0]"] = await ctx.call_status(ctx.inference.rerank, rerank)
    refused = {field: o for field, o in outcomes.items() if o.code == Status.INVALID_ARGUMENT.name}
    if not refused:  # a server may truncate instead; another code is not this clause's to judge
        raise CaseSkipped(
            f"texts of {limit + 16} words are not refused INVALID_ARGUMENT by Score or Rerank here"
        )
    for field, outcome in refused.items():
        ctx.check.that(
            field in outcome.message,
            f"the refusal of a too long {field}",
            f"names {field!r}",
            outcome.message,
        )


async def _raw_unary(ctx: Ctx, path: str) -> str:
    try:
        async with ctx.session.target.channel.request(
            path, Cardinality.UNARY_UNARY, RawMessage, RawMessage, timeout=ctx.budgets.rpc_s
        ) as stream:
            await stream.send_message(RawMessage(b""), end=True)
            await stream.recv_message()
            await stream.recv_trailing_metadata()
        return "OK"
    except GRPCError as exc:
        return exc.status.name


@case("ERR-4", tag="method")
async def unknown_method(ctx: Ctx) -> None:
    """An unknown method of a served service is UNIMPLEMENTED."""
    for path in ("/lmrpc.v1.InferenceService/NoSuchMethod", "/lmrpc.v1.ControlService/NoSuchMethod"):
        ctx.check.equal(f"call {path}", Status.UNIMPLEMENTED.name, await _raw_unary(ctx, path))


@case("ERR-4", tag="service")
async def unknown_service(ctx: Ctx) -> None:
    """A method of an unknown service is UNIMPLEMENTED."""
    ctx.check.equal(
        "call /lmrpc.v9.NoSuchService/Generate",
        Status.UNIMPLEMENTED.name,
        await _raw_unary(ctx, "/lmrpc.v9.NoSuchService/Generate"),
    )


@case("ERR-5")
async def serves_after_invalid(ctx: Ctx) -> None:
    """After a burst of invalid requests a valid request succeeds."""
    entries = applicable(ctx.info)
    await asyncio.gather(*(ctx.answer(e.build(ctx.info, ctx.uid())) for e in entries))
    ok(ctx, await ctx.generate(request(ctx, max_tokens=2)), "a valid Generate after invalid ones")


@case("REQ-3", budget=2.0, exclusive=True)
async def duplicate_in_flight(ctx: Ctx) -> None:
    """A second Generate with an in-flight id is ALREADY_EXISTS with no messages; the first is unaffected;
    once the first was cancelled and its resources released, the id is accepted again at once."""
    baseline = await quiet_load(ctx)
    for _ in range(3):
        rid = ctx.uid("dup")
        first = ctx.open(long_request(ctx, request_id=rid))
        await first.read_until(lambda e: e.kind == "delta", ctx.budgets.prompt_s)
        duplicate = await ctx.generate(request(ctx, request_id=rid, max_tokens=1))
        if duplicate.accepted:
            ended = await first.finish(ctx.budgets.release_s)
            finishes = [v.finish for v in ended.outputs().values()]
            if (
                ended.ended_ok
                and finishes
                and all(f is not None and f.reason == FinishReason.LENGTH for f in finishes)
            ):
                ctx.note("the first request may have ended before its duplicate arrived; trying again")
                continue  # the whole window was generated already: the id was free, nothing proven
        expect_rejected(
            ctx, duplicate, (Status.ALREADY_EXISTS,), "Generate with the id of a request in flight"
        )
        await streams_on(ctx, first, "the request in flight after the duplicate")
        await ctx.cancel(first)
        if (await released(ctx, baseline))[0]:  # a server that never releases fails ABORT-3, not this
            reused = await ctx.generate(request(ctx, request_id=rid, max_tokens=1))
            ctx.check.that(
                reused.ended_ok and reused.error is None,
                "Generate reusing the id once the cancelled request was released",
                "accepted at once, status OK",
                status_of(reused),
            )
        return
    raise CaseSkipped(
        "every long request finished before its duplicate arrived: REQ-3 could not be exercised"
    )


@case("REQ-3", tag="reuse-after-finish", sends=("scenario.reuse-after-finish",))
async def reuse_after_finish(ctx: Ctx) -> None:
    """Once a request's terminal message arrived, a Generate reusing its id is accepted at once."""
    rid = ctx.uid("reuse")
    for attempt in range(3):
        record = await ctx.generate(request(ctx, request_id=rid, max_tokens=2))
        ctx.check.that(
            record.ended_ok and record.error is None,
            f"Generate #{attempt + 1} with the id {rid!r}, right after the previous one ended",
            "accepted, status OK",
            status_of(record),
        )


@case("REQ-4", tag="id-128-bytes")
async def longest_request_id(ctx: Ctx) -> None:
    """A request_id of exactly 128 bytes of the allowed characters is accepted (and echoed)."""
    rid = (ctx.uid("longest") + "-" + "x" * 128)[:128]
    record = await ctx.generate(request(ctx, request_id=rid, max_tokens=1))
    ctx.check.that(
        record.ended_ok and record.error is None,
        "Generate with a 128-byte request_id",
        "accepted",
        status_of(record),
    )
    ctx.check.equal("request_id on its messages", {rid}, {e.message.request_id for e in record.events})


def _boundaries(info: TargetInfo) -> list[tuple[str, GenerateRequest]]:
    """One request per closed end of a SAMPLE-5 range (the open ends are in the invalid table)."""

    def sampled(**kw: float) -> GenerateRequest:
        sampling = SamplingParams(**kw)  # type: ignore[arg-type]
        return GenerateRequest(text="Hello", sampling=sampling, stopping=StoppingCriteria(max_tokens=2))

    out = [
        ("temperature=0", sampled(temperature=0.0)),
        ("max_tokens=1", GenerateRequest(text="Hello", stopping=StoppingCriteria(max_tokens=1))),
    ]
    out.append(
        (
            "min_tokens=max_tokens",
            GenerateRequest(text="Hello", stopping=StoppingCriteria(max_tokens=2, min_tokens=2)),
        )
    )
    if info.has("truncation_sampling"):
        out += [(f"{k}={v}", sampled(**{k: v})) for k, v in (("top_p", 1.0), ("min_p", 0.0), ("min_p", 1.0))]
    if info.has("penalties"):
        for name in ("frequency_penalty", "presence_penalty"):
            out += [(f"{name}={v}", sampled(**{name: v})) for v in (-2.0, 2.0)]
        out.append(("repetition_penalty=10", sampled(repetition_penalty=10.0)))
    return out


@case("SAMPLE-5", tag="boundaries-accepted")
async def boundaries_accepted(ctx: Ctx) -> None:
    """Every closed end of a SAMPLE-5 range is a valid value: accepted, and the stream ends OK."""
    labelled = _boundaries(ctx.info)
    for _, req in labelled:
        req.request_id = ctx.uid()
    records = await asyncio.gather(*(ctx.generate(req) for _, req in labelled))
    for (label, _), record in zip(labelled, records, strict=True):
        ctx.check.that(
            record.ended_ok and record.error is None,
            f"Generate with {label}",
            "accepted, status OK",
            status_of(record),
        )
