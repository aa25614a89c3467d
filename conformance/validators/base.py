"""The validator registry: ``@validator("STREAM-2")`` binds a pure function (StreamRecord, Facts) ->
mismatches to the clause it judges.

Each validator judges one clause only and returns its mismatches, so one server bug fails the
clause it breaks and not every case that happened to see it. ``Facts`` carries what the validators
need from outside the stream (Tokenize and Detokenize answers, concurrent request ids).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from conformance.spec.effective import Effective, effective
from conformance.stream.record import OutputView, StreamRecord
from conformance.vocabulary import Mismatch, TargetInfo


@dataclass(slots=True)
class Facts:
    info: TargetInfo
    prompt_ids: list[int] | None = None  # Tokenize(input), or the token_ids input itself
    detok: dict[int, str] = field(default_factory=dict)  # output index -> Detokenize(its ids)
    detok_but_last: dict[int, str] = field(default_factory=dict)  # ... without its last token
    detok_before_min: dict[int, str] = field(default_factory=dict)  # ... of its first min_tokens - 1 ids
    others: frozenset[str] = frozenset()  # ids of requests that ran at the same time
    aborted: bool = False  # the harness aborted or cancelled the request: an ABORTED finish has a cause

    def eff(self, record: StreamRecord) -> Effective:
        prompt = record.prompt_info
        return effective(record.request, self.info, prompt.prompt_tokens if prompt else None)


Validator = Callable[[StreamRecord, Facts], list[Mismatch]]
VALIDATORS: dict[str, Validator] = {}


def validator(clause: str) -> Callable[[Validator], Validator]:
    def register(fn: Validator) -> Validator:
        VALIDATORS[clause] = fn
        return fn

    return register


def first_stop_match(text: str, stops: tuple[str, ...], after: int = 0) -> tuple[int, int] | None:
    """(start, end) of the stop-string occurrence that ``text`` completes first (STOP-2): the one that
    ends first, of two ending at the same character the longer; only occurrences ending after
    character ``after`` count (the text before the ``min_tokens``-th token, STOP-5)."""
    best: tuple[int, int] | None = None
    for stop in stops:
        start = text.find(stop)
        while start >= 0 and start + len(stop) <= after:
            start = text.find(stop, start + 1)
        if start >= 0 and (best is None or (start + len(stop), start) < (best[1], best[0])):
            best = (start, start + len(stop))
    return best


def expected_text(record: StreamRecord, view: OutputView, facts: Facts) -> str | None:
    """The exact text an output's deltas must add up to (STREAM-4, STOP-1, STOP-6, STOP-7), or None
    when the facts cannot say (no Detokenize, no finish, text or ids not returned)."""
    eff = facts.eff(record)
    full = facts.detok.get(view.index)
    finish = view.finish
    if full is None or finish is None or not (eff.return_text and eff.return_token_ids):
        return None
    stop = finish.stop
    if stop is not None and stop.stop_string is not None:
        after = len(facts.detok_before_min.get(view.index, ""))
        match = first_stop_match(full, eff.stop_strings, after)
        if match is None:
            return None
        return full[: match[1]] if eff.include_stop else full[: match[0]]
    by_token = stop is not None and (stop.eos_token_id is not None or stop.stop_token_id is not None)
    if by_token and not eff.include_stop:
        return facts.detok_but_last.get(view.index)
    return full


def terminal_seq(record: StreamRecord) -> int | None:
    """The seq of the message that ends the stream by the contract: the RequestError or the last needed finish."""
    finished: set[int] = set()
    n = record.n
    for e in record.events:
        if e.kind == "error":
            return e.seq
        if e.kind == "finished" and e.finished is not None:
            finished.add(e.finished.output_index or 0)
            if finished >= set(range(n)):
                return e.seq
    return None
