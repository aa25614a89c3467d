"""The OpenAI profile judged by its own mutants: smg in front of the reference server (fake engine,
2 ms per token) behind a mutating proxy. The correct proxy must pass every case; each of the
one-fault mutants (tests/openai_compat/mutants.py, modelled on bugs real OpenAI-compatible servers
have had) must fail its declared cases, and may fail its tolerated ones (in the default zoo scope it runs
only those; with LMRPC_SELFTEST_ZOO=full it runs every case and must fail nothing else:
tests/zoo_scope.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from zoo_process import start_zoo
from zoo_scope import SCOPE, scope_args

from conformance.cases import all_cases
from conformance.spec.registry import matches

from .mutants import CONTROLS, MUTANTS
from .servers import ROOT, run_openai, smg_in_front

MIN_MUTANTS = 20
REPORTS = ROOT / "reports" / "selftest" / "openai"
UPSTREAM_ARGS = (
    "--fake-token-delay",
    "0.002",
)  # long streams last seconds: disconnects and unread streams bite

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def expand(patterns: frozenset[str]) -> set[str]:
    """Case IDs of the OpenAI profile: an exact ID names that case, a pattern with * or ? a glob."""
    cases = [c for c in all_cases() if "openai" in c.protocols]
    ids = {c.id for c in cases}
    found: set[str] = set()
    for pattern in patterns:
        hits = (
            {pattern} if pattern in ids else {c.id for c in cases if "*" in pattern and matches(pattern, c)}
        )
        assert hits, f"pattern {pattern!r} names no case of the OpenAI profile"
        found |= hits
    return found


def test_every_mutant_declares_real_cases() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)), "mutant names must be unique"
    assert len(MUTANTS) >= MIN_MUTANTS
    for mutant in MUTANTS:
        assert mutant.expected, f"{mutant.name} declares no expected failure"
        assert mutant.describe(), f"{mutant.name} does not say what its fault is"
        assert not expand(mutant.expected) & expand(mutant.tolerated), mutant.name


@pytest.fixture(scope="module")
def zoo() -> Iterator[dict[str, int]]:
    with smg_in_front("fake", UPSTREAM_ARGS) as gateway:
        process, ports = start_zoo("tests.openai_compat.zoo", "--upstream", gateway.url, timeout_s=60)
        try:
            yield ports
        finally:
            process.terminate()
            process.wait(10)


def test_each_mutant_fails_exactly_its_cases(zoo: dict[str, int]) -> None:
    problems, rows = [], []
    for mutant in (*CONTROLS, *MUTANTS):
        expected, tolerated = expand(mutant.expected), expand(mutant.tolerated)
        scope = scope_args(expected | tolerated | mutant.runs, REPORTS, mutant.name, fixed=bool(mutant.runs))
        outcome = run_openai(f"http://127.0.0.1:{zoo[mutant.name]}", REPORTS, mutant.name, *scope)
        failing = outcome.failing
        missed, extra = expected - failing, failing - expected - tolerated
        rows.append(
            f"{mutant.name:36s} {'caught' if expected and not missed else 'control':8s} {sorted(failing)}"
        )
        if missed or extra or (not expected and outcome.exit_code != 0):
            problems.append(
                f"{mutant.name}: missed {sorted(missed)}, extra {sorted(extra)}, exit {outcome.exit_code}\n{outcome.stdout}"
            )
    print("\n".join(rows))
    caught = sum(1 for m in MUTANTS if not any(p.startswith(f"{m.name}:") for p in problems))
    print(f"OpenAI profile mutation score: {caught}/{len(MUTANTS)} ({SCOPE})")
    assert not problems, "\n\n".join(problems)
