"""Correct variants of the reference server: the harness must pass them (no false alarms)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from lmrpc.v1 import GenerateResponse

from ..proxy import Call, Out
from .base import Mutant, delta, kind


class SlowButCorrect(Mutant):
    name = "slow-but-correct"
    fault = (
        "(control) every RPC answers 50 ms late and every message 1 ms late (queued deltas merged, STREAM-9)"
    )
    is_control = True
    time_scale = 2.0

    async def unary(self, method: str, request: Any) -> Any:
        await asyncio.sleep(0.05)
        return await super().unary(method, request)

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        queue: asyncio.Queue[GenerateResponse | None] = asyncio.Queue()

        async def pull() -> None:
            try:
                async for event in events:
                    queue.put_nowait(event)
            finally:
                queue.put_nowait(None)

        puller = asyncio.ensure_future(pull())
        try:
            await asyncio.sleep(0.05)
            while True:
                await asyncio.sleep(0.001)
                batch = [await queue.get()]
                while not queue.empty() and batch[-1] is not None:
                    batch.append(queue.get_nowait())
                for event in merge_deltas([e for e in batch if e is not None]):
                    yield event
                if batch[-1] is None:
                    await puller  # its errors (a failed upstream call) are the stream's
                    return
        finally:
            puller.cancel()


def merge_deltas(events: list[GenerateResponse]) -> list[GenerateResponse]:
    """Consecutive deltas of one output merged into one, as a server does for a slow reader."""
    out: list[GenerateResponse] = []
    for event in events:
        last = out[-1] if out else None
        if (
            last is not None
            and kind(event) == "delta"
            and kind(last) == "delta"
            and delta(last).output_index == delta(event).output_index
            and last.usage is None
        ):
            delta(last).token_ids = [*delta(last).token_ids, *delta(event).token_ids]
            delta(last).text += delta(event).text
            delta(last).logprobs = [*delta(last).logprobs, *delta(event).logprobs]
            last.usage = event.usage
            continue
        out.append(event)
    return out


class MergedDeltas(Mutant):
    name = "merged-deltas"
    fault = "(control) consecutive deltas of one output are merged, as STREAM-9 allows"
    is_control = True

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        held: GenerateResponse | None = None
        async for event in events:
            if kind(event) == "delta":
                if (
                    held is not None
                    and delta(held).output_index == delta(event).output_index
                    and held.usage is None
                    and len(delta(held).token_ids) < 8
                ):
                    delta(held).token_ids = [*delta(held).token_ids, *delta(event).token_ids]
                    delta(held).text += delta(event).text
                    delta(held).logprobs = [*delta(held).logprobs, *delta(event).logprobs]
                    held.usage = event.usage
                    continue
                if held is not None:
                    yield held
                held = event
                continue
            if held is not None:
                yield held
                held = None
            yield event
        if held is not None:
            yield held


CORRECT_VARIANTS: tuple[type[Mutant], ...] = (SlowButCorrect, MergedDeltas)
