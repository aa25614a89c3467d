"""Score and Rerank (SCORE-1, SCORE-2): one score per item in input order, each the score the item
gets alone; Rerank's order is Score's, best first, cut at top_n; bad input names its field."""

from __future__ import annotations

import math
from typing import Any

from grpclib.const import Status

from conformance.harness.context import Ctx, RpcOutcome
from conformance.spec.registry import case
from lmrpc.v1 import RerankRequest, ScoreRequest

QUERY = "apples and pears"
ITEMS = [
    "a red apple",
    "the stock market fell today",
    "pear tart with apples",
    "green apples",
    "日本語の文章",
]
TOLERANCE = 1e-4


async def _scores(ctx: Ctx, items: list[str], query: str = QUERY) -> list[float]:
    return list(
        (
            await ctx.call(
                ctx.inference.score, ScoreRequest(request_id=ctx.uid("score"), query=query, items=items)
            )
        ).scores
    )


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= TOLERANCE for x, y in zip(a, b, strict=True))


@case("SCORE-1", requires=("score",))
async def scores_in_input_order(ctx: Ctx) -> None:
    """One finite score per item, the i-th the score the i-th item gets alone, the same every time;
    prompt_tokens > 0; the request_id echoed, or assigned when empty."""
    rid = ctx.uid("score")
    reply = await ctx.call(ctx.inference.score, ScoreRequest(request_id=rid, query=QUERY, items=ITEMS))
    scores = list(reply.scores)
    ctx.check.equal("number of scores", len(ITEMS), len(scores))
    ctx.check.that(all(math.isfinite(s) for s in scores), "every score", "finite", scores)
    alone = [(await _scores(ctx, [item]) or [math.nan])[0] for item in ITEMS]
    ctx.check.that(
        _close(scores, alone),
        "each item's score",
        f"the score it gets alone (within {TOLERANCE})",
        {"together": scores, "alone": alone},
    )
    again = await _scores(ctx, ITEMS)
    ctx.check.that(
        _close(scores, again), "the same Score again", f"the same scores (within {TOLERANCE})", again
    )
    ctx.check.that(
        reply.usage is not None and reply.usage.prompt_tokens > 0,
        "ScoreResponse.usage.prompt_tokens",
        "> 0",
        reply.usage,
    )
    ctx.check.equal("ScoreResponse.request_id", rid, reply.request_id)
    assigned = await ctx.call(ctx.inference.score, ScoreRequest(query=QUERY, items=ITEMS[:1]))
    ctx.check.that(bool(assigned.request_id), "ScoreResponse.request_id for an empty one", "non-empty", "''")


@case("SCORE-1", tag="invalid", requires=("score",))
async def score_refuses_bad_input(ctx: Ctx) -> None:
    """An empty query, no items, an empty item or a malformed request_id is INVALID_ARGUMENT naming
    the field."""
    bad = {
        "query": ScoreRequest(query="", items=["x"]),
        "items": ScoreRequest(query=QUERY),
        "items[1]": ScoreRequest(query=QUERY, items=["x", ""]),
        "request_id": ScoreRequest(request_id=ctx.uid("score") + " !", query=QUERY, items=["x"]),
    }
    for field, request in bad.items():
        _refused(ctx, f"Score with a bad {field}", field, await ctx.call_status(ctx.inference.score, request))


@case("SCORE-2", requires=("score",))
async def rerank_orders_by_score(ctx: Ctx) -> None:
    """Every document once, best first (equal scores by lower index), each with the score Score gives
    it; with top_n, the best min(top_n, documents)."""
    scores = await _scores(ctx, ITEMS)
    full = list(
        (
            await ctx.call(
                ctx.inference.rerank,
                RerankRequest(request_id=ctx.uid("rerank"), query=QUERY, documents=ITEMS),
            )
        ).results
    )
    indexes = [r.index for r in full]
    ctx.check.equal("the indexes Rerank returns, sorted", list(range(len(ITEMS))), sorted(indexes))
    got = [(r.index, r.score) for r in full]
    ctx.check.equal("Rerank's order", sorted(got, key=lambda pair: (-pair[1], pair[0])), got)
    ctx.check.that(
        _close([r.score for r in full], [scores[i] if i < len(scores) else math.nan for i in indexes]),
        "each document's Rerank score",
        f"the one Score gives it (within {TOLERANCE})",
        {"rerank": got, "score": scores},
    )
    for top_n in (2, len(ITEMS) + 3):
        cut = list(
            (
                await ctx.call(ctx.inference.rerank, RerankRequest(query=QUERY, documents=ITEMS, top_n=top_n))
            ).results
        )
        ctx.check.equal(
            f"the indexes Rerank returns with top_n={top_n}", indexes[:top_n], [r.index for r in cut]
        )


@case("SCORE-2", tag="invalid", requires=("score",))
async def rerank_refuses_bad_input(ctx: Ctx) -> None:
    """top_n = 0, an empty query, no documents or an empty document is INVALID_ARGUMENT naming the field."""
    bad = {
        "top_n": RerankRequest(query=QUERY, documents=["x"], top_n=0),
        "query": RerankRequest(query="", documents=["x"]),
        "documents": RerankRequest(query=QUERY),
        "documents[0]": RerankRequest(query=QUERY, documents=[""]),
    }
    for field, request in bad.items():
        _refused(
            ctx, f"Rerank with a bad {field}", field, await ctx.call_status(ctx.inference.rerank, request)
        )


def _refused(ctx: Ctx, what: str, field: str, outcome: RpcOutcome[Any]) -> None:
    ctx.check.equal(f"{what}: status", Status.INVALID_ARGUMENT.name, outcome.code)
    ctx.check.that(field in outcome.message, f"{what}: message", f"names {field!r}", outcome.message)
