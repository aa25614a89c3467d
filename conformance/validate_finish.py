"""Stream validators, part 2: finishing, usage, n>1 and the per-option clauses."""

from __future__ import annotations

from conformance.results import Mismatch
from conformance.streams import End, StreamRecord
from conformance.validate_core import Facts, M, terminal_seq, validator
from lmrpc.v1 import FinishReason


@validator("FINISH-1")
def finish_1(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    out = []
    outputs = record.outputs()
    for view in outputs.values():
        if len(view.finishes) > 1:
            out.append(
                M(
                    f"output {view.index}: OutputFinished messages",
                    "exactly 1",
                    f"{len(view.finishes)} (at messages {[seq for seq, _ in view.finishes]})",
                )
            )
        if view.events_after_finish:
            out.append(
                M(f"output {view.index}: events after its OutputFinished", 0, view.events_after_finish)
            )
    if record.ended_ok and record.error is None:
        unfinished = [i for i in range(record.n) if i not in outputs or not outputs[i].finishes]
        if unfinished:
            out.append(M("outputs unfinished when the stream ended OK", "none", unfinished))
    return out


@validator("FINISH-2")
def finish_2(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if not facts.eff(record).return_token_ids:
        return []
    out = []
    for view in record.outputs().values():
        finish = view.finish
        if (
            finish is not None
            and view.ids_before_finish is not None
            and view.ids_before_finish < finish.completion_tokens
        ):
            out.append(
                M(
                    f"output {view.index}: token ids delivered before its OutputFinished",
                    finish.completion_tokens,
                    f"{view.ids_before_finish} (the last tokens were lost)",
                )
            )
    return out


@validator("FINISH-3")
def finish_3(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if record.end is End.HUNG:
        return [M("the stream's end", "a terminal message, then status OK", f"hung: {record.detail}")]
    if not record.ended_ok or not record.events:
        return []
    terminal = terminal_seq(record)
    last = record.events[-1]
    if terminal is None:
        return [M("terminal message", "the last output's OutputFinished or a RequestError", last.kind)]
    if terminal != last.seq:
        kinds = [e.kind for e in record.events[terminal + 1 :]]
        return [M("messages after the terminal message", "none", f"{len(kinds)}: {kinds[:6]}")]
    return []


@validator("FINISH-4")
def finish_4(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    return [
        M(f"message {e.seq}: OutputFinished.reason", "not FINISH_REASON_UNSPECIFIED", "UNSPECIFIED")
        for e in record.events
        if e.finished is not None and e.finished.reason == FinishReason.UNSPECIFIED
    ][:3]


@validator("FINISH-5")
def finish_5(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    eff = facts.eff(record)
    out = []
    for view in record.outputs().values():
        finish = view.finish
        if finish is None:
            continue
        stop = finish.stop
        last = view.token_ids[-1] if view.token_ids and eff.return_token_ids else None
        what = f"output {view.index}: OutputFinished.stop"
        if (finish.reason == FinishReason.STOP) != (stop is not None):
            out.append(
                M(what, "set if and only if reason is STOP", f"reason={finish.reason.name}, stop={stop}")
            )
            continue
        if stop is None:
            continue
        if stop.eos_token_id is not None:
            if stop.eos_token_id not in facts.info.eos_ids:
                out.append(M(what + ".eos_token_id", f"one of {facts.info.eos_ids}", stop.eos_token_id))
            if last is not None and last != stop.eos_token_id:
                out.append(M(what + ".eos_token_id", f"the output's last token {last}", stop.eos_token_id))
            if stop.eos_token_id in eff.stop_token_ids:
                out.append(
                    M(
                        what,
                        f"stop_token_id={stop.eos_token_id} (a requested stop token wins)",
                        f"eos_token_id={stop.eos_token_id}",
                    )
                )
        elif stop.stop_token_id is not None:
            if stop.stop_token_id not in eff.stop_token_ids:
                out.append(
                    M(what + ".stop_token_id", f"one of {list(eff.stop_token_ids)}", stop.stop_token_id)
                )
            if last is not None and last != stop.stop_token_id:
                out.append(M(what + ".stop_token_id", f"the output's last token {last}", stop.stop_token_id))
        elif stop.stop_string is not None and stop.stop_string not in eff.stop_strings:
            out.append(M(what + ".stop_string", f"one of {list(eff.stop_strings)}", stop.stop_string))
        elif stop.eos_token_id is None and stop.stop_token_id is None and stop.stop_string is None:
            out.append(M(what, "one member of StopMatch.kind set", "none"))
    return out


@validator("FINISH-6")
def finish_6(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    eff = facts.eff(record)
    prompt = record.prompt_info
    if eff.max_tokens is None or prompt is None:
        return []
    out = []
    room = facts.info.max_context - prompt.prompt_tokens
    for view in record.outputs().values():
        finish = view.finish
        if finish is None:
            continue
        full = finish.completion_tokens >= eff.max_tokens or finish.completion_tokens >= room
        if finish.reason == FinishReason.LENGTH and not full:
            out.append(
                M(
                    f"output {view.index}: completion_tokens of a LENGTH finish",
                    f"max_tokens={eff.max_tokens} (or a full window)",
                    finish.completion_tokens,
                )
            )
        if (
            eff.ignore_eos
            and not eff.has_stop_conditions
            and finish.reason != FinishReason.ABORTED
            and eff.max_tokens <= room
            and (finish.reason != FinishReason.LENGTH or finish.completion_tokens != eff.max_tokens)
        ):
            out.append(
                M(
                    f"output {view.index} with ignore_eos and no stop conditions",
                    f"LENGTH after {eff.max_tokens} tokens",
                    f"{finish.reason.name} after {finish.completion_tokens}",
                )
            )
    return out


@validator("USAGE-1")
def usage_1(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if not record.events:
        return []
    out = []
    early = [e.seq for e in record.events[:-1] if e.message.usage is not None]
    if early:
        out.append(M("messages carrying Usage before the terminal one", "none", early[:6]))
    if record.ended_ok and record.events[-1].message.usage is None:
        out.append(M("Usage on the terminal message", "set", "absent"))
    return out


@validator("USAGE-2")
def usage_2(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    usage, prompt = record.usage, record.prompt_info
    if usage is None or prompt is None:
        return []
    out = []
    if usage.prompt_tokens != prompt.prompt_tokens:
        out.append(
            M("Usage.prompt_tokens (== PromptInfo.prompt_tokens)", prompt.prompt_tokens, usage.prompt_tokens)
        )
    if facts.prompt_ids is not None and usage.prompt_tokens != len(facts.prompt_ids):
        out.append(
            M(
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
            M(
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
            M(
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
            out.append(M(what + " (== ids its deltas carried)", carried, got))
        if eff.max_tokens is not None and got > eff.max_tokens:
            out.append(M(what, f"<= max_tokens={eff.max_tokens}", got))
        window_full = prompt is not None and prompt.prompt_tokens + got >= facts.info.max_context
        if got < eff.min_tokens and finish.reason != FinishReason.ABORTED and not window_full:
            out.append(M(what, f">= min_tokens={eff.min_tokens}", got))
    return out


@validator("N-1")
def n_1(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if not record.ended_ok or record.error is not None:
        return []
    outputs = record.outputs()
    want = set(range(record.n))
    out = []
    if set(outputs) != want:
        out.append(M("output indices in the stream", sorted(want), sorted(outputs)))
    no_deltas = [
        i
        for i, v in outputs.items()
        if not v.deltas and v.finish is not None and v.finish.reason != FinishReason.ABORTED
    ]
    if no_deltas:
        out.append(M("outputs with at least one TokenDelta", sorted(want), f"none for {no_deltas}"))
    return out


@validator("N-2")
def n_2(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    usage, prompt = record.usage, record.prompt_info
    if record.n < 2 or usage is None or prompt is None:
        return []
    out = []
    if usage.prompt_tokens != prompt.prompt_tokens:
        out.append(
            M(
                f"Usage.prompt_tokens of an n={record.n} request (prompt counted once)",
                prompt.prompt_tokens,
                usage.prompt_tokens,
            )
        )
    total = sum(v.finish.completion_tokens for v in record.outputs().values() if v.finish is not None)
    if usage.completion_tokens != total:
        out.append(
            M(f"Usage.completion_tokens of an n={record.n} request (summed)", total, usage.completion_tokens)
        )
    return out
