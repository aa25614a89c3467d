"""Layered time budgets, all multiplied by ``--time-scale``, and per-level example counts.

Defaults are sized for a CPU fake engine; a slow accelerator or a cold model runs with
``--time-scale 3`` (or more) instead of editing constants. Nothing in the harness waits on a
hard-coded number of seconds: it asks ``Budgets``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Budgets:
    scale: float = 1.0
    connect_base_s: float = 5.0  # reaching the target and reading its info
    rpc_base_s: float = 10.0  # one unary RPC
    stream_base_s: float = 30.0  # one Generate call from start to trailers
    idle_base_s: float = 10.0  # the longest silence inside a stream before it counts as hung
    release_base_s: float = 5.0  # load back to its baseline after an abort, cancel or deadline
    prompt_base_s: float = 10.0  # time to a request's first message (acceptance)
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
