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
from conformance.spec.profiles.lmrpc import LMRPC
from conformance.spec.profiles.openai import OPENAI
from conformance.spec.profiles.sglang_runtime import SGLANG_RUNTIME
from conformance.spec.profiles.sglang_scheduler import SGLANG_SCHEDULER
from conformance.spec.profiles.vllm_engine import VLLM_ENGINE

__all__ = [
    "AS_WRITTEN",
    "GRPC_PROFILES",
    "LMRPC",
    "OPENAI",
    "PROFILES",
    "SGLANG_RUNTIME",
    "SGLANG_SCHEDULER",
    "VLLM_ENGINE",
    "Profile",
    "Reading",
    "clause_text",
    "markdown_table",
    "na",
    "reads",
]

PROFILES: dict[str, Profile] = {
    p.protocol: p for p in (LMRPC, VLLM_ENGINE, SGLANG_SCHEDULER, SGLANG_RUNTIME, OPENAI)
}
GRPC_PROFILES: tuple[Profile, ...] = (LMRPC, VLLM_ENGINE, SGLANG_SCHEDULER, SGLANG_RUNTIME)


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
    reading = PROFILES[protocol].clause(clause_id) if protocol in PROFILES else AS_WRITTEN
    if protocol == OPENAI.protocol and reading.applies and reading.text:
        return f"{reading.text} (the OpenAI reading)"
    return CLAUSES[clause_id].text
