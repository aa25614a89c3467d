"""Helpers for integration tests: run a coroutine against a server, collect a stream, poll load."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import betterproto2

from lmrpc.client import LmrpcClient
from lmrpc.v1 import GenerateRequest, GenerateResponse, Load

T = TypeVar("T")


def run(target: str, body: Callable[[LmrpcClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with LmrpcClient.connect(target) as client:
            return await body(client)

    return asyncio.run(main())


async def collect(
    client: LmrpcClient, request: GenerateRequest, timeout: float = 30
) -> list[GenerateResponse]:
    return [r async for r in client.stream(request, timeout=timeout)]


def kinds(responses: list[GenerateResponse]) -> list[str]:
    return [betterproto2.which_one_of(r, "event")[0] for r in responses]


async def wait_idle(client: LmrpcClient, timeout: float = 5.0) -> Load:
    """Poll GetLoad until nothing is in flight (LOAD-1); fail with the last load seen."""
    deadline = time.monotonic() + timeout
    while True:
        load = await client.load()
        if not (
            load.active_requests or load.running_sequences or load.waiting_sequences or load.kv_tokens_in_use
        ):
            return load
        if time.monotonic() > deadline:
            raise AssertionError(f"server not idle after {timeout} s: {load}")
        await asyncio.sleep(0.05)


async def first_delta(
    client: LmrpcClient, request: GenerateRequest
) -> tuple[asyncio.Task[list[GenerateResponse]], list[GenerateResponse]]:
    """Start a stream in a task and return once its first TokenDelta arrived."""
    seen: list[GenerateResponse] = []
    got_delta = asyncio.Event()

    async def consume() -> list[GenerateResponse]:
        async with contextlib.aclosing(client.stream(request, timeout=60)) as events:
            async for response in events:
                seen.append(response)
                if response.delta is not None:
                    got_delta.set()
        return seen

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_delta.wait(), 30)
    return task, seen
