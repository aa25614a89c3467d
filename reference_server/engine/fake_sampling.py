"""Sampling rules over a short candidate list, in plain Python (the fake engine's sampler).

The rules are those of the real sampler: penalties on raw logits, then temperature, then
top-k, top-p and min-p truncation, then a draw from the request's own generator.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

from reference_server.ipc import SamplingConfig


class Candidate(NamedTuple):
    token_id: int
    logit: float


def apply_penalties(
    candidates: list[Candidate], prompt_ids: list[int], output_ids: list[int], sampling: SamplingConfig
) -> list[Candidate]:
    if not (sampling.frequency_penalty or sampling.presence_penalty or sampling.repetition_penalty != 1.0):
        return candidates
    counts: dict[int, int] = {}
    for token_id in output_ids:
        counts[token_id] = counts.get(token_id, 0) + 1
    seen = set(prompt_ids) | counts.keys()
    result = []
    for c in candidates:
        logit = c.logit
        if c.token_id in seen and sampling.repetition_penalty != 1.0:
            rp = sampling.repetition_penalty
            logit = logit / rp if logit > 0 else logit * rp
        count = counts.get(c.token_id, 0)
        logit -= sampling.frequency_penalty * count + sampling.presence_penalty * (count > 0)
        result.append(Candidate(c.token_id, logit))
    return result


def sample_candidates(candidates: list[Candidate], sampling: SamplingConfig, rng: random.Random) -> int:
    """Pick a token. Greedy ties break toward the earlier candidate."""
    if sampling.is_greedy:
        return max(candidates, key=lambda c: c.logit).token_id
    ranked = sorted(candidates, key=lambda c: -c.logit)
    if sampling.top_k:
        ranked = ranked[: sampling.top_k]
    scaled = [c.logit / sampling.temperature for c in ranked]
    top = scaled[0]
    weights = [math.exp(s - top) for s in scaled]
    total = sum(weights)
    probs = [w / total for w in weights]
    keep = len(probs)
    if sampling.top_p < 1.0:
        mass = 0.0
        for i, p in enumerate(probs):
            mass += p
            if mass >= sampling.top_p:
                keep = i + 1
                break
    if sampling.min_p > 0.0:
        threshold = sampling.min_p * probs[0]
        keep = min(keep, sum(1 for p in probs if p >= threshold))
    kept, kept_probs = ranked[: max(keep, 1)], probs[: max(keep, 1)]
    draw = rng.random() * sum(kept_probs)
    for c, p in zip(kept, kept_probs, strict=True):
        draw -= p
        if draw < 0:
            return c.token_id
    return kept[-1].token_id
