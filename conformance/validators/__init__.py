"""Pure functions from a recorded stream (and the facts around it) to the mismatches of one clause.

``validate`` runs them; what they need from outside the stream (Tokenize and Detokenize answers) is
fetched by ``conformance.harness.facts``. Importing this package registers every validator, in
report order.
"""

from __future__ import annotations

from collections.abc import Iterable

from conformance.stream.record import StreamRecord
from conformance.validators.base import VALIDATORS, Facts
from conformance.vocabulary import Mismatch

# isort: off
# Registration order is the order of the pool cases in every report.
import conformance.validators.structure
import conformance.validators.finish
import conformance.validators.usage
import conformance.validators.options  # noqa: F401

# isort: on

STREAM_CLAUSES: tuple[str, ...] = tuple(VALIDATORS)


def validate(record: StreamRecord, facts: Facts, clauses: Iterable[str] | None = None) -> list[Mismatch]:
    """The mismatches of ``clauses``: each validator's, and the protocol driver's findings filed
    under that clause (breaks of an engine protocol's own semantics, ``conformance.drivers``)."""
    found: list[Mismatch] = []
    for clause in clauses if clauses is not None else STREAM_CLAUSES:
        found.extend(VALIDATORS[clause](record, facts))
        found.extend(Mismatch(f.what, f.want, f.got) for f in record.findings if f.clause == clause)
    return found
