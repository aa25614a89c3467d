"""Embeddings (EMBED-1, EMBED-2, EMBED-3): shape and input order, normalization and repeatability, request ids."""

from __future__ import annotations

import asyncio
import math

from grpclib.const import Status

from conformance.cases._helpers import abort
from conformance.harness.context import Ctx
from conformance.spec.registry import case
from lmrpc.v1 import EmbedRequest


@case("EMBED-1", requires=("embed",), sends=("embed.texts>1",))
async def embeddings_shape(ctx: Ctx) -> None:
    """One embedding per text, in input order (the i-th is the vector the i-th text gets alone), each of
    EmbeddingModelInfo.dimensions values; prompt_tokens > 0."""
    texts = ["Hello", "A longer sentence about conformance testing.", "日本語"]
    reply = await ctx.call(ctx.inference.embed, EmbedRequest(request_id=ctx.uid(), texts=texts))
    dims = ctx.info.embedding.dimensions if ctx.info.embedding else None
    ctx.check.equal("number of embeddings", len(texts), len(reply.embeddings))
    ctx.check.equal("values per embedding", [dims] * len(texts), [len(e.values) for e in reply.embeddings])
    ctx.check.that(
        reply.usage is not None and reply.usage.prompt_tokens > 0,
        "EmbedResponse.usage.prompt_tokens",
        "> 0",
        reply.usage,
    )
    alone = [await _embed_one(ctx, text) for text in texts]
    nearest = [_nearest(list(e.values), alone) for e in reply.embeddings]
    ctx.check.equal("which text's own vector each embedding is closest to", list(range(len(texts))), nearest)


async def _embed_one(ctx: Ctx, text: str) -> list[float]:
    reply = await ctx.call(ctx.inference.embed, EmbedRequest(request_id=ctx.uid(), texts=[text]))
    return list(reply.embeddings[0].values) if reply.embeddings else []


def _nearest(vector: list[float], candidates: list[list[float]]) -> int:
    return min(range(len(candidates)), key=lambda j: _max_diff(vector, candidates[j]))


def _max_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return math.inf
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@case("EMBED-2", requires=("embed",))
async def embeddings_normalized(ctx: Ctx) -> None:
    """Every embedding has L2 norm 1 (within 1e-3); the same text always gives the same vector (within 1e-5)."""
    hello, other, again = [await _embed_one(ctx, t) for t in ("Hello", "conformance", "Hello")]
    for label, values in (("'Hello'", hello), ("'conformance'", other)):
        norm = math.sqrt(sum(v * v for v in values))
        ctx.check.that(abs(norm - 1) <= 1e-3, f"L2 norm of the embedding of {label}", "1 +- 1e-3", norm)
    ctx.check.that(
        _max_diff(hello, again) <= 1e-5,
        "'Hello' embedded again",
        "the same vector (max diff <= 1e-5)",
        _max_diff(hello, again),
    )


@case(
    "EMBED-3",
    requires=("embed",),
    sends=(
        "embed.request_id=empty",
        "embed.request_id-malformed",
    ),
)
async def embed_request_ids(ctx: Ctx) -> None:
    """Embed echoes the request_id, assigns a non-empty one when it is empty, and rejects a malformed one."""
    rid = ctx.uid("embed")
    given = await ctx.call(ctx.inference.embed, EmbedRequest(request_id=rid, texts=["Hi"]))
    ctx.check.equal("EmbedResponse.request_id", rid, given.request_id)
    assigned = await ctx.call(ctx.inference.embed, EmbedRequest(texts=["Hi"]))
    ctx.check.that(bool(assigned.request_id), "EmbedResponse.request_id for an empty one", "non-empty", "''")
    bad = await ctx.call_status(ctx.inference.embed, EmbedRequest(request_id=rid + " !", texts=["Hi"]))
    ctx.check.equal(f"Embed with request_id={rid + ' !'!r}", Status.INVALID_ARGUMENT.name, bad.code)
    twins = await asyncio.gather(
        *(ctx.call_status(ctx.inference.embed, EmbedRequest(request_id=rid, texts=["Hi"])) for _ in range(2))
    )
    ctx.check.equal(
        "two concurrent Embeds with one request_id (not Generate ids)", ["OK", "OK"], [t.code for t in twins]
    )
    ctx.check.equal("Abort of an Embed request_id", [(rid, "NOT_IN_FLIGHT")], await abort(ctx, rid))
