"""The runner never turns a harness failure into a silent NOT-RUN."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from conformance.spec.clauses import CLAUSES
from conformance.spec.registry import Case
from conformance.vocabulary import Verdict


async def _never_called(ctx: Any) -> None:
    raise AssertionError("the body must not run")


class _BrokenInfo:
    def has(self, requirement: str) -> bool:
        raise AttributeError(f"no capability {requirement!r}")


def test_an_exception_outside_the_case_body_is_an_error() -> None:
    from conformance.harness.runner import run_all

    case = Case("TOK-2[broken]", CLAUSES["TOK-2"], CLAUSES["TOK-2"].level, ("tokenize",), _never_called)
    session: Any = SimpleNamespace(info=_BrokenInfo())
    [result] = asyncio.run(run_all(session, [case], jobs=1, progress=None))
    assert result.verdict is Verdict.ERROR, result
    assert "AttributeError" in result.reason
