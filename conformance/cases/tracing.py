"""Trace context (TRACE-1): a caller's W3C ``traceparent`` continued in the spans the server
exports, read by the harness's own OTLP receiver (``--otlp-listen``), and a malformed one ignored."""

from __future__ import annotations

import secrets

from grpclib.exceptions import GRPCError

from conformance.harness.context import Ctx
from conformance.harness.requests import request
from conformance.spec.registry import case
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import GenerateRequest

MALFORMED = (
    "00-0123",
    "01-" + "a" * 32 + "-" + "b" * 16 + "-01-extra",
    "00-" + "0" * 32 + "-" + "1" * 16 + "-01",
)


async def traced_generate(ctx: Ctx, req: GenerateRequest, traceparent: str) -> str:
    """One Generate carrying ``traceparent``, read to its end; "" if it completed, else what broke."""
    metadata = {"traceparent": traceparent}
    try:
        async for _ in ctx.session.target.inference.generate(
            req, metadata=metadata, timeout=ctx.budgets.stream_s
        ):
            pass
    except GRPCError as exc:
        return f"{exc.status.name}: {exc.message}"
    return ""


@case("TRACE-1", tag="malformed")
async def malformed_traceparent_ignored(ctx: Ctx) -> None:
    """A call whose traceparent is malformed (too short, an unknown version with extra fields, an
    all-zero trace id) is served as if it carried none."""
    for value in MALFORMED:
        broke = await traced_generate(ctx, request(ctx, max_tokens=2), value)
        ctx.check.that(not broke, f"Generate with traceparent {value!r}", "served, status OK", broke)


@case("TRACE-1")
async def caller_trace_continued(ctx: Ctx) -> None:
    """With --otlp-listen: the spans the server exports for a call that carries a traceparent are in
    the caller's trace, one of them a child of the caller's span and every other one below it."""
    receiver = ctx.session.spans
    if receiver is None:
        raise CaseSkipped("no --otlp-listen: the harness receives no spans of the server")
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    broke = await traced_generate(ctx, request(ctx, max_tokens=4), f"00-{trace_id}-{parent}-01")
    ctx.check.that(not broke, "Generate with a traceparent", "served, status OK", broke)
    spans = await receiver.wait_for(trace_id, parent, ctx.budgets.release_s * 2)
    ctx.note("spans: " + ", ".join(f"{s.service}/{s.name} (parent {s.parent_span_id or '-'})" for s in spans))
    children = [s for s in spans if s.parent_span_id == parent]
    ctx.check.that(
        bool(children),
        f"spans exported in the caller's trace {trace_id}",
        f"one whose parent is the caller's span {parent}",
        f"{len(spans)} spans, parents {sorted({s.parent_span_id for s in spans})}",
    )
    known = {parent} | {s.span_id for s in spans}
    strays = [s for s in spans if s.parent_span_id not in known]
    ctx.check.that(
        not strays,
        "every span of the caller's trace",
        "below the caller's span",
        ", ".join(f"{s.name} (parent {s.parent_span_id or 'none'})" for s in strays),
    )
