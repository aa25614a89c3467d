"""Runs the lifecycle machine once per run, for the four cases that report its invariants.

The search asserts every invariant still unjudged; when one fails, that clause gets the shrunk step
list and a repro, and the search starts again without it, so one broken invariant cannot hide
another.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from conformance.check import CaseFailed
from conformance.context import Ctx
from conformance.hyp import _notes, profile
from conformance.machines.lifecycle import INVARIANTS, Stop, build_machine, describe
from conformance.props import _LOCK
from conformance.repro import script
from conformance.results import Mismatch, Repro
from conformance.session import Session


@dataclass(slots=True)
class Judgement:
    passed: bool
    mismatches: list[Mismatch] = field(default_factory=list)
    repro: Repro | None = None
    programs: int = 0
    steps: int = 0


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
            ) -> tuple[tuple[str, list[Mismatch], list[str], int] | None, str]:
                with _LOCK:
                    try:
                        run_state_machine_as_test(machine, settings=config)
                    except CaseFailed as exc:
                        return machine.failures[-1], _notes(exc)[0]
                    except Stop as exc:
                        return exc.failure, ""
                    except Flaky:  # failed, then passed on replay: still a failure, reported as seen
                        if not machine.failures:
                            raise
                        return machine.failures[
                            -1
                        ], "(intermittent: the failing program passed when replayed)"
                return None, ""

            failure, shown = await asyncio.to_thread(search)
            stats = machine.stats  # type: ignore[attr-defined]
            total_programs += stats["programs"]
            total_steps += stats["steps"]
            if failure is None:
                verdicts.update({clause: Judgement(True) for clause in remaining})
                break
            clause, mismatches, steps, first_call = failure
            target = str(session.target.endpoint)
            shown = (
                shown
                if shown.startswith("Failing test case")
                else "\n".join(filter(None, [shown, describe(steps)]))
            )
            repro = Repro(
                kind="steps",
                example=shown,
                script=script(f"{clause}[stateful]", target, ctx.transcript[first_call:]),
            )
            verdicts[clause] = Judgement(False, mismatches, repro)
            remaining.discard(clause)
    finally:
        await ctx.close()
    for judgement in verdicts.values():
        judgement.programs, judgement.steps = total_programs, total_steps
    return verdicts


def _machine_case(clause: str) -> None:
    from conformance.registry import case

    @case(clause, tag="stateful", exclusive=True, budget=4.0)
    async def stateful(ctx: Ctx) -> None:
        verdicts: dict[str, Judgement] = await ctx.session.shared("machine", lambda: run_machine(ctx.session))
        judgement = verdicts[clause]
        ctx.note(f"{judgement.programs} programs, {judgement.steps} steps")
        if not judgement.passed:
            ctx.repro = judgement.repro
            raise CaseFailed(judgement.mismatches)

    stateful.__doc__ = (
        f"Random interleavings of start/read/abort/cancel/deadline/health across concurrent "
        f"requests keep the {clause} invariant."
    )


for _clause in INVARIANTS:
    _machine_case(_clause)
