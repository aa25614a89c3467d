"""lmrpc.v1 is the contract itself: every clause applies as written (the engine clauses of §14 and
sglang.runtime.v1's of §15 do not)."""

from __future__ import annotations

from conformance.spec.profiles.base import ENGINE_ONLY, NOT_RUNTIME, Profile, na

LMRPC = Profile(
    "lmrpc",
    "lmrpc.v1",
    {**{f"SMG-{i}": na(ENGINE_ONLY) for i in range(1, 7)}, **NOT_RUNTIME},
)
