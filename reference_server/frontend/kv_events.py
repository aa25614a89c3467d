"""KV-cache events, numbered and fanned out to subscribers (smg's ``SubscribeKvEvents``).

Every ``ipc.KvEvents`` from the scheduler becomes one batch with the next sequence number
(1, 2, ...). The hub keeps the last ``history_batches`` batches and a mirror of every live block
since startup, and serves each subscriber from a cursor:

- ``start_sequence_number = 0``: the current state first, as a snapshot (chunks numbered up to the
  current sequence: a ``KvCacheCleared``, then one stored event per live block, parents first),
  then every later batch;
- ``n > 0``: the batches after ``n`` from the history, then every later batch. A cursor that the
  history no longer reaches, or that is ahead of this server (it restarted), is refused with
  ``ReplayUnavailableError`` (OUT_OF_RANGE): the subscriber clears what it knows and resubscribes
  from 0.

A subscriber that falls ``queue_batches`` behind is dropped (``SubscriberOverflowError``,
DATA_LOSS) instead of holding memory for it; it resubscribes from 0 the same way.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import assert_never

from reference_server import ipc


class ReplayUnavailableError(Exception):
    pass


class SubscriberOverflowError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class SnapshotPart:
    index: int  # 0-based
    count: int
    blocks: int  # live blocks in the whole snapshot


@dataclass(frozen=True, slots=True)
class KvEventRecord:
    event_id: int  # 0 for events made up for a snapshot
    event: ipc.KvCacheEvent


@dataclass(frozen=True, slots=True)
class KvBatch:
    sequence_number: int
    timestamp: float
    block_size: int
    records: list[KvEventRecord]
    snapshot: SnapshotPart | None = None


@dataclass(eq=False)
class KvSubscription:
    capacity: int
    _batches: deque[KvBatch] = field(default_factory=deque)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    overflowed: bool = False
    closed: bool = False

    def offer(self, batch: KvBatch) -> bool:
        """Queue a batch; False (and the subscription is over) if the subscriber is too far behind."""
        if len(self._batches) >= self.capacity:
            self.overflowed = True
            self._wakeup.set()
            return False
        self._batches.append(batch)
        self._wakeup.set()
        return True

    async def next(self) -> KvBatch:
        while not self._batches:
            if self.overflowed:
                raise SubscriberOverflowError(
                    f"the subscriber fell more than {self.capacity} KV event batches behind"
                )
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._batches.popleft()


class KvEventHub:
    def __init__(
        self, *, history_batches: int = 4096, queue_batches: int = 4096, snapshot_chunk_blocks: int = 512
    ) -> None:
        self.sequence_number = 0  # of the last batch published
        self.block_size = 0  # learned from the first batch
        self._history: deque[KvBatch] = deque(maxlen=history_batches)
        self._live: dict[int, tuple[int | None, list[int]]] = {}  # hash -> (parent, tokens), parents first
        self._subscribers: list[KvSubscription] = []
        self._event_ids = itertools.count(1)
        self._queue_batches = queue_batches
        self._snapshot_chunk_blocks = snapshot_chunk_blocks

    @property
    def live_blocks(self) -> int:
        return len(self._live)

    def publish(self, message: ipc.KvEvents) -> None:
        self.sequence_number += 1
        self.block_size = message.block_size
        records = [KvEventRecord(next(self._event_ids), event) for event in message.events]
        batch = KvBatch(self.sequence_number, time.time(), message.block_size, records)
        self._history.append(batch)
        for event in message.events:
            self._apply(event)
        self._subscribers = [s for s in self._subscribers if not s.closed and s.offer(batch)]

    def subscribe(self, start_sequence_number: int) -> KvSubscription:
        """A subscription primed with what the cursor has not seen; see the module docstring."""
        if start_sequence_number == 0:
            backlog = self._snapshot()
        else:
            backlog = self._replay(start_sequence_number)
        subscription = KvSubscription(self._queue_batches + len(backlog))
        for batch in backlog:
            subscription.offer(batch)
        self._subscribers.append(subscription)
        return subscription

    def unsubscribe(self, subscription: KvSubscription) -> None:
        subscription.closed = True
        if subscription in self._subscribers:
            self._subscribers.remove(subscription)

    def _replay(self, start: int) -> list[KvBatch]:
        if start > self.sequence_number:
            raise ReplayUnavailableError(
                f"start_sequence_number={start} is ahead of this server's last KV event batch "
                f"({self.sequence_number}); it restarted since: subscribe from 0"
            )
        oldest = self._history[0].sequence_number if self._history else self.sequence_number + 1
        if start < oldest - 1:
            raise ReplayUnavailableError(
                f"start_sequence_number={start} is older than the oldest KV event batch this server "
                f"still holds ({oldest}): subscribe from 0"
            )
        return [batch for batch in self._history if batch.sequence_number > start]

    def _snapshot(self) -> list[KvBatch]:
        """The live blocks as chunks numbered so that they end at the current sequence number."""
        if not self._live:
            return []
        blocks = list(self._live.items())
        count = min(-(-len(blocks) // self._snapshot_chunk_blocks), self.sequence_number)
        per_chunk = -(-len(blocks) // count)
        now = time.time()
        chunks = []
        for index in range(count):
            records = [KvEventRecord(0, ipc.KvCacheCleared())] if index == 0 else []
            for h, (parent, tokens) in blocks[index * per_chunk : (index + 1) * per_chunk]:
                records.append(KvEventRecord(0, ipc.KvBlocksStored(parent, [ipc.KvBlock(h, tokens)])))
            chunks.append(
                KvBatch(
                    self.sequence_number - count + 1 + index,
                    now,
                    self.block_size,
                    records,
                    SnapshotPart(index, count, len(blocks)),
                )
            )
        return chunks

    def _apply(self, event: ipc.KvCacheEvent) -> None:
        match event:
            case ipc.KvBlocksStored():
                parent = event.parent_block_hash
                for block in event.blocks:
                    self._live[block.block_hash] = (parent, block.token_ids)
                    parent = block.block_hash
            case ipc.KvBlocksRemoved():
                for h in event.block_hashes:
                    self._live.pop(h, None)
            case ipc.KvCacheCleared():
                self._live.clear()
            case _:
                assert_never(event)
