"""Known failures: a TOML file whose entries turn matching FAILs into XFAILs, and go stale loudly.

    [[known_failure]]
    case = "USAGE-6[short]"          # a case ID or a glob ("USAGE-6*")
    reason = "prefix cache works on whole 16-token pages"   # required
    issue = "https://example.org/issues/12"                  # optional

An entry is stale, and the run exits 4, when it names no case of this harness, or when a case it
matches ran and passed. Remove stale entries: a baseline only ever shrinks.

``conformance run --write-baseline FILE`` writes the baseline a run calls for: entries that still
fail kept as they are, stale ones dropped (a glob narrowed to the cases that still fail), and one
entry per new failure whose reason says what failed, to be replaced by why.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conformance.spec.registry import Case, matches
from conformance.vocabulary import CaseResult, Verdict


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

    def updated(self, results: Sequence[CaseResult], registry: Sequence[Case], recorded: str) -> Baseline:
        """The baseline this run calls for (``recorded`` dates the entries of new failures)."""
        by_id = {r.case_id: r for r in results}
        entries: list[Entry] = []
        covered: set[str] = set()
        for entry in self.entries:
            known = [c for c in registry if matches(entry.case, c)]
            if not known:
                continue  # names no case any more
            ran = [by_id[c.id] for c in known if c.id in by_id]
            failing = [r for r in ran if r.verdict in (Verdict.FAIL, Verdict.XFAIL)]
            if any(r.verdict is Verdict.PASS for r in ran):
                entries += [
                    Entry(r.case_id, entry.reason, entry.issue) for r in failing if r.case_id not in covered
                ]
            else:
                entries.append(entry)  # still failing, or not run this time: keep it as written
            covered.update(r.case_id for r in failing)
        for r in results:
            if r.verdict is Verdict.FAIL and r.case_id not in covered:
                why = r.reason or (r.mismatches[0].render() if r.mismatches else "failed")
                entries.append(Entry(r.case_id, f"recorded {recorded} by --write-baseline: {why}"[:300]))
                covered.add(r.case_id)
        return Baseline(entries, self.path)

    def to_toml(self) -> str:
        lines = [
            "# Known failures of `conformance run` (see `conformance run --help`, --baseline).",
            "# Every entry needs a reason; an entry that passes again fails the run until removed.",
        ]
        for entry in self.entries:
            lines += ["", "[[known_failure]]", f"case = {_toml_string(entry.case)}"]
            lines.append(f"reason = {_toml_string(entry.reason)}")
            if entry.issue:
                lines.append(f"issue = {_toml_string(entry.issue)}")
        return "\n".join(lines) + "\n"

    def write(self, path: str) -> None:
        Path(path).write_text(self.to_toml(), encoding="utf-8")


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    escaped = []
    for char in text:
        if char in ('"', "\\"):
            escaped.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04X}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'
