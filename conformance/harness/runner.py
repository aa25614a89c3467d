"""Runs the selected cases against one target: budgets, skips, isolation, liveness after failures.

Cases run concurrently up to ``jobs`` at a time, except ``exclusive`` ones (load baselines, pause),
which run alone, and the cases that restart or end the server run after all others (``Stage``). A
case that overruns its budget is cancelled and reported as hung; after any
failure a liveness probe decides whether the rest can run, so one crash never turns into dozens of
phantom failures.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from conformance.harness.context import Ctx
from conformance.harness.session import Session
from conformance.report.http_repro import http_script
from conformance.report.repro import script
from conformance.spec.profiles import PROFILES
from conformance.spec.registry import Case
from conformance.stream import wiretap
from conformance.stream.live import StreamStalled
from conformance.vocabulary import (
    CaseFailed,
    CaseResult,
    CaseSkipped,
    Mismatch,
    Repro,
    RpcTimedOut,
    StreamHung,
    Verdict,
    show,
)

PROBES = 3  # liveness tries before the target is called down: a stall of one budget is survived
PROBE_PAUSE_S = 1.0


@dataclass(slots=True)
class Progress:
    on_start: Callable[[Case], None] = lambda case: None
    on_result: Callable[[CaseResult], None] = lambda result: None


def _result(case: Case, verdict: Verdict, reason: str = "", **kw: object) -> CaseResult:
    return CaseResult(case.id, case.clause.id, case.level.value, verdict, reason=reason, **kw)  # type: ignore[arg-type]


async def run_case(session: Session, case: Case) -> CaseResult:
    protocol = session.protocol
    reading = PROFILES[protocol].case(case)
    if not reading.applies:
        return _result(case, Verdict.SKIP, f"n/a in {protocol}: {reading.text}")
    missing = [r for r in case.requires if not session.info.has(r)]
    if missing:
        return _result(case, Verdict.SKIP, f"capability absent: {', '.join(missing)}")
    ctx = Ctx(session, case.id, dict(case.params))
    started = time.monotonic()
    budget = session.budgets.case_s(case.budget_factor)
    verdict, reason, mismatches = Verdict.PASS, "", list[Mismatch]()
    try:
        with wiretap.in_case(case.id):
            await asyncio.wait_for(case.body(ctx), budget)
    except CaseFailed as exc:
        verdict, mismatches = Verdict.FAIL, exc.mismatches
        reason = mismatches[0].render() if mismatches else "failed"
    except CaseSkipped as exc:
        verdict, reason = Verdict.SKIP, str(exc)
    except RpcTimedOut as exc:
        verdict, reason = Verdict.FAIL, str(exc)
        mismatches = [
            *ctx.check.mismatches,
            Mismatch(f"{exc.method} reply", f"within {exc.timeout_s:.1f}s", "none"),
        ]
    except TimeoutError:
        verdict = Verdict.FAIL
        elapsed = time.monotonic() - started
        if elapsed < budget:  # a wait inside the case ran out, not the case's own budget
            reason = (
                f"a wait inside the case ran out after {elapsed:.1f}s (the case's budget is {budget:.1f}s)"
            )
        else:
            reason = f"hung: the case did not finish within its budget of {budget:.1f}s and was cancelled"
        mismatches = [*ctx.check.mismatches, Mismatch("case", f"done within {budget:.1f}s", reason)]
    except GRPCError as exc:
        verdict = Verdict.FAIL
        reason = f"an RPC failed: {exc.status.name} {exc.message!r}"
        mismatches = [
            *ctx.check.mismatches,
            Mismatch("RPC status", "OK", f"{exc.status.name}: {exc.message}"),
        ]
    except (StreamStalled, StreamHung, StreamTerminatedError, ProtocolError, ConnectionError, OSError) as exc:
        verdict = Verdict.FAIL
        reason = f"{type(exc).__name__}: {exc}"
        mismatches = [*ctx.check.mismatches, Mismatch("transport", "a completed call", reason)]
    except Exception as exc:  # a bug in the harness, not in the target
        verdict, reason = Verdict.ERROR, f"harness error: {type(exc).__name__}: {exc}"
        ctx.note(traceback.format_exc())
    finally:
        await ctx.close()
    if verdict is Verdict.PASS and ctx.check.mismatches:
        verdict, mismatches = Verdict.FAIL, ctx.check.mismatches
        reason = mismatches[0].render()
    result = _result(
        case,
        verdict,
        reason,
        duration_s=time.monotonic() - started,
        mismatches=mismatches,
        notes=ctx.notes,
        sent=sorted(ctx.sent),
    )
    if verdict is Verdict.FAIL:
        result.repro = ctx.repro or _transcript_repro(session, ctx, case, mismatches)
    return result


def _transcript_repro(session: Session, ctx: Ctx, case: Case, mismatches: list[Mismatch]) -> Repro:
    """A script replaying what the case sent: its HTTP calls where it made them (a case of an HTTP
    API), else its gRPC calls."""
    if ctx.http_transcript:
        return Repro(
            kind="transcript",
            example="\n".join(
                f"{c.t_s:7.3f}s {c.method} {c.url} {show(c.body)} {c.outcome}" for c in ctx.http_transcript
            ),
            script=http_script(
                case.id,
                session.http.endpoint.base_url,
                session.http.endpoint.root_url,
                ctx.http_transcript,
                mismatches,
            ),
        )
    return Repro(
        kind="transcript",
        example="\n".join(f"{c.t_s:7.3f}s {c.method}({show(c.request)}) {c.outcome}" for c in ctx.transcript),
        script=script(case.id, str(session.target.endpoint), ctx.transcript, session.protocol),
    )


async def probe(session: Session) -> tuple[bool, str]:
    """Is the target still serving? Asked up to PROBES times, a pause apart: a server (or its host)
    that stalls for a while and answers again is alive, and the run goes on."""
    detail = ""
    for attempt in range(PROBES):
        if attempt:
            await asyncio.sleep(PROBE_PAUSE_S)
        alive, detail = await probe_once(session)
        if alive:
            return True, detail
    return False, f"{detail} ({PROBES} tries, {session.budgets.liveness_s:.0f}s each)"


async def probe_once(session: Session) -> tuple[bool, str]:
    """A cheap request only, never a generation (``Target.alive``): a slow server, or one that
    serves one request at a time and is busy with a case's, is alive as long as it answers."""
    return await session.wire.alive(session.budgets.liveness_s)


