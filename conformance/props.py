"""Property searches from async cases: hypothesis runs in a worker thread, RPCs on the case's loop.

A failing search is shrunk within a time budget; a hung example stops the search at once. Either
way the case gets the smallest failing input seen, hypothesis' own rendering of it, and a repro.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

from conformance.check import CaseFailed, StreamHung
from conformance.context import Call, Ctx
from conformance.hyp import Hung, PropertyOutcome, profile, run_property
from conformance.repro import script
from conformance.results import Mismatch, Repro
from lmrpc.v1 import GenerateRequest

T = TypeVar("T")
_LOCK = threading.Lock()  # one hypothesis search at a time: its engine state is per process


class _Budget(BaseException):
    """Shrinking ran out of time; carries the smallest failing example so far."""

    def __init__(self, example: object, mismatches: list[Mismatch]) -> None:
        super().__init__("shrink budget spent")
        self.example, self.mismatches = example, mismatches


async def search(
    ctx: Ctx,
    strategy: st.SearchStrategy[T],
    body: Callable[[T], Coroutine[Any, Any, list[Mismatch]]],
    *,
    examples: int | None = None,
    explicit: Sequence[T] = (),
    shrink_budget_s: float = 5.0,
) -> PropertyOutcome:
    """Run ``body`` on generated inputs until one returns mismatches; shrink it within a budget."""
    config = profile(ctx.session.profile, examples or ctx.tuning.examples)
    first_failure: list[float] = []
    smallest: list[tuple[T, list[Mismatch]]] = []
    budget = shrink_budget_s * ctx.budgets.scale

    def sync_body(value: T) -> None:
        if first_failure and time.monotonic() - first_failure[0] > budget and smallest:
            raise _Budget(*smallest[-1])
        try:
            mismatches = ctx.block(body(value), ctx.budgets.stream_s * 2)
        except StreamHung as exc:
            raise Hung(str(exc), value) from None
        if mismatches:
            first_failure[:1] = first_failure[:1] or [time.monotonic()]
            smallest.append((value, mismatches))
            raise CaseFailed(mismatches)

    def run() -> PropertyOutcome:
        test: Callable[[T], None] = sync_body
        with _LOCK:
            for value in explicit:
                try:
                    sync_body(value)
                except CaseFailed as exc:
                    return PropertyOutcome(False, exc.mismatches, f"explicit example: {value!r}", "", value)
            try:
                return run_property(strategy, test, config, ctx.session.seed)
            except _Budget as exc:
                return PropertyOutcome(
                    False,
                    exc.mismatches,
                    f"(shrinking stopped after {budget:.0f}s) {exc.example!r}",
                    "",
                    exc.example,
                )

    return await asyncio.to_thread(run)


def raise_outcome(ctx: Ctx, outcome: PropertyOutcome) -> None:
    """Turn a failed search into the case's failure, with the shrunk example and a repro script."""
    if outcome.passed:
        return
    calls = list(ctx.transcript)
    if isinstance(outcome.last_failing, GenerateRequest):
        calls = [Call(0.0, "inference", "generate", outcome.last_failing)]
    ctx.repro = Repro(
        kind="example",
        example=outcome.example,
        blob=outcome.blob,
        seed=ctx.session.seed or None,
        script=script(ctx.case_id, str(ctx.session.target.endpoint), calls),
    )
    raise CaseFailed(outcome.mismatches)
