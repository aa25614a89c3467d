"""The state machine's four cases (STREAM-6, FINISH-1, USAGE-3, ABORT-3 ``[stateful]``): each reports
one invariant of the one machine run ``conformance.search.machine.run_machine`` makes per run."""

from __future__ import annotations

from conformance.harness.context import Ctx
from conformance.search.machine import INVARIANTS, Judgement, run_machine
from conformance.spec.registry import case
from conformance.vocabulary import CaseFailed


def _machine_case(clause: str) -> None:
    @case(clause, tag="stateful", exclusive=True, budget=4.0)
    async def stateful(ctx: Ctx) -> None:
        verdicts: dict[str, Judgement] = await ctx.session.shared("machine", lambda: run_machine(ctx.session))
        judgement = verdicts[clause]
        ctx.note(f"{judgement.programs} programs, {judgement.steps} steps")
        if not judgement.passed:
            ctx.repro = judgement.repro
            if judgement.error is not None:  # the search ended before this invariant was judged
                raise judgement.error
            raise CaseFailed(judgement.mismatches)

    stateful.__doc__ = (
        f"Random interleavings of start/read/abort/cancel/deadline/health across concurrent "
        f"requests keep the {clause} invariant."
    )


for _clause in INVARIANTS:
    _machine_case(_clause)
