"""SGLang's embeddings and rankings on its native service, read as SGLang reads them.

lmrpc.v1's Embed runs through the driver as ``OpenAIEmbed`` (EMBED-1, EMBED-2 and ERR-1[embed] as
written); the cases here read what only the native RPCs show: ``TextEmbed`` and ``Embed`` (the ids
``Tokenize`` gives) embed a text as ``OpenAIEmbed`` does, their ``meta_info`` names the request
(EMBED-1[native], EMBED-3[native]); ``Score`` and ``Rerank`` take and answer SGLang's
``/v1/score`` and ``/v1/rerank`` JSON, with the HTTP status in band (SCORE-1[native],
SCORE-2[native]). SGLang scores an item by the generation model's probabilities of
``label_token_ids`` after query and item, and asks for them (a 400 naming them) where a body has
none: the cases then send the first ids of " yes" and " no". A server that answers UNIMPLEMENTED
serves no model for the RPC (SGLang serves one model per process): SKIP.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from grpclib import GRPCError, Status

from conformance.cases.scoring import ITEMS, QUERY, TOLERANCE
from conformance.cases.sglang_runtime import runtime
from conformance.drivers.sglang_runtime import JsonAnswer, error_message
from conformance.harness.context import Ctx
from conformance.spec.registry import case
from conformance.vocabulary import CaseFailed, CaseSkipped, Mismatch
from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import EmbedRequest

TEXTS = ("Hello", "A longer sentence about conformance testing.", "日本語")
SAME_TEXT = 1e-5  # EMBED-2: the same text's vectors within this of each other
LABEL_WORDS = (" yes", " no")  # SGLang's scores are these tokens' probabilities, where it asks for labels
RUNTIME = ("sglang-runtime",)
# Rerank with duplicates: documents 0 and 5, 3 and 6 are the same text, so their scores tie.
DOCUMENTS = [*ITEMS, ITEMS[0], ITEMS[3]]


def max_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return math.inf
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def meta_values(meta: dict[str, str]) -> dict[str, Any]:
    """meta_info decoded; a value that is not JSON text is left out (and so reads as missing)."""
    values: dict[str, Any] = {}
    for key, text in meta.items():
        try:
            values[key] = json.loads(text)
        except ValueError:
            continue
    return values


def _counted(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


async def _openai_vector(ctx: Ctx, text: str) -> list[float]:
    reply = await ctx.call(ctx.inference.embed, EmbedRequest(texts=[text]))
    return list(reply.embeddings[0].values) if reply.embeddings else []


def _stub(ctx: Ctx) -> rt.SglangServiceStub:
    return runtime(ctx).stub(ctx.session.target.channel)


@case("EMBED-1", tag="native", requires=("embed", "tokenize"), protocols=RUNTIME)
async def native_embeddings_agree(ctx: Ctx) -> None:
    """TextEmbed of a text and Embed of the ids Tokenize gives it return the vector OpenAIEmbed gives
    that text (within 1e-5), of the embedding model's dimensions, with meta_info prompt_tokens > 0
    (JSON text)."""
    stub = _stub(ctx)
    dims = ctx.info.embedding.dimensions if ctx.info.embedding else None
    for text in TEXTS:
        want = await _openai_vector(ctx, text)
        by_text = await stub.text_embed(
            rt.TextEmbedRequest(text=text, rid=ctx.uid("embed")), timeout=ctx.budgets.rpc_s
        )
        ids = await ctx.tokenize(text)
        by_ids = await stub.embed(
            rt.EmbedRequest(input_ids=ids, rid=ctx.uid("embed")), timeout=ctx.budgets.rpc_s
        )
        for rpc, reply in (("TextEmbed", by_text), (f"Embed of {ids}", by_ids)):
            got = list(reply.embedding)
            what = f"{rpc} of {text!r}"
            ctx.check.equal(f"{what}: values", dims, len(got))
            ctx.check.that(max_diff(got, want) <= SAME_TEXT, f"{what}: the vector",
                           f"OpenAIEmbed's for the text (max diff <= {SAME_TEXT})", f"max diff {max_diff(got, want):.3g}")  # fmt: skip
            prompt = meta_values(reply.meta_info).get("prompt_tokens")
            ctx.check.that(_counted(prompt), f"{what}: meta_info['prompt_tokens']", "a JSON integer > 0",
                           reply.meta_info.get("prompt_tokens", "missing"))  # fmt: skip


@case("EMBED-3", tag="native", requires=("embed", "tokenize"), protocols=RUNTIME)
async def native_embedding_ids(ctx: Ctx) -> None:
    """TextEmbed's and Embed's meta_info `id` is the rid sent (JSON text), or a non-empty one the
    server assigned when none was sent."""
    stub = _stub(ctx)
    ids = await ctx.tokenize("Hi")
    for rpc, send in (
        (
            "TextEmbed",
            lambda rid: stub.text_embed(rt.TextEmbedRequest(text="Hi", rid=rid), timeout=ctx.budgets.rpc_s),
        ),
        ("Embed", lambda rid: stub.embed(rt.EmbedRequest(input_ids=ids, rid=rid), timeout=ctx.budgets.rpc_s)),
    ):
        rid = ctx.uid("embed")
        named = meta_values((await send(rid)).meta_info).get("id")
        ctx.check.equal(f"{rpc} with rid {rid!r}: meta_info['id']", rid, named)
        assigned = meta_values((await send(None)).meta_info).get("id")
        ctx.check.that(isinstance(assigned, str) and bool(assigned), f"{rpc} without rid: meta_info['id']",
                       "a non-empty JSON string", assigned)  # fmt: skip


# ── Score and Rerank ─────────────────────────────────────────
@dataclass
class Ranker:
    """Score and Rerank calls of one case, with SGLang's label tokens once the server asks for them."""

    ctx: Ctx
    labels: list[int] | None = None
    calls: list[str] = field(default_factory=list)

    async def call(self, rpc: str, body: dict[str, Any]) -> JsonAnswer:
        driver = runtime(self.ctx)
        method = getattr(driver.stub(self.ctx.session.target.channel), rpc)
        try:
            answer = await driver.openai_json(method, self.labelled(rpc, body), self.ctx.budgets.rpc_s)
            if rpc == "score" and self.labels is None and self.asks_for_labels(answer):
                self.labels = [(await self.ctx.tokenize(word) or [0])[0] for word in LABEL_WORDS]
                answer = await driver.openai_json(method, self.labelled(rpc, body), self.ctx.budgets.rpc_s)
        except GRPCError as exc:
            if exc.status is Status.UNIMPLEMENTED:
                raise CaseSkipped(
                    f"{rpc}: UNIMPLEMENTED ({exc.message}): no model for it is served"
                ) from None
            raise
        return answer

    def labelled(self, rpc: str, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "label_token_ids": self.labels} if rpc == "score" and self.labels else body

    @staticmethod
    def asks_for_labels(answer: JsonAnswer) -> bool:
        return 400 <= answer.status_code < 500 and "label_token_ids" in error_message(answer.body)

    async def ok(self, rpc: str, body: dict[str, Any], what: str) -> Any:
        """The body of a 200 answer; anything else fails the case."""
        answer = await self.call(rpc, body)
        if not answer.ok:
            got = f"status_code {answer.status_code}: {error_message(answer.body)}"
            raise CaseFailed([*self.ctx.check.mismatches, Mismatch(what, "status_code 200", got)])
        return answer.body

    async def scores(self, items: list[str], what: str) -> list[list[float]]:
        """Score's ``scores``, each item's entry as a list (SGLang: one probability per label)."""
        body = await self.ok("score", {"query": QUERY, "items": items}, what)
        scores = body.get("scores") if isinstance(body, dict) else None
        if not isinstance(scores, list):
            raise CaseFailed(
                [*self.ctx.check.mismatches, Mismatch(f"{what}: scores", "a list", str(body)[:200])]
            )
        return [[float(x) for x in s] if _numbers(s) else [float(s)] if _number(s) else [] for s in scores]

    async def rerank(self, documents: list[str], what: str, top_n: int | None = None) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"query": QUERY, "documents": documents}
        if top_n is not None:
            body["top_n"] = top_n
        results = await self.ok("rerank", body, what)
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
            raise CaseFailed(
                [*self.ctx.check.mismatches, Mismatch(what, "a list of results", str(results)[:200])]
            )
        return results


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(_number(x) for x in value)


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= TOLERANCE for x, y in zip(a, b, strict=True))


