"""Where ServingStats learns what happens: the request table and every RPC handler. Used only when metrics are on (``--metrics-port``), so a server without them pays
nothing; the subclasses add observation and change no behaviour.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from grpclib import GRPCError
from grpclib.const import Handler
from grpclib.exceptions import StreamTerminatedError
from grpclib.server import Stream

from reference_server.frontend.metrics.stats import ServingStats
from reference_server.frontend.requests import FlowHooks, RequestState, RequestTable

PROTOCOLS = {
    "lmrpc.v1": "lmrpc",
    "vllm.grpc.engine": "vllm-engine",
    "sglang.grpc.scheduler": "sglang-scheduler",
    "sglang.runtime.v1": "sglang-runtime",
    "grpc.health.v1": "health",
    "grpc.reflection.v1": "reflection",
    "grpc.reflection.v1alpha": "reflection",
}


class ObservedRequestTable(RequestTable):
    def __init__(self, abort_grace_s: float, flow: FlowHooks, stats: ServingStats) -> None:
        super().__init__(abort_grace_s, flow)
        self.stats = stats

    def register(self, *args: Any, **kwargs: Any) -> RequestState:
        state = super().register(*args, **kwargs)
        self.stats.on_register(state.rid)
        return state

    def mark_submitted(self, state: RequestState, prompt_tokens: int) -> None:
        self.stats.on_submit(state.rid, prompt_tokens)
        super().mark_submitted(state, prompt_tokens)

    def unregister(self, state: RequestState) -> None:
        self.stats.on_unregister(
            state.rid, completed=state.complete, cancelled=state.submitted and not state.complete
        )
        super().unregister(state)

    def dispatch(self, events: Any) -> None:
        events = list(events)
        self.stats.on_events(events)
        super().dispatch(events)


def protocol_and_rpc(path: str) -> tuple[str, str]:
    """``/vllm.grpc.engine.VllmEngine/Generate`` -> ``("vllm-engine", "Generate")``."""
    service, _, rpc = path.lstrip("/").partition("/")
    package = service.rpartition(".")[0]
    return PROTOCOLS.get(package, package or "unknown"), rpc


def counted_handlers(handlers: Mapping[str, Handler], stats: ServingStats) -> dict[str, Handler]:
    """Every handler, each counting its RPC by protocol, method and final status."""
    counted = {}
    for path, handler in handlers.items():
        protocol, rpc = protocol_and_rpc(path)
        counted[path] = Handler(
            _counted(handler.func, stats, protocol, rpc),
            handler.cardinality,
            handler.request_type,
            handler.reply_type,
        )
    return counted


def _counted(
    func: Callable[[Stream[Any, Any]], Coroutine[Any, Any, None]],
    stats: ServingStats,
    protocol: str,
    rpc: str,
) -> Callable[[Stream[Any, Any]], Coroutine[Any, Any, None]]:
    async def handle(stream: Stream[Any, Any]) -> None:
        code = "OK"
        try:
            await func(stream)
        except GRPCError as exc:
            code = exc.status.name
            raise
        except (asyncio.CancelledError, StreamTerminatedError):  # the client went away
            code = "CANCELLED"
            raise
        except TimeoutError:  # grpclib enforcing the client's deadline
            code = "DEADLINE_EXCEEDED"
            raise
        except Exception:
            code = "UNKNOWN"
            raise
        finally:
            stats.on_rpc(protocol, rpc, code)

    return handle
