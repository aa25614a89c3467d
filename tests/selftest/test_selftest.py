"""The harness against the reference server (must pass 100%) and against every mutant (must fail
its declared cases: only those it declares in the default zoo scope, exactly those among all cases
with LMRPC_SELFTEST_ZOO=full; tests/zoo_scope.py). Prints the detection matrix and the mutation
score."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from harness_cli import assert_fields_covered
from zoo_scope import SCOPE, scope_args

from conformance.cases import all_cases
from conformance.spec.coverage import CLASSES
from conformance.spec.registry import matches

from .lanes import KNOWN_FAILURES, Lane, Outcome, _cases, run_harness, triggered
from .mutants import MUTANTS, Mutant

TIME_SCALE = float(os.environ.get("LMRPC_SELFTEST_TIME_SCALE", "0.5"))
LANES = int(os.environ.get("LMRPC_SELFTEST_LANES", "3"))
STATEFUL = "[stateful]"  # the state machine's cases: timing decides whether one run trips a fault
REPORTS = Path(os.environ.get("LMRPC_SELFTEST_REPORTS", "reports/selftest"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # the whole zoo runs inside one test


def known_failures() -> set[str]:
    """Cases the reference server itself still fails (its baseline): they are XFAIL on every lane."""
    with KNOWN_FAILURES.open("rb") as handle:
        return {entry["case"] for entry in tomllib.load(handle).get("known_failure", [])}


def expand(patterns: frozenset[str]) -> set[str]:
    """Case IDs: an exact ID names that case only; a pattern with ``*`` or ``?`` is a glob."""
    cases = [c for c in all_cases() if "lmrpc" in c.protocols]  # the cases its zoo is judged by
    ids = {c.id for c in cases}
    found = set()
    for pattern in patterns:
        hits = (
            {pattern} if pattern in ids else {c.id for c in cases if "*" in pattern and matches(pattern, c)}
        )
        assert hits, f"expected pattern {pattern!r} names no case"
        found |= hits
    return found


@pytest.fixture(scope="module")
def lanes() -> Iterator[list[Lane]]:
    with ThreadPoolExecutor(LANES) as pool:
        started = list(pool.map(lambda _: Lane.start(), range(LANES)))
    try:
        yield started
    finally:
        for lane in started:
            lane.stop()


def test_every_mutant_declares_real_cases() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)), "mutant names must be unique"
    assert sum(not m.is_control for m in MUTANTS) >= 20
    for mutant in MUTANTS:
        assert mutant.is_control or mutant.expected, f"{mutant.name} declares no expected failure"
        expand(mutant.expected | mutant.tolerated)
        assert not mutant.expected & mutant.tolerated, mutant.name
        assert mutant.triggered_by <= set(CLASSES), f"{mutant.name}: unknown input classes"


def test_reference_server_passes(lanes: list[Lane]) -> None:
    REPORTS.mkdir(parents=True, exist_ok=True)
    fields = REPORTS / "reference.fields.json"
    outcome = run_harness(
        lanes[0].server.target, REPORTS, "reference", time_scale=TIME_SCALE, extra=("--fields", str(fields))
    )
    assert outcome.failing == set(), _explain(outcome)
    assert outcome.exit_code == 0
    assert not undelivered_sends(outcome), undelivered_sends(outcome)
    print(assert_fields_covered(fields))


def undelivered_sends(outcome: Outcome) -> list[str]:
    """Cases whose declared input classes (conformance list --coverage) their calls did not send."""
    sent = {c["id"]: set(c.get("sent", [])) for c in _cases(outcome.report) if c["verdict"] == "PASS"}
    problems = []
    for case in all_cases():
        declared = {s for s in case.sends if CLASSES[s].sent is not None}
        if case.id in sent and not declared <= sent[case.id]:
            problems.append(f"{case.id} declares {sorted(declared - sent[case.id])} but never sent them")
    return problems


# A proxy re-frames every message and reads its upstream eagerly, so the cases of the wire boundary
# see the proxy, not the server behind it; test_edge_selftest.py runs them against edge mutants.
THROUGH_A_PROXY_SKIP = ("--skip", "MALFORMED-*", "--skip", "FLOW-*")


def _run_lane(lane: Lane, mutants: list[type[Mutant]]) -> list[Outcome]:  # one lane, one mutant at a time
    outcomes = []
    for mutant in mutants:
        lane.reset()
        outcomes.append(
            run_harness(
                lane.target(mutant.name),
                REPORTS,
                mutant.name,
                time_scale=TIME_SCALE * mutant.time_scale,
                extra=THROUGH_A_PROXY_SKIP
                + scope_args(expand(mutant.expected | mutant.tolerated), REPORTS, mutant.name),
            )
        )
    return outcomes


def test_mutants_fail_exactly_their_cases(lanes: list[Lane], capsys: pytest.CaptureFixture[str]) -> None:
    REPORTS.mkdir(parents=True, exist_ok=True)
    plan: list[list[type[Mutant]]] = [[] for _ in lanes]
    for i, mutant in enumerate(sorted(MUTANTS, key=lambda m: m.name)):
        plan[i % len(lanes)].append(mutant)
    plan[0].insert(0, _ReferenceProxy)
    with ThreadPoolExecutor(len(lanes)) as pool:
        outcomes = {o.mutant: o for lane_outcomes in pool.map(_run_lane, lanes, plan) for o in lane_outcomes}
    problems, rows, detected = [], [], 0
    stateful_wanted = stateful_seen = 0
    candidates: list[type[Mutant]] = [_ReferenceProxy, *MUTANTS]
    for mutant in candidates:
        outcome = outcomes[mutant.name]
        declared = expand(mutant.expected)
        # The state machine's random programs race aborts, cancels and deadlines against
        # generation, so whether one run trips a given mutant is timing; they are counted
        # across the zoo below instead of required per mutant.
        stateful = {case_id for case_id in declared if case_id.endswith(STATEFUL)}
        want, may = declared - stateful - known_failures(), expand(mutant.tolerated) | stateful
        if mutant.is_control or mutant is _ReferenceProxy:
            may = expand(mutant.tolerated)  # a correct server must pass every case, the machine's too
        else:  # on a broken server the machine may also trip over the fault through another invariant
            may |= {case_id for case_id in outcome.failing if case_id.endswith(STATEFUL)}
            may |= triggered(outcome.report, mutant.triggered_by)
        stateful_wanted += len(stateful)
        stateful_seen += len(stateful & outcome.failing)
        good = want <= outcome.failing <= want | may and outcome.exit_code == (1 if outcome.failing else 0)
        detected += bool(outcome.failing) and not mutant.is_control and mutant is not _ReferenceProxy
        rows.append(
            f"{'ok ' if good else 'BAD'} {mutant.name:28} exit {outcome.exit_code} "
            f"{outcome.duration_s:5.1f}s  {', '.join(sorted(outcome.failing)) or '(all pass)'}"
        )
        if not good:
            problems.append(
                f"{mutant.name}: missing {sorted(want - outcome.failing)}, "
                f"unexpected {sorted(outcome.failing - want - may)}, exit {outcome.exit_code}"
            )
    broken = [m for m in MUTANTS if not m.is_control]
    summary = (
        f"mutation score: {detected}/{len(broken)} mutants detected, "
        f"{len(rows) - len(problems)}/{len(rows)} with exactly the declared failures "
        f"({SCOPE}); "
        f"state machine: {stateful_seen}/{stateful_wanted} of its declared detections"
    )
    if 2 * stateful_seen < stateful_wanted:
        problems.append(f"the state machine caught only {stateful_seen} of {stateful_wanted} declared faults")
    (REPORTS / "matrix.txt").write_text("\n".join([*rows, summary]) + "\n")
    with capsys.disabled():
        print("\n" + "\n".join(rows) + "\n" + summary)
    assert not problems, "\n".join(problems)


class _ReferenceProxy(Mutant):
    """The unmutated proxy: proves the proxy itself is transparent."""

    name = "reference-proxy"
    is_control = True


def _explain(outcome: Outcome) -> str:
    lines = [f"exit {outcome.exit_code}, failing {sorted(outcome.failing)}"]
    for case in _cases(outcome.report):
        if case["verdict"] not in ("PASS", "SKIP"):
            lines.append(f"  {case['id']}: {case['verdict']} {case['reason']}")
    return "\n".join(lines)
