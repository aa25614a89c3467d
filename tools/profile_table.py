"""Writes the clause-profile table of docs/conformance.md from ``conformance.spec.profiles``.

    .venv/bin/python tools/profile_table.py          # rewrite the table in place
    .venv/bin/python tools/profile_table.py --check  # exit 1 if the document is out of date

The table sits between the two marker comments below; a unit test runs ``--check``'s comparison.
"""

from __future__ import annotations

import sys
from pathlib import Path

from conformance.spec.profiles import markdown_table
from conformance.spec.registry import all_cases

DOC = Path(__file__).resolve().parents[1] / "docs" / "conformance.md"
START, END = "<!-- profile-table:start -->", "<!-- profile-table:end -->"


def table() -> str:
    case_ids: dict[str, list[str]] = {}
    for case in all_cases():
        case_ids.setdefault(case.clause.id, []).append(case.id)
    return markdown_table(case_ids)


def rendered(document: str) -> str:
    head, start, rest = document.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"{DOC} has no {START} ... {END} section")
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main() -> int:
    document = DOC.read_text(encoding="utf-8")
    wanted = rendered(document)
    if "--check" in sys.argv[1:]:
        return 0 if wanted == document else 1
    DOC.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
