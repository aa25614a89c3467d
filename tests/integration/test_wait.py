"""``conformance run --wait``: a run started before its server (as a CI step that starts the server
in the background and runs the harness at once) waits for health SERVING instead of stopping at
once with exit 3."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from harness_cli import harness_command

from reference_server.testing import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]


def harness(port: int, report: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*harness_command(), "run", "--target", f"127.0.0.1:{port}", "--run", "SVC-1",
         "--json", str(report), "--quiet", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_run_waits_for_a_server_that_starts_after_it(tmp_path: Path) -> None:
    port = free_port()
    run = harness(port, tmp_path / "report.json", "--wait", "120")
    time.sleep(1.0)  # the harness is already polling a port nobody listens on
    assert run.poll() is None, "the run did not wait"
    with ServerProcess(engine="fake", args=("--port", str(port))):
        assert run.wait(120) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert str(report["settings"]["waited"]).startswith("health is SERVING"), report["settings"]
    assert [c["verdict"] for c in report["cases"]] == ["PASS"]


def test_without_wait_a_missing_server_is_exit_3(tmp_path: Path) -> None:
    assert harness(free_port(), tmp_path / "report.json").wait(60) == 3
