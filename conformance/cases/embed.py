"""Embeddings (EMBED-1, EMBED-2, EMBED-3): shape and input order, normalization and repeatability, request ids."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from grpclib.const import Status
from hypothesis import strategies as st

from conformance.cases._helpers import abort, first_delta, ran_to_its_end, streams_on
from conformance.harness.context import Ctx
from conformance.harness.requests import long_request
from conformance.search.property import raise_outcome, search
from conformance.search.strategies import prompt_texts
from conformance.spec.registry import case
from conformance.stream.record import StreamRecord
from conformance.vocabulary import Mismatch
from lmrpc.v1 import EmbedRequest

NORM_TOLERANCE = 1e-3  # EMBED-2: the L2 norm within this of 1
SAME_TEXT_TOLERANCE = 1e-5  # EMBED-2: the same text's vectors within this of each other


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


@dataclass(frozen=True, slots=True)
class Batch:
    texts: tuple[str, ...]
    named: bool  # the request carries a request_id (else the server assigns one)


def batches() -> st.SearchStrategy[Batch]:
    texts = st.lists(prompt_texts(), min_size=1, max_size=4).map(tuple)
    return st.builds(Batch, texts, st.booleans())


@case("EMBED-1", tag="batches", requires=("embed",), sends=("embed.texts>1", "embed.request_id=empty"))
async def embedding_batches(ctx: Ctx) -> None:
    """Generated batches of texts, repeats included: each embedding has the model's dimensions, is
    L2-normalized and is its own text's vector (nearest to the vector that text gets alone among the
    batch's texts, and equal to the vector of the same text elsewhere in the batch); the reply carries
    the request's id, or a server-assigned one when it had none."""
    dims = ctx.info.embedding.dimensions if ctx.info.embedding else None
    alone: dict[str, list[float]] = {}

    async def body(batch: Batch) -> list[Mismatch]:
        rid = ctx.uid("embed") if batch.named else ""
        reply = await ctx.call(ctx.inference.embed, EmbedRequest(request_id=rid, texts=list(batch.texts)))
        what = f"Embed of {len(batch.texts)} texts {list(batch.texts)!r}"
        found = _id_mismatches(what, rid, reply.request_id)
        vectors = [list(e.values) for e in reply.embeddings]
        if len(vectors) != len(batch.texts):
            return [*found, Mismatch(f"{what}: embeddings", str(len(batch.texts)), str(len(vectors)))]
        for text in batch.texts:
            if text not in alone:
                alone[text] = await _embed_one(ctx, text)
        distinct = list(dict.fromkeys(batch.texts))
        first: dict[str, list[float]] = {}
        for i, (text, values) in enumerate(zip(batch.texts, vectors, strict=True)):
            where = f"{what}: embedding {i}"
            if len(values) != dims:
                found.append(Mismatch(f"{where}: values", str(dims), str(len(values))))
                continue
            norm = math.sqrt(sum(v * v for v in values))
            if abs(norm - 1) > NORM_TOLERANCE:
                found.append(Mismatch(f"{where}: L2 norm", f"1 +- {NORM_TOLERANCE}", f"{norm:.6g}"))
            nearest = distinct[_nearest(values, [alone[t] for t in distinct])]
            if nearest != text:
                found.append(
                    Mismatch(f"{where}: the text whose own vector it is nearest", repr(text), repr(nearest))
                )
            if text in first and _max_diff(values, first[text]) > SAME_TEXT_TOLERANCE:
                diff = _max_diff(values, first[text])
                found.append(
                    Mismatch(
                        f"{where}: {text!r} again in the batch", "the same vector", f"max diff {diff:.3g}"
                    )
                )
            first.setdefault(text, values)
        return found

    explicit = [Batch(("Hello", "日本語", "Hello"), named=True), Batch(("conformance", "Hi"), named=False)]
    raise_outcome(ctx, await search(ctx, batches(), body, explicit=explicit))


def _id_mismatches(what: str, sent: str, answered: str) -> list[Mismatch]:
    if sent and answered != sent:
        return [Mismatch(f"{what}: EmbedResponse.request_id", sent, answered)]
    if not sent and not answered:
        return [Mismatch(f"{what}: EmbedResponse.request_id for an empty one", "non-empty", "''")]
    return []


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


SHARED_ID_ATTEMPTS = 3  # a Generate that ends on its own just before the Abort arrives is tried again


@case("EMBED-3", tag="generate-id", requires=("embed",))
async def embed_beside_generate_id(ctx: Ctx) -> None:
    """An Embed may carry the id of a Generate in flight: it is answered with that id (no ALREADY_EXISTS),
    the Generate streams on, and an Abort of the id aborts the Generate alone."""
    for attempt in range(1, SHARED_ID_ATTEMPTS + 1):
        rid, going, aborted, record = await _embed_beside(ctx)
        raced = aborted == [(rid, "NOT_IN_FLIGHT")] and ran_to_its_end(record)
        if not (going and raced) or attempt == SHARED_ID_ATTEMPTS:
            break
        ctx.note(f"attempt {attempt}: the Generate ended on its own before the Abort arrived; again")
    if going:  # not where it ended meanwhile: the id was free again
        ctx.check.equal("Abort of the id the Generate and the Embed share", [(rid, "ABORTED")], aborted)


async def _embed_beside(ctx: Ctx) -> tuple[str, bool, list[tuple[str, str]], StreamRecord]:
    """One try: (the shared id, whether the Generate streamed on past the Embed, what the Abort of
    the id answered, the Generate's record)."""
    rid = ctx.uid("shared")
    stream = ctx.open(long_request(ctx, request_id=rid))
    going = False
    try:
        await first_delta(ctx, stream)
        reply = await ctx.call_status(ctx.inference.embed, EmbedRequest(request_id=rid, texts=["Hi"]))
        answered = reply.response.request_id if reply.response is not None else None
        ctx.check.equal(
            f"Embed with the request_id {rid!r} of a Generate in flight: (status, request_id)",
            ("OK", rid),
            (reply.code, answered),
        )
        going = await streams_on(ctx, stream, "the Generate after an Embed with its id")
    finally:
        aborted = await abort(ctx, rid)
    return rid, going, aborted, await stream.finish(ctx.budgets.release_s)
