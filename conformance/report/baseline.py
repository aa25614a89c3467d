"""Known failures: a TOML file whose entries turn matching FAILs into XFAILs, and go stale loudly.

    [[known_failure]]
    case = "USAGE-6[short]"          # a case ID or a glob ("USAGE-6*")
    fingerprint = "cached_tokens — want >= #"   # the finding(s) it excuses: one, or a list; "*" globs
    reason = "prefix cache works on whole 16-token pages"   # required
    issue = "https://example.org/issues/12"                  # optional
    intermittent = true    # optional: seen in some runs only (sampling, timing), so never stale

An entry excuses only the findings it names (``Mismatch.fingerprint``: what differs, without this
run's values; a run's JSON report and ``--write-baseline`` show them). A case that fails with a
finding no entry names is a FAIL, even where other findings of it are known: a baseline never hides
a new fault behind an old one. An entry is stale, and the run exits 4, when it names no case of
this harness, or when the cases it matches ran and none showed any of its fingerprints (the forms
one finding takes: streamed or not, chat or completions), unless it is marked intermittent (a
finding of sampled output or timing that some runs do not meet). Remove
stale entries: a baseline only ever shrinks.

A baseline records the harness release that wrote it (``harness_version = "0.2.0"``, before the
entries); a run by another release warns, since cases may have been added or changed since.

``conformance run --write-baseline FILE`` writes the baseline a run calls for: the findings still
seen kept with their reasons, gone ones dropped, and one entry per new finding whose reason says
what failed, to be replaced by why.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conformance.spec.registry import Case, matches
from conformance.vocabulary import HARNESS_VERSION, CaseResult, Verdict

RAN = (Verdict.PASS, Verdict.FAIL, Verdict.XFAIL)


class BaselineError(ValueError):
    """The baseline file is malformed (a usage error, exit 2)."""


@dataclass(frozen=True, slots=True)
class Entry:
    case: str
    fingerprints: tuple[str, ...]
    reason: str
    issue: str = ""
    intermittent: bool = False  # seen in some runs only: not stale when a run does not meet it

    def covers(self, fingerprint: str) -> bool:
        return any(_pattern(p).match(fingerprint) for p in self.fingerprints)


def _pattern(fingerprint: str) -> re.Pattern[str]:
    """A fingerprint as written in a baseline: ``*`` matches anything, the rest is literal."""
    return re.compile("^" + ".*".join(re.escape(part) for part in fingerprint.split("*")) + "$")


def _fingerprints(raw: object, where: str) -> tuple[str, ...]:
    values = [raw] if isinstance(raw, str) else raw
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        raise BaselineError(
            f"{where} needs fingerprint = the finding it excuses (a string, or a list of them), as a "
            "run's JSON report or --write-baseline shows it"
        )
    return tuple(values)


@dataclass(slots=True)
class Baseline:
    entries: list[Entry] = field(default_factory=list)
    path: str = ""
    harness_version: str = ""  # the harness that wrote it ("" where the file does not say)

    def version_warning(self) -> str | None:
        """What a run says when the baseline was written by another harness release: its cases may
        have changed since (CHANGELOG.md lists them)."""
        if not self.harness_version or self.harness_version == HARNESS_VERSION:
            return None
        return (
            f"the baseline {self.path} was written with harness {self.harness_version}, this is "
            f"{HARNESS_VERSION}: see CHANGELOG.md for the cases added or changed between them"
        )

    @staticmethod
    def load(path: str) -> Baseline:
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise BaselineError(f"baseline={path!r}: {exc}") from exc
        unknown = set(data) - {"known_failure", "harness_version"}
        if unknown:
            raise BaselineError(
                f"baseline={path!r}: unknown keys {sorted(unknown)} (only harness_version and [[known_failure]])"
            )
        version = data.get("harness_version", "")
        if not isinstance(version, str):
            raise BaselineError(f"baseline={path!r}: harness_version={version!r} must be a string")
        entries = []
        for i, raw in enumerate(data.get("known_failure", [])):
            case, reason = raw.get("case"), raw.get("reason")
            if not isinstance(case, str) or not case:
                raise BaselineError(f"baseline={path!r}: known_failure #{i + 1} has no case")
            where = f"baseline={path!r}: known_failure case={case!r}"
            if not isinstance(reason, str) or not reason.strip():
                raise BaselineError(f"{where} has no reason")
            extra = set(raw) - {"case", "fingerprint", "reason", "issue", "intermittent"}
            if extra:
                raise BaselineError(f"{where} has unknown keys {sorted(extra)}")
            fingerprints = _fingerprints(raw.get("fingerprint"), where)
            intermittent = raw.get("intermittent", False)
            if not isinstance(intermittent, bool):
                raise BaselineError(f"{where}: intermittent={intermittent!r} must be true or false")
            entries.append(Entry(case, fingerprints, reason.strip(), str(raw.get("issue", "")), intermittent))
        return Baseline(entries, path, version)

    def _entries_of(self, case_id: str, registry: Sequence[Case]) -> list[Entry]:
        case = next((c for c in registry if c.id == case_id), None)
        return [e for e in self.entries if case is not None and matches(e.case, case)]

    def apply(self, results: Sequence[CaseResult], registry: Sequence[Case]) -> list[str]:
        """Mark known failures XFAIL in place (every finding of the case named by an entry); return one
        line per stale entry."""
        for result in results:
            self._mark(result, registry)
        return self._stale(results, registry)

    def marked(self, result: CaseResult, registry: Sequence[Case]) -> CaseResult:
        """A copy of ``result`` as ``apply`` will leave it: what a log shows as the case ends."""
        copy = dataclasses.replace(result)
        self._mark(copy, registry)
        return copy

    def _mark(self, result: CaseResult, registry: Sequence[Case]) -> None:
        if result.verdict is not Verdict.FAIL:
            return
        entries = self._entries_of(result.case_id, registry)
        if not entries:
            return
        new = [f for f in result.findings() if not any(e.covers(f) for e in entries)]
        if new:
            result.reason = f"not in the baseline: {'; '.join(new)} ({result.reason})"
            return
        covering = [e for e in entries if any(e.covers(f) for f in result.findings())]
        result.verdict = Verdict.XFAIL
        result.baseline_reason = " / ".join(dict.fromkeys(e.reason for e in covering))

    def _stale(self, results: Sequence[CaseResult], registry: Sequence[Case]) -> list[str]:
        by_id = {r.case_id: r for r in results}
        stale = []
        for entry in self.entries:
            known = [c for c in registry if matches(entry.case, c)]
            if not known:
                stale.append(f"{entry.case}: names no case of this harness (renamed or removed?)")
                continue
            ran = [by_id[c.id] for c in known if c.id in by_id and by_id[c.id].verdict in RAN]
            if not ran or entry.intermittent:
                continue
            seen = [f for r in ran for f in r.findings()]
            if not any(entry.covers(f) for f in seen):  # the entry's fingerprints are one finding's forms
                how = "passes now" if all(r.verdict is Verdict.PASS for r in ran) else "fails otherwise now"
                named = entry.fingerprints[0] if len(entry.fingerprints) == 1 else list(entry.fingerprints)
                stale.append(f"{entry.case}: {named!r} is gone ({how}); remove it ({entry.reason})")
        return stale

    def updated(self, results: Sequence[CaseResult], registry: Sequence[Case], recorded: str) -> Baseline:
        """The baseline this run calls for (``recorded`` dates the entries of new findings): each
        finding still seen keeps its entry's case, reason and issue; a finding gone leaves its entry;
        entries of cases that did not run stay as written."""
        by_id = {r.case_id: r for r in results}
        kept: dict[tuple[str, str, str, bool], list[str]] = {}
        for entry in self.entries:
            known = [c for c in registry if matches(entry.case, c)]
            ran = [by_id[c.id] for c in known if c.id in by_id and by_id[c.id].verdict in RAN]
            if known and (not ran or entry.intermittent):
                kept[(entry.case, entry.reason, entry.issue, entry.intermittent)] = list(entry.fingerprints)
        for result in results:
            if result.verdict not in (Verdict.FAIL, Verdict.XFAIL):
                continue
            entries = self._entries_of(result.case_id, registry)
            for fingerprint in result.findings():
                covering = next((e for e in entries if e.covers(fingerprint)), None)
                if covering is not None:
                    key = (covering.case, covering.reason, covering.issue, covering.intermittent)
                else:
                    example = next(
                        (m.render() for m in result.mismatches if m.fingerprint == fingerprint), ""
                    )
                    why = example or result.reason or "failed"
                    key = (result.case_id, f"recorded {recorded} by --write-baseline: {why}"[:300], "", False)
                kept.setdefault(key, [])
                if fingerprint not in kept[key]:
                    kept[key].append(fingerprint)
        entries = [
            Entry(case, tuple(fps), reason, issue, intermittent)
            for (case, reason, issue, intermittent), fps in kept.items()
        ]
        return Baseline(entries, self.path, HARNESS_VERSION)

    def to_toml(self) -> str:
        lines = [
            "# Known failures of `conformance run` (see `conformance run --help`, --baseline).",
            "# Every entry needs a reason and the fingerprints of the findings it excuses; an entry",
            "# whose findings are gone fails the run until removed.",
        ]
        if self.harness_version:
            lines += ["", f"harness_version = {_toml_string(self.harness_version)}"]
        for entry in self.entries:
            lines += ["", "[[known_failure]]", f"case = {_toml_string(entry.case)}"]
            if len(entry.fingerprints) == 1:
                lines.append(f"fingerprint = {_toml_string(entry.fingerprints[0])}")
            else:
                lines.append("fingerprint = [")
                lines += [f"  {_toml_string(f)}," for f in entry.fingerprints]
                lines.append("]")
            lines.append(f"reason = {_toml_string(entry.reason)}")
            if entry.issue:
                lines.append(f"issue = {_toml_string(entry.issue)}")
            if entry.intermittent:
                lines.append("intermittent = true")
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
