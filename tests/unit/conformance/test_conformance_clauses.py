"""The harness reads its clauses from docs/contract.md, and the case library covers the contract."""

from __future__ import annotations

from pathlib import Path

from conformance.cases import all_cases
from conformance.spec.clauses import CLAUSES, MUST, parse_contract, revision_of
from lmrpc import CONTRACT_REVISION

CONTRACT = Path(__file__).resolve().parents[3] / "docs" / "contract.md"


def test_the_packaged_contract_is_docs_contract() -> None:
    packaged = Path(__file__).resolve().parents[3] / "conformance" / "spec" / "contract.md"
    assert packaged.read_bytes() == CONTRACT.read_bytes()
    parsed = parse_contract(CONTRACT.read_text(encoding="utf-8"))
    assert [c.id for c in parsed] == list(CLAUSES)
    assert [(c.level, c.section, c.text) for c in parsed] == [
        (c.level, c.section, c.text) for c in CLAUSES.values()
    ]


def test_one_contract_revision() -> None:
    assert revision_of(CONTRACT.read_text(encoding="utf-8")) == CONTRACT_REVISION


def test_clause_ids_are_unique_and_every_row_is_read() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("| ") and ("| MUST |" in line or "| SHOULD |" in line)
    ]
    assert len(rows) == len(CLAUSES), "a clause row the parser does not read, or a duplicate ID"


def test_every_case_names_an_existing_clause() -> None:
    for case in all_cases():
        assert case.clause.id in CLAUSES, case.id
        assert case.id == case.clause.id or case.id.startswith(case.clause.id + "["), case.id
        assert case.doc, f"{case.id} has no docstring (it is shown on failure and in `conformance list`)"


def test_every_checkable_clause_has_a_case() -> None:
    covered = {c.clause.id for c in all_cases()}
    missing = [c.id for c in CLAUSES.values() if c.checkable and c.id not in covered]
    assert not missing, f"checkable clauses without a case: {missing}"
    assert all(CLAUSES[i].level is MUST for i in ("STREAM-1", "FINISH-1", "ABORT-4"))


def test_unchecked_clauses_say_why() -> None:
    for clause in CLAUSES.values():
        assert clause.checkable or clause.unchecked, clause.id
    assert {c.id for c in CLAUSES.values() if not c.checkable} == {
        "VER-1",
        "STREAM-9",
        "CAP-4",
        "N-3",
        "LIFE-2",
        "LIFE-4",
    }
