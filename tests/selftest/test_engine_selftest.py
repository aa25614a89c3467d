"""The harness through its engine-protocol drivers: against the reference server's vLLM dialect
(main port), SGLang scheduler protocol (``--sglang-scheduler-port``) and SGLang's native service
(``--sglang-runtime-port``) it must pass with 0 failures, with ``--protocol auto`` picking each
port's protocol; against every mutant of each protocol's zoo
(tests/selftest/protocols/) it must fail the mutant's declared cases (exactly those, among all
cases, with LMRPC_SELFTEST_ZOO=full: tests/zoo_scope.py). Prints the detection
matrix and the mutation score per protocol."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from harness_cli import assert_fields_covered
from zoo_scope import SCOPE, scope_args

from conformance.cases import all_cases
from conformance.spec.coverage import CLASSES
from conformance.spec.registry import matches
from reference_server.testing import ServerProcess, free_port

from .lanes import Outcome, _cases, run_harness, triggered
from .protocols.engine_proxy import EngineProxy, RuntimeProxy
from .protocols.lanes import EngineLane, server_target
from .protocols.sglang_runtime_openai_faults import SGLANG_RUNTIME_OPENAI_MUTANTS
from .protocols.zoo import REFERENCE, ZOOS

TIME_SCALE = float(os.environ.get("LMRPC_SELFTEST_TIME_SCALE", "0.5"))
LANES = int(os.environ.get("LMRPC_ENGINE_SELFTEST_LANES", "2"))
REPORTS = Path(os.environ.get("LMRPC_SELFTEST_REPORTS", "reports/selftest")) / "engines"
ASSUME = {  # what the reference server promises that neither protocol can advertise
    "vllm-engine": "deterministic_greedy,prefix_cache,seeded_sampling",
    "sglang-scheduler": "deterministic_greedy,prefix_cache",  # no seed field
    "sglang-runtime": "deterministic_greedy,prefix_cache",  # no seed field
}
RUNTIME = "sglang-runtime"  # SGLang's native service: its reference run and --protocol auto
MIN_MUTANTS = 15

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the whole zoo runs inside one test (760 s quiet)


def expand(patterns: frozenset[str]) -> set[str]:
    """Case IDs: an exact ID names that case only; a pattern with ``*`` or ``?`` is a glob."""
    cases = [c for c in all_cases() if "openai" not in c.protocols]  # the gRPC protocols' cases
    found: set[str] = set()
    for pattern in patterns:
        hits = {pattern} if pattern in {c.id for c in cases} else {c.id for c in cases if matches(pattern, c)}
        assert hits, f"expected pattern {pattern!r} names no case"
        found |= hits
    return found


def harness_args(protocol: str) -> tuple[str, ...]:
    return ("--protocol", protocol, "--assume", ASSUME[protocol])


@pytest.fixture(scope="module")
def lanes() -> Iterator[list[EngineLane]]:
    with ThreadPoolExecutor(LANES) as pool:
        started = list(pool.map(lambda _: EngineLane.start(), range(LANES)))
    try:
        yield started
    finally:
        for lane in started:
            lane.stop()


@pytest.mark.parametrize("protocol", sorted(ZOOS))
def test_every_engine_mutant_declares_real_cases(protocol: str) -> None:
    _, mutants = ZOOS[protocol]
    names = [m.name for m in mutants]
    assert len(names) == len(set(names)), "mutant names must be unique"
    assert sum(not m.is_control for m in mutants) >= MIN_MUTANTS
    assert any(m.is_control for m in mutants), "at least one correct variant must pass everything"
    for mutant in mutants:
        assert mutant.is_control or mutant.expected, f"{mutant.name} declares no expected failure"
        assert not (mutant.is_control and mutant.expected), mutant.name
        assert mutant.describe(), f"{mutant.name} does not say what its fault is"
        expand(mutant.expected | mutant.tolerated)
        assert mutant.triggered_by <= set(CLASSES), f"{mutant.name}: unknown input classes"


def test_reference_server_passes_in_each_protocol(lanes: list[EngineLane]) -> None:
    REPORTS.mkdir(parents=True, exist_ok=True)
    lane = lanes[0]
    fields = [REPORTS / f"reference-{protocol}.fields.json" for protocol in ZOOS]
    for protocol, field_file in zip(
        ZOOS, fields, strict=True
    ):  # one after the other: load-watching cases need a quiet server
        lane.reset()
        outcome = run_harness(
            lane.server_target(protocol),
            REPORTS,
            f"reference-{protocol}",
            time_scale=TIME_SCALE,
            extra=(*harness_args(protocol), "--fields", str(field_file)),
        )
        assert outcome.failing == set(), _explain(outcome)
        assert outcome.exit_code == 0, _explain(outcome)
        assert outcome.report["protocol"] == protocol
        passed = [c for c in _cases(outcome.report) if c["verdict"] == "PASS"]
        assert len(passed) >= 50, f"{protocol}: only {len(passed)} cases ran"
    print(assert_fields_covered(*fields))


@pytest.mark.parametrize("protocol", sorted(ZOOS))
def test_auto_picks_each_ports_protocol(lanes: list[EngineLane], protocol: str) -> None:
    """``--protocol auto`` on the main port finds lmrpc.v1 (the complete contract, checked first);
    with lmrpc.v1 out of the way (a proxy of the vLLM dialect) it finds vLLM, and on the SGLang port
    SGLang: smg's probe order."""
    REPORTS.mkdir(parents=True, exist_ok=True)
    lane = lanes[0]
    targets = {"its-proxy": (protocol, lane.target(protocol, REFERENCE))}  # that protocol's service only
    if protocol in ("sglang-scheduler", RUNTIME):
        targets["its-port"] = (protocol, lane.server_target(protocol))
    else:  # the main port serves lmrpc.v1 and the vLLM dialect
        targets["main-port"] = ("lmrpc", lane.server_target(protocol))
    for where, (want, target) in targets.items():
        outcome = run_harness(
            target,
            REPORTS,
            f"auto-{protocol}-{where}",
            time_scale=TIME_SCALE,
            extra=("--protocol", "auto", "--run", "SVC-1"),
        )
        assert outcome.report["protocol"] == want, (
            f"{where}: --protocol auto picked {outcome.report['protocol']}"
        )
        settings = outcome.report["settings"]
        assert isinstance(settings, dict) and str(settings["protocol"]).startswith("--protocol auto"), (
            settings
        )
        assert outcome.failing == set() and outcome.exit_code == 0, _explain(outcome)


