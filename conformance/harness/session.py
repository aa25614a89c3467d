"""State shared by every case of one run (the target, results computed once), its layered time
budgets and its per-level search tuning.

Budgets: defaults are sized for a CPU fake engine; a slow accelerator or a cold model runs with
``--time-scale 3`` (or more) instead of editing constants. Nothing in the harness waits on a
hard-coded number of seconds: it asks ``Budgets``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from conformance.drivers.base import Target
from conformance.harness.otlp import SpanReceiver

if TYPE_CHECKING:
    from conformance.drivers.openai.target import HttpTarget
    from conformance.harness.target import GrpcTarget
from conformance.vocabulary import TargetInfo

ASSUMED_PARALLEL = 64  # what a server is taken to run at once until its pace says otherwise


@dataclass(frozen=True, slots=True)
class Budgets:
    scale: float = 1.0
    connect_base_s: float = 5.0  # reaching the target and reading its info
    rpc_base_s: float = 10.0  # one unary RPC
    stream_base_s: float = 30.0  # one Generate call from start to trailers
    idle_base_s: float = 10.0  # the longest silence inside a stream before it counts as hung
    release_base_s: float = 5.0  # load back to its baseline after an abort, cancel or deadline
    prompt_base_s: float = 10.0  # time to a request's first message (acceptance)
    file_work_base_s: float = 30.0  # one administrative RPC that loads or writes files (profiler, weights)
    case_base_s: float = 90.0  # one case, everything included
    liveness_base_s: float = 10.0  # the probe after a failure

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"time_scale={self.scale} must be > 0")

    @property
    def connect_s(self) -> float:
        return self.connect_base_s * self.scale

    @property
    def rpc_s(self) -> float:
        return self.rpc_base_s * self.scale

    @property
    def stream_s(self) -> float:
        return self.stream_base_s * self.scale

    @property
    def idle_s(self) -> float:
        return self.idle_base_s * self.scale

    @property
    def release_s(self) -> float:
        return self.release_base_s * self.scale

    @property
    def prompt_s(self) -> float:
        return self.prompt_base_s * self.scale

    @property
    def file_work_s(self) -> float:
        return self.file_work_base_s * self.scale

    @property
    def liveness_s(self) -> float:
        return self.liveness_base_s * self.scale

    def case_s(self, factor: float = 1.0) -> float:
        return self.case_base_s * factor * self.scale


@dataclass(frozen=True, slots=True)
class Tuning:
    """How much searching each kind of case does. Tuned per level, never by skipping checks."""

    examples: int  # hypothesis examples per property case
    pool_size: int  # generated requests in the shared stream pool
    max_tokens: int  # the largest max_tokens a generated request uses
    machine_examples: int  # state-machine programs
    machine_steps: int  # steps per program
    long_tokens: int = 1 << 20  # max_tokens of requests that must stay in flight (capped by the window)

    @staticmethod
    def for_level(level: str, max_examples: int | None = None) -> Tuning:
        base = {
            "must": Tuning(examples=8, pool_size=24, max_tokens=12, machine_examples=3, machine_steps=10),
            "should": Tuning(examples=8, pool_size=24, max_tokens=12, machine_examples=3, machine_steps=10),
            "all": Tuning(examples=12, pool_size=32, max_tokens=16, machine_examples=4, machine_steps=12),
        }[level]
        if max_examples is None:
            return base
        if max_examples < 1:
            raise ValueError(f"max_examples={max_examples} must be >= 1")
        return Tuning(
            examples=max_examples,
            pool_size=max(max_examples * 3, 4),
            max_tokens=base.max_tokens,
            machine_examples=max(1, max_examples // 3),
            machine_steps=base.machine_steps,
        )


@dataclass(frozen=True, slots=True)
class ServerAccess:
    """What the user tells the harness about the server besides its address. Each one enables the
    cases that need it; they skip without it."""

    weights_path: str | None = None  # --weights-path: a checkpoint of the served weights (ADMIN-2)
    metrics_url: str | None = None  # --metrics-url: the server's Prometheus endpoint (LOAD-2)
    restart_hook: str | None = None  # --restart-hook: a shell command that restarts the server (SVC-4)
    drain_hook: str | None = None  # --drain-hook: a shell command that begins its shutdown (LIFE-1)
    otlp_listen: str | None = None  # --otlp-listen: where the harness receives the server's spans (TRACE-1)


@dataclass(slots=True)
class Session:
    wire: Target  # the server under test, through its protocol (a gRPC one, or an HTTP API)
    budgets: Budgets
    tuning: Tuning
    seed: int | None = None  # hypothesis seed for the explore profile (0 is a seed); ci is derandomized
    profile: str = "conformance-ci"
    access: ServerAccess = ServerAccess()
    spans: SpanReceiver | None = None  # receiving at access.otlp_listen for the whole run
    run_token: str = field(default_factory=lambda: secrets.token_hex(3))
    # requests the server runs at once: measured on a slow server (harness/pace.py), else assumed
    # to be at least what any case keeps in flight
    parallel: int = ASSUMED_PARALLEL
    gate: asyncio.Semaphore | None = None  # on a slow server: no more requests at once than it runs
    step_s: float = 0.0  # one engine step, as the pace measured it (a one-token answer)
    _memo: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    _ids: int = 0

    @property
    def info(self) -> TargetInfo:
        return self.wire.info

    @property
    def protocol(self) -> str:
        return self.wire.protocol

    # A case is registered for its protocols only (spec/registry.py), so a gRPC case meets a gRPC
    # target and an HTTP case an HTTP one: these views are the case's, never a question of the run's.
    @property
    def target(self) -> GrpcTarget:
        """The gRPC target, as a case of a gRPC protocol sees it."""
        return cast("GrpcTarget", self.wire)

    @property
    def http(self) -> HttpTarget:
        """The HTTP target, as a case of an HTTP API sees it."""
        return cast("HttpTarget", self.wire)

    @property
    def promptly_s(self) -> float:
        """The contract's "promptly" and "at once": 1 s plus the engine step in progress (Terms)."""
        return 1.0 * self.budgets.scale + self.step_s

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

    async def aclose(self) -> None:
        for task in self._memo.values():
            task.cancel()
        if self.spans is not None:
            await self.spans.close()
        await self.wire.aclose()
