"""The run on GitHub Actions: the log lines of ``lines``, each failure block folded in a group, one
``::error`` annotation per failing case, a ``::warning`` per stale baseline entry, and a job
summary appended to ``$GITHUB_STEP_SUMMARY`` (the counts per level, each failing case with its
findings and repro script, the stale entries).

Workflow commands and their escaping: docs.github.com/actions/reference/workflow-commands.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Mapping
from typing import TextIO

from conformance.report.lines import LineWriter, counts_line, failure_block, first_finding
from conformance.report.model import RunReport, badge
from conformance.spec.clauses import CLAUSES
from conformance.vocabulary import HARNESS_VERSION, CaseResult, Verdict
from lmrpc import CONTRACT_REVISION

SUMMARY_FAILURES_SHOWN = 100  # failing cases written whole to the job summary; the rest counted
SUMMARY_VERDICTS = (Verdict.PASS, Verdict.FAIL, Verdict.ERROR, Verdict.XFAIL, Verdict.SKIP, Verdict.NOT_RUN)


def escape_data(text: str) -> str:
    """A workflow command's message: ``%``, CR and LF escaped."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value (``title=``): also ``:`` and ``,``."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(result: CaseResult) -> str:
    """``::error title=FAIL CASE (MUST)::clause: first finding`` for one failing case."""
    title = f"{result.verdict.value} {result.case_id} ({result.level})"
    message = f"{result.clause}: {first_finding(result)}"
    if result.repro is not None and result.repro.script_path:
        message += f"\nrepro script: python {result.repro.script_path} [host:port]"
    return f"::error title={escape_property(title)}::{escape_data(message)}"


def summary_markdown(report: RunReport) -> str:
    """The job summary: what ran against what, the counts per level, every failing case."""
    lines = [
        f"## {_md(badge(report))}",
        "",
        f"`{_md(report.target)}` over `{report.protocol}` · harness {HARNESS_VERSION} · "
        f"contract r{CONTRACT_REVISION} · level {report.level} · {report.duration_s:.0f} s",
        "",
        "| verdict | MUST | SHOULD |",
        "|---|---:|---:|",
    ]
    must, should = report.counts("MUST"), report.counts("SHOULD")
    lines += [f"| {v.value} | {must[v]} | {should[v]} |" for v in SUMMARY_VERDICTS if must[v] or should[v]]
    failing = [r for r in report.results if r.verdict.is_failure]
    if report.aborted:
        lines += ["", f"**Run stopped early:** {_md(report.aborted)}"]
    if failing:
        lines += ["", f"### Failing cases ({len(failing)})", ""]
        for result in failing[:SUMMARY_FAILURES_SHOWN]:
            lines += _failure_details(result, report.protocol)
        if len(failing) > SUMMARY_FAILURES_SHOWN:
            lines.append(
                f"… and {len(failing) - SUMMARY_FAILURES_SHOWN} more: the JSON report has every one."
            )
    if report.stale:
        lines += ["", f"### Stale baseline entries ({len(report.stale)})", ""]
        lines += [f"- {_md(line)}" for line in report.stale]
    if report.warnings:
        lines += ["", "### Warnings", "", *(f"- {_md(line)}" for line in report.warnings)]
    return "\n".join(lines) + "\n"


def _failure_details(result: CaseResult, protocol: str) -> list[str]:
    clause = CLAUSES[result.clause]
    head = (
        f"<b>{result.verdict.value}</b> <code>{html.escape(result.case_id)}</code> "
        f"({clause.id}, {result.level}): {html.escape(first_finding(result))}"
    )
    block = "\n".join(failure_block(result, protocol))
    return [
        "<details>",
        f"<summary>{head}</summary>",
        "",
        "```",
        block.replace("```", "'''"),
        "```",
        "</details>",
        "",
    ]


def _md(text: str) -> str:
    """Free text in a markdown line: no table cell, link or HTML breaks out of it."""
    return html.escape(text).replace("|", "\\|").replace("[", "\\[")


class GithubWriter(LineWriter):
    """``--format github``: lines, with the failure blocks folded, annotations and the job summary."""

    def __init__(
        self,
        *,
        verbose: bool = False,
        quiet: bool = False,
        out: TextIO | None = None,
        classify: Callable[[CaseResult], CaseResult] = lambda result: result,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(verbose=verbose, quiet=quiet, out=out, classify=classify)
        self.environ = os.environ if environ is None else environ

    def failures(self, report: RunReport) -> None:
        for result in report.results:
            if result.verdict.is_failure:
                self.write(f"::group::{escape_data(f'{result.verdict.value} {result.case_id}')}")
                for line in failure_block(result, report.protocol):
                    self.write(line)
                self.write("::endgroup::")

    def end(self, report: RunReport) -> None:
        self.failures(report)
        for result in report.results:
            if result.verdict.is_failure:
                self.write(annotation(result))
        for line in report.stale:
            self.write(f"::warning title=stale baseline entry::{escape_data(line)}")
        for line in report.warnings:
            self.write(f"::warning title=conformance::{escape_data(line)}")
        if report.aborted:
            self.write(f"::error title=conformance run stopped early::{escape_data(report.aborted)}")
        self.write(counts_line(report))
        self.write(badge(report))
        path = self.environ.get("GITHUB_STEP_SUMMARY")
        if path:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(summary_markdown(report))
