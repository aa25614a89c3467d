"""The server's pace, measured once before the cases: how long a one-token answer and an ordinary
request take, and, for a server slow enough that it matters, how many requests it runs at once.

The default budgets fit a server that answers an ordinary request in well under a second. A slower
one gets its budgets stretched (a request may queue behind the others a case keeps in flight) and
its cases run no more at once than it serves, so a server that takes ten seconds a request and runs
one at a time still gets a verdict for every case. ``--time-scale`` sets the least scale; the
measurement only ever raises it. What was chosen is printed and kept in the report.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from conformance.drivers.openai.calls import CaseHttp
from conformance.drivers.openai.exchange import Api
from conformance.drivers.openai.support import base_probe
from conformance.harness.context import Ctx
from conformance.harness.requests import request
from conformance.harness.session import Budgets, Session
from conformance.spec.protocols import Wire, wire_of
from conformance.vocabulary import StreamHung

ONE_TOKEN_RUNS = 3
AT_ONCE = 4  # requests sent together to see how many the server runs at once
IN_FLIGHT = 8  # the most requests a case keeps in flight at once (the stream pool's concurrency)
MARGIN = 2.0  # a queued request may wait this many times the queue's expected length
FIRST_CONTACT = 6.0  # the calibration's own requests may be silent this many idle budgets (a cold server)


@dataclass(frozen=True, slots=True)
class Pace:
    one_token_s: float  # median time to a one-token answer, alone
    request_s: float  # an ordinary request (the level's max_tokens), alone
    parallel: int  # requests it runs at once (measured only when it matters, else AT_ONCE)
    measured_parallel: bool
    scale: float  # the time scale budgets run at
    jobs: int  # cases run at once

    def describe(self) -> str:
        at_once = (
            f"{self.parallel} of {AT_ONCE} requests at once"
            if self.measured_parallel
            else "fast enough that its parallelism was not measured"
        )
        return (
            f"pace: a one-token answer in {self.one_token_s:.2f}s, a request in {self.request_s:.2f}s, "
            f"{at_once}; budgets at time scale {self.scale:.2f}, {self.jobs} case(s) at once"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "one_token_s": round(self.one_token_s, 3),
            "request_s": round(self.request_s, 3),
            "parallel": self.parallel,
            "measured_parallel": self.measured_parallel,
            "time_scale": round(self.scale, 3),
            "jobs": self.jobs,
        }


async def measure_pace(session: Session, jobs: int) -> Pace:
    """Measure, then size: ``session.budgets`` is replaced when the server needs more time."""
    ctx = Ctx(session, "pace", {})
    send = SENDERS[wire_of(session.protocol)](ctx)
    try:
        one_token = statistics.median([await _timed(send(1)) for _ in range(ONE_TOKEN_RUNS)])
        session.step_s = one_token
        ordinary = await _timed(send(session.tuning.max_tokens))
        budgets = session.budgets
        queue_s = MARGIN * IN_FLIGHT * ordinary
        if queue_s <= budgets.idle_s:  # even a one-at-a-time server fits the budgets as they are
            return Pace(one_token, ordinary, AT_ONCE, False, budgets.scale, jobs)
        together = await _timed(*(send(session.tuning.max_tokens) for _ in range(AT_ONCE)))
        parallel = max(1, min(AT_ONCE, round(AT_ONCE * ordinary / max(together, 1e-6))))
        needed = MARGIN * math.ceil(IN_FLIGHT / parallel) * ordinary / budgets.idle_base_s
        scale = max(budgets.scale, needed)
        session.budgets = Budgets(scale=scale)
        session.parallel, session.gate = parallel, asyncio.Semaphore(parallel)
        return Pace(one_token, ordinary, parallel, True, scale, max(1, min(jobs, parallel)))
    finally:
        await ctx.close()


async def _timed(*calls: Awaitable[None]) -> float:
    started = time.monotonic()
    await asyncio.gather(*calls)
    return time.monotonic() - started


def _grpc_send(ctx: Ctx) -> Callable[[int], Awaitable[None]]:
    async def send(tokens: int) -> None:
        record = await ctx.generate(
            request(ctx, max_tokens=tokens, ignore_eos=True), total_s=FIRST_CONTACT * ctx.budgets.idle_s
        )
        if not record.ended_ok:
            raise StreamHung(
                f"measuring the server's pace: a {tokens}-token request ended {record.summary()}"
            )

    return send


def _http_send(ctx: Ctx) -> Callable[[int], Awaitable[None]]:
    budget = FIRST_CONTACT * ctx.budgets.idle_s
    http = CaseHttp(ctx.session.http, call_s=budget, idle_s=budget)  # a cold server may answer late
    apis = http.support.apis()
    api: Api = apis[0] if apis else "chat"

    async def send(tokens: int) -> None:
        exchange = await http.send(base_probe(api).with_body(max_tokens=tokens))
        if exchange.status != 200:
            raise StreamHung(
                f"measuring the server's pace: a {tokens}-token {api} request: {exchange.summary()}"
            )

    return send


# An ordinary request of each wire: what the pace is measured with.
SENDERS: dict[Wire, Callable[[Ctx], Callable[[int], Awaitable[None]]]] = {
    "grpc": _grpc_send,
    "http": _http_send,
}
