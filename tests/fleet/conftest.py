"""Fixtures: reference servers behind the real smg gateway (see gateway_fleet.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from gateway_fleet import DETERMINISTIC_ROUTING, FAKE_MODEL, Fleet, start_replica

from reference_server.smg_gateway import SmgGateway


@contextlib.contextmanager
def _two_replica_fleet() -> Iterator[Fleet]:
    """Two fake-engine replicas (5 ms per step) behind one smg with cache-aware routing."""
    with contextlib.ExitStack() as stack:
        replicas = [start_replica(stack, args=("--fake-token-delay", "0.005")) for _ in range(2)]
        gateway = SmgGateway(
            [r.server.target for r in replicas], model=FAKE_MODEL, args=DETERMINISTIC_ROUTING
        )
        stack.enter_context(gateway)
        yield Fleet(replicas, gateway)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """One fleet shared by a module's tests."""
    with _two_replica_fleet() as shared:
        yield shared


@pytest.fixture
def fresh_fleet() -> Iterator[Fleet]:
    """A fleet of its own, for a test about routing: on the shared fleet, smg's routing state
    (per-worker load and request counts, its cache trees) is whatever earlier tests left."""
    with _two_replica_fleet() as own:
        yield own