def test_auto_finds_sglangs_native_service(lanes: list[EngineLane]) -> None:
    """On the ``--sglang-runtime-port`` (sglang.runtime.v1 only) ``--protocol auto`` finds it, after
    lmrpc.v1 and smg's engine protocols answered no, and every SRT case runs and passes."""
    REPORTS.mkdir(parents=True, exist_ok=True)
    outcome = run_harness(
        lanes[0].server_target(RUNTIME),
        REPORTS,
        "auto-sglang-runtime",
        time_scale=TIME_SCALE,
        extra=("--protocol", "auto", "--assume", ASSUME[RUNTIME], "--run", "SVC-1", "--run", "SRT-*"),
    )
    assert outcome.report["protocol"] == RUNTIME, _explain(outcome)
    ran = {c["id"] for c in _cases(outcome.report) if c["verdict"] == "PASS"}
    assert {"SRT-1[ids]", "SRT-1[text]", "SRT-2", "SRT-3", "SRT-4[rid]", "SRT-4[abort_all]"} <= ran, ran
    assert outcome.failing == set() and outcome.exit_code == 0, _explain(outcome)


def test_the_openai_api_through_sglangs_native_service(lanes: list[EngineLane]) -> None:
    """``--target sglang-runtime://HOST:PORT`` judges ChatComplete and Complete by the OpenAI profile:
    the reference server (directly and through the zoo's unmutated proxy) passes, and each OpenAI
    mutant of the pass-through fails its declared cases (and at most those it may also fail)."""
    REPORTS.mkdir(parents=True, exist_ok=True)
    lane = lanes[0]
    runs: list[tuple[str, str, type[EngineProxy] | None]] = [("direct", lane.server_target(RUNTIME), None)]
    runs += [
        (m.name, lane.target(RUNTIME, m.name), m) for m in (RuntimeProxy, *SGLANG_RUNTIME_OPENAI_MUTANTS)
    ]
    for name, target, mutant in runs:
        lane.reset()
        outcome = run_harness(
            f"sglang-runtime://{target}", REPORTS, f"openai-through-runtime-{name}", time_scale=TIME_SCALE
        )
        want = set(mutant.expected) if mutant is not None else set()
        may = set(mutant.tolerated) if mutant is not None else set()
        assert outcome.report["protocol"] == "openai", _explain(outcome)
        assert want <= outcome.failing <= want | may, f"{name}: {_explain(outcome)}"
        assert outcome.exit_code == (1 if outcome.failing else 0), _explain(outcome)


