"""The cases that restart and drain the server through the user's hooks (SVC-4, LIFE-1), against
the reference server under a supervisor (must pass) and against each lifecycle mutant (must fail
exactly its declared cases). The hooks are shell commands, as a user gives them: they signal the
server the supervisor runs (``supervisor.py``), and the harness sees only the address."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reference_server.testing import free_port

from .lanes import Outcome, run_harness
from .lifecycle_mutants import LIFECYCLE_MUTANTS
from .supervisor import drain_hook, restart_hook

ROOT = Path(__file__).resolve().parents[2]
REPORTS = Path(os.environ.get("LMRPC_SELFTEST_REPORTS", "reports/selftest")) / "lifecycle"
DRAINS = {"lmrpc": "LIFE-1[drain]", "vllm-engine": "SMG-5[drain]", "sglang-scheduler": "SMG-5[drain]"}
REFERENCE_RUNS = tuple(("reference", protocol) for protocol in DRAINS)
DRAIN_TIMEOUT_S = "4"  # LIFE-1[drain]'s long stream outlives it and must end ABORTED with usage
TOKEN_DELAY_S = "0.02"  # its short stream is still in flight when the drain begins

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run_supervised(name: str, protocol: str, state: Path) -> tuple[Outcome, list[str]]:
    """The reference (``name="reference"``) or a lifecycle mutant under the supervisor; the hook
    cases run against it in ``protocol``. Returns the harness's outcome and the server processes'
    exit statuses."""
    port, sglang_scheduler_port = free_port(), free_port()
    server = (
        *(sys.executable, "-m", "tests.selftest.lifecycle_mutants", name),
        *("--engine", "fake", "--port", str(port), "--fake-token-delay", TOKEN_DELAY_S),
        *("--drain-timeout", DRAIN_TIMEOUT_S, "--sglang-scheduler-port", str(sglang_scheduler_port)),
    )
    target = f"127.0.0.1:{sglang_scheduler_port if protocol == 'sglang-scheduler' else port}"
    state.mkdir(parents=True)
    supervisor = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/selftest/supervisor.py"), str(state), "--", *server],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=(state / "server.log").open("w"),
        start_new_session=True,
    )
    try:
        hooks = ("--restart-hook", restart_hook(state), "--drain-hook", drain_hook(state))
        selection = [
            arg for case_id in ("SVC-4", "SVC-4[restart]", DRAINS[protocol]) for arg in ("--run", case_id)
        ]
        extra = (*selection, *hooks, "--protocol", protocol, "--wait", "120")
        outcome = run_harness(target, REPORTS, f"{name}-{protocol}", time_scale=1.0, extra=extra)
        (state / "stop").touch()
        supervisor.wait(60)
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
    exits = (state / "exits").read_text().split() if (state / "exits").exists() else []
    return outcome, exits


def test_hook_cases_pass_on_the_reference_and_catch_each_lifecycle_mutant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    REPORTS.mkdir(parents=True, exist_ok=True)
    runs = [*REFERENCE_RUNS, *((m.name, m.protocol) for m in LIFECYCLE_MUTANTS)]
    with ThreadPoolExecutor(2) as pool:
        done = pool.map(lambda run: run_supervised(*run, tmp_path / "-".join(run)), runs)
        outcomes = dict(zip(runs, done, strict=True))
    problems, rows = [], []
    for protocol, drain in DRAINS.items():
        outcome, exits = outcomes["reference", protocol]
        verdicts = {c["id"]: c["verdict"] for c in outcome.report.get("cases", [])}  # type: ignore[union-attr]
        passing = sorted(case_id for case_id, verdict in verdicts.items() if verdict == "PASS")
        rows.append(f"reference {protocol:16} {outcome.duration_s:5.1f}s  pass: {passing}")
        if passing != sorted(("SVC-4", "SVC-4[restart]", drain)) or outcome.failing:
            problems.append(f"reference in {protocol}: {verdicts}")
        if exits != ["0", "0"]:  # the restart, then the drain: each a clean exit (LIFE-1)
            problems.append(f"reference in {protocol}: server exit statuses {exits}, want ['0', '0']")
    for mutant in LIFECYCLE_MUTANTS:
        outcome, _ = outcomes[mutant.name, mutant.protocol]
        rows.append(f"{mutant.name:30} {outcome.duration_s:5.1f}s  {sorted(outcome.failing) or '(all pass)'}")
        if outcome.failing != mutant.expected:
            problems.append(
                f"{mutant.name} ({mutant.fault}): missing {sorted(mutant.expected - outcome.failing)}, "
                f"unexpected {sorted(outcome.failing - mutant.expected)}"
            )
    with capsys.disabled():
        print("\n" + "\n".join(rows))
    assert not problems, "\n".join(problems)
