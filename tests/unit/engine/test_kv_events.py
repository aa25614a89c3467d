"""KV-cache events: the blocks that the radix cache (and the fake engine) report are exactly the
full blocks of the token paths they cache, parents before children, under any mix of inserts,
splits, locks, evictions and flushes."""

from __future__ import annotations

import random

import torch

from reference_server.engine.fake_blocks import FakeBlockCache
from reference_server.engine.kv_events import block_hash
from reference_server.engine.radix_cache import RadixCache, RadixNode
from reference_server.ipc import KvBlocksRemoved, KvBlocksStored, KvCacheCleared, KvCacheEvent

B = 4


class Mirror:
    """What a router rebuilds from the events, checking their order as it goes."""

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[int | None, tuple[int, ...]]] = {}

    def apply(self, events: list[KvCacheEvent]) -> None:
        for event in events:
            if isinstance(event, KvBlocksStored):
                parent = event.parent_block_hash
                assert parent is None or parent in self.blocks, "a child stored before its parent"
                for block in event.blocks:
                    assert len(block.token_ids) == B
                    assert block.block_hash not in self.blocks, "a block stored twice"
                    assert block.block_hash == block_hash(parent, block.token_ids)
                    self.blocks[block.block_hash] = (parent, tuple(block.token_ids))
                    parent = block.block_hash
            elif isinstance(event, KvBlocksRemoved):
                for h in event.block_hashes:
                    assert h in self.blocks, "an unknown block removed"
                    del self.blocks[h]
                    assert all(parent != h for parent, _ in self.blocks.values()), "a parent removed first"
            else:
                assert isinstance(event, KvCacheCleared)
                self.blocks.clear()


def expected_blocks(paths: list[list[int]]) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    blocks: dict[int, tuple[int | None, tuple[int, ...]]] = {}
    for path in paths:
        parent = None
        for i in range(len(path) // B):
            tokens = tuple(path[i * B : (i + 1) * B])
            h = block_hash(parent, tokens)
            blocks[h] = (parent, tokens)
            parent = h
    return blocks


def cached_paths(cache: RadixCache) -> list[list[int]]:
    paths, stack = [], [(child, list(child.key)) for child in cache.root.children.values()]
    while stack:
        node, path = stack.pop()
        paths.append(path)
        stack.extend((child, path + child.key) for child in node.children.values())
    return paths


def slots(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64)


def test_radix_cache_events_track_its_blocks_through_random_operations() -> None:
    rng = random.Random(7)
    cache, mirror = RadixCache(block_size=B), Mirror()
    locked: list[RadixNode] = []
    stems = [[rng.randrange(3) for _ in range(rng.randrange(1, 12))] for _ in range(6)]
    for _ in range(600):
        op = rng.random()
        key = rng.choice(stems) + [rng.randrange(3) for _ in range(rng.randrange(0, 10))]
        if op < 0.45:
            cache.insert(key, slots(len(key)))
        elif op < 0.65:
            match = cache.match_prefix(key)  # splits edges mid-block
            if rng.random() < 0.5 and match.length:
                cache.lock(match.node)
                locked.append(match.node)
        elif op < 0.8 and locked:
            cache.unlock(locked.pop(rng.randrange(len(locked))))
        elif op < 0.97:
            cache.evict(rng.randrange(1, 12))
        else:
            cache.flush()
        mirror.apply(cache.drain_events())
        assert mirror.blocks == expected_blocks(cached_paths(cache))


def test_a_split_mid_block_keeps_one_block_per_branch() -> None:
    cache, mirror = RadixCache(block_size=B), Mirror()
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], slots(8))
    cache.insert([1, 2, 3, 4, 5, 9, 9, 9], slots(8))  # diverges inside block 1
    mirror.apply(cache.drain_events())
    first = block_hash(None, [1, 2, 3, 4])
    assert set(mirror.blocks) == {
        first,
        block_hash(first, [5, 6, 7, 8]),
        block_hash(first, [5, 9, 9, 9]),
    }
    cache.evict(1)  # the least recently used branch goes; block 0 stays with the other one
    mirror.apply(cache.drain_events())
    assert first in mirror.blocks and len(mirror.blocks) == 2


def test_no_events_without_a_block_size() -> None:
    cache = RadixCache()
    cache.insert(list(range(40)), slots(40))
    cache.flush()
    assert cache.drain_events() == []


def test_fake_block_cache_reports_full_prompt_blocks_and_evicts_leaves() -> None:
    cache, mirror = FakeBlockCache(capacity_blocks=6, block_size=B), Mirror()
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8, 9])  # two full blocks; the 9 is not a block
    cache.insert([1, 2, 3, 4, 6, 6, 6, 6])
    mirror.apply(cache.drain_events())
    assert mirror.blocks == expected_blocks([[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 6, 6, 6, 6]])
    cache.insert(list(range(100, 116)))  # 4 new blocks: 7 > 6, the oldest leaf goes
    mirror.apply(cache.drain_events())
    assert len(mirror.blocks) == len(cache) == 6
    assert block_hash(None, [1, 2, 3, 4]) in mirror.blocks  # a parent outlives its leaves
    cache.clear()
    mirror.apply(cache.drain_events())
    assert mirror.blocks == {}
