"""``conformance run`` on a server nobody here wrote, as a user runs it: in a subprocess, its JSON
report read back. The tests that judge llama.cpp, smg and vLLM share it."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness_cli import harness_command

ROOT = Path(__file__).resolve().parents[1]
BASELINES = ROOT / "docs" / "reports" / "baselines"


@dataclass
class Outcome:
    exit_code: int
    report: dict[str, object]
    stdout: str

    def verdicts(self, *kinds: str) -> set[str]:
        cases = self.report.get("cases", [])
        assert isinstance(cases, list)
        return {c["id"] for c in cases if c["verdict"] in kinds}

    @property
    def failing(self) -> set[str]:
        return self.verdicts("FAIL", "ERROR")

    def explain(self) -> str:
        return f"failing {sorted(self.failing)}, stale baseline entries {self.report.get('stale_baseline')}\n{self.stdout}"


def run_conformance(target: str, protocol: str, out: Path, name: str, *extra: str) -> Outcome:
    """``conformance run --protocol PROTOCOL --target TARGET`` with ``extra`` flags; the JSON report
    and repro scripts go to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    report = out / f"{name}.json"
    done = subprocess.run(
        [
            *harness_command(), "run", "--protocol", protocol, "--target", target,
            "--json", str(report), "--repro-dir", str(out / f"{name}-repro"), "--quiet", *extra,
        ],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip
    data = json.loads(report.read_text()) if report.exists() else {"cases": []}
    return Outcome(done.returncode, data, done.stdout[-4000:] + done.stderr[-2000:])
