"""Lifecycle mutants: the reference server with one fault in what a router sees across its life,
for the cases that restart or drain the server through the user's hooks (SVC-4, LIFE-1). Like the
edge mutants, each is the real server with one part replaced before it starts.

    python -m tests.selftest.lifecycle_mutants MUTANT [server options...]
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from lmrpc.v1 import ServerInfo
from reference_server.frontend import app, context

from .edge_mutants import serve_mutant


@dataclass(frozen=True)
class LifecycleMutant:
    name: str
    fault: str
    expected: frozenset[str]  # the cases that must fail, and no others
    apply: Callable[[], None]
    protocol: str = "lmrpc"  # the protocol the harness speaks to it


def _rewrite_instance(instance: Callable[[], str]) -> None:
    original = context.FrontendContext.server_info

    def server_info(self: context.FrontendContext) -> ServerInfo:
        info = original(self)
        info.instance_id = instance()
        return info

    context.FrontendContext.server_info = server_info  # type: ignore[method-assign]


def _instance_fixed() -> None:
    _rewrite_instance(lambda: "lmrpc-reference")  # a name, not an instance: the same after a restart


def _instance_per_call() -> None:
    _rewrite_instance(lambda: uuid.uuid4().hex)


def _serving_while_draining() -> None:
    original = context.FrontendContext.set_phase

    def set_phase(self: context.FrontendContext, phase: context.Phase) -> None:
        original(self, phase)
        if phase is context.Phase.DRAINING:
            self.health.set(True)

    context.FrontendContext.set_phase = set_phase  # type: ignore[method-assign]


def _drain_drops_streams() -> None:
    original = app.Frontend.drain

    async def drain(self: app.Frontend) -> None:
        self.config = dataclasses.replace(self.config, drain_timeout_s=0.0)  # still reports its own
        await original(self)

    app.Frontend.drain = drain  # type: ignore[method-assign]


def _engine_healthy_while_draining() -> None:
    from reference_server.frontend.dialects.base import service

    original = service.DialectBase.health

    def health(self: service.DialectBase) -> tuple[bool, str]:  # type: ignore[type-arg]
        if self.ctx.phase is context.Phase.DRAINING:
            return True, "serving"
        return original(self)

    service.DialectBase.health = health  # type: ignore[method-assign]


def _start_time_per_call() -> None:
    from reference_server.frontend.dialects.base import service

    original = service.DialectBase.server_facts

    async def server_facts(self: service.DialectBase) -> service.ServerFacts:  # type: ignore[type-arg]
        facts = await original(self)
        return dataclasses.replace(
            facts, started_at_unix=time.time() - facts.uptime_seconds
        )  # as it once was

    service.DialectBase.server_facts = server_facts  # type: ignore[method-assign]


LIFECYCLE_MUTANTS = (
    LifecycleMutant("instance-fixed", "ServerInfo.instance_id is the same after a restart", frozenset({"SVC-4[restart]"}), _instance_fixed),
    LifecycleMutant("instance-per-call", "ServerInfo.instance_id is new on every call", frozenset({"SVC-4", "SVC-4[restart]"}), _instance_per_call),
    LifecycleMutant("serving-while-draining", "health stays SERVING while the server drains", frozenset({"LIFE-1[drain]"}), _serving_while_draining),
    LifecycleMutant("drain-drops-streams", "a drain aborts the streams in flight at once", frozenset({"LIFE-1[drain]"}), _drain_drops_streams),
    LifecycleMutant("engine-healthy-while-draining", "the engine HealthCheck says healthy while draining", frozenset({"SMG-5[drain]"}), _engine_healthy_while_draining, "vllm-engine"),
    LifecycleMutant("start-time-per-call", "sglang start_time is the time of the call", frozenset({"SVC-4", "SVC-4[restart]"}), _start_time_per_call, "sglang-scheduler"),
)  # fmt: skip


def main() -> None:
    serve_mutant({m.name: m.apply for m in LIFECYCLE_MUTANTS}, sys.argv[1:])


if __name__ == "__main__":
    main()
