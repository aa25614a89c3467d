"""The outcome of one run, its exit code and its one-line, per-level summary (usable as a badge)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from conformance.spec.clauses import CLAUSES
from conformance.spec.profiles import clause_text
from conformance.vocabulary import HARNESS_VERSION, REPORT_SCHEMA, CaseResult, Verdict
from lmrpc import CONTRACT_REVISION

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INFRA, EXIT_STALE = 0, 1, 2, 3, 4


@dataclass(slots=True)
class RunReport:
    target: str
    results: list[CaseResult]
    level: str = "all"
    server: dict[str, object] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)
    started_at: str = ""
    duration_s: float = 0.0
    stale: list[str] = field(default_factory=list)
    aborted: str = ""  # why the run stopped early (target down, interrupted), if it did
    protocol: str = "lmrpc"  # the wire protocol the run spoke (conformance.drivers)
    warnings: list[str] = field(default_factory=list)  # what the run noticed that is no verdict

    def counts(self, level: str | None = None) -> Counter[Verdict]:
        return Counter(r.verdict for r in self.results if level is None or r.level == level)

    def to_json(self) -> dict[str, object]:
        return {
            "schema": REPORT_SCHEMA,
            "harness_version": HARNESS_VERSION,
            "contract_revision": CONTRACT_REVISION,
            "target": self.target,
            "protocol": self.protocol,
            "server": self.server,
            "level": self.level,
            "settings": self.settings,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "exit_code": exit_code(self),
            "badge": badge(self),
            "summary": {
                level: {v.value: n for v, n in self.counts(level).items()} for level in ("MUST", "SHOULD")
            },
            "stale_baseline": self.stale,
            "aborted": self.aborted,
            "warnings": self.warnings,
            "cases": [r.to_json() for r in self.results],
        }


def failure_text(result: CaseResult, protocol: str = "lmrpc") -> str:
    """A failure as plain text (JUnit, pytest): the clause, every mismatch as want/got, the repro."""
    clause = CLAUSES[result.clause]
    lines = [f"{clause.id} ({result.level}): {clause_text(protocol, clause.id)}", ""]
    findings = result.findings()
    if len(findings) > 1 or len(result.mismatches) > 1:
        lines += ["Findings:", *(f"  {count} x {fp}" for fp, count in findings.items()), ""]
    lines += [
        f"- {m.subject + ': ' if m.subject else ''}{m.what}\n    want: {m.want}\n    got:  {m.got}"
        for m in result.mismatches
    ]
    if result.reason and not result.mismatches:
        lines.append(result.reason)
    if result.repro is not None:
        lines += ["", "Repro:", result.repro.example, "", result.repro.script]
    return "\n".join(lines)


def badge(report: RunReport) -> str:
    """``lmrpc conformance r2: MUST 58/58 PASS, SHOULD 9/10`` (skipped and not-run cases excluded)."""
    parts = []
    for level in ("MUST", "SHOULD"):
        counts = report.counts(level)
        ran = sum(counts[v] for v in (Verdict.PASS, Verdict.FAIL, Verdict.XFAIL, Verdict.ERROR))
        if not ran:
            parts.append(f"{level} not run")
            continue
        text = f"{level} {counts[Verdict.PASS]}/{ran}"
        if level == "MUST":
            text += " PASS" if counts[Verdict.PASS] == ran and not counts[Verdict.NOT_RUN] else " FAIL"
        parts.append(text)
    spoken = "" if report.protocol == "lmrpc" else f" ({report.protocol})"
    return f"lmrpc conformance r{CONTRACT_REVISION}{spoken}: " + ", ".join(parts)


def exit_code(report: RunReport) -> int:
    counts = report.counts()
    if counts[Verdict.FAIL]:
        return EXIT_FAIL
    if counts[Verdict.ERROR] or report.aborted:
        return EXIT_INFRA
    if report.stale:
        return EXIT_STALE
    return EXIT_OK
