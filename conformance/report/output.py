"""Which console output a run writes: ``--format table`` (a terminal's progress bar, tables and
panels), ``lines`` (a CI log's one line per case, then the failures), ``github`` (lines plus
annotations and a job summary); ``auto`` picks github under GitHub Actions, lines when standard
output is no terminal or ``CI`` is set, else table."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from conformance.report.console import TableWriter
from conformance.report.github import GithubWriter
from conformance.report.lines import LineWriter
from conformance.report.model import RunReport
from conformance.spec.registry import Case
from conformance.vocabulary import CaseResult

FORMATS = ("auto", "table", "lines", "github")


class Writer(Protocol):
    def begin(self, case_ids: Sequence[str]) -> None: ...
    def say(self, line: str) -> None: ...
    def on_start(self, case: Case) -> None: ...
    def on_result(self, result: CaseResult) -> None: ...
    def end(self, report: RunReport) -> None: ...


def choose(requested: str, environ: Mapping[str, str], isatty: bool) -> str:
    """The format ``auto`` stands for here; any other is taken as asked."""
    if requested != "auto":
        return requested
    if environ.get("GITHUB_ACTIONS") == "true":
        return "github"
    if not isatty or environ.get("CI", "").lower() not in ("", "0", "false"):
        return "lines"
    return "table"


def writer(
    requested: str,
    *,
    verbose: bool,
    quiet: bool,
    classify: Callable[[CaseResult], CaseResult],
    environ: Mapping[str, str] | None = None,
) -> Writer:
    environ = os.environ if environ is None else environ
    chosen = choose(requested, environ, sys.stdout.isatty())
    if chosen == "github":
        return GithubWriter(verbose=verbose, quiet=quiet, classify=classify, environ=environ)
    if chosen == "lines":
        return LineWriter(verbose=verbose, quiet=quiet, classify=classify)
    return TableWriter(verbose=verbose, quiet=quiet, classify=classify)
