"""Stream validators: how outputs finish (FINISH-1..6)."""

from __future__ import annotations

from conformance.stream.record import End, StreamRecord
from conformance.validators.base import Facts, terminal_seq, validator
from conformance.vocabulary import Mismatch, mismatch
from lmrpc.v1 import FinishReason


@validator("FINISH-1")
def finish_1(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    out = []
    outputs = record.outputs()
    for view in outputs.values():
        if len(view.finishes) > 1:
            out.append(
                mismatch(
                    f"output {view.index}: OutputFinished messages",
                    "exactly 1",
                    f"{len(view.finishes)} (at messages {[seq for seq, _ in view.finishes]})",
                )
            )
        if view.events_after_finish:
            out.append(
                mismatch(f"output {view.index}: events after its OutputFinished", 0, view.events_after_finish)
            )
    if record.ended_ok and record.error is None:
        unfinished = [i for i in range(record.n) if i not in outputs or not outputs[i].finishes]
        if unfinished:
            out.append(mismatch("outputs unfinished when the stream ended OK", "none", unfinished))
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
                mismatch(
                    f"output {view.index}: token ids delivered before its OutputFinished",
                    finish.completion_tokens,
                    f"{view.ids_before_finish} (the last tokens were lost)",
                )
            )
    return out


@validator("FINISH-3")
def finish_3(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if record.end is End.HUNG:
        return [mismatch("the stream's end", "a terminal message, then status OK", f"hung: {record.detail}")]
    if not record.ended_ok or not record.events:
        return []
    terminal = terminal_seq(record)
    last = record.events[-1]
    if terminal is None:
        return [mismatch("terminal message", "the last output's OutputFinished or a RequestError", last.kind)]
    if terminal != last.seq:
        kinds = [e.kind for e in record.events[terminal + 1 :]]
        return [mismatch("messages after the terminal message", "none", f"{len(kinds)}: {kinds[:6]}")]
    return []


@validator("FINISH-4")
def finish_4(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    return [
        mismatch(f"message {e.seq}: OutputFinished.reason", "not FINISH_REASON_UNSPECIFIED", "UNSPECIFIED")
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
                mismatch(
                    what, "set if and only if reason is STOP", f"reason={finish.reason.name}, stop={stop}"
                )
            )
            continue
        if stop is None:
            continue
        if stop.eos_token_id is not None:
            if stop.eos_token_id not in facts.info.eos_ids:
                out.append(
                    mismatch(what + ".eos_token_id", f"one of {facts.info.eos_ids}", stop.eos_token_id)
                )
            if last is not None and last != stop.eos_token_id:
                out.append(
                    mismatch(what + ".eos_token_id", f"the output's last token {last}", stop.eos_token_id)
                )
            if stop.eos_token_id in eff.stop_token_ids:
                out.append(
                    mismatch(
                        what,
                        f"stop_token_id={stop.eos_token_id} (a requested stop token wins)",
                        f"eos_token_id={stop.eos_token_id}",
                    )
                )
        elif stop.stop_token_id is not None:
            if stop.stop_token_id not in eff.stop_token_ids:
                out.append(
                    mismatch(
                        what + ".stop_token_id", f"one of {list(eff.stop_token_ids)}", stop.stop_token_id
                    )
                )
            if last is not None and last != stop.stop_token_id:
                out.append(
                    mismatch(what + ".stop_token_id", f"the output's last token {last}", stop.stop_token_id)
                )
        elif stop.stop_string is not None and stop.stop_string not in eff.stop_strings:
            out.append(mismatch(what + ".stop_string", f"one of {list(eff.stop_strings)}", stop.stop_string))
        elif stop.eos_token_id is None and stop.stop_token_id is None and stop.stop_string is None:
            out.append(mismatch(what, "one member of StopMatch.kind set", "none"))
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
                mismatch(
                    f"output {view.index}: completion_tokens of a LENGTH finish",
                    f"max_tokens={eff.max_tokens} (or a full window)",
                    finish.completion_tokens,
                )
            )
        if (
            eff.ignore_eos
            and not eff.has_stop_conditions
            and not (facts.aborted and finish.reason == FinishReason.ABORTED)
            and eff.max_tokens <= room
            and (finish.reason != FinishReason.LENGTH or finish.completion_tokens != eff.max_tokens)
        ):
            out.append(
                mismatch(
                    f"output {view.index} with ignore_eos and no stop conditions",
                    f"LENGTH after {eff.max_tokens} tokens",
                    f"{finish.reason.name} after {finish.completion_tokens}",
                )
            )
    return out


@validator("FINISH-7")
def finish_7(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if facts.aborted:
        return []
    return [
        mismatch(
            f"output {view.index}: OutputFinished.reason of a request nobody aborted",
            "STOP or LENGTH (ABORTED needs an Abort or a drain)",
            f"ABORTED after {view.finish.completion_tokens} tokens",
        )
        for view in record.outputs().values()
        if view.finish is not None and view.finish.reason == FinishReason.ABORTED
    ]
