"""``conformance list``: the cases, and a protocol's profile clause by clause, as a table or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from conformance.spec.clauses import CLAUSES, Clause
from conformance.spec.profiles import Profile, Reading
from conformance.spec.registry import Case


def print_cases(cases: Sequence[Case], *, as_json: bool) -> None:
    """Every case: ID, clause, level, the capabilities it requires, what it checks."""
    if as_json:
        print(json.dumps([_case_json(c) for c in cases], indent=2))
        return
    table = Table(
        "case", "clause", "level", "requires", "doc", title=f"{len(cases)} cases", title_justify="left"
    )
    for c in cases:
        table.add_row(
            escape(c.id),
            c.clause.id,
            c.level.value,
            escape(", ".join(c.requires) or "-"),
            escape(c.doc.split("\n")[0]),
        )
    Console().print(table)


def _case_json(case: Case) -> dict[str, object]:
    return {
        "id": case.id,
        "clause": case.clause.id,
        "level": case.level.value,
        "group": case.group,
        "requires": list(case.requires),
        "exclusive": case.exclusive,
        "doc": case.doc,
    }


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One clause as a protocol reads it, with the cases that run for it and those it leaves out."""

    clause: Clause
    reading: Reading
    runs: list[str]
    left_out: dict[str, str]  # case id -> why the profile leaves it out of a clause that applies


def profile_rows(profile: Profile, cases: Sequence[Case], level: str) -> list[ProfileRow]:
    by_clause: dict[str, list[Case]] = {}
    for case in cases:
        by_clause.setdefault(case.clause.id, []).append(case)
    rows = []
    for clause in CLAUSES.values():
        if level != "all" and clause.level.value.lower() != level:
            continue
        reading = profile.clause(clause.id)
        own = by_clause.get(clause.id, [])
        runs = [c.id for c in own if profile.case(c).applies]
        left_out = {
            c.id: profile.case(c).text for c in own if not profile.case(c).applies and reading.applies
        }
        rows.append(ProfileRow(clause, reading, runs, left_out))
    return rows


def print_profile(profile: Profile, rows: Sequence[ProfileRow], *, as_json: bool) -> None:
    """``conformance list --protocol X``: every clause, whether it applies there and how it reads
    there, or why it cannot be checked there; and the cases a profile leaves out of a clause."""
    if as_json:
        clauses = [
            {
                "clause": row.clause.id,
                "level": row.clause.level.value,
                "applies": row.reading.applies,
                "reads": row.reading.text,
                "cases": row.runs,
                "cases_left_out": row.left_out,
            }
            for row in rows
        ]
        print(
            json.dumps(
                {"protocol": profile.protocol, "revision": profile.revision, "clauses": clauses}, indent=2
            )
        )
        return
    applying = sum(row.reading.applies for row in rows)
    table = Table(
        "clause",
        "level",
        "applies",
        "how it reads there, or why not",
        "cases",
        title=f"{profile.title} ({profile.protocol}, profile r{profile.revision}): "
        f"{applying} of {len(rows)} clauses apply",
        title_justify="left",
    )
    for row in rows:
        note = row.reading.text or "as written"
        if row.left_out:
            note += "; not " + "; not ".join(f"{i}: {why}" for i, why in row.left_out.items())
        table.add_row(
            row.clause.id,
            row.clause.level.value,
            "yes" if row.reading.applies else "no",
            escape(note),
            escape(", ".join(row.runs) or "-"),
        )
    Console().print(table)
