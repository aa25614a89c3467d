"""Radix prefix cache: matching, splitting, insertion ownership, locks and LRU eviction."""

from __future__ import annotations

import torch

from reference_server.engine.radix_cache import RadixCache


def slots(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_match_insert_and_split() -> None:
    cache = RadixCache()
    assert cache.match_prefix([1, 2, 3]).length == 0
    assert cache.insert([1, 2, 3, 4], slots(10, 11, 12, 13)) == 0
    match = cache.match_prefix([1, 2, 9])
    assert match.length == 2 and match.slots.tolist() == [10, 11]
    assert match.node.key == [1, 2]  # the edge was split at the match
    # a diverging insert keeps the shared prefix and reports it as already cached
    assert cache.insert([1, 2, 7, 8], slots(20, 21, 22, 23)) == 2
    assert cache.match_prefix([1, 2, 7, 8, 5]).slots.tolist() == [10, 11, 22, 23]
    assert cache.match_prefix([1, 2, 3, 4]).slots.tolist() == [10, 11, 12, 13]
    assert cache.total_size == cache.evictable_size == 6


def test_locks_protect_the_whole_path() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(10, 11, 12, 13))
    cache.insert([1, 2, 5], slots(10, 11, 14))
    node = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(node)
    assert (cache.protected_size, cache.evictable_size) == (4, 1)
    assert cache.evict(10).tolist() == [14]  # only the unlocked branch goes
    cache.lock(node)
    cache.unlock(node)
    assert cache.protected_size == 4  # still held once
    cache.unlock(node)
    assert (cache.protected_size, cache.evictable_size) == (0, 4)


def test_split_keeps_locks_of_the_deeper_node() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(10, 11, 12, 13))
    deep = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(deep)
    cache.match_prefix([1, 2])  # splits the locked edge
    assert cache.evict(100).numel() == 0
    cache.unlock(deep)  # the holder's node still unlocks both halves
    assert cache.evict(100).numel() == 4 and cache.total_size == 0


def test_eviction_is_lru_and_leaf_first() -> None:
    cache = RadixCache()
    cache.insert([1, 2], slots(1, 2))
    cache.insert([1, 2, 3], slots(1, 2, 3))  # extends [1, 2]
    cache.insert([7, 8], slots(7, 8))
    cache.insert([9], slots(9))
    cache.match_prefix([7, 8])  # now the most recent
    assert sorted(cache.evict(1).tolist()) == [3]  # the oldest leaf
    assert sorted(cache.evict(1).tolist()) == [1, 2]  # its parent became a leaf, older than [9]
    assert sorted(cache.evict(1).tolist()) == [9]
    assert cache.match_prefix([7, 8]).length == 2
    assert cache.flush().tolist() == [7, 8] and cache.total_size == 0
