"""Writes the tables of the docs that are facts of the code, each between its two marker
comments: the clause profiles (conformance.spec.profiles), the protocol index
(conformance.spec.protocols' table) and the harness's package map, every module with the first
sentence of its docstring.

    .venv/bin/python tools/docs_tables.py          # rewrite the tables in place
    .venv/bin/python tools/docs_tables.py --check  # exit 1, naming the file, if one is out of date

A unit test runs ``--check``.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from conformance.cases import all_cases
from conformance.spec.profiles import GRPC_PROFILES, PROFILES, Profile, markdown_table
from conformance.spec.protocols import TABLE

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "conformance"
FIRST_SENTENCE_CHARS = 220


@dataclass(frozen=True)
class Section:
    doc: str  # relative to the repository
    name: str  # the markers are <!-- NAME:start --> and <!-- NAME:end -->
    render: Callable[[], str]


def profiles_table(profiles: tuple[Profile, ...]) -> Callable[[], str]:
    def render() -> str:
        case_ids: dict[str, list[str]] = {}
        for case in all_cases():
            case_ids.setdefault(case.clause.id, []).append(case.id)
        return markdown_table(case_ids, profiles)

    return render


def protocol_index() -> str:
    lines = ["| harness id | service or API | who serves it | guide |", "|---|---|---|---|"]
    for row in TABLE:
        guide = Path(row.page).name
        lines.append(f"| `{row.id}` | {row.api} | {row.served_by} | [{guide}]({guide}) |")
    return "\n".join(lines)


def first_sentence(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(docstring.split("\n\n", 1)[0].split())
    found = re.search(r"^(.*?[.!?])(\s|$)", paragraph)
    sentence = found.group(1) if found else paragraph
    if len(sentence) > FIRST_SENTENCE_CHARS:
        sentence = sentence[: FIRST_SENTENCE_CHARS - 1].rstrip() + "…"
    return sentence.replace("|", "\\|")


def module_map() -> str:
    """Every module of the harness, by package, with what its docstring says it is."""
    lines = ["| module | what it is |", "|---|---|"]
    for path in sorted(HARNESS.rglob("*.py"), key=lambda p: p.relative_to(HARNESS).parts):
        relative = path.relative_to(ROOT).as_posix()
        lines.append(
            f"| [`{path.relative_to(HARNESS).as_posix()}`](../{relative}) | {first_sentence(path)} |"
        )
    return "\n".join(lines)


SECTIONS = (
    Section("docs/conformance.md", "profile-table", profiles_table(GRPC_PROFILES)),
    Section("docs/protocols/openai.md", "openai-profile-table", profiles_table((PROFILES["openai"],))),
    Section("docs/protocols/README.md", "protocol-table", protocol_index),
    Section("docs/conformance-map.md", "module-map", module_map),
)


def rendered(document: str, section: Section) -> str:
    start, end = f"<!-- {section.name}:start -->", f"<!-- {section.name}:end -->"
    head, found_start, rest = document.partition(start)
    _, found_end, tail = rest.partition(end)
    if not found_start or not found_end:
        raise SystemExit(f"{section.doc} has no {start} ... {end} section")
    return f"{head}{start}\n{section.render()}\n{end}{tail}"


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for doc in dict.fromkeys(s.doc for s in SECTIONS):
        path = ROOT / doc
        document = path.read_text(encoding="utf-8")
        wanted = document
        for section in (s for s in SECTIONS if s.doc == doc):
            wanted = rendered(wanted, section)
        if wanted != document:
            stale.append(doc)
            if not check:
                path.write_text(wanted, encoding="utf-8")
    if check and stale:
        print(f"out of date: {', '.join(stale)} (run tools/docs_tables.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
