"""Relevance of texts to a query: the cosine similarity of the embedding model's vectors. lmrpc's
Score and Rerank (SCORE-1, SCORE-2) and the dialects that score answer with it.

Scores are rounded to float32 before documents are ordered, because the client sees float32
values: an order decided on the unrounded values could put two scores that read as equal in an
order the client cannot explain.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norms if norms else 0.0


def as_float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def scores_against(query: Sequence[float], vectors: Sequence[Sequence[float]]) -> list[float]:
    """Each vector's score against the query, as the client will read it."""
    return [as_float32(cosine(query, v)) for v in vectors]


def best_first(scores: Sequence[float], top_n: int | None = None) -> list[tuple[int, float]]:
    """(index, score) pairs, higher scores first and equal scores by lower index; the best
    ``top_n`` of them when it is given."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return [(i, scores[i]) for i in order[:top_n]]
