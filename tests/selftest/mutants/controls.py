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
    fault = "(control) every RPC answers 50 ms late and every message 1 ms late"
    is_control = True
    time_scale = 2.0

    async def unary(self, method: str, request: Any) -> Any:
        await asyncio.sleep(0.05)
        return await super().unary(method, request)

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        await asyncio.sleep(0.05)
        async for event in events:
            await asyncio.sleep(0.001)
            yield event


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
