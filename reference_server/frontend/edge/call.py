"""The call being served: who made it, and what to do if its client stops reading.

The edge guard opens a Call for every RPC before its handler runs; code anywhere below the
handler (in the same task) reads it with ``current_call()``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from reference_server.frontend.edge.auth import ANONYMOUS, Principal


@dataclass
class Call:
    method: str
    principal: Principal = ANONYMOUS
    # Set by a handler whose work continues while the client does not read (Generate): called
    # once when a response has waited ``stall_timeout_s`` for the client (FLOW-2).
    on_stall: Callable[[], None] | None = None
    traceparent: str = ""  # the caller's W3C trace context, if it sent a valid one (TRACE-1)


_CURRENT: ContextVar[Call | None] = ContextVar("lmrpc_call", default=None)


def current_call() -> Call:
    """The call this task serves (a fresh anonymous one outside the guard, e.g. in unit tests)."""
    call = _CURRENT.get()
    if call is None:
        call = Call(method="")
        _CURRENT.set(call)
    return call


def enter_call(call: Call) -> None:
    _CURRENT.set(call)
