"""The run as plain lines, for a CI log: one line per case as it ends (verdict, id, time, first
finding), then one block per failure, the stale baseline entries, the counts and the badge.

No table, box, colour or cursor movement: what a log viewer shows is what was written, and the
harness never wraps a line (a log viewer that wraps long lines wraps one line, not a table's rows).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from conformance.report.model import RunReport, badge
from conformance.spec.clauses import CLAUSES
from conformance.spec.profiles import clause_text
from conformance.spec.registry import Case
from conformance.vocabulary import CaseResult, Verdict

FINDING_CHARS = 240  # of the first finding on a case's line; its block has every finding whole
MISMATCHES_SHOWN = 12  # per failure block; the JSON report has all
ID_WIDTH_MAX = 48  # case ids are padded to the longest selected one, up to this


def first_finding(result: CaseResult) -> str:
    """What a case's line says after its time: the first mismatch, or why it did not pass."""
    if result.verdict is Verdict.XFAIL:
        text = f"known failure: {result.baseline_reason}"
    elif result.mismatches:
        text = result.mismatches[0].render()
    else:
        text = result.reason
    text = " ".join(text.split())
    return text if len(text) <= FINDING_CHARS else text[: FINDING_CHARS - 1] + "…"


def case_line(result: CaseResult, id_width: int = 0) -> str:
    """``FAIL    USAGE-2[openai]  1.03s  prompt_tokens …: want …, got …``"""
    line = f"{result.verdict.value:<7} {result.case_id:<{id_width}}  {result.duration_s:6.2f}s"
    detail = first_finding(result) if result.verdict is not Verdict.PASS else ""
    return f"{line}  {detail}" if detail else line


def shown(result: CaseResult, *, verbose: bool, quiet: bool) -> bool:
    """Whether a case gets its line: failures always; passes, skips and known failures unless
    ``quiet``; cases deselected or left unrun only when ``verbose``."""
    if result.verdict.is_failure:
        return True
    if quiet:
        return False
    return verbose or result.verdict is not Verdict.NOT_RUN


def failure_block(result: CaseResult, protocol: str) -> list[str]:
    """A failure whole: its clause, the findings, each mismatch as want/got, the repro."""
    clause = CLAUSES[result.clause]
    lines = [f"{clause.id} ({result.level}): {clause_text(protocol, clause.id)}"]
    findings = result.findings()
    if len(findings) > 1 or len(result.mismatches) > 1:
        lines += ["findings:", *(f"  {n} x {fingerprint}" for fingerprint, n in findings.items())]
    for m in result.mismatches[:MISMATCHES_SHOWN]:
        subject = f"{m.subject}: " if m.subject else ""
        lines += [f"- {subject}{m.what}", f"    want: {m.want}", f"    got:  {m.got}"]
    if len(result.mismatches) > MISMATCHES_SHOWN:
        lines.append(f"... and {len(result.mismatches) - MISMATCHES_SHOWN} more (the JSON report has all)")
    if not result.mismatches:
        lines.append(result.reason)
    if result.notes and result.verdict is Verdict.ERROR:
        lines.append(result.notes[-1])
    repro = result.repro
    if repro is not None and repro.example:
        lines += ["minimal repro:", *repro.example.splitlines()]
    if repro is not None and repro.blob:
        lines.append(repro.blob)
    if repro is not None and repro.script_path:
        lines.append(f"repro script: python {repro.script_path} [host:port]")
    return lines


def counts_line(report: RunReport) -> str:
    counts = report.counts()
    return " ".join(f"{v.value} {counts[v]}" for v in Verdict if counts[v]) + f"  in {report.duration_s:.1f}s"


def id_width(case_ids: Sequence[str]) -> int:
    return min(max((len(i) for i in case_ids), default=0), ID_WIDTH_MAX)


class LineWriter:
    """Writes a run as lines to ``out`` (standard output by default): each case as it ends, the
    rest when the run is over. ``classify`` gives a result as the run will report it (the baseline
    makes a known failure XFAIL) without changing the runner's copy."""

    def __init__(
        self,
        *,
        verbose: bool = False,
        quiet: bool = False,
        out: TextIO | None = None,
        classify: Callable[[CaseResult], CaseResult] = lambda result: result,
    ) -> None:
        self.verbose = verbose
        self.quiet = quiet
        self.out = out or sys.stdout
        self.classify = classify
        self.width = 0

    def write(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def begin(self, case_ids: Sequence[str]) -> None:
        self.width = id_width(case_ids)

    def say(self, line: str) -> None:
        if not self.quiet:
            self.write(line)

    def on_start(self, case: Case) -> None:
        pass

    def on_result(self, result: CaseResult) -> None:
        settled = self.classify(result)
        if shown(settled, verbose=self.verbose, quiet=self.quiet):
            self.write(case_line(settled, self.width))

    def failures(self, report: RunReport) -> None:
        for result in report.results:
            if result.verdict.is_failure:
                self.write("")
                self.write(f"== {result.verdict.value} {result.case_id}")
                for line in failure_block(result, report.protocol):
                    self.write(line)

    def end(self, report: RunReport) -> None:
        self.failures(report)
        if report.results and any(r.verdict.is_failure for r in report.results):
            self.write("")
        for line in report.stale:
            self.write(f"STALE BASELINE {line}")
        for line in report.warnings:
            self.write(f"warning: {line}")
        if report.aborted:
            self.write(f"run stopped early: {report.aborted}")
        self.write(counts_line(report))
        self.write(badge(report))
