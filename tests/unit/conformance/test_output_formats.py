"""Console output for CI logs (``--format lines``, ``github``), the format ``auto`` picks, the
version a baseline records, and ``conformance --version``."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from conformance.cases import all_cases
from conformance.cli import main
from conformance.report.baseline import Baseline
from conformance.report.github import GithubWriter, annotation, escape_property, summary_markdown
from conformance.report.lines import FINDING_CHARS, LineWriter, case_line
from conformance.report.model import RunReport
from conformance.report.output import choose
from conformance.vocabulary import HARNESS_VERSION, CaseResult, Mismatch, Repro, Verdict

LONG = "x" * 700


def report() -> RunReport:
    passed = CaseResult("STREAM-1", "STREAM-1", "MUST", Verdict.PASS, 0.12)
    failed = CaseResult("USAGE-2[openai]", "USAGE-2", "MUST", Verdict.FAIL, 1.5)
    failed.mismatches = [
        Mismatch("prompt_tokens of the same prompt", "the same integer", "{'n=1': 39,\n 'n=2': 41}"),
        Mismatch("completion_tokens", "12", LONG, subject="cf-00aa11-2-pool"),
    ]
    failed.reason = failed.mismatches[0].render()
    failed.repro = Repro(script="print(1)", script_path="conformance-repro/USAGE-2_openai.py")
    error = CaseResult(
        "SVC-1", "SVC-1", "MUST", Verdict.ERROR, 0.3, reason="harness error: KeyError: 'a,b: 100%'"
    )
    known = CaseResult("N-1", "N-1", "SHOULD", Verdict.XFAIL, 0.2, baseline_reason="ignores n")
    skipped = CaseResult("LOAD-2", "LOAD-2", "SHOULD", Verdict.SKIP, reason="needs --metrics-url")
    unrun = CaseResult("ADMIN-2", "ADMIN-2", "SHOULD", Verdict.NOT_RUN, reason="not run: --level must")
    run = RunReport("127.0.0.1:1", [passed, failed, error, known, skipped, unrun], protocol="lmrpc")
    run.stale = ["SVC-3: 'x' is gone (passes now); remove it (fixed)"]
    run.duration_s = 12.0
    return run


def written(writer_class: type[LineWriter], run: RunReport, **kwargs: object) -> list[str]:
    out = io.StringIO()
    writer = writer_class(out=out, **kwargs)  # type: ignore[arg-type]
    writer.begin([r.case_id for r in run.results])
    for result in run.results:
        writer.on_result(result)
    writer.end(run)
    return out.getvalue().splitlines()


@pytest.mark.parametrize(
    ("requested", "environ", "isatty", "chosen"),
    [
        ("auto", {"GITHUB_ACTIONS": "true", "CI": "true"}, False, "github"),
        ("auto", {"CI": "true"}, True, "lines"),
        ("auto", {}, False, "lines"),
        ("auto", {"CI": "false"}, True, "table"),
        ("auto", {}, True, "table"),
        ("table", {"GITHUB_ACTIONS": "true"}, False, "table"),
        ("lines", {}, True, "lines"),
    ],
)
def test_auto_picks_github_under_actions_lines_in_a_log_and_a_table_on_a_terminal(
    requested: str, environ: dict[str, str], isatty: bool, chosen: str
) -> None:
    assert choose(requested, environ, isatty) == chosen


def test_lines_give_each_case_one_line_then_each_failure_whole() -> None:
    lines = written(LineWriter, report())
    verdicts = [line.split()[0] for line in lines[:5]]
    assert verdicts == ["PASS", "FAIL", "ERROR", "XFAIL", "SKIP"]  # NOT-RUN only with --verbose
    assert not any("ADMIN-2" in line for line in lines)
    fail = lines[1]
    assert fail.startswith("FAIL    USAGE-2[openai]") and "1.50s" in fail
    assert "prompt_tokens of the same prompt: want the same integer, got {'n=1': 39, 'n=2': 41}" in fail
    assert "known failure: ignores n" in lines[3] and "needs --metrics-url" in lines[4]
    assert all(len(line) <= 100 + FINDING_CHARS for line in lines[:5])
    assert not any(ch in "".join(lines) for ch in "│┃╭╰━─")  # no table, no box
    block = lines[lines.index("== FAIL USAGE-2[openai]") :]
    assert any(line.startswith("USAGE-2 (MUST): ") for line in block)
    assert "    got:  " + LONG in block  # the block has the finding whole
    assert "repro script: python conformance-repro/USAGE-2_openai.py [host:port]" in block
    assert "== ERROR SVC-1" in lines
    assert lines[-3].startswith("STALE BASELINE SVC-3")
    assert lines[-2].startswith("PASS 1 FAIL 1 SKIP 1 NOT-RUN 1 XFAIL 1 ERROR 1")
    assert lines[-1].startswith("lmrpc conformance r")


def test_quiet_lines_keep_the_failures_and_the_summary_and_verbose_lines_every_case() -> None:
    quiet = written(LineWriter, report(), quiet=True)
    case_lines = [line for line in quiet if re.match(r"\S+ +\S+ +\d+\.\d\ds", line)]
    assert [line.split()[:2] for line in case_lines] == [["FAIL", "USAGE-2[openai]"], ["ERROR", "SVC-1"]]
    assert quiet[-1].startswith("lmrpc conformance r")
    verbose = written(LineWriter, report(), verbose=True)
    assert any(line.startswith("NOT-RUN ADMIN-2") for line in verbose)


def test_a_case_line_is_never_wrapped_however_long_its_finding() -> None:
    result = CaseResult("X-1", "STREAM-1", "MUST", Verdict.FAIL, reason="line one\nline two " + LONG)
    line = case_line(result, 10)
    assert "\n" not in line and line.endswith("…") and "line one line two" in line


def test_github_annotates_each_failing_case_and_writes_the_job_summary(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    lines = written(GithubWriter, report(), environ={"GITHUB_STEP_SUMMARY": str(summary)})
    errors = [line for line in lines if line.startswith("::error ")]
    assert len(errors) == 2
    assert errors[0].startswith("::error title=FAIL USAGE-2[openai] (MUST)::USAGE-2: ")
    assert "%0Arepro script: python conformance-repro/USAGE-2_openai.py" in errors[0]
    assert "\n" not in errors[0] and "got {'n=1': 39, 'n=2': 41}" in errors[0]
    assert "100%25" in errors[1]  # a percent sign in the message, escaped
    assert "::group::FAIL USAGE-2[openai]" in lines and "::endgroup::" in lines
    assert any(line.startswith("::warning title=stale baseline entry::SVC-3") for line in lines)
    text = summary.read_text()
    assert text.startswith("earlier step\n## lmrpc conformance r")  # appended, never replaced
    assert "| FAIL | 1 | 0 |" in text and "| XFAIL | 0 | 1 |" in text
    assert "<code>USAGE-2[openai]</code>" in text and "<code>SVC-1</code>" in text
    assert "conformance-repro/USAGE-2_openai.py" in text and "Stale baseline entries (1)" in text


def test_workflow_command_escaping() -> None:
    assert escape_property("a: b, c%\nd") == "a%3A b%2C c%25%0Ad"
    result = CaseResult("A-1[x,y]", "STREAM-1", "MUST", Verdict.FAIL, reason="r")
    assert annotation(result).startswith("::error title=FAIL A-1[x%2Cy] (MUST)::STREAM-1: r")
    assert "|" not in summary_markdown(RunReport("h|1", [result])).split("\n")[2].replace("\\|", "")


def test_a_baseline_records_its_harness_version_and_a_run_of_another_warns(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    failed = CaseResult("STREAM-1", "STREAM-1", "MUST", Verdict.FAIL, reason="broken")
    Baseline().updated([failed], all_cases(), "2026-12-01").write(str(path))
    written_back = Baseline.load(str(path))
    assert written_back.harness_version == HARNESS_VERSION and written_back.version_warning() is None
    path.write_text(path.read_text().replace(f'"{HARNESS_VERSION}"', '"0.0.9"'))
    warning = Baseline.load(str(path)).version_warning()
    assert warning is not None and "0.0.9" in warning and HARNESS_VERSION in warning
    path.write_text('[[known_failure]]\ncase = "X"\nfingerprint = "*"\nreason = "r"\n')
    assert Baseline.load(str(path)).version_warning() is None  # a hand-written one that does not say


def test_version_names_the_contract_and_each_protocols_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"lmrpc conformance {HARNESS_VERSION}\ncontract revision ")
    for protocol in ("lmrpc", "vllm-engine", "sglang-scheduler", "sglang-runtime", "openai"):
        assert f"  {protocol} " in text
    assert "profile r1, " in text
