"""Stream validators: structure, ids and text (STREAM-1..6, REQ-2, ERR-2)."""

from __future__ import annotations

from conformance.stream.record import End, StreamRecord
from conformance.validators.base import Facts, expected_text, validator
from conformance.vocabulary import Mismatch, mismatch


@validator("STREAM-1")
def stream_1(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if not record.events:
        return (
            [mismatch("first message", "PromptInfo", f"no messages, then {record.end.value}")]
            if record.ended_ok
            else []
        )
    out = []
    if record.events[0].kind != "prompt_info":
        out.append(mismatch("first message", "prompt_info", record.events[0].kind))
    extra = [e.seq for e in record.events[1:] if e.kind == "prompt_info"]
    if extra:
        out.append(
            mismatch("PromptInfo messages", "exactly 1", f"{1 + len(extra)} (also at messages {extra})")
        )
    prompt = record.prompt_info
    if prompt is not None and prompt.num_outputs != record.n:
        out.append(mismatch("PromptInfo.num_outputs", record.n, prompt.num_outputs))
    return out


@validator("STREAM-2")
def stream_2(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    if not facts.eff(record).return_token_ids:
        return []
    out = []
    for view in record.outputs().values():
        finish = view.finish
        delivered = sum(len(d.token_ids) for d in view.deltas)
        if finish is not None and delivered > finish.completion_tokens:
            out.append(
                mismatch(
                    f"output {view.index}: token ids delivered in deltas (== completion_tokens)",
                    finish.completion_tokens,
                    f"{delivered} (repeated or cumulative ids)",
                )
            )
    return out


@validator("STREAM-3")
def stream_3(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    out = []
    for e in record.events:
        body = e.delta if e.delta is not None else e.finished
        if body is None:
            continue
        if body.output_index is None:
            out.append(
                mismatch(f"message {e.seq} ({e.kind}).output_index", "present (also for output 0)", "absent")
            )
        elif not 0 <= body.output_index < record.n:
            out.append(
                mismatch(f"message {e.seq} ({e.kind}).output_index", f"in [0, {record.n})", body.output_index)
            )
    return out[:5]


@validator("STREAM-4")
def stream_4(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    out = []
    for view in record.outputs().values():
        want = expected_text(record, view, facts)
        if want is None or not view.text_is_utf8:
            continue
        if view.text != want:
            what = f"output {view.index}: concatenated text deltas vs Detokenize(its ids), cut at its stop"
            out.append(mismatch(what, want, view.text))
    return out


@validator("STREAM-5")
def stream_5(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    out = []
    offsets: dict[int, int] = {}  # output index -> characters its text deltas carried so far
    expected = {v.index: expected_text(record, v, facts) for v in record.outputs().values()}
    for e in record.events:
        delta = e.delta
        if delta is None:
            continue
        index = delta.output_index or 0
        start = offsets.get(index, 0)
        offsets[index] = start + len(delta.text)
        if not e.text_is_utf8:
            out.append(
                mismatch(
                    f"message {e.seq}: text bytes",
                    "well-formed UTF-8 ending on a character boundary",
                    e.text_bytes,
                )
            )
            continue
        want = expected.get(index)
        for k, char in enumerate(delta.text):
            if char != "\ufffd":
                continue
            position = start + k
            if want is not None and position < len(want) and want[position] == "\ufffd":
                continue
            if want is None and "\ufffd" in facts.detok.get(index, "\ufffd"):
                continue  # nothing to compare with
            out.append(
                mismatch(
                    f"message {e.seq}: U+FFFD at character {position} of output {index}",
                    "only where Detokenize of the output has one",
                    delta.text,
                )
            )
            break
    return out[:5]


@validator("STREAM-6")
def stream_6(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    own = record.request_id
    if not own:
        return []
    foreign = {e.message.request_id for e in record.events} - {own, ""}
    if not foreign:
        return []
    from_others = foreign & facts.others
    return [
        mismatch(
            "request ids on this stream",
            repr(own),
            f"also {sorted(foreign)}" + (" (ids of concurrent requests)" if from_others else ""),
        )
    ]


@validator("REQ-2")
def req_2(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    ids = [e.message.request_id for e in record.events]
    if not ids:
        return []
    own = record.request_id
    if own:
        wrong = [(i, got) for i, got in enumerate(ids) if got != own]
        return [mismatch(f"message {i}.request_id", own, got) for i, got in wrong[:3]]
    if not ids[0] or len(set(ids)) != 1:
        return [mismatch("server-assigned request_id", "one non-empty id on every message", sorted(set(ids)))]
    return []


@validator("ERR-2")
def err_2(record: StreamRecord, facts: Facts) -> list[Mismatch]:
    out = []
    if record.events and record.end in (End.STATUS, End.BROKEN):
        got = f"{record.status.name if record.status else record.detail} after {len(record.events)} messages"
        out.append(
            mismatch("how an accepted stream ends", "status OK (a failure is a terminal RequestError)", got)
        )
    errors = [e for e in record.events if e.kind == "error"]
    if len(errors) > 1 or (errors and errors[0] is not record.events[-1]):
        out.append(
            mismatch(
                "RequestError",
                "exactly one, as the terminal message",
                f"{len(errors)}, at {[e.seq for e in errors]}",
            )
        )
    for e in errors:
        if e.message.error is not None and e.message.error.code == 0:
            out.append(mismatch(f"message {e.seq}: RequestError.code", "a non-zero gRPC status", 0))
    return out