async def run_all(
    session: Session, cases: Sequence[Case], *, jobs: int = 4, progress: Progress | None = None
) -> list[CaseResult]:
    progress = progress or Progress()
    results: dict[str, CaseResult] = {}
    running: set[asyncio.Task[CaseResult]] = set()
    down: list[str] = []

    async def one(case: Case) -> CaseResult:
        progress.on_start(case)
        try:
            result = await run_case(session, case)
        except Exception as exc:  # outside the case body: the harness broke, never a silent NOT-RUN
            result = _result(case, Verdict.ERROR, f"harness error: {type(exc).__name__}: {exc}")
            result.notes.append(traceback.format_exc())
        results[case.id] = result
        progress.on_result(result)
        if result.verdict.is_failure and not down:
            alive, detail = await probe(session)
            if not alive:
                down.append(f"target down after {case.id}: {detail}")
        return result

    async def drain(limit: int) -> None:
        while len(running) > limit:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            running.difference_update(done)

    for case in sorted(cases, key=lambda c: c.stage):  # stable: the given order within a stage
        if down:
            break
        await drain(0 if case.exclusive else max(jobs, 1) - 1)
        if down:
            break
        task = asyncio.ensure_future(one(case))
        running.add(task)
        if case.exclusive:
            await drain(0)
    await drain(0)
    for case in cases:
        if case.id not in results:
            result = _result(case, Verdict.NOT_RUN, down[0] if down else "not run")
            results[case.id] = result
            progress.on_result(result)
    return [results[c.id] for c in cases]
