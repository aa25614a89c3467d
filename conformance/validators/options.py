"""Stream validators: clauses about response options (logprobs, final_only, return_*, seed)."""

from __future__ import annotations

import math

from conformance.harness.outcome import Mismatch, mismatch
from conformance.stream.record import StreamRecord
from conformance.validators.base import Facts, validator
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
        if c.token_id == lp.token_id and not math.isclose(c.logprob, lp.logprob, rel_tol=1e-3, abs_tol=1e-3):
            out.append(mismatch(f"{where}: logprob of the sampled token in top", lp.logprob, c.logprob))
    if lp.top:
        is_top = lp.top[0].token_id == lp.token_id or math.isclose(
            lp.logprob, lp.top[0].logprob, abs_tol=1e-6
        )
        if (lp.rank == 1) != is_top:
            out.append(
                mismatch(
                    f"{where}.rank",
                    "1 exactly when the token is the top candidate",
                    f"rank={lp.rank}, top[0]={lp.top[0].token_id}, token={lp.token_id}",
                )
            )
    return out


@validator("STREAM-7")
def stream_7(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    eff = facts.eff(record)
    out: list[Mismatch] = []
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
        if finish is None or finish.reason == FinishReason.ABORTED:
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
