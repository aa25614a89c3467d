"""What every mutant declares, and helpers for rewriting events."""

from __future__ import annotations

import os
from typing import ClassVar

import betterproto2

from conformance.harness.session import Budgets
from lmrpc.v1 import GenerateResponse, OutputFinished, PromptInfo, TokenDelta

from ..proxy import Proxy

# The harness's budgets in the self-test (tests/selftest/test_selftest.py runs it with this scale), for a
# mutant whose fault must outlast one of them.
SELFTEST_BUDGETS = Budgets(float(os.environ.get("LMRPC_SELFTEST_TIME_SCALE", "0.5")))


class Mutant(Proxy):
    """A proxy with one fault. ``expected``: case IDs or globs that must fail (empty for controls)."""

    name: ClassVar[str] = ""
    fault: ClassVar[str] = ""
    expected: ClassVar[frozenset[str]] = frozenset()
    tolerated: ClassVar[frozenset[str]] = frozenset()  # may also fail, for a timing reason stated beside it
    # input classes (spec/coverage.py) that set the fault off: a case that sent one may also fail
    triggered_by: ClassVar[frozenset[str]] = frozenset()
    is_control: ClassVar[bool] = False  # a correct variant (slow, merging deltas): must pass everything
    time_scale: ClassVar[float] = 1.0  # multiplies the self-test's --time-scale for this mutant


def delta(event: GenerateResponse) -> TokenDelta:
    assert event.delta is not None
    return event.delta


def finished(event: GenerateResponse) -> OutputFinished:
    assert event.finished is not None
    return event.finished


def prompt(event: GenerateResponse) -> PromptInfo:
    assert event.prompt_info is not None
    return event.prompt_info


def kind(event: GenerateResponse) -> str:
    return betterproto2.which_one_of(event, "event")[0]


def clone(event: GenerateResponse) -> GenerateResponse:
    return GenerateResponse.parse(bytes(event))
