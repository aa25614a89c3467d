"""Writes the clause-profile tables of docs/conformance.md from ``conformance.spec.profiles``: the
gRPC protocols' table and the OpenAI-compatible HTTP profile's.

    .venv/bin/python tools/profile_table.py          # rewrite the tables in place
    .venv/bin/python tools/profile_table.py --check  # exit 1 if the document is out of date

Each table sits between its two marker comments below; a unit test runs ``--check``'s comparison.
"""

from __future__ import annotations

import sys
from pathlib import Path

from conformance.cases import all_cases
from conformance.spec.profiles import GRPC_PROFILES, PROFILES, Profile, markdown_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "conformance.md"
TABLES = {
    ("<!-- profile-table:start -->", "<!-- profile-table:end -->"): GRPC_PROFILES,
    ("<!-- openai-profile-table:start -->", "<!-- openai-profile-table:end -->"): (PROFILES["openai"],),
}


def table(profiles: tuple[Profile, ...]) -> str:
    case_ids: dict[str, list[str]] = {}
    for case in all_cases():
        case_ids.setdefault(case.clause.id, []).append(case.id)
    return markdown_table(case_ids, profiles)


def rendered(document: str) -> str:
    for (start_marker, end_marker), profiles in TABLES.items():
        head, start, rest = document.partition(start_marker)
        _, end, tail = rest.partition(end_marker)
        if not start or not end:
            raise SystemExit(f"{DOC} has no {start_marker} ... {end_marker} section")
        document = f"{head}{start}\n{table(profiles)}\n{end}{tail}"
    return document


def main() -> int:
    document = DOC.read_text(encoding="utf-8")
    wanted = rendered(document)
    if "--check" in sys.argv[1:]:
        return 0 if wanted == document else 1
    DOC.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
