"""What a profile is: for one protocol, how each clause of docs/contract.md reads there (a
``Reading``), and the readings several protocols share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conformance.spec.clauses import CLAUSES

if TYPE_CHECKING:
    from conformance.spec.registry import Case


@dataclass(frozen=True, slots=True)
class Reading:
    applies: bool
    text: str = ""  # how the clause reads there (applies), or why it cannot be checked there


AS_WRITTEN = Reading(True)


def reads(text: str) -> Reading:
    return Reading(True, text)


def na(text: str) -> Reading:
    return Reading(False, text)


@dataclass(frozen=True, slots=True)
class Profile:
    protocol: str
    title: str
    clauses: Mapping[str, Reading]  # clause ID -> reading; a clause not listed applies as written
    cases: Mapping[str, Reading] = field(default_factory=dict)  # case ID -> reading, overriding its clause's
    otherwise: Reading = AS_WRITTEN  # the reading of a clause not listed
    # Raised when a reading changes so that a server's verdicts may (CHANGELOG.md): a baseline
    # written against one revision may need another look under the next.
    revision: int = 1
    # its cases check the readings themselves, not lmrpc.v1's wire (an HTTP API's own cases): a
    # failure is shown with the reading, not the clause as written
    shows_reading: bool = False

    def clause(self, clause_id: str) -> Reading:
        clause = CLAUSES[clause_id]
        if clause.unchecked is not None:
            return na(f"unchecked: {clause.unchecked}")
        return self.clauses.get(clause_id, self.otherwise)

    def case(self, case: Case) -> Reading:
        return self.cases.get(case.id) or self.clause(case.clause.id)


NO_TEXT = "no text: the gateway detokenizes (and matches stop strings again itself)"
ENGINE_ONLY = (
    "engine protocols only: lmrpc.v1 has LOAD-1, ABORT-3 and HEALTH-1/2 instead, and no GetTokenizer"
)

RUNTIME_ONLY = "sglang.runtime.v1 only (contract §15): lmrpc.v1 states these rules in its own clauses"
NOT_RUNTIME = {f"SRT-{i}": na(RUNTIME_ONLY) for i in range(1, 5)}
# Contract revision 3's RPCs: each capability-gated; other protocols' drivers do not drive them.
REVISION_3_FLAGS = ("list_models", "score", "profiler", "weight_updates")
NOT_DRIVEN_CAP_1 = {f"CAP-1[{flag}]": na("lmrpc.v1's capability flag") for flag in REVISION_3_FLAGS}
