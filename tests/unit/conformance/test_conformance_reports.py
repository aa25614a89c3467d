"""Baselines, exit codes, the badge line, JSON and JUnit reports, repro scripts."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.cases import all_cases
from conformance.report.baseline import Baseline, BaselineError
from conformance.report.files import junit_xml, write_json
from conformance.report.model import RunReport, badge, exit_code
from conformance.report.repro import script
from conformance.spec.clauses import CONTRACT_REVISION
from conformance.vocabulary import Call, CaseResult, Mismatch, Repro, Verdict
from lmrpc.v1 import GenerateRequest, SamplingParams, StoppingCriteria


def result(case_id: str, verdict: Verdict, level: str = "MUST") -> CaseResult:
    return CaseResult(case_id, case_id.split("[")[0], level, verdict)


def failing(case_id: str, *findings: tuple[str, str]) -> CaseResult:
    """A FAIL whose mismatches are (what, want) pairs, with this run's values in them."""
    failed = result(case_id, Verdict.FAIL)
    failed.mismatches = [
        Mismatch(what, want, "x", subject=f"cf-00aa11-{i}-pool") for i, (what, want) in enumerate(findings)
    ]
    failed.reason = failed.mismatches[0].render()
    return failed


CACHED = "Usage.cached_tokens — want >= #"
SORTED = "output # token #.top — want sorted by decreasing logprob"


def test_a_fingerprint_is_what_differs_without_this_runs_values() -> None:
    one = Mismatch("output 0 token 3.top", "sorted by decreasing logprob", "[-0.1, -0.5]", "cf-1a2b3c-4-p")
    other = Mismatch("output 1 token 12.top", "sorted by decreasing logprob", "[-2.0]", "cf-9f8e7d-51-p")
    assert one.fingerprint == other.fingerprint == SORTED
    assert (
        Mismatch("choice indices", "[0, 1]", "[0]").fingerprint
        == Mismatch("choice indices", "[0, 1, 2]", "[]").fingerprint
    )
    assert Mismatch("output 0.top entries", "3", "4").fingerprint != one.fingerprint


def test_baseline_turns_known_findings_into_xfail_and_flags_stale_entries(tmp_path: Path) -> None:
    path = tmp_path / "baseline.toml"
    path.write_text(
        f'[[known_failure]]\ncase = "USAGE-6*"\nfingerprint = "{CACHED}"\nreason = "page-granular cache"\n'
        '[[known_failure]]\ncase = "SVC-3"\nfingerprint = "*"\nreason = "fixed last week"\n'
        '[[known_failure]]\ncase = "NO-SUCH-9"\nfingerprint = "*"\nreason = "renamed"\n'
    )
    results = [
        failing("USAGE-6[short]", ("Usage.cached_tokens", ">= 16")),
        result("USAGE-6[long]", Verdict.PASS),
        result("SVC-3", Verdict.PASS),
    ]
    stale = Baseline.load(str(path)).apply(results, all_cases())
    assert results[0].verdict is Verdict.XFAIL and results[0].baseline_reason == "page-granular cache"
    assert len(stale) == 2 and any("NO-SUCH-9" in s for s in stale) and any("SVC-3" in s for s in stale)


def test_a_baselined_case_that_fails_with_a_new_finding_fails_the_run(tmp_path: Path) -> None:
    path = tmp_path / "baseline.toml"
    path.write_text(f'[[known_failure]]\ncase = "STREAM-7*"\nfingerprint = "{SORTED}"\nreason = "known"\n')
    known_and_new = failing(
        "STREAM-7[openai,pool]",
        ("output 0 token 3.top", "sorted by decreasing logprob"),
        ("output 1.top entries", "2"),
    )
    only_known = failing("STREAM-7[openai,pool]", ("output 4 token 0.top", "sorted by decreasing logprob"))
    baseline = Baseline.load(str(path))
    assert baseline.apply([known_and_new], all_cases()) == []
    assert known_and_new.verdict is Verdict.FAIL
    assert known_and_new.reason.startswith("not in the baseline: output #.top entries — want #")
    assert exit_code(RunReport("t", [known_and_new])) == 1
    assert baseline.apply([only_known], all_cases()) == [] and only_known.verdict is Verdict.XFAIL
    # the known finding gone while the case still fails otherwise: the entry is stale
    other = failing("STREAM-7[openai,pool]", ("output 1.top entries", "2"))
    stale = baseline.apply([other], all_cases())
    assert other.verdict is Verdict.FAIL and len(stale) == 1 and "fails otherwise now" in stale[0]


