"""The human view: a progress bar while cases run, then one table per clause group, then every
failure with its clause, want/got lines and repro, then the badge line."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table

from conformance.report.lines import failure_block
from conformance.report.model import RunReport, badge
from conformance.spec.clauses import CLAUSES
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
    for line in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(line)}")
    if report.aborted:
        console.print(f"[bold red]run stopped early:[/] {escape(report.aborted)}")
    counts = report.counts()
    console.print(
        " ".join(f"[{STYLE[v]}]{v.value} {counts[v]}[/]" for v in Verdict if counts[v])
        + f"  in {report.duration_s:.1f}s"
    )
    console.print(f"[bold]{escape(badge(report))}")


def _failure(console: Console, r: CaseResult, verbose: bool, protocol: str) -> None:
    body = "\n".join(_styled(line) for line in failure_block(r, protocol))
    console.print(
        Panel(
            body,
            title=f"[{STYLE[r.verdict]}]{r.verdict.value} {escape(r.case_id)}",
            title_align="left",
            border_style="red",
        )
    )
    if verbose and r.repro and r.repro.script:
        console.print(Syntax(r.repro.script, "python", line_numbers=False, word_wrap=True))


def _styled(line: str) -> str:
    """A line of ``failure_block`` with the terminal's emphasis: headings bold, want green, got red."""
    for prefix, style in (("    want: ", "green"), ("    got:  ", "red")):
        if line.startswith(prefix):
            return f"{prefix}[{style}]{escape(line[len(prefix) :])}[/]"
    if line.startswith("- ") or line in ("findings:", "minimal repro:"):
        return f"[bold]{escape(line)}[/]"
    return escape(line)


class TableWriter:
    """``--format table``: a progress bar while cases run, then the tables and failure panels."""

    def __init__(
        self,
        *,
        verbose: bool = False,
        quiet: bool = False,
        classify: Callable[[CaseResult], CaseResult] = lambda result: result,
        console: Console | None = None,
    ) -> None:
        self.verbose = verbose
        self.quiet = quiet
        self.classify = classify
        self.console = console or Console(highlight=False)
        self._bar: Progress | None = None
        self._on_start: Callable[[Case], None] = lambda case: None
        self._on_result: Callable[[CaseResult], None] = lambda result: None

    def begin(self, case_ids: Sequence[str]) -> None:
        if not self.quiet:
            self._bar, self._on_start, self._on_result = progress_bar(self.console, len(case_ids))
            self._bar.start()

    def say(self, line: str) -> None:
        if not self.quiet:
            self.console.print(escape(line), highlight=False)

    def on_start(self, case: Case) -> None:
        self._on_start(case)

    def on_result(self, result: CaseResult) -> None:
        self._on_result(self.classify(result))

    def end(self, report: RunReport) -> None:
        if self._bar is not None:
            self._bar.stop()
        render(self.console, report, verbose=self.verbose, quiet=self.quiet)
