"""Stream validators: token counts and n>1 (USAGE-1..5, N-1, N-2)."""

from __future__ import annotations

from conformance.stream.record import StreamRecord
from conformance.validators.base import Facts, validator
from conformance.vocabulary import Mismatch, mismatch
from lmrpc.v1 import FinishReason


@validator("USAGE-1")
def usage_1(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if not record.events:
        return []
    out = []
    early = [e.seq for e in record.events[:-1] if e.message.usage is not None]
    if early:
        out.append(mismatch("messages carrying Usage before the terminal one", "none", early[:6]))
    if record.ended_ok and record.events[-1].message.usage is None:
        out.append(mismatch("Usage on the terminal message", "set", "absent"))
    return out


@validator("USAGE-2")
def usage_2(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    usage, prompt = record.usage, record.prompt_info
    if usage is None or prompt is None:
        return []
    out = []
    if usage.prompt_tokens != prompt.prompt_tokens:
        out.append(
            mismatch(
                "Usage.prompt_tokens (== PromptInfo.prompt_tokens)", prompt.prompt_tokens, usage.prompt_tokens
            )
        )
    if facts.prompt_ids is not None and usage.prompt_tokens != len(facts.prompt_ids):
        out.append(
            mismatch(
                "Usage.prompt_tokens (== number of ids Tokenize returns)",
                len(facts.prompt_ids),
                usage.prompt_tokens,
            )
        )
    return out


@validator("USAGE-3")
def usage_3(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    usage = record.usage
    if usage is None:
        return []
    total = sum(v.finish.completion_tokens for v in record.outputs().values() if v.finish is not None)
    if usage.completion_tokens != total:
        return [
            mismatch(
                "Usage.completion_tokens (sum of OutputFinished.completion_tokens)",
                total,
                usage.completion_tokens,
            )
        ]
    return []


@validator("USAGE-4")
def usage_4(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    usage = record.usage
    if usage is not None and usage.cached_prompt_tokens > usage.prompt_tokens:
        return [
            mismatch(
                "Usage.cached_prompt_tokens",
                f"<= prompt_tokens={usage.prompt_tokens}",
                usage.cached_prompt_tokens,
            )
        ]
    return []


@validator("USAGE-5")
def usage_5(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    eff = facts.eff(record)
    prompt = record.prompt_info
    out = []
    for view in record.outputs().values():
        finish = view.finish
        if finish is None:
            continue
        got = finish.completion_tokens
        carried = sum(len(d.token_ids) for d in view.deltas)
        what = f"output {view.index}: OutputFinished.completion_tokens"
        if eff.return_token_ids and got != carried:
            out.append(mismatch(what + " (== ids its deltas carried)", carried, got))
        if eff.max_tokens is not None and got > eff.max_tokens:
            out.append(mismatch(what, f"<= max_tokens={eff.max_tokens}", got))
        window_full = prompt is not None and prompt.prompt_tokens + got >= facts.info.max_context
        aborted = facts.aborted and finish.reason == FinishReason.ABORTED
        if got < eff.min_tokens and not aborted and not window_full:
            out.append(mismatch(what, f">= min_tokens={eff.min_tokens}", got))
    return out


@validator("N-1")
def n_1(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if not record.ended_ok or record.error is not None:
        return []
    outputs = record.outputs()
    want = set(range(record.n))
    out = []
    if set(outputs) != want:
        out.append(mismatch("output indices in the stream", sorted(want), sorted(outputs)))
    no_deltas = [
        i
        for i, v in outputs.items()
        if not v.deltas
        and v.finish is not None
        and not (facts.aborted and v.finish.reason == FinishReason.ABORTED)
    ]
    if no_deltas:
        out.append(mismatch("outputs with at least one TokenDelta", sorted(want), f"none for {no_deltas}"))
    return out


@validator("N-2")
def n_2(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    usage, prompt = record.usage, record.prompt_info
    if record.n < 2 or usage is None or prompt is None:
        return []
    out = []
    if usage.prompt_tokens != prompt.prompt_tokens:
        out.append(
            mismatch(
                f"Usage.prompt_tokens of an n={record.n} request (prompt counted once)",
                prompt.prompt_tokens,
                usage.prompt_tokens,
            )
        )
    total = sum(v.finish.completion_tokens for v in record.outputs().values() if v.finish is not None)
    if usage.completion_tokens != total:
        out.append(
            mismatch(
                f"Usage.completion_tokens of an n={record.n} request (summed)", total, usage.completion_tokens
            )
        )
    return out
