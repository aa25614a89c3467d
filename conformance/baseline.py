"""Known failures: a TOML file whose entries turn matching FAILs into XFAILs, and go stale loudly.

    [[known_failure]]
    case = "USAGE-6[short]"          # a case ID or a glob ("USAGE-6*")
    reason = "prefix cache works on whole 16-token pages"   # required
    issue = "https://example.org/issues/12"                  # optional

An entry is stale, and the run exits 4, when it names no case of this harness, or when a case it
matches ran and passed. Remove stale entries: a baseline only ever shrinks.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field

from conformance.registry import Case, matches
from conformance.results import CaseResult, Verdict


class BaselineError(ValueError):
    """The baseline file is malformed (a usage error, exit 2)."""


@dataclass(frozen=True, slots=True)
class Entry:
    case: str
    reason: str
    issue: str = ""


@dataclass(slots=True)
class Baseline:
    entries: list[Entry] = field(default_factory=list)
    path: str = ""

    @staticmethod
    def load(path: str) -> Baseline:
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise BaselineError(f"baseline={path!r}: {exc}") from exc
        unknown = set(data) - {"known_failure"}
        if unknown:
            raise BaselineError(f"baseline={path!r}: unknown keys {sorted(unknown)} (only [[known_failure]])")
        entries = []
        for i, raw in enumerate(data.get("known_failure", [])):
            case, reason = raw.get("case"), raw.get("reason")
            if not isinstance(case, str) or not case:
                raise BaselineError(f"baseline={path!r}: known_failure #{i + 1} has no case")
            if not isinstance(reason, str) or not reason.strip():
                raise BaselineError(f"baseline={path!r}: known_failure case={case!r} has no reason")
            extra = set(raw) - {"case", "reason", "issue"}
            if extra:
                raise BaselineError(
                    f"baseline={path!r}: known_failure case={case!r} has unknown keys {sorted(extra)}"
                )
            entries.append(Entry(case, reason.strip(), str(raw.get("issue", ""))))
        return Baseline(entries, path)

    def apply(self, results: Sequence[CaseResult], registry: Sequence[Case]) -> list[str]:
        """Mark known failures XFAIL in place; return one line per stale entry."""
        by_id = {r.case_id: r for r in results}
        stale = []
        for entry in self.entries:
            known = [c for c in registry if matches(entry.case, c)]
            if not known:
                stale.append(f"{entry.case}: names no case of this harness (renamed or removed?)")
                continue
            for case in known:
                result = by_id.get(case.id)
                if result is None:
                    continue
                if result.verdict is Verdict.FAIL:
                    result.verdict, result.baseline_reason = Verdict.XFAIL, entry.reason
                elif result.verdict is Verdict.PASS:
                    stale.append(f"{entry.case}: {case.id} passes now; remove the entry ({entry.reason})")
        return stale
