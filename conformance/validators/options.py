"""Stream validators: clauses about response options (logprobs, final_only, return_*, seed)."""

from __future__ import annotations

import math

from conformance.stream.record import StreamRecord
from conformance.validators.base import Facts, validator
from conformance.vocabulary import Mismatch, mismatch
from lmrpc.v1 import FinishReason, TokenLogprob


def _logprob_problems(where: str, lp: TokenLogprob, token: int | None, top_n: int) -> list[Mismatch]:
    out = []
    if token is not None and lp.token_id != token:
        out.append(mismatch(f"{where}.token_id", token, lp.token_id))
    if not lp.logprob <= 0 or math.isnan(lp.logprob):
        out.append(mismatch(f"{where}.logprob", "<= 0", lp.logprob))
    if lp.rank < 1:
        out.append(mismatch(f"{where}.rank", ">= 1", lp.rank))
    if len(lp.top) != top_n:
        out.append(mismatch(f"{where}.top entries", top_n, len(lp.top)))
    values = [c.logprob for c in lp.top]
    if values != sorted(values, reverse=True):
        out.append(mismatch(f"{where}.top", "sorted by decreasing logprob", values))
    for c in lp.top:
        if c.token_id == lp.token_id and not _same(c.logprob, lp.logprob):
            out.append(mismatch(f"{where}: logprob of the sampled token in top", lp.logprob, c.logprob))
    out.extend(_rank_problems(where, lp))
    return out


def _rank_problems(where: str, lp: TokenLogprob) -> list[Mismatch]:
    """STREAM-7's rank rule, exact up to ties: the candidates listed before the token's rank have a
    logprob at least its own, those from its rank on at most; ``top[rank - 1]`` has its logprob; a
    token missing from ``top`` despite a rank inside it is allowed only when ties fill ``top``."""
    if lp.rank < 1 or not lp.top:
        return []
    before, rest = lp.top[: lp.rank - 1], lp.top[lp.rank - 1 :]
    listed = any(c.token_id == lp.token_id for c in lp.top)
    problems = []
    if any(c.logprob < lp.logprob and not _same(c.logprob, lp.logprob) for c in before):
        problems.append("a candidate ranked before the token has a smaller logprob")
    if any(c.logprob > lp.logprob and not _same(c.logprob, lp.logprob) for c in rest):
        problems.append("a candidate ranked at or after the token has a greater logprob")
    if rest and not _same(rest[0].logprob, lp.logprob):
        problems.append(f"top[rank - 1] has logprob {rest[0].logprob}, not the token's")
    if rest and not listed and not all(_same(c.logprob, lp.logprob) for c in rest):
        problems.append("the token is missing from top although its rank is inside it")
    if not problems:
        return []
    return [
        mismatch(
            f"{where}.rank (token {lp.token_id}, logprob {lp.logprob}, rank {lp.rank})",
            "its position in top, ties in any order",
            f"{'; '.join(problems)}: top {[(c.token_id, round(c.logprob, 4)) for c in lp.top]}",
        )
    ]


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


@validator("STREAM-7")
def stream_7(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    eff = facts.eff(record)
    out: list[Mismatch] = []
    if eff.return_logprobs:
        for view in record.outputs().values():
            if view.finish is not None and len(view.logprobs) != view.finish.completion_tokens:
                out.append(
                    mismatch(
                        f"output {view.index}: TokenLogprob entries (one per token)",
                        view.finish.completion_tokens,
                        len(view.logprobs),
                    )
                )
    for e in record.events:
        delta = e.delta
        if delta is None:
            continue
        if not eff.return_logprobs:
            if delta.logprobs:
                out.append(
                    mismatch(
                        f"message {e.seq}: logprobs without return_logprobs", "none", len(delta.logprobs)
                    )
                )
            continue
        ids = list(delta.token_ids) if eff.return_token_ids else None
        if ids is not None and len(delta.logprobs) != len(ids):
            out.append(
                mismatch(
                    f"message {e.seq}: TokenLogprob entries (one per token)", len(ids), len(delta.logprobs)
                )
            )
            continue
        for i, lp in enumerate(delta.logprobs):
            out.extend(
                _logprob_problems(
                    f"message {e.seq} logprobs[{i}]", lp, ids[i] if ids else None, eff.top_logprobs
                )
            )
    return out[:6]


@validator("STREAM-8")
def stream_8(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if not facts.eff(record).final_only or not record.ended_ok:
        return []
    out = []
    for view in record.outputs().values():
        finish = view.finish
        if finish is None or (facts.aborted and finish.reason == FinishReason.ABORTED):
            continue
        if len(view.deltas) != 1:
            out.append(
                mismatch(
                    f"output {view.index}: TokenDeltas with final_only",
                    "exactly 1 holding all tokens",
                    len(view.deltas),
                )
            )
    return out


@validator("STREAM-10")
def stream_10(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    eff = facts.eff(record)
    out = []
    for e in record.events:
        delta = e.delta
        if delta is None:
            continue
        if not eff.return_text and delta.text:
            out.append(mismatch(f"message {e.seq}: text with return_text=false", "empty", delta.text))
        if not eff.return_token_ids and delta.token_ids:
            out.append(
                mismatch(
                    f"message {e.seq}: token_ids with return_token_ids=false", "empty", list(delta.token_ids)
                )
            )
    prompt = record.prompt_info
    if (
        eff.return_prompt_token_ids
        and prompt is not None
        and len(prompt.prompt_token_ids) != prompt.prompt_tokens
    ):
        out.append(
            mismatch(
                "PromptInfo.prompt_token_ids (the prompt prompt_tokens counts)",
                f"{prompt.prompt_tokens} ids",
                f"{len(prompt.prompt_token_ids)} ids",
            )
        )
    return out[:5]


@validator("SAMPLE-4")
def sample_4(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    seed, prompt = facts.eff(record).seed, record.prompt_info
    if seed is None or prompt is None or prompt.seed == seed:
        return []
    return [mismatch("PromptInfo.seed (the seed in effect)", seed, prompt.seed)]


@validator("TOK-1")
def tok_1(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    prompt = record.prompt_info
    if prompt is None or facts.prompt_ids is None or not facts.eff(record).return_prompt_token_ids:
        return []
    if list(prompt.prompt_token_ids) != facts.prompt_ids:
        return [
            mismatch(
                "PromptInfo.prompt_token_ids (== Tokenize of the same input)",
                facts.prompt_ids,
                list(prompt.prompt_token_ids),
            )
        ]
    return []