def test_the_default_fake_engine_passes_in_every_grpc_protocol() -> None:
    """``lmrpc-server --engine fake`` as a new user starts it (no token delay: tokens come far faster
    than a busy client reads them) must pass in lmrpc.v1 and both engine protocols: the harness
    judges what the server did, never how far behind its own reading was (ABORT-2, ABORT-4). With
    spans exported to the harness, TRACE-1 runs (and passes) on every protocol's port."""
    REPORTS.mkdir(parents=True, exist_ok=True)
    otlp_port = free_port()
    tracing = ("--otlp-endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces")
    with ServerProcess(
        engine="fake", args=("--sglang-scheduler-port", "0", "--sglang-runtime-port", "0", *tracing)
    ) as server:
        for protocol in ("lmrpc", *ZOOS):
            target = server_target(server, protocol)
            extra = ("--protocol", protocol) + (("--assume", ASSUME[protocol]) if protocol in ASSUME else ())
            extra += ("--otlp-listen", f"127.0.0.1:{otlp_port}")
            outcome = run_harness(
                target, REPORTS, f"default-fake-{protocol}", time_scale=TIME_SCALE, extra=extra
            )
            assert outcome.failing == set() and outcome.exit_code == 0, _explain(outcome)
            verdicts = {
                c["id"]: c["verdict"] for c in outcome.report["cases"] if c["id"].startswith("TRACE-1")
            }
            assert verdicts == {"TRACE-1": "PASS", "TRACE-1[malformed]": "PASS"}, (protocol, verdicts)


Job = tuple[str, type[EngineProxy]]


def _run_lane(lane: EngineLane, jobs: list[Job]) -> list[tuple[Job, Outcome]]:
    outcomes = []
    for protocol, mutant in jobs:
        lane.reset()
        name = f"{protocol}-{mutant.name}" if mutant.name == REFERENCE else mutant.name
        outcome = run_harness(
            lane.target(protocol, mutant.name),
            REPORTS,
            name,
            time_scale=TIME_SCALE,
            extra=harness_args(protocol)
            + scope_args(expand(mutant.expected | mutant.tolerated), REPORTS, name),
        )
        outcomes.append(((protocol, mutant), outcome))
    return outcomes


def test_engine_mutants_fail_exactly_their_cases(
    lanes: list[EngineLane], capsys: pytest.CaptureFixture[str]
) -> None:
    REPORTS.mkdir(parents=True, exist_ok=True)
    jobs: list[Job] = [(p, reference) for p, (reference, _) in ZOOS.items()]
    jobs += sorted(((p, m) for p, (_, mutants) in ZOOS.items() for m in mutants), key=lambda j: j[1].name)
    plan: list[list[Job]] = [jobs[i :: len(lanes)] for i in range(len(lanes))]
    with ThreadPoolExecutor(len(lanes)) as pool:
        results = [r for lane_results in pool.map(_run_lane, lanes, plan) for r in lane_results]
    outcomes = {(protocol, mutant.name): outcome for (protocol, mutant), outcome in results}
    problems, rows, summaries = [], [], []
    for protocol, (reference, mutants) in ZOOS.items():
        detected = exact = 0
        for mutant in (reference, *mutants):
            outcome = outcomes[(protocol, mutant.name)]
            want = expand(mutant.expected)
            may = expand(mutant.tolerated) | triggered(outcome.report, mutant.triggered_by)
            good = want <= outcome.failing <= want | may and outcome.exit_code == (
                1 if outcome.failing else 0
            )
            broken = not mutant.is_control and mutant is not reference
            detected += broken and bool(outcome.failing)
            exact += good
            rows.append(
                f"{'ok ' if good else 'BAD'} {protocol:16} {mutant.name:38} exit {outcome.exit_code} "
                f"{outcome.duration_s:5.1f}s  {', '.join(sorted(outcome.failing)) or '(all pass)'}"
            )
            if not good:
                problems.append(
                    f"{protocol} {mutant.name}: missing {sorted(want - outcome.failing)}, "
                    f"unexpected {sorted(outcome.failing - want - may)}, exit {outcome.exit_code}"
                )
        faulty = sum(not m.is_control for m in mutants)
        summaries.append(
            f"{protocol}: mutation score {detected}/{faulty} ({100 * detected // max(faulty, 1)}%), "
            f"{exact}/{len(mutants) + 1} runs with exactly the declared failures "
            f"({SCOPE})"
        )
    (REPORTS / "matrix.txt").write_text("\n".join([*rows, *summaries]) + "\n")
    with capsys.disabled():
        print("\n" + "\n".join([*rows, *summaries]))
    assert not problems, "\n".join(problems)


def _explain(outcome: Outcome) -> str:
    lines = [f"{outcome.mutant}: exit {outcome.exit_code}, failing {sorted(outcome.failing)}"]
    for case in _cases(outcome.report):
        if case["verdict"] not in ("PASS", "SKIP", "XFAIL"):
            lines.append(f"  {case['id']}: {case['verdict']} {case['reason']}")
    return "\n".join(lines)
