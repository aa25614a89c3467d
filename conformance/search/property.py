"""Hypothesis, pinned and run off the event loop: property searches from async cases.

Profiles are registered here and always passed explicitly, so the built-in ``ci`` profile that
``CI=true`` switches on never changes what the harness does. Property bodies run in a worker thread
and drive RPCs on the case's event loop through ``Ctx.block``. A failing search is shrunk within a
time budget; a hung example stops the search at once. Either way the case gets the smallest failing
input seen, hypothesis' own rendering of it, and a repro.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from grpclib.exceptions import GRPCError
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky

from conformance.harness.context import Ctx
from conformance.report.repro import script
from conformance.vocabulary import Call, CaseFailed, Mismatch, Repro, StreamHung
from lmrpc.v1 import GenerateRequest

T = TypeVar("T")
SEARCH_LOCK = threading.Lock()  # one hypothesis search at a time: its engine state is per process

CI_PROFILE = "conformance-ci"
EXPLORE_PROFILE = "conformance-explore"
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
_DEFAULT = settings.get_profile("default")  # hypothesis' own defaults, never the "ci" profile

settings.register_profile(
    CI_PROFILE,
    parent=_DEFAULT,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SUPPRESS,
    report_multiple_bugs=False,
)
settings.register_profile(
    EXPLORE_PROFILE,
    parent=_DEFAULT,
    derandomize=False,
    deadline=None,
    print_blob=True,
    database=DirectoryBasedExampleDatabase(".hypothesis/conformance"),
    suppress_health_check=_SUPPRESS,
    report_multiple_bugs=False,
)


class Interrupted(BaseException):
    """An example ended on an error that is not the property's verdict (an RPC past its deadline or
    failing, a broken transport). Not an ``Exception``, so hypothesis stops at once instead of
    replaying an example whose outcome was the target's timing; the case gets the error itself and
    the runner judges it as in any other case."""

    def __init__(self, error: Exception, example: object) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error, self.example = error, example


class Hung(BaseException):
    """A property example hung. Not an ``Exception``, so hypothesis stops at once instead of shrinking
    by re-running examples that each wait out a timeout."""

    def __init__(self, detail: str, example: object) -> None:
        super().__init__(detail)
        self.example = example


def profile(name: str, max_examples: int, **overrides: Any) -> settings:
    return settings(settings.get_profile(name), max_examples=max_examples, **overrides)


@dataclass(slots=True)
class PropertyOutcome:
    passed: bool
    mismatches: list[Mismatch] = field(default_factory=list)
    example: str = ""  # the shrunk failing example, as hypothesis printed it
    blob: str = ""
    last_failing: Any = None  # the value of the last failing example (the shrunk one)
    hung: bool = False


_BLOB = re.compile(r"@reproduce_failure\((.*?)\)")


def notes_of(exc: BaseException) -> tuple[str, str]:
    notes = [n for n in getattr(exc, "__notes__", []) if isinstance(n, str)]
    blob = next((m.group(0) for n in notes if (m := _BLOB.search(n))), "")
    shown = [n for n in notes if "reproduce_failure" not in n]
    return "\n".join(shown).strip(), blob


def run_property(
    strategy: st.SearchStrategy[T], body: Callable[[T], None], config: settings, seed: int | None = None
) -> PropertyOutcome:
    """Search for an input on which ``body`` raises CaseFailed; shrink it. Runs in the calling thread."""
    failing: list[Any] = []
    last_mismatches: list[Mismatch] = []

    def test(value: T) -> None:
        try:
            body(value)
        except CaseFailed as exc:
            failing.append(value)
            last_mismatches[:] = exc.mismatches
            raise

    wrapped = settings(config)(given(strategy)(test))
    if seed is not None and not config.derandomize:
        wrapped = hypothesis_seed(seed)(wrapped)
    try:
        wrapped()
    except CaseFailed as exc:
        example, blob = notes_of(exc)
        return PropertyOutcome(False, exc.mismatches, example, blob, failing[-1] if failing else None)
    except Flaky:  # failed, then passed on replay: report what failed, marked intermittent
        if not failing:
            raise
        return PropertyOutcome(
            False,
            list(last_mismatches),
            f"(intermittent: passed when replayed) {failing[-1]!r}",
            "",
            failing[-1],
        )
    except Hung as exc:
        return PropertyOutcome(
            False,
            [Mismatch("the stream's end", "a terminal message, then status OK", str(exc))],
            repr(exc.example),
            "",
            exc.example,
            hung=True,
        )
    return PropertyOutcome(True)


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
        except GRPCError as exc:  # the target's answer to this input: shrunk like any mismatch
            mismatches = [Mismatch("RPC status", "OK", f"{exc.status.name}: {exc.message}")]
        except CaseFailed:
            raise
        except Exception as exc:
            raise Interrupted(exc, value) from exc
        if mismatches:
            first_failure[:1] = first_failure[:1] or [time.monotonic()]
            smallest.append((value, mismatches))
            raise CaseFailed(mismatches)

    def run() -> PropertyOutcome:
        test: Callable[[T], None] = sync_body
        with SEARCH_LOCK:
            for value in explicit:
                try:
                    sync_body(value)
                except CaseFailed as exc:
                    return PropertyOutcome(False, exc.mismatches, f"explicit example: {value!r}", "", value)
            try:
                return run_property(strategy, test, config, ctx.session.seed)
            except Interrupted as exc:
                ctx.note(f"the search stopped on {exc.example!r}")
                raise exc.error from None
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
    keep_repro(ctx, outcome)
    raise CaseFailed(outcome.mismatches)


def keep_repro(ctx: Ctx, outcome: PropertyOutcome) -> None:
    """The case's repro: the shrunk example of a failed search, as a script."""
    calls = list(ctx.transcript)
    if isinstance(outcome.last_failing, GenerateRequest):
        calls = [Call(0.0, "inference", "generate", outcome.last_failing)]
    ctx.repro = Repro(
        kind="example",
        example=outcome.example,
        blob=outcome.blob,
        seed=ctx.session.seed,
        script=script(
            ctx.case_id, str(ctx.session.target.endpoint), calls, ctx.session.target.driver.protocol
        ),
    )
