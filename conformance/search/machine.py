"""A state machine that interleaves start, read, abort, cancel, deadline and health across many
concurrent requests, then checks the invariants that must survive any interleaving:

- STREAM-6: no request_id cross-talk: a stream only ever carries its own id;
- FINISH-1: every request that was not cancelled terminates exactly once (one finish per output,
  or one RequestError, then status OK);
- USAGE-3: counts are conserved: Usage.completion_tokens = sum of finishes = token ids delivered;
- ABORT-3: GetLoad is back at its baseline at teardown.

Rules run on the case's event loop through ``Ctx.block``; hypothesis runs in a worker thread.
``run_machine`` runs it once per run for the four cases that report its invariants: when one
invariant fails, that clause gets the shrunk step list and a repro, and the search starts again
without it, so one broken invariant cannot hide another.

Only an invariant's own verdict is a failure hypothesis may shrink. Anything else that ends a step
(an RPC past its deadline or failing, a broken transport) depends on the target's timing, so a replay
of the same program may not meet it again; it stops the search at once instead (``Trouble``) and the
cases not yet judged get that error, judged as in any other case.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from conformance.harness.context import Ctx
from conformance.harness.load import expect_released, quiet_load
from conformance.harness.requests import long_request
from conformance.harness.session import Session
from conformance.report.repro import script
from conformance.search.property import SEARCH_LOCK, Interrupted, notes_of, profile
from conformance.search.strategies import valid_requests
from conformance.stream.live import LiveStream, StreamStalled
from conformance.stream.record import End, StreamRecord
from conformance.validators.base import VALIDATORS, Facts
from conformance.vocabulary import CaseFailed, Mismatch, Repro
from lmrpc.v1 import AbortRequest, GenerateRequest, RequestIds

INVARIANTS = ("STREAM-6", "FINISH-1", "USAGE-3", "ABORT-3")
# Requests one program starts at most: enough to interleave aborts, cancels and deadlines across
# concurrent requests. More only tests how fast the harness reads: a dozen long streams of a fast
# server kept its event loop so busy on a shared CPU that an Abort's answer sat unread past its
# deadline (seen in CI, against the reference).
MAX_STREAMS = 4
T = TypeVar("T")


Failure = tuple[str, list[Mismatch], list[str], int]  # clause, mismatches, steps, first transcript call


class Trouble(Interrupted):
    """A step ended on an error that is not an invariant's verdict (see ``Interrupted``)."""

    def __init__(self, error: Exception, steps: list[str], first_call: int) -> None:
        super().__init__(error, describe(steps))
        self.steps, self.first_call = steps, first_call


class Stop(BaseException):
    """Ends the whole search (time budget spent): carries the failure to report."""

    def __init__(self, failure: Failure) -> None:
        super().__init__("machine budget spent")
        self.failure = failure


@dataclass(slots=True)
class MachineRun:
    """What the machines of one search share: the case's context, the invariants asserted, the
    time budget, and what they found."""

    ctx: Ctx
    asserted: set[str]
    budget_s: float
    started_at: float = field(default_factory=time.monotonic)
    failures: list[Failure] = field(default_factory=list)
    programs: int = 0
    steps: int = 0

    @property
    def wait(self) -> float:
        """How long a step waits for its coroutine: past an RPC's own deadline, so that the RPC's
        timeout, which names the method, is what a silent target meets."""
        return 2 * self.ctx.budgets.rpc_s

    @property
    def deadline_s(self) -> float:
        return 0.3 * self.ctx.budgets.scale


