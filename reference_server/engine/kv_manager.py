"""Who owns which KV slot: the free pool, the prefix cache, or a running sequence.

Every slot is in exactly one of three places: free in the pool; held by the prefix cache
(evictable, or locked by sequences that use it); or owned by one sequence (tokens it computed
that are not in the cache yet). Admission reserves a group's worst case up front, and
``free + evictable >= reserved`` holds at all times, so allocation never fails mid-flight.

New weights (``retire_cache``) make every cached prefix stale: later requests start from an
empty tree, while the sequences admitted before keep the tree they locked (a *retired* one) to
the end. Nothing of a retired tree is ever matched again: what its sequences leave behind is
freed, and the tree is dropped once none of them runs.
"""

from __future__ import annotations

import torch

from reference_server.engine.kv_events import KV_EVENT_BLOCK_SIZE
from reference_server.engine.kv_pool import KVPool, SlotTable
from reference_server.engine.radix_cache import RadixCache
from reference_server.engine.sequence import RequestGroup, Sequence
from reference_server.ipc import KvCacheCleared, KvCacheEvent


class KVManager:
    def __init__(
        self, pool: KVPool, table: SlotTable, kv_event_block_size: int = KV_EVENT_BLOCK_SIZE
    ) -> None:
        self.pool = pool
        self.table = table
        self.block_size = kv_event_block_size
        self.cache = RadixCache(kv_event_block_size)  # the tree of the current weights
        self.cache_version = 0  # the current weights; a sequence's tree is the one it was admitted under
        self.retired: dict[int, RadixCache] = {}  # trees of older weights that sequences still lock
        self.reserved = 0  # sum of admitted groups' kv_reserved
        self._events: list[KvCacheEvent] = []  # before the current tree's own

    @property
    def num_available(self) -> int:
        return self.pool.num_free + self.cache.evictable_size - self.reserved

    def try_admit(self, group: RequestGroup) -> bool:
        """Lock the cached prompt prefix, take rows, reserve the worst case; or change nothing."""
        if self.table.num_free_rows < group.request.num_outputs:
            return False
        for seq in group.outputs:
            seq.cache_version = self.cache_version
        prompt = group.request.prompt_ids
        match = self.cache.match_prefix(prompt[:-1])  # the last prompt token is always computed
        self.cache.lock(match.node)
        group.num_cached_prompt_tokens = match.length
        need = group.kv_worst_case
        if need > self.num_available:
            self.cache.unlock(match.node)
            group.num_cached_prompt_tokens = 0
            return False
        group.kv_reserved = need
        self.reserved += need
        for seq in group.outputs:
            seq.row = self.table.alloc_row()
        lead = group.prefill_sequence
        lead.lock_node = match.node
        lead.num_locked_tokens = lead.num_computed_tokens = match.length
        self._write_row(lead, match.slots)
        return True

    def alloc(self, counts: list[tuple[RequestGroup, int]]) -> torch.Tensor:
        """New slots for this step, charged to each group's reservation, in order."""
        total = sum(n for _, n in counts)
        if total > self.pool.num_free:
            self.pool.free(self.cache.evict(total - self.pool.num_free))
        for group, n in counts:
            assert group.kv_reserved >= n, "a group allocated more KV than it reserved"
            group.kv_reserved -= n
            self.reserved -= n
        return self.pool.alloc(total)

    def fork(self, group: RequestGroup) -> None:
        """The prompt is prefilled: move it into the prefix cache and share it with every output."""
        lead = group.prefill_sequence
        prompt = group.request.prompt_ids
        assert lead.row is not None and lead.num_computed_tokens == len(prompt)
        tree = self._tree(lead)
        self._cache_computed(lead)
        match = tree.match_prefix(prompt)
        assert match.length == len(prompt)
        for seq in group.outputs:
            tree.lock(match.node)
            seq.lock_node = match.node
            seq.num_locked_tokens = seq.num_computed_tokens = len(prompt)
            self._write_row(seq, match.slots)
        group.forked = True
        self._drop_unused(lead.cache_version)

    def release(self, seq: Sequence) -> None:
        """The output ended: its computed tokens go to the prefix cache, its row back to the table."""
        if seq.row is not None:
            self._cache_computed(seq)
            self.table.free_row(seq.row)
            seq.row = None
            self._drop_unused(seq.cache_version)
        seq.finished = True

    def suspend(self, group: RequestGroup) -> None:
        """A held group (FLOW-1) keeps the slots it filled and its rows, and gives its unused
        reservation back, so that requests of clients who read can be admitted meanwhile."""
        group.kv_suspended += group.kv_reserved
        self.reserved -= group.kv_reserved
        group.kv_reserved = 0

    def try_resume(self, group: RequestGroup) -> bool:
        """Take the reservation back, or change nothing if it is not available now."""
        if group.kv_suspended > self.num_available:
            return False
        group.kv_reserved, group.kv_suspended = group.kv_suspended, 0
        self.reserved += group.kv_reserved
        return True

    def finish_group(self, group: RequestGroup) -> None:
        self.reserved -= group.kv_reserved
        group.kv_reserved = 0

    def flush(self) -> int:
        released = self.cache.flush()
        self.pool.free(released)
        return int(released.numel())

    def retire_cache(self) -> int:
        """The weights changed: free every unused cached prefix, keep the rest in a retired tree
        for the sequences that lock it, and start an empty tree (reported as KvCacheCleared).
        Returns the slots released now."""
        old = self.cache
        released = old.flush()
        self.pool.free(released)
        old.drain_events()  # the clear below supersedes them
        if old.total_size:
            self.retired[self.cache_version] = old
        self.cache_version += 1
        self.cache = RadixCache(self.block_size)
        self._events.append(KvCacheCleared())
        return int(released.numel())

    def drain_events(self) -> list[KvCacheEvent]:
        """What the current tree stored and removed, after any clear (retired trees report nothing)."""
        events, self._events = self._events, []
        return events + self.cache.drain_events()

    def owned_by(self, seq: Sequence) -> int:
        return seq.num_computed_tokens - seq.num_locked_tokens if seq.row is not None else 0

    def check_integrity(self, groups: list[RequestGroup]) -> None:
        owned = sum(self.owned_by(s) for g in groups for s in g.outputs)
        cached = self.cache.total_size + sum(tree.total_size for tree in self.retired.values())
        total = self.pool.num_free + cached + owned
        assert total == self.pool.num_slots, (
            f"KV slots leaked: free {self.pool.num_free} + cached {cached} + owned {owned} != {self.pool.num_slots}"
        )
        assert all(not tree.evictable_size for tree in self.retired.values()), (
            "a retired tree keeps unused KV"
        )
        assert self.reserved == sum(g.kv_reserved for g in groups), "KV reservations out of sync"
        assert self.num_available >= 0, "KV reserved beyond what is free or evictable"
        rows = sum(s.row is not None for g in groups for s in g.outputs)
        assert rows + self.table.num_free_rows == self.table.rows.shape[0], "slot-table rows leaked"

    def _cache_computed(self, seq: Sequence) -> None:
        """Insert the sequence's computed tokens into the prefix cache and drop its lock; slots the
        cache already had a copy of are freed."""
        assert seq.row is not None
        tree = self._tree(seq)
        n = seq.num_computed_tokens
        if n > seq.num_locked_tokens:
            slots = self.table.read(seq.row, n)
            already = tree.insert(seq.token_ids[:n], slots)
            self.pool.free(slots[seq.num_locked_tokens : max(already, seq.num_locked_tokens)])
        if seq.lock_node is not None:
            tree.unlock(seq.lock_node)
            seq.lock_node = None
        seq.num_locked_tokens = 0

    def _tree(self, seq: Sequence) -> RadixCache:
        """The prefix cache of the weights ``seq`` was admitted under."""
        if seq.cache_version == self.cache_version:
            return self.cache
        return self.retired[seq.cache_version]

    def _drop_unused(self, version: int) -> None:
        """Free what no sequence locks in a retired tree; drop the tree once it is empty."""
        tree = self.retired.get(version)
        if tree is None:
            return
        self.pool.free(tree.flush())
        tree.drain_events()
        if not tree.total_size:
            del self.retired[version]

    def _write_row(self, seq: Sequence, slots: torch.Tensor) -> None:
        assert seq.row is not None
        n = slots.numel()
        if n:
            device = self.table.rows.device
            rows = torch.full((n,), seq.row, device=device)
            self.table.write(rows, torch.arange(n, device=device), slots.to(device))
