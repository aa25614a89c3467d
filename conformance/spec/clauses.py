"""The numbered clauses of docs/contract.md, read from the copy shipped inside this package.

``conformance/spec/contract.md`` is a link to ``docs/contract.md`` (a wheel carries the file itself), so
the clause text has one source: the harness parses the document instead of mirroring it. Only what
the document cannot say lives here: why a black-box client cannot check a few clauses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources

from lmrpc import CONTRACT_REVISION

__all__ = ["CLAUSES", "CONTRACT_REVISION", "MUST", "SECTIONS", "SHOULD", "Clause", "Level", "parse_contract"]


class Level(StrEnum):
    """How binding a clause is: MUST gates conformance, SHOULD is checked by ``--level should``."""

    MUST = "MUST"
    SHOULD = "SHOULD"


MUST = Level.MUST
SHOULD = Level.SHOULD


@dataclass(frozen=True, slots=True)
class Clause:
    id: str
    level: Level
    section: str
    text: str
    unchecked: str | None = None  # why a black-box client cannot check it, when it cannot

    @property
    def checkable(self) -> bool:
        return self.unchecked is None


UNCHECKED: dict[str, str] = {
    "VER-1": "static wire-compatibility rule, checked by `buf breaking`, not at run time",
    "STREAM-9": "a rule for clients",
    "CAP-4": "a rule for clients",
    "N-3": "server-internal",
    "LIFE-2": "needs a worker process to die",
    "LIFE-4": "needs a worker process to die",
}

_ROW = re.compile(r"^\| ([A-Z]+-\d+) \| (MUST|SHOULD) \| (.*) \|\s*$")
_HEADING = re.compile(r"^## \d+\. (.*)$")
_REVISION = re.compile(r"^\*\*Contract revision (\d+)\.\*\*", re.MULTILINE)


def parse_contract(markdown: str) -> list[Clause]:
    """Read the clause tables of docs/contract.md: ID, level, section (its ``## N.`` heading), text."""
    section = ""
    clauses: list[Clause] = []
    for line in markdown.splitlines():
        if heading := _HEADING.match(line):
            section = heading.group(1).strip()
        elif row := _ROW.match(line):
            clause_id = row.group(1)
            clauses.append(
                Clause(clause_id, Level(row.group(2)), section, row.group(3), UNCHECKED.get(clause_id))
            )
    return clauses


def revision_of(markdown: str) -> int:
    """The revision the document states in its first paragraph (``**Contract revision N.**``)."""
    found = _REVISION.search(markdown)
    if found is None:
        raise ValueError("the contract does not state its revision ('**Contract revision N.**')")
    return int(found.group(1))


def _load() -> tuple[Clause, ...]:
    markdown = resources.files("conformance.spec").joinpath("contract.md").read_text(encoding="utf-8")
    if revision_of(markdown) != CONTRACT_REVISION:
        raise RuntimeError(
            f"the packaged contract is revision {revision_of(markdown)}, "
            f"lmrpc.CONTRACT_REVISION is {CONTRACT_REVISION}"
        )
    return tuple(parse_contract(markdown))


_TABLE = _load()
CLAUSES: dict[str, Clause] = {c.id: c for c in _TABLE}
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(c.section for c in _TABLE))