def test_write_baseline_keeps_seen_findings_drops_gone_ones_and_adds_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "baseline.toml"
    path.write_text(
        f'[[known_failure]]\ncase = "USAGE-6*"\nfingerprint = "{CACHED}"\nreason = "page-granular cache"\n'
        'issue = "https://x/1"\n'
        '[[known_failure]]\ncase = "SVC-3"\nfingerprint = "*"\nreason = "fixed last week"\n'
        '[[known_failure]]\ncase = "STREAM-1"\nfingerprint = ["a", "b"]\nreason = "not run this time"\n'
        '[[known_failure]]\ncase = "NO-SUCH-9"\nfingerprint = "*"\nreason = "renamed"\n'
    )
    results = [
        failing("USAGE-6[short]", ("Usage.cached_tokens", ">= 16")),
        result("USAGE-6[long]", Verdict.PASS),
        result("SVC-3", Verdict.PASS),
        failing("ERR-1[control]", ("Tokenize status", '"INVALID_ARGUMENT"')),
        result("SVC-1", Verdict.PASS),
    ]
    old = Baseline.load(str(path))
    old.apply(results, all_cases())
    new = old.updated(results, all_cases(), "2026-11-23")
    new.write(str(path))
    reloaded = Baseline.load(str(path))
    assert [(e.case, e.fingerprints, e.reason, e.issue) for e in reloaded.entries] == [
        ("STREAM-1", ("a", "b"), "not run this time", ""),
        ("USAGE-6*", (CACHED,), "page-granular cache", "https://x/1"),
        (
            "ERR-1[control]",
            ("Tokenize status — want '…'",),
            "recorded 2026-11-23 by --write-baseline: cf-00aa11-0-pool: Tokenize status: want "
            '"INVALID_ARGUMENT", got x',
            "",
        ),
    ]
    # the written baseline, applied to the same results, is exactly right: nothing stale, no FAIL left
    fresh = [
        r if r.verdict is Verdict.PASS else failing(r.case_id, *[(m.what, m.want) for m in r.mismatches])
        for r in results
    ]
    assert reloaded.apply(fresh, all_cases()) == []
    assert {r.case_id for r in fresh if r.verdict is Verdict.XFAIL} == {"USAGE-6[short]", "ERR-1[control]"}


@pytest.mark.parametrize(
    "text",
    [
        '[[known_failure]]\ncase = "SVC-3"\nfingerprint = "*"\n',
        '[[known_failure]]\nreason = "x"\nfingerprint = "*"\n',
        '[[known_failure]]\ncase = "SVC-3"\nreason = "no fingerprint: it would hide every finding"\n',
        '[[known_failure]]\ncase = "SVC-3"\nfingerprint = "*"\nreason = " "\n',
        "oops = 1\n",
        "not toml [",
    ],
)
def test_malformed_baselines_are_usage_errors(tmp_path: Path, text: str) -> None:
    path = tmp_path / "b.toml"
    path.write_text(text)
    with pytest.raises(BaselineError):
        Baseline.load(str(path))


