"""The CLI contract: exit codes for usage errors and unreachable targets; the report is always written."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from conformance.cli import main


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    assert (
        set(report["seen_once"]) == once and "HEALTH-1.1" not in once
    )  # two cases since HEALTH-1[in-flight]
