"""State shared by every case of one run: the target, the budgets, and results computed once."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from conformance.budgets import Budgets, Tuning
from conformance.target import Target, TargetInfo


@dataclass(slots=True)
class Session:
    target: Target
    budgets: Budgets
    tuning: Tuning
    seed: int = 0  # hypothesis seed for the explore profile; the ci profile is derandomized
    profile: str = "conformance-ci"
    run_token: str = field(default_factory=lambda: secrets.token_hex(3))
    _memo: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    _ids: int = 0

    @property
    def info(self) -> TargetInfo:
        return self.target.info

    def next_id(self, tag: str) -> str:
        """A request id unique within the run and valid under REQ-4."""
        self._ids += 1
        safe = "".join(c if c.isalnum() or c in "._:/-" else "-" for c in tag)[:60]
        return f"cf-{self.run_token}-{self._ids}-{safe}"

    def shared(self, key: str, factory: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
        """Compute something once per run (the stream pool, a state-machine run) for many cases."""
        task = self._memo.get(key)
        if task is None:
            task = asyncio.ensure_future(factory())
            self._memo[key] = task
        return task

    def close(self) -> None:
        for task in self._memo.values():
            task.cancel()
        self.target.close()
