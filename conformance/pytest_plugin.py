"""Run the conformance cases as pytest tests, one test per case, in an implementation's own CI:

    pytest -p conformance.pytest_plugin --lmrpc-target 127.0.0.1:50051 --lmrpc-level must

Options: ``--lmrpc-level must|should|all``, ``--lmrpc-run GLOB`` / ``--lmrpc-skip GLOB`` (repeatable),
``--lmrpc-time-scale F``, ``--lmrpc-baseline FILE`` (known failures become xfail; a listed case that
passes fails as stale). Without ``--lmrpc-target`` the plugin adds nothing. Cases run one at a time on
one connection; ``conformance run`` is faster (it runs independent cases concurrently).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from conformance.cases import all_cases
from conformance.harness.runner import run_case
from conformance.harness.session import Budgets, Session, Tuning
from conformance.harness.target import Endpoint, GrpcTarget
from conformance.report.baseline import Baseline
from conformance.report.model import failure_text
from conformance.search.property import CI_PROFILE
from conformance.spec.registry import Case, expand_patterns, matches, select
from conformance.vocabulary import CaseResult, Verdict

T = TypeVar("T")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lmrpc", "lmrpc conformance")
    group.addoption("--lmrpc-target", metavar="HOST:PORT", help="run the lmrpc conformance cases against it")
    group.addoption("--lmrpc-level", choices=("must", "should", "all"), default="all")
    group.addoption("--lmrpc-run", action="append", default=[], metavar="GLOB")
    group.addoption("--lmrpc-skip", action="append", default=[], metavar="GLOB")
    group.addoption("--lmrpc-time-scale", type=float, default=1.0, metavar="F")
    group.addoption("--lmrpc-baseline", metavar="FILE", help="TOML known failures: they run as xfail")


class _Runner:
    """One event loop in a thread, one connection, one Session for the whole pytest session."""

    def __init__(self, config: pytest.Config) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="lmrpc-conformance", daemon=True)
        self.thread.start()
        level = config.getoption("--lmrpc-level")
        budgets = Budgets(scale=config.getoption("--lmrpc-time-scale"))
        endpoint = Endpoint.parse(config.getoption("--lmrpc-target"))
        target = self.call(GrpcTarget.connect(endpoint, budgets.connect_s))
        self.session = Session(target, budgets, Tuning.for_level(level), profile=CI_PROFILE)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.call(self.session.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class ConformanceFailure(Exception):
    def __init__(self, result: CaseResult) -> None:
        super().__init__(result.reason)
        self.result = result


class CaseItem(pytest.Item):
    def __init__(self, *, case: Case, known: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case, self.known = case, known

    def runtest(self) -> None:
        runner: _Runner = self.config.stash[_RUNNER]
        result = runner.call(run_case(runner.session, self.case))
        if result.verdict is Verdict.SKIP:
            pytest.skip(result.reason)
        failed = result.verdict.is_failure
        if self.known is not None:
            if failed:
                pytest.xfail(f"known failure (baseline): {self.known}")
            raise ConformanceFailure(
                CaseResult(
                    self.case.id,
                    self.case.clause.id,
                    self.case.level.value,
                    Verdict.FAIL,
                    reason=f"stale baseline: passes now; remove it ({self.known})",
                )
            )
        if failed:
            raise ConformanceFailure(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if not isinstance(excinfo.value, ConformanceFailure):
            return str(super().repr_failure(excinfo))
        return failure_text(excinfo.value.result)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "lmrpc-conformance", None, self.case.id


_RUNNER = pytest.StashKey[_Runner]()


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if not config.getoption("--lmrpc-target"):
        return
    baseline = (
        Baseline.load(config.getoption("--lmrpc-baseline")) if config.getoption("--lmrpc-baseline") else None
    )
    cases = select(
        all_cases(),
        protocol="lmrpc",
        level=config.getoption("--lmrpc-level"),
        run=expand_patterns(config.getoption("--lmrpc-run")),
        skip=expand_patterns(config.getoption("--lmrpc-skip")),
    )
    config.stash[_RUNNER] = _Runner(config)
    for case in cases:
        known = (
            next((e.reason for e in baseline.entries if matches(e.case, case)), None) if baseline else None
        )
        items.append(CaseItem.from_parent(session, name=case.id, case=case, known=known))


def pytest_sessionfinish(session: pytest.Session) -> None:
    runner = session.config.stash.get(_RUNNER, None)
    if runner is not None:
        runner.close()
