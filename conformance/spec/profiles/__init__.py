"""Per-protocol clause profiles: for each protocol the harness drives, whether each clause of
docs/contract.md applies there, how it reads there, or why it cannot be checked there.

lmrpc.v1 is the contract itself: every clause applies as written (the engine clauses of §14 do
not). The engine protocols of smg (``vllm-engine``, ``sglang-scheduler``) carry less: no text, no
PromptInfo, one ``matched_token_id`` for EOS and stop token, no capabilities; each reading says
what the gateway relies on instead, with the smg source it comes from. ``conformance list
--protocol X`` prints a profile; the table in docs/conformance.md is ``markdown_table()``.

A case of a clause that does not apply is SKIP, with the reason; a case override narrows a
clause that applies to some of its cases only.
"""

from __future__ import annotations

from collections.abc import Mapping

from conformance.spec.clauses import CLAUSES
from conformance.spec.profiles.base import AS_WRITTEN, Profile, Reading, na, reads
from conformance.spec.protocols import GRPC_PROTOCOLS, TABLE, Protocol, load

__all__ = [
    "AS_WRITTEN",
    "GRPC_PROFILES",
    "PROFILES",
    "Profile",
    "Reading",
    "clause_text",
    "markdown_table",
    "na",
    "reads",
]


def _profile(row: Protocol) -> Profile:
    found = load(row.profile)
    if not isinstance(found, Profile) or found.protocol != row.id:
        raise TypeError(f"the {row.id} row names {row.profile}, which is no profile of {row.id}")
    return found


PROFILES: dict[str, Profile] = {row.id: _profile(row) for row in TABLE}
GRPC_PROFILES: tuple[Profile, ...] = tuple(PROFILES[p] for p in GRPC_PROTOCOLS)


def _cell(profile: Profile, clause_id: str, case_ids: list[str]) -> str:
    reading = profile.clause(clause_id)
    if reading.text.startswith("unchecked: "):
        return reading.text
    text = ("✓" if reading.applies else "—") + (f" {reading.text}" if reading.text else "")
    if reading.applies:
        narrowed = [f"`{i}`: {profile.cases[i].text}" for i in case_ids if i in profile.cases]
        if narrowed:
            text += " — not " + "; not ".join(narrowed)
    return text.replace("|", "\\|")


def markdown_table(case_ids: Mapping[str, list[str]], profiles: tuple[Profile, ...] = GRPC_PROFILES) -> str:
    """Every clause of docs/contract.md, one row each, read for every protocol of ``profiles``
    (``case_ids``: each clause's case IDs, for the cases a profile leaves out)."""
    header = "| clause | level | " + " | ".join(f"{p.title} (`{p.protocol}`)" for p in profiles) + " |"
    lines = [header, "|---|---|" + "---|" * len(profiles)]
    for clause in CLAUSES.values():
        cells = [_cell(p, clause.id, case_ids.get(clause.id, [])) for p in profiles]
        lines.append(f"| {clause.id} | {clause.level.value} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def clause_text(protocol: str, clause_id: str) -> str:
    """What a failure of ``clause_id`` is shown with: the clause as written, or, in the OpenAI
    profile (whose cases check its reading, not lmrpc.v1's wire), the reading."""
    profile = PROFILES.get(protocol)
    reading = profile.clause(clause_id) if profile is not None else AS_WRITTEN
    if profile is not None and profile.shows_reading and reading.applies and reading.text:
        return f"{reading.text} (the OpenAI reading)"
    return CLAUSES[clause_id].text