class Lifecycle(RuleBasedStateMachine):
    """The machine; ``build_machine`` binds it to a run and adds the two rules whose strategies
    depend on what the target advertises."""

    run: ClassVar[MachineRun]

    def __init__(self) -> None:
        super().__init__()
        run = self.run
        if run.failures and time.monotonic() - run.started_at > run.budget_s:
            raise Stop(run.failures[-1])
        self.streams: dict[str, LiveStream] = {}
        self.cancelled: set[str] = set()
        self.aborted: set[str] = set()
        self.steps: list[str] = []
        run.programs += 1
        self.first_call = len(run.ctx.transcript)
        self.baseline = self._drive(quiet_load(run.ctx), run.ctx.budgets.release_s + run.wait)

    def _drive(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run one step's coroutine on the case's loop; an error of it ends the search (``Trouble``)."""
        try:
            return self.run.ctx.block(coro, timeout_s)
        except Exception as exc:
            raise Trouble(exc, list(self.steps), self.first_call) from exc

    def _fail(self, clause: str, mismatches: list[Mismatch]) -> None:
        self.run.failures.append((clause, mismatches, list(self.steps), self.first_call))
        raise CaseFailed(mismatches)

    def _open(self, req: GenerateRequest, deadline: float | None = None) -> None:
        ctx = self.run.ctx

        async def start() -> LiveStream:  # streams are tasks of the case's loop, not of this thread
            return ctx.open(req, deadline_s=deadline)

        self.streams[req.request_id] = self._drive(start(), self.run.wait)

    def _pick(self, data: st.DataObject) -> str:
        """A started request, by start order. The draw never depends on timing (hypothesis replays it);
        picking one that already ended makes the step a no-op."""
        names = list(self.streams)
        return names[data.draw(st.integers(0, 63), label="request") % len(names)]

    def _start(self, req: GenerateRequest) -> None:
        req = GenerateRequest.parse(bytes(req))
        req.request_id = self.run.ctx.uid("m")
        self.steps.append(f"start({req!r})")
        self._open(req)

    def _start_long(self, n: int) -> None:
        req = long_request(self.run.ctx, n=n)
        self.steps.append(f"start_long({req.request_id!r}, n={n})")
        self._open(req)

    def room(self) -> bool:
        """Whether another request may start (a count of starts, never of what timing ended)."""
        return len(self.streams) < MAX_STREAMS

    @precondition(lambda self: self.room())
    @rule()
    def start_with_deadline(self) -> None:
        req = long_request(self.run.ctx)
        self.steps.append(f"start_with_deadline({req.request_id!r}, {self.run.deadline_s:.2f}s)")
        self.cancelled.add(req.request_id)  # a deadline ends the call like a cancel
        self._open(req, self.run.deadline_s)

    @precondition(lambda self: bool(self.streams))
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        rid = self._pick(data)
        self.steps.append(f"read({rid!r})")
        stream = self.streams[rid]

        async def read() -> None:
            with contextlib.suppress(StreamStalled):
                await stream.next(0.5 * self.run.ctx.budgets.scale)

        self._drive(read(), self.run.wait)

    @precondition(lambda self: bool(self.streams))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = self._pick(data)
        self.steps.append(f"abort({rid!r})")
        self.aborted.add(rid)
        self._abort(rid)

    def _abort(self, *rids: str) -> None:
        """One Abort per id, side by side (not every protocol takes several ids in one call)."""
        ctx = self.run.ctx

        async def abort(rid: str) -> None:
            with contextlib.suppress(GRPCError):  # a status is ABORT-1's business, not this machine's
                await ctx.call(ctx.control.abort, AbortRequest(request_ids=RequestIds(ids=[rid])))

        async def every() -> None:
            await asyncio.gather(*(abort(rid) for rid in rids))

        if rids:
            self._drive(every(), self.run.wait)

    @precondition(lambda self: bool(self.streams))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = self._pick(data)
        self.steps.append(f"cancel({rid!r})")
        self.cancelled.add(rid)
        self._drive(self.run.ctx.cancel(self.streams[rid]), self.run.wait)

    @rule()
    def health(self) -> None:
        self.steps.append("health()")
        ctx = self.run.ctx

        async def health() -> None:
            with contextlib.suppress(GRPCError):  # statuses are HEALTH-1's and LOAD-1's business
                await HealthStub(ctx.session.target.channel).Check(
                    HealthCheckRequest(service=""), timeout=ctx.budgets.rpc_s
                )
                await ctx.load()

        self._drive(health(), self.run.wait)

    @invariant()
    def no_cross_talk(self) -> None:
        if "STREAM-6" not in self.run.asserted:
            return
        for rid, stream in self.streams.items():
            foreign = {e.message.request_id for e in stream.events} - {rid, ""}
            if foreign:
                self._fail(
                    "STREAM-6",
                    [Mismatch(f"request ids on stream {rid!r}", repr(rid), repr(sorted(foreign)))],
                )

    def teardown(self) -> None:
        self.steps.append("teardown()")
        left = [r for r, s in self.streams.items() if not s.done.is_set() and r not in self.cancelled]
        self.aborted.update(left)
        self._abort(*left)
        records = self._finish_all()
        self.run.steps += len(self.steps)
        for rid, record in records.items():
            self._judge_stream(rid, record)
        if "ABORT-3" in self.run.asserted:
            self._judge_release()

    def _finish_all(self) -> dict[str, StreamRecord]:
        ctx = self.run.ctx

        async def finish_all() -> list[StreamRecord]:  # side by side: an aborted request ends promptly
            return list(
                await asyncio.gather(
                    *(
                        s.finish(ctx.budgets.release_s if rid in self.aborted else None)
                        for rid, s in self.streams.items()
                    )
                )
            )

        return dict(zip(self.streams, self._drive(finish_all(), ctx.budgets.stream_s * 2), strict=True))

    def _judge_stream(self, rid: str, record: StreamRecord) -> None:
        """FINISH-1 and USAGE-3 of one request, unless it was cancelled and ended so."""
        facts = Facts(self.run.ctx.info, aborted=rid in self.aborted or rid in self.cancelled)
        if rid in self.cancelled and record.end in (End.CANCELLED, End.DEADLINE):
            return
        for clause, validators in (
            ("FINISH-1", ("FINISH-1", "FINISH-3")),
            ("USAGE-3", ("USAGE-3", "USAGE-5")),
        ):
            if clause in self.run.asserted:
                found = [m for v in validators for m in VALIDATORS[v](record, facts)]
                if record.end is End.HUNG and clause == "FINISH-1" and not found:
                    found.append(Mismatch(f"how {rid!r} ended", "terminated", record.summary()))
                if found:
                    self._fail(clause, found)

    def _judge_release(self) -> None:
        """ABORT-3: the load is back at its baseline once every request ended."""
        ctx = self.run.ctx
        ctx.check.mismatches.clear()
        released = expect_released(ctx, self.baseline, "every request ended")
        if not self._drive(released, ctx.budgets.release_s + self.run.wait):
            self._fail("ABORT-3", list(ctx.check.mismatches))
            ctx.check.mismatches.clear()


def build_machine(ctx: Ctx, asserted: set[str], budget_s: float) -> type[Lifecycle]:
    """The machine bound to ``ctx``, asserting only the ``asserted`` invariants."""
    small = valid_requests(ctx.info, max_tokens=max(2, ctx.tuning.max_tokens // 2), max_n=2)
    longest = min(2, ctx.info.caps.max_outputs)

    class Bound(Lifecycle):
        run = MachineRun(ctx, asserted, budget_s)

        @precondition(lambda self: self.room())
        @rule(req=small)
        def start(self, req: GenerateRequest) -> None:
            self._start(req)

        @precondition(lambda self: self.room())
        @rule(n=st.sampled_from([1, longest]))
        def start_long(self, n: int) -> None:
            self._start_long(n)

    Bound.__name__ = Bound.__qualname__ = "Lifecycle"
    return Bound


def describe(steps: list[str]) -> str:
    return "\n".join(["state = Lifecycle()", *(f"state.{s}" for s in steps)])


@dataclass(slots=True)
class Judgement:
    passed: bool
    mismatches: list[Mismatch] = field(default_factory=list)
    repro: Repro | None = None
    programs: int = 0
    steps: int = 0
    error: Exception | None = None  # what ended the search before this invariant was judged


async def run_machine(session: Session) -> dict[str, Judgement]:
    ctx = Ctx(session, "stateful", {})
    remaining = set(INVARIANTS)
    verdicts: dict[str, Judgement] = {}
    total_programs = total_steps = 0
    budget = 5.0 * session.budgets.scale
    config = profile(
        session.profile, session.tuning.machine_examples, stateful_step_count=session.tuning.machine_steps
    )
    try:
        while remaining:
            machine = build_machine(ctx, set(remaining), budget)

            def search(
                machine: Any = machine,
            ) -> tuple[Failure | Trouble | None, str]:
                with SEARCH_LOCK:
                    try:
                        run_state_machine_as_test(machine, settings=config)
                    except Trouble as exc:  # while shrinking a failure, that failure is the finding
                        return (machine.run.failures[-1] if machine.run.failures else exc), ""
                    except CaseFailed as exc:
                        return machine.run.failures[-1], notes_of(exc)[0]
                    except Stop as exc:
                        return exc.failure, ""
                    except Flaky:  # failed, then passed on replay: still a failure, reported as seen
                        if not machine.run.failures:
                            raise
                        return machine.run.failures[
                            -1
                        ], "(intermittent: the failing program passed when replayed)"
                return None, ""

            failure, shown = await asyncio.to_thread(search)
            total_programs += machine.run.programs
            total_steps += machine.run.steps
            if failure is None:
                verdicts.update({clause: Judgement(True) for clause in remaining})
                break
            if isinstance(failure, Trouble):
                repro = _repro("stateful", failure.steps, failure.first_call, ctx)
                repro.example = f"{failure}\n{repro.example}"
                verdicts.update(
                    {clause: Judgement(False, [], repro, error=failure.error) for clause in remaining}
                )
                break
            clause, mismatches, steps, first_call = failure
            repro = _repro(f"{clause}[stateful]", steps, first_call, ctx)
            if shown.startswith("Failing test case"):
                repro.example = shown
            elif shown:
                repro.example = f"{shown}\n{repro.example}"
            verdicts[clause] = Judgement(False, mismatches, repro)
            remaining.discard(clause)
    finally:
        await ctx.close()
    for judgement in verdicts.values():
        judgement.programs, judgement.steps = total_programs, total_steps
    return verdicts


def _repro(name: str, steps: list[str], first_call: int, ctx: Ctx) -> Repro:
    """The program's steps, and a script named ``name`` replaying its calls from the program's first."""
    target = ctx.session.target
    return Repro(
        kind="steps",
        example=describe(steps),
        script=script(name, str(target.endpoint), ctx.transcript[first_call:], target.driver.protocol),
    )
