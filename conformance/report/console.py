"""The human view: a progress bar while cases run, then one table per clause group, then every
failure with its clause, want/got lines and repro, then the badge line."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table

from conformance.report.model import RunReport, badge
from conformance.spec.clauses import CLAUSES
from conformance.spec.profiles import clause_text
from conformance.spec.registry import Case
from conformance.vocabulary import CaseResult, Verdict

STYLE = {
    Verdict.PASS: "green",
    Verdict.FAIL: "bold red",
    Verdict.SKIP: "yellow",
    Verdict.NOT_RUN: "dim",
    Verdict.XFAIL: "magenta",
    Verdict.ERROR: "bold red",
}


MISMATCHES_SHOWN = 12  # per failure on the console; the JSON report has all


def progress_bar(
    console: Console, total: int
) -> tuple[Progress, Callable[[Case], None], Callable[[CaseResult], None]]:
    """A progress bar, and what a run calls as each case starts and ends."""
    bar = Progress(
        TextColumn("[bold]conformance"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=True,
    )
    task = bar.add_task("", total=total)
    failures = [0]

    def on_start(case: Case) -> None:
        bar.update(task, description=escape(case.id))

    def on_result(result: CaseResult) -> None:
        failures[0] += result.verdict.is_failure
        bar.update(task, advance=1, description=f"[red]{failures[0]} failing" if failures[0] else "")

    return bar, on_start, on_result


def render(console: Console, report: RunReport, *, verbose: bool = False, quiet: bool = False) -> None:
    groups: dict[str, list[CaseResult]] = defaultdict(list)
    for result in report.results:
        groups[CLAUSES[result.clause].section].append(result)
    for section, results in groups.items() if not quiet else ():
        if not verbose and all(r.verdict is Verdict.NOT_RUN for r in results):
            continue
        table = Table(title=section, title_justify="left", expand=False, show_edge=False)
        table.add_column("case")
        table.add_column("level")
        table.add_column("verdict")
        table.add_column("time", justify="right")
        table.add_column("detail", overflow="fold", max_width=80)
        for r in results:
            if r.verdict is Verdict.NOT_RUN and not verbose and r.reason.startswith("not run"):
                continue
            detail = r.baseline_reason if r.verdict is Verdict.XFAIL else r.reason
            table.add_row(
                escape(r.case_id),
                r.level,
                f"[{STYLE[r.verdict]}]{r.verdict.value}",
                f"{r.duration_s:.2f}s",
                escape(detail),
            )
        console.print(table)
    for r in report.results:
        if r.verdict.is_failure:
            _failure(console, r, verbose, report.protocol)
    for line in report.stale:
        console.print(f"[bold magenta]STALE BASELINE[/] {escape(line)}")
    if report.aborted:
        console.print(f"[bold red]run stopped early:[/] {escape(report.aborted)}")
    counts = report.counts()
    console.print(
        " ".join(f"[{STYLE[v]}]{v.value} {counts[v]}[/]" for v in Verdict if counts[v])
        + f"  in {report.duration_s:.1f}s"
    )
    console.print(f"[bold]{escape(badge(report))}")


def _failure(console: Console, r: CaseResult, verbose: bool, protocol: str) -> None:
    clause = CLAUSES[r.clause]
    body = [f"[bold]{clause.id}[/] ({r.level}) {escape(clause_text(protocol, clause.id))}", ""]
    findings = r.findings()
    if len(findings) > 1 or len(r.mismatches) > 1:
        body += ["[bold]findings[/]", *(f"  {n} x {escape(fp)}" for fp, n in findings.items()), ""]
    for m in r.mismatches[:MISMATCHES_SHOWN]:
        subject = f"[dim]{escape(m.subject)}:[/] " if m.subject else ""
        body.append(
            f"{subject}[bold]{escape(m.what)}[/]\n  want: [green]{escape(m.want)}[/]\n  got:  [red]{escape(m.got)}[/]"
        )
    if len(r.mismatches) > MISMATCHES_SHOWN:
        body.append(f"... and {len(r.mismatches) - MISMATCHES_SHOWN} more (every one is in the JSON report)")
    if not r.mismatches:
        body.append(escape(r.reason))
    if r.repro and r.repro.example:
        body += ["", "[bold]minimal repro[/]", escape(r.repro.example)]
    if r.repro and r.repro.blob:
        body.append(escape(r.repro.blob))
    if r.notes and r.verdict is Verdict.ERROR:
        body += ["", escape(r.notes[-1])]
    if r.repro and r.repro.script_path:
        body += ["", f"[bold]repro script[/]: python {escape(r.repro.script_path)} [host:port]"]
    console.print(
        Panel(
            "\n".join(body),
            title=f"[{STYLE[r.verdict]}]{r.verdict.value} {escape(r.case_id)}",
            title_align="left",
            border_style="red",
        )
    )
    if verbose and r.repro and r.repro.script:
        console.print(Syntax(r.repro.script, "python", line_numbers=False, word_wrap=True))
