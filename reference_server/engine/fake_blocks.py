"""The fake engine's prefix cache as blocks: KV-cache events consistent with what it serves.

The fake engine has no KV pool, so this keeps only block hashes: every full block of an admitted
prompt is cached, least recently used leaf blocks are evicted past the capacity, and a flush
clears everything. It reports exactly the events a real cache would for that behaviour.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from reference_server.engine.kv_events import block_hash, stored_blocks
from reference_server.ipc import KvBlocksRemoved, KvCacheCleared, KvCacheEvent


@dataclass
class _Block:
    parent_hash: int | None
    children: int = 0


class FakeBlockCache:
    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self._blocks: OrderedDict[int, _Block] = OrderedDict()  # least recently used first
        self._events: list[KvCacheEvent] = []

    def __len__(self) -> int:
        return len(self._blocks)

    def insert(self, token_ids: list[int]) -> None:
        """Cache every full block of ``token_ids``."""
        b = self.block_size
        num_blocks = len(token_ids) // b
        parent: int | None = None
        for index in range(num_blocks):
            h = block_hash(parent, token_ids[index * b : (index + 1) * b])
            if h not in self._blocks:  # this block and all after it are new
                event = stored_blocks(token_ids, index, num_blocks, parent, b)
                for block in event.blocks:
                    self._add(block.block_hash, parent)
                    parent = block.block_hash
                self._events.append(event)
                break
            self._blocks.move_to_end(h)
            parent = h
        self._evict_beyond_capacity()

    def clear(self) -> None:
        if self._blocks:
            self._blocks.clear()
            self._events.append(KvCacheCleared())

    def drain_events(self) -> list[KvCacheEvent]:
        events, self._events = self._events, []
        return events

    def _add(self, h: int, parent: int | None) -> None:
        self._blocks[h] = _Block(parent)
        if parent is not None:
            self._blocks[parent].children += 1

    def _evict_beyond_capacity(self) -> None:
        removed: list[int] = []
        while len(self._blocks) > self.capacity_blocks:
            leaf = next(h for h, block in self._blocks.items() if block.children == 0)
            parent = self._blocks.pop(leaf).parent_hash
            if parent is not None:
                self._blocks[parent].children -= 1
            removed.append(leaf)
        if removed:
            self._events.append(KvBlocksRemoved(removed))
