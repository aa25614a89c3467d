"""One run against one target, whatever its wire: reach it (``--wait``, then connect), open the
session, record who the server is, learn what it refuses by design, size budgets and concurrency
from its pace, run the cases. Every step's failure ends the run with its reason in the report and
the remaining cases NOT-RUN; results of cases already run survive an interruption."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from conformance.drivers.base import Address, ConnectOptions, Target
from conformance.drivers.detect import DetectionError
from conformance.harness.connect import connect, wait_until_ready
from conformance.harness.otlp import SpanReceiver
from conformance.harness.pace import measure_pace
from conformance.harness.refusals import learn_refusals
from conformance.harness.runner import Progress, run_all
from conformance.harness.session import Budgets, ServerAccess, Session, Tuning
from conformance.report.model import RunReport
from conformance.spec.registry import Case
from conformance.vocabulary import CaseResult, Verdict


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What a run is asked to do, beyond the cases."""

    protocol: str
    budgets: Budgets
    tuning: Tuning
    options: ConnectOptions
    profile: str
    seed: int | None
    jobs: int
    wait_s: float = 0.0
    access: ServerAccess = field(default_factory=ServerAccess)


def not_run(cases: list[Case], done: dict[str, CaseResult], reason: str) -> list[CaseResult]:
    """Each case's result so far, NOT-RUN with ``reason`` where it has none."""
    return [
        done.get(c.id) or CaseResult(c.id, c.clause.id, c.level.value, Verdict.NOT_RUN, reason=reason)
        for c in cases
    ]


async def execute(
    address: Address,
    cases: list[Case],
    plan: RunPlan,
    progress: Progress,
    report: RunReport,
    say: Callable[[str], None] = lambda line: None,
) -> None:
    """Run ``cases`` against the target at ``address`` and fill ``report``. ``say`` prints what
    the run chose."""
    done: dict[str, CaseResult] = {}
    inner_result = progress.on_result

    def on_result(result: CaseResult) -> None:
        done[result.case_id] = result
        inner_result(result)

    progress.on_result = on_result
    target = await _reach(address, plan, report)
    session = await _open(target, plan, report) if target is not None else None
    if session is None:
        report.results = not_run(cases, done, report.aborted)
        return
    describe(report, session)
    try:
        await _refusals(session, report, say)
        jobs = await _pace(session, plan.jobs, report, say)
        report.settings.update(session.wire.report_fields()[1])
        report.results = await run_all(session, cases, jobs=jobs, progress=progress)
    except asyncio.CancelledError:
        report.aborted = "interrupted"
        report.results = not_run(cases, done, "interrupted")
    finally:
        await session.aclose()
    down = [
        r.reason
        for r in report.results
        if r.verdict is Verdict.NOT_RUN and r.reason.startswith("target down")
    ]
    if down:
        report.aborted = down[0]


async def _reach(address: Address, plan: RunPlan, report: RunReport) -> Target | None:
    """The connected target, or None with ``report.aborted`` saying why not."""
    try:
        if plan.wait_s > 0:
            report.settings["waited"] = await wait_until_ready(address, plan.wait_s, plan.budgets)
        target, how = await connect(address, plan.protocol, plan.options)
    except DetectionError as exc:
        report.aborted = f"target {address}: {exc}"
        return None
    except Exception as exc:  # unreachable, refused, TLS, not a server of the protocol...
        report.aborted = f"target {address} unreachable: {type(exc).__name__}: {exc}"
        return None
    report.settings["protocol"] = how
    return target


async def _open(target: Target, plan: RunPlan, report: RunReport) -> Session | None:
    """The run's session, receiving spans where asked; None (the target closed) where it cannot."""
    session = Session(
        target, plan.budgets, plan.tuning, seed=plan.seed, profile=plan.profile, access=plan.access
    )
    if session.access.otlp_listen:
        session.spans = SpanReceiver()
        try:
            await session.spans.start(session.access.otlp_listen)
        except OSError as exc:
            report.aborted = f"--otlp-listen {session.access.otlp_listen}: {exc}"
            await session.aclose()
            return None
    return session


def describe(report: RunReport, session: Session) -> None:
    """Who the server says it is, and what was learned of it while connecting."""
    report.protocol = session.protocol
    server = session.info.server
    identity, learned = session.wire.report_fields()
    report.server = {
        "name": server.server_name,
        "version": server.server_version,
        "contract_revision": server.contract_revision,
        "model": session.info.model.model_id,
        **identity,
    }
    report.settings.update(learned)


async def _refusals(session: Session, report: RunReport, say: Callable[[str], None]) -> None:
    """What the server refuses by design, learned once (harness/refusals.py). A server that cannot
    answer the question runs without it: the cases then say what is wrong with it."""
    try:
        await learn_refusals(session)
    except Exception as exc:
        report.settings["refusals"] = f"not learned: {type(exc).__name__}: {exc}"
        return
    if session.info.refusals:
        report.settings["refusals"] = dict(session.info.refusals)
        say("refused by design: " + "; ".join(f"{k} ({v})" for k, v in session.info.refusals.items()))


async def _pace(session: Session, jobs: int, report: RunReport, say: Callable[[str], None]) -> int:
    """Size budgets and concurrency from the server's measured pace (harness/pace.py); the number
    of cases to run at once. A server that cannot answer the measurement runs at the flags' settings:
    the cases then say what is wrong."""
    try:
        pace = await measure_pace(session, jobs)
    except Exception as exc:
        report.settings["pace"] = f"not measured: {type(exc).__name__}: {exc}"
        say(
            f"pace not measured ({type(exc).__name__}: {exc}); budgets at --time-scale {session.budgets.scale}"
        )
        return jobs
    session.wire.paced(pace.parallel if pace.measured_parallel else None)
    report.settings["pace"] = pace.to_json()
    report.settings["jobs"] = pace.jobs
    say(pace.describe())
    return pace.jobs
