"""The wire-boundary cases (MALFORMED-*, FLOW-*, AUTH-*) against the reference server with
authentication on (must pass) and against each edge mutant (must fail exactly its declared cases;
in the default zoo scope it runs only those, tests/zoo_scope.py).

These cases cannot run through the zoo's proxy: a proxy re-frames every message and reads eagerly,
so it hides exactly what they check. Their mutants are real servers with one part replaced
(``edge_mutants.py``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from zoo_scope import scope_args

from reference_server.testing import ServerProcess, free_port

from .edge_mutants import EDGE_MUTANTS, EdgeMutant
from .lanes import Outcome, run_harness
from .test_selftest import expand

ROOT = Path(__file__).resolve().parents[2]
REPORTS = Path(os.environ.get("LMRPC_SELFTEST_REPORTS", "reports/selftest")) / "edge"
CLIENT_TOKEN, ADMIN_TOKEN = "edge-client-token", "edge-admin-token"
EDGE_CASES = ("MALFORMED-*", "FLOW-*", "AUTH-*", "LOAD-2", "TRACE-1*")  # the server's own metrics and spans

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("edge") / "tokens"
    path.write_text(f"{CLIENT_TOKEN} client\n{ADMIN_TOKEN} admin\n")
    yield path


def run_against(name: str, tokens: Path, declared: frozenset[str] = frozenset()) -> Outcome:
    """Start the reference server (``name="reference"``) or an edge mutant, run the edge cases (in the
    default zoo scope, a mutant runs only its ``declared`` cases: tests/zoo_scope.py)."""
    metrics_port, otlp_port = free_port(), free_port()
    server = ServerProcess(
        engine="fake",
        launcher=("-m", "tests.selftest.edge_mutants", name),
        args=(
            # a stall timeout that FLOW-1's wait fits at a busy machine's rate (it waits 1.5 x its bound)
            *("--max-parked-tokens", "16", "--stall-timeout", "5", "--auth", str(tokens)),
            *("--metrics-port", str(metrics_port)),
            *("--otlp-endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces"),
        ),
        env={"PYTHONPATH": str(ROOT)},
    ).start()
    try:
        selection = scope_args(expand(declared), REPORTS, name) or tuple(
            arg for glob in EDGE_CASES for arg in ("--run", glob)
        )
        credentials = ("--token", CLIENT_TOKEN, "--admin-token", ADMIN_TOKEN)
        metrics = ("--metrics-url", f"http://127.0.0.1:{metrics_port}/metrics")
        spans = ("--otlp-listen", f"127.0.0.1:{otlp_port}")
        return run_harness(
            server.target, REPORTS, name, time_scale=1.0, extra=(*selection, *credentials, *metrics, *spans)
        )
    finally:
        server.stop()


def test_edge_cases_pass_on_the_reference_and_catch_each_edge_mutant(
    tokens: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    REPORTS.mkdir(parents=True, exist_ok=True)
    runs = {"reference": frozenset[str](), **{m.name: m.expected for m in EDGE_MUTANTS}}
    with ThreadPoolExecutor(2) as pool:
        done = pool.map(lambda name: run_against(name, tokens, runs[name]), runs)
        outcomes = dict(zip(runs, done, strict=True))
    reference = outcomes["reference"]
    ran = {c["id"] for c in reference.report.get("cases", []) if c["verdict"] == "PASS"}  # type: ignore[union-attr]
    problems = [] if not reference.failing else [f"reference: failing {sorted(reference.failing)}"]
    rows = [_row("reference", reference, set())]
    for mutant in EDGE_MUTANTS:
        outcome, want = outcomes[mutant.name], expand(mutant.expected)
        rows.append(_row(mutant.name, outcome, want))
        if outcome.failing != want:
            problems.append(_problem(mutant, outcome, want))
    skipped = {c["id"] for c in reference.report.get("cases", []) if c["verdict"] == "SKIP"}  # type: ignore[union-attr]
    with capsys.disabled():
        print("\n" + "\n".join(rows) + f"\nreference: {len(ran)} edge cases pass, skipped: {sorted(skipped)}")
    assert not skipped, f"edge cases the reference setup should exercise were skipped: {sorted(skipped)}"
    assert not problems, "\n".join(problems)


def _row(name: str, outcome: Outcome, want: set[str]) -> str:
    mark = "ok " if outcome.failing == want else "BAD"
    return (
        f"{mark} {name:26} {outcome.duration_s:5.1f}s  {', '.join(sorted(outcome.failing)) or '(all pass)'}"
    )


def _problem(mutant: EdgeMutant, outcome: Outcome, want: set[str]) -> str:
    return (
        f"{mutant.name} ({mutant.fault}): missing {sorted(want - outcome.failing)}, "
        f"unexpected {sorted(outcome.failing - want)}"
    )