@case("SCORE-1", tag="native", protocols=RUNTIME)
async def native_scores(ctx: Ctx) -> None:
    """Score (SGLang's /v1/score JSON): status_code 200, one entry of finite scores per item in input
    order, each the scores that item gets alone (within 1e-4), the same request the same scores,
    usage.prompt_tokens > 0; a body without items is a 400 in band."""
    ranker = Ranker(ctx)
    scores = await ranker.scores(ITEMS, "Score of 5 items")
    ctx.check.equal("number of score entries", len(ITEMS), len(scores))
    ctx.check.that(all(scores), "every item's entry", "a non-empty list of finite numbers", scores)
    alone = [(await ranker.scores([item], f"Score of {item!r} alone") or [[]])[0] for item in ITEMS]
    ctx.check.that(len(scores) == len(alone) and all(_close(a, b) for a, b in zip(scores, alone, strict=False)),
                   "each item's scores", f"the scores it gets alone (within {TOLERANCE})",
                   {"together": scores, "alone": alone})  # fmt: skip
    again = await ranker.scores(ITEMS, "the same Score again")
    ctx.check.that(len(again) == len(scores) and all(_close(a, b) for a, b in zip(scores, again, strict=False)),
                   "the same Score again", f"the same scores (within {TOLERANCE})", again)  # fmt: skip
    body = await ranker.ok("score", {"query": QUERY, "items": ITEMS[:2]}, "Score of 2 items")
    usage = body.get("usage") if isinstance(body, dict) else None
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    ctx.check.that(_counted(prompt), "Score's usage.prompt_tokens", "an integer > 0", usage)
    bad = await ranker.call("score", {"query": QUERY})
    ctx.check.equal("Score without items: status_code (in band)", 400, bad.status_code)


