"""Prefix cache: a radix tree over token ids whose edges carry the KV slots of those tokens.

The tree owns the slots it holds. A node locked by a running sequence (reference count > 0,
propagated to its ancestors) is in use; unlocked nodes are *evictable* and are freed leaf-first
in least-recently-used order when the pool needs room.
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple

import torch

_EMPTY = torch.empty(0, dtype=torch.int64)


class RadixNode:
    __slots__ = ("children", "key", "last_access", "lock_ref", "parent", "value")

    def __init__(self, key: list[int], value: torch.Tensor, parent: RadixNode | None) -> None:
        self.key = key
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
    def __init__(self) -> None:
        self.root = RadixNode([], _EMPTY, None)
        self.root.lock_ref = 1  # never evicted
        self.evictable_size = 0
        self.protected_size = 0
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
                leaf = RadixNode(key[matched:], slots[matched:].clone(), node)
                leaf.last_access = now
                node.children[key[matched]] = leaf
                self.evictable_size += len(leaf.key)
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
        count = 0
        while heap and count < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            released.append(leaf.value)
            count += len(leaf.key)
            self.evictable_size -= len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return torch.cat(released) if released else _EMPTY

    def flush(self) -> torch.Tensor:
        """Evict everything that no running sequence uses."""
        return self.evict(self.evictable_size)

    def _split(self, node: RadixNode, n: int) -> RadixNode:
        """Cut ``node`` after ``n`` tokens; returns the new prefix node (the original object keeps
        the suffix, so holders of a lock on it still unlock the whole path)."""
        parent = node.parent
        assert parent is not None and 0 < n < len(node.key)
        prefix = RadixNode(node.key[:n], node.value[:n], parent)
        prefix.lock_ref = node.lock_ref
        prefix.last_access = node.last_access
        prefix.children[node.key[n]] = node
        parent.children[node.key[0]] = prefix
        node.key, node.value, node.parent = node.key[n:], node.value[n:], prefix
        return prefix

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
