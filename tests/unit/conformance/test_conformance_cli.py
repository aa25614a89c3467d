"""The CLI contract: exit codes for usage errors and unreachable targets; the report is always written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.report.coverage import seen_once, seen_once_because, stale_exceptions
from conformance.spec.coverage import SEEN_ONCE_BECAUSE
from reference_server.testing import free_port


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["run"],
        ["run", "--target", "nohostport"],
        ["run", "--target", "h:1", "--level", "may"],
        ["run", "--target", "h:1", "--time-scale", "0"],
        ["run", "--target", "h:1", "--run", "NO-SUCH-CLAUSE"],
        ["run", "--target", "h:1", "--baseline", "/nonexistent.toml"],
        ["replay", "/nonexistent.json"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2


def test_unreachable_target_exits_3_and_still_writes_reports(tmp_path: Path) -> None:
    report, junit = tmp_path / "r.json", tmp_path / "j.xml"
    code = main(
        [
            "run",
            "--target",
            f"127.0.0.1:{free_port()}",
            "--level",
            "must",
            "--json",
            str(report),
            "--junit",
            str(junit),
            "--time-scale",
            "0.2",
            "--quiet",
            "--repro-dir",
            str(tmp_path / "repro"),
        ]
    )
    assert code == 3
    data = json.loads(report.read_text())
    assert data["exit_code"] == 3 and "unreachable" in data["aborted"]
    assert data["cases"] and all(c["verdict"] == "NOT-RUN" for c in data["cases"])
    assert junit.read_text().startswith("<?xml")


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--json", "--run", "ABORT-4"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in listed] == ["ABORT-4[n=2]", "ABORT-4[n=4]"]
    assert listed[0]["requires"] == ["max_outputs>=2"] and listed[0]["level"] == "MUST"


def test_list_coverage_has_no_gap(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--coverage", "--json"]) == 0, capsys.readouterr().out[-2000:]
    report = json.loads(capsys.readouterr().out)
    assert not report["gaps"]
    assert all(report["input_classes"].values()) and all(report["must_sentences"].values())
    once = {sid for sid, who in report["must_sentences"].items() if len(who) == 1}
    excepted = report["seen_once_because"]
    assert excepted == SEEN_ONCE_BECAUSE and set(excepted) <= once  # no exception is stale
    assert all(reason.strip() for reason in excepted.values())
    assert report["seen_once"] == []  # every other sentence is seen by two cases
    assert "HEALTH-1.1" not in once  # two cases since HEALTH-1[in-flight]


def test_list_coverage_prints_each_exception_with_its_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one table row a line, reasons unwrapped
    assert main(["list", "--coverage"]) == 0
    out = capsys.readouterr().out
    assert f"{len(SEEN_ONCE_BECAUSE)} MUST sentences seen by one case on purpose" in out
    for sid, reason in SEEN_ONCE_BECAUSE.items():
        assert any(sid in line and reason in line for line in out.splitlines()), sid


def test_seen_once_leaves_out_the_sentences_an_exception_explains() -> None:
    observers = {"X-1.1": ["X-1"], "X-1.2": ["X-1"], "X-1.3": ["X-1", "X-1[b]"]}
    because = {"X-1.1": "one static answer"}
    assert seen_once(observers, because) == ["X-1.2"]
    assert seen_once_because(observers, because) == because
    assert stale_exceptions(observers, because) == []
    assert stale_exceptions(observers, {"X-1.3": "observed twice", "X-9.9": "no such sentence"}) == [
        "SEEN_ONCE_BECAUSE names a sentence that does not exist: X-9.9",
        "SEEN_ONCE_BECAUSE[X-1.3]: 2 cases observe it, so it needs no exception",
    ]


def test_an_exception_that_no_longer_holds_is_a_gap(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(SEEN_ONCE_BECAUSE, "X-9.9", "names no sentence")
    monkeypatch.setitem(SEEN_ONCE_BECAUSE, "HEALTH-1.1", "two cases observe it since HEALTH-1[in-flight]")
    assert main(["list", "--coverage", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert len(report["gaps"]) == 2
    assert any("X-9.9" in gap and "does not exist" in gap for gap in report["gaps"])
    assert any("HEALTH-1.1" in gap and "cases observe it" in gap for gap in report["gaps"])
    assert "X-9.9" not in report["seen_once_because"] and "HEALTH-1.1" not in report["seen_once_because"]