def test_exit_codes_and_badge() -> None:
    passing = RunReport(
        "t",
        [
            result("SVC-3", Verdict.PASS),
            result("TOK-2", Verdict.PASS, "SHOULD"),
            result("CAP-1[embed]", Verdict.SKIP),
        ],
    )
    assert exit_code(passing) == 0
    assert badge(passing) == f"lmrpc conformance r{CONTRACT_REVISION}: MUST 1/1 PASS, SHOULD 1/1"
    failing = RunReport("t", [result("SVC-3", Verdict.FAIL), result("SVC-1", Verdict.PASS)])
    assert exit_code(failing) == 1 and badge(failing).endswith("MUST 1/2 FAIL, SHOULD not run")
    assert exit_code(RunReport("t", [result("SVC-3", Verdict.ERROR)])) == 3
    assert exit_code(RunReport("t", [], aborted="unreachable")) == 3
    assert exit_code(RunReport("t", [result("SVC-3", Verdict.XFAIL)], stale=["x"])) == 4
    assert exit_code(RunReport("t", [result("SVC-3", Verdict.FAIL)], stale=["x"])) == 1


def test_json_and_junit(tmp_path: Path) -> None:
    failed = result("USAGE-3", Verdict.FAIL)
    failed.mismatches = [Mismatch("Usage.completion_tokens", "6", "7")]
    failed.repro = Repro(kind="example", example="GenerateRequest(text='x')", script="print(1)\n")
    report = RunReport(
        "127.0.0.1:1", [failed, result("SVC-3", Verdict.PASS), result("TOK-2", Verdict.SKIP, "SHOULD")]
    )
    write_json(report, str(tmp_path / "r.json"))
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema"] == "lmrpc-conformance/1" and data["exit_code"] == 1
    record = data["cases"][0]
    assert record["clause"] == "USAGE-3" and record["level"] == "MUST" and record["verdict"] == "FAIL"
    assert record["mismatches"] == [
        {
            "what": "Usage.completion_tokens",
            "want": "6",
            "got": "7",
            "subject": "",
            "fingerprint": "Usage.completion_tokens — want #",
        }
    ]
    assert record["findings"] == [{"fingerprint": "Usage.completion_tokens — want #", "count": 1}]
    assert record["repro"]["script"] == "print(1)\n" and "duration_s" in record
    root = ET.fromstring(junit_xml(report))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["USAGE-3"].find("failure") is not None
    assert "USAGE-3 (MUST)" in (cases["USAGE-3"].find("failure").text or "")  # type: ignore[union-attr]
    assert cases["TOK-2"].find("skipped") is not None


def test_repro_script_is_valid_python_that_rebuilds_the_requests() -> None:
    request = GenerateRequest(
        request_id="r-1",
        text='héllo "quoted"',
        sampling=SamplingParams(temperature=float("nan")),
        stopping=StoppingCriteria(max_tokens=3, stop_strings=["\n"]),
    )
    text = script(
        "USAGE-3",
        "127.0.0.1:50051",
        [Call(0.0, "inference", "generate", request, cancel_after=2), Call(0.1, "control", "abort", request)],
    )
    compile(text, "repro.py", "exec")
    assert "cancel_after=2" in text and "client.control.abort(" in text
    namespace: dict[str, object] = {}
    exec("from lmrpc.v1 import *\nnan = float('nan')\nvalue = " + repr(request), namespace)
    rebuilt = namespace["value"]
    assert isinstance(rebuilt, GenerateRequest) and rebuilt.text == request.text


def test_an_intermittent_entry_excuses_its_finding_and_is_never_stale(tmp_path: Path) -> None:
    path = tmp_path / "baseline.toml"
    path.write_text(
        f'[[known_failure]]\ncase = "STREAM-7*"\nfingerprint = "{SORTED}"\nreason = "sampled output"\n'
        "intermittent = true\n"
    )
    baseline = Baseline.load(str(path))
    seen = failing("STREAM-7[openai,pool]", ("output 0 token 3.top", "sorted by decreasing logprob"))
    assert baseline.apply([seen], all_cases()) == [] and seen.verdict is Verdict.XFAIL
    assert baseline.apply([result("STREAM-7[openai,pool]", Verdict.PASS)], all_cases()) == []
    written = baseline.updated([result("STREAM-7[openai,pool]", Verdict.PASS)], all_cases(), "2026-11-28")
    assert [(e.fingerprints, e.intermittent) for e in written.entries] == [((SORTED,), True)]
