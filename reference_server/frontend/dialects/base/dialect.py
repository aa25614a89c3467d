"""One row of the dialect table (``dialects/table.py``): how the frontend serves one protocol."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reference_server.config import ServerConfig
from reference_server.frontend.dialects.base.service import Backend, DialectBase


def on_lmrpc_port(config: ServerConfig) -> int | None:
    return None


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str  # short: the metrics' protocol label, and the ready file's line of a port of its own
    grpc_service: str  # e.g. "vllm.grpc.engine.VllmEngine"
    service: Callable[[Backend], DialectBase[Any, Any]]
    admin_rpcs: tuple[str, ...]  # need the admin role when authentication is on (AUTH-2)
    enabled: Callable[[ServerConfig], bool]
    #: the port it listens on when enabled: None for lmrpc.v1's port, else its own (0: a free one)
    own_port: Callable[[ServerConfig], int | None] = on_lmrpc_port

    @property
    def admin_methods(self) -> frozenset[str]:
        return frozenset(f"/{self.grpc_service}/{rpc}" for rpc in self.admin_rpcs)