@case("SCORE-2", tag="native", protocols=RUNTIME)
async def native_rerank(ctx: Ctx) -> None:
    """Rerank (SGLang's /v1/rerank JSON) of documents with duplicates: every document once by index,
    best first, equal scores by lower index (the duplicates tie), each with its text as sent and the
    score it gets in a Rerank of its own (within 1e-4); with top_n, the best min(top_n, documents)."""
    ranker = Ranker(ctx)
    full = await ranker.rerank(DOCUMENTS, f"Rerank of {len(DOCUMENTS)} documents")
    indexes = [r.get("index") for r in full]
    ctx.check.equal("the indexes Rerank returns, sorted", list(range(len(DOCUMENTS))),
                    sorted(i for i in indexes if isinstance(i, int)))  # fmt: skip
    got = [(r.get("index"), r.get("score")) for r in full]
    if not all(isinstance(i, int) and _number(s) for i, s in got):
        raise CaseFailed(
            [*ctx.check.mismatches, Mismatch("each result", "an int index and a finite score", str(got))]
        )
    pairs: list[tuple[int, float]] = [(int(i), float(s)) for i, s in got]  # type: ignore[arg-type]
    ctx.check.equal("Rerank's order (higher score first, equal scores by lower index)",
                    sorted(pairs, key=lambda pair: (-pair[1], pair[0])), pairs)  # fmt: skip
    score_of = dict(pairs)
    for first, again in ((0, len(ITEMS)), (3, len(ITEMS) + 1)):
        ctx.check.that(abs(score_of.get(first, math.nan) - score_of.get(again, math.inf)) <= TOLERANCE,
                       f"documents {first} and {again} (the same text)", f"the same score (within {TOLERANCE})",
                       (score_of.get(first), score_of.get(again)))  # fmt: skip
    for result in full:
        index, document = result.get("index"), result.get("document")
        if document is not None and isinstance(index, int) and 0 <= index < len(DOCUMENTS):
            ctx.check.equal(f"Rerank's document of index {index}", DOCUMENTS[index], document)
    alone = {}
    for index, text in enumerate(ITEMS):
        own = await ranker.rerank([text], f"Rerank of {text!r} alone")
        alone[index] = (
            float(own[0].get("score", math.nan)) if own and _number(own[0].get("score")) else math.nan
        )
    ctx.check.that(all(abs(score_of.get(i, math.nan) - s) <= TOLERANCE for i, s in alone.items()),
                   "each document's score", f"the one it gets in a Rerank of its own (within {TOLERANCE})",
                   {"together": score_of, "alone": alone})  # fmt: skip
    for top_n in (2, len(DOCUMENTS) + 3):
        cut = await ranker.rerank(DOCUMENTS, f"Rerank with top_n={top_n}", top_n=top_n)
        ctx.check.equal(
            f"the indexes Rerank returns with top_n={top_n}", indexes[:top_n], [r.get("index") for r in cut]
        )
