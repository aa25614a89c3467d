"""OpenAIEmbed, Score and Rerank: OpenAI-style JSON answered by the embedding model.

- OpenAIEmbed takes what ``POST /v1/embeddings`` takes (``input`` a string or a list of
  strings, ``encoding_format`` float or base64) and answers the OpenAI embedding list;
- Score takes SGLang's ``/v1/score`` body. SGLang scores an item by the generation model's
  next-token probabilities of ``label_token_ids`` after query and item; this server scores it by
  the cosine similarity of the embedding model's vectors of query and item, one score per item
  (``scores[i] == [similarity]``). A body with ``label_token_ids`` or ``apply_softmax`` asks for
  the other meaning: UNIMPLEMENTED, naming it;
- Rerank takes SGLang's ``/v1/rerank`` body and answers its list of ``{score, document, index}``,
  best first, scored the same way.

Token-id inputs are UNIMPLEMENTED: they would be ids of the embedding model's tokenizer, which
this server does not hand out.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any

from reference_server.frontend.dialects.sglang_runtime.openai_body import Body, OpenAIError, unimplemented
from reference_server.frontend.ranking import best_first, scores_against

EMBED_PARAMETERS = ("input", "model", "encoding_format", "dimensions", "user")
SCORE_PARAMETERS = ("query", "items", "label_token_ids", "apply_softmax", "item_first", "model")
RERANK_PARAMETERS = ("query", "documents", "top_n", "return_documents", "instruct", "model")


@dataclass(frozen=True, slots=True)
class Embedded:
    """Vectors of some texts, in order, and the embedding model's tokens they took in all."""

    vectors: list[list[float]]
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    texts: list[str]
    base64: bool
    dimensions: int | None


def embeddings_request(body: Body) -> EmbeddingsRequest:
    texts = _texts(body.values.get("input"), "input")
    encoding = body.string("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise OpenAIError(f"encoding_format={encoding!r} must be 'float' or 'base64'", "encoding_format")
    return EmbeddingsRequest(texts, encoding == "base64", body.integer("dimensions", low=1))


def embeddings_body(request: EmbeddingsRequest, embedded: Embedded, model: str) -> dict[str, Any]:
    dimensions = len(embedded.vectors[0]) if embedded.vectors else 0
    if request.dimensions is not None and request.dimensions != dimensions:
        raise unimplemented(f"dimensions={request.dimensions}", f"the embedding model gives {dimensions}")
    data = [
        {"object": "embedding", "embedding": _encoded(v) if request.base64 else v, "index": i}
        for i, v in enumerate(embedded.vectors)
    ]
    usage = {"prompt_tokens": embedded.prompt_tokens, "total_tokens": embedded.prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


@dataclass(frozen=True, slots=True)
class Ranking:
    """A query and the texts to score against it."""

    query: str
    texts: list[str]


def score_request(body: Body) -> Ranking:
    if body.values.get("label_token_ids"):
        raise unimplemented(
            "label_token_ids",
            "scores are cosine similarities of the embedding model's vectors, not label-token probabilities",
        )
    if body.boolean("apply_softmax", False):
        raise unimplemented("apply_softmax", "each item has one score (a cosine similarity)")
    body.boolean("item_first", False)  # the similarity is symmetric: the order does not matter
    query = body.values.get("query")
    if not isinstance(query, str) or not query:
        raise _text_or_ids("query", query)
    items = body.values.get("items")
    return Ranking(query, _texts([items] if isinstance(items, str) else items, "items"))


def score_body(ranking: Ranking, embedded: Embedded, model: str) -> dict[str, Any]:
    query, *items = embedded.vectors
    usage = {
        "prompt_tokens": embedded.prompt_tokens,
        "completion_tokens": 0,
        "total_tokens": embedded.prompt_tokens,
    }
    scores = [[score] for score in scores_against(query, items)]
    return {"scores": scores, "model": model, "usage": usage, "object": "scoring"}


@dataclass(frozen=True, slots=True)
class RerankRequest:
    ranking: Ranking
    top_n: int | None
    return_documents: bool


def rerank_request(body: Body) -> RerankRequest:
    if body.string("instruct"):
        raise unimplemented("instruct", "the embedding model takes no instruction")
    query = body.values.get("query")
    if not isinstance(query, str) or not query:
        raise _text_or_ids("query", query)
    ranking = Ranking(query, _texts(body.values.get("documents"), "documents"))
    return RerankRequest(ranking, body.integer("top_n", low=1), body.boolean("return_documents", True))


def rerank_body(request: RerankRequest, embedded: Embedded) -> list[dict[str, Any]]:
    query, *documents = embedded.vectors
    texts = request.ranking.texts
    return [
        {"score": score, "index": i, "meta_info": None}
        | ({"document": texts[i]} if request.return_documents else {})
        for i, score in best_first(scores_against(query, documents), request.top_n)
    ]


def _encoded(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def _texts(value: Any, name: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise OpenAIError(f"{name} must be a non-empty string or list of strings", name)
    if all(_token_ids(v) for v in value):
        raise _text_or_ids(name, value)
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise _text_or_ids(f"{name}[{i}]", text)
        if not text:
            raise OpenAIError(f"{name}[{i}] must not be empty", name)
    return list(value)


def _token_ids(value: Any) -> bool:
    """An id, or a list of them (one tokenized text)."""
    if isinstance(value, list):
        return bool(value) and all(_token_ids(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool)


def _text_or_ids(name: str, value: Any) -> Exception:
    if _token_ids(value):
        return unimplemented(f"{name} as token ids", "send text; the embedding model tokenizes it itself")
    return OpenAIError(f"{name} must be a non-empty string", name.split("[")[0])
