"""Prefix cache: a radix tree over token ids whose edges carry the KV slots of those tokens.

The tree owns the slots it holds. A node locked by a running sequence (reference count > 0,
propagated to its ancestors) is in use; unlocked nodes are *evictable* and are freed leaf-first
in least-recently-used order when the pool needs room.

With ``block_size > 0`` the tree also reports itself as blocks (``engine/kv_events.py``): a node
owns the blocks whose last token lies on its edge. A new leaf stores its blocks, an evicted leaf
removes them; splits move ownership without an event. ``drain_events`` hands them out.
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple

import torch

from reference_server.engine.kv_events import stored_blocks
from reference_server.ipc import KvBlocksRemoved, KvCacheEvent

_EMPTY = torch.empty(0, dtype=torch.int64)


class RadixNode:
    __slots__ = ("blocks", "children", "key", "last_access", "lock_ref", "parent", "start", "value")

    def __init__(self, key: list[int], value: torch.Tensor, parent: RadixNode | None, start: int = 0) -> None:
        self.key = key
        self.start = start  # depth of the edge's first token
        self.blocks: list[int] = []  # hashes of the blocks that end on this edge, in order
        self.value = value  # [len(key)] int64 slots, CPU
        self.children: dict[int, RadixNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0


class MatchResult(NamedTuple):
    length: int
    slots: torch.Tensor  # [length] int64, CPU
    node: RadixNode  # the node where the match ends (the root for an empty match)


class RadixCache:
    def __init__(self, block_size: int = 0) -> None:
        self.root = RadixNode([], _EMPTY, None)
        self.root.lock_ref = 1  # never evicted
        self.evictable_size = 0
        self.protected_size = 0
        self.block_size = block_size  # 0: no KV-cache events
        self._events: list[KvCacheEvent] = []
        self._clock = itertools.count(1)

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def match_prefix(self, key: list[int]) -> MatchResult:
        """Longest cached prefix of ``key``. The returned node ends exactly at the match (a node
        that extends past it is split), so locking it protects exactly the matched tokens."""
        node, matched, parts = self.root, 0, []
        now = next(self._clock)
        while matched < len(key):
            child = node.children.get(key[matched])
            if child is None:
                break
            n = _common_prefix(child.key, key, matched)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            parts.append(child.value)
            matched += n
            node = child
        slots = torch.cat(parts) if parts else _EMPTY
        return MatchResult(matched, slots, node)

    def insert(self, key: list[int], slots: torch.Tensor) -> int:
        """Cache ``key`` → ``slots``. Returns how many leading tokens were cached already: the
        caller's slots for those are duplicates that it still owns (and must free); the tree
        takes ownership of the rest."""
        assert len(key) == slots.numel()
        node, matched = self.root, 0
        now = next(self._clock)
        while matched < len(key):
            child = node.children.get(key[matched])
            if child is None:
                leaf = RadixNode(key[matched:], slots[matched:].clone(), node, matched)
                leaf.last_access = now
                node.children[key[matched]] = leaf
                self.evictable_size += len(leaf.key)
                if self.block_size:
                    self._store_blocks(leaf, key)
                return matched
            n = _common_prefix(child.key, key, matched)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            matched += n
            node = child
        return matched

    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            assert node.lock_ref > 0, "radix node unlocked more often than locked"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            assert node.parent is not None
            node = node.parent

    def evict(self, num_tokens: int) -> torch.Tensor:
        """Drop unlocked leaves, least recently used first, until at least ``num_tokens`` slots
        are released (or nothing evictable is left). Returns the released slots."""
        heap = [(n.last_access, id(n), n) for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        released: list[torch.Tensor] = []
        removed_blocks: list[int] = []
        count = 0
        while heap and count < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            released.append(leaf.value)
            removed_blocks += reversed(leaf.blocks)  # children before parents
            count += len(leaf.key)
            self.evictable_size -= len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        if removed_blocks:
            self._events.append(KvBlocksRemoved(removed_blocks))
        return torch.cat(released) if released else _EMPTY

    def flush(self) -> torch.Tensor:
        """Evict everything that no running sequence uses."""
        return self.evict(self.evictable_size)

    def drain_events(self) -> list[KvCacheEvent]:
        """Block stored/removed events since the last call, in order."""
        events, self._events = self._events, []
        return events

    def _split(self, node: RadixNode, n: int) -> RadixNode:
        """Cut ``node`` after ``n`` tokens; returns the new prefix node (the original object keeps
        the suffix, so holders of a lock on it still unlock the whole path)."""
        parent = node.parent
        assert parent is not None and 0 < n < len(node.key)
        prefix = RadixNode(node.key[:n], node.value[:n], parent, node.start)
        prefix.lock_ref = node.lock_ref
        prefix.last_access = node.last_access
        prefix.children[node.key[n]] = node
        parent.children[node.key[0]] = prefix
        if node.blocks:
            b = self.block_size
            on_prefix = (node.start + n) // b - node.start // b
            prefix.blocks, node.blocks = node.blocks[:on_prefix], node.blocks[on_prefix:]
        node.key, node.value, node.parent = node.key[n:], node.value[n:], prefix
        node.start += n
        return prefix

    def _store_blocks(self, leaf: RadixNode, path: list[int]) -> None:
        """Report the blocks that end on a new leaf's edge (``path``: tokens from the root)."""
        b = self.block_size
        first, end = leaf.start // b, (leaf.start + len(leaf.key)) // b
        if first == end:
            return
        parent_hash = None
        if first > 0:  # block first - 1 ends above the leaf: on the nearest ancestor owning blocks
            owner = leaf.parent
            while owner is not None and not owner.blocks:
                owner = owner.parent
            assert owner is not None, "a cached path lost its earlier blocks"
            parent_hash = owner.blocks[-1]
        event = stored_blocks(path, first, end, parent_hash, b)
        leaf.blocks = [block.block_hash for block in event.blocks]
        self._events.append(event)

    def _nodes(self) -> list[RadixNode]:
        result, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            result.append(node)
            stack.extend(node.children.values())
        return result


def _common_prefix(edge: list[int], key: list[int], start: int) -> int:
    n = 0
    limit = min(len(edge), len(key) - start)
    while n < limit and edge[n] == key[start + n]:
        n += 1
    return n
