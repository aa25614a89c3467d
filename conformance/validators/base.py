"""The validator registry: ``@validator("STREAM-2")`` binds a pure function (StreamRecord, Facts) ->
mismatches to the clause it judges.

Each validator judges one clause only and returns its mismatches, so one server bug fails the
clause it breaks and not every case that happened to see it. ``Facts`` carries what the validators
need from outside the stream (Tokenize and Detokenize answers, concurrent request ids).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from conformance.harness.outcome import Mismatch
from conformance.harness.target import TargetInfo
from conformance.spec.effective import Effective, effective
from conformance.stream.record import StreamRecord


@dataclass(slots=True)
class Facts:
    info: TargetInfo
    prompt_ids: list[int] | None = None  # Tokenize(input), or the token_ids input itself
    detok: dict[int, str] = field(default_factory=dict)  # output index -> Detokenize(its ids)
    detok_but_last: dict[int, str] = field(default_factory=dict)  # ... without its last token
    others: frozenset[str] = frozenset()  # ids of requests that ran at the same time

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
