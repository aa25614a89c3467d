"""Paged KV cache with a page size of one token: a pool of token slots plus a slot table.

A *slot* holds the K and V of one token in every layer. Sequences own arbitrary, scattered
slots; the slot table maps (sequence row, position) → slot so attention can gather a
sequence's keys with one index operation.
"""

from __future__ import annotations

import mmap

import torch


class KVPool:
    """Per layer K and V tensors ``[num_slots, num_kv_heads, head_dim]`` and a free list."""

    def __init__(
        self,
        *,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_slots, num_kv_heads, head_dim)
        # zeros, not empty: masked-out padding slots are still read, and 0 * NaN would poison sums
        self._mappings: list[mmap.mmap] = []
        self.k = [self._zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v = [self._zeros(shape, dtype, device) for _ in range(num_layers)]
        self.num_slots = num_slots
        self.dtype = dtype
        # a stack: the most recently freed slots are used first (still in cache), and the pool's
        # low slots before its high ones, so the memory it touches stays that of its peak use
        self._free = torch.arange(num_slots - 1, -1, -1, dtype=torch.int64)
        self._is_free = torch.ones(num_slots, dtype=torch.bool)

    def _zeros(self, shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """On the CPU, a fresh anonymous mapping: zero-filled by the kernel, and resident only
        where slots were written (a large ``--kv-tokens`` costs no memory until it is used)."""
        if device.type != "cpu":
            return torch.zeros(shape, dtype=dtype, device=device)
        size = shape[0] * shape[1] * shape[2] * torch.empty((), dtype=dtype).element_size()
        mapping = mmap.mmap(-1, max(size, 1))
        self._mappings.append(mapping)
        return torch.frombuffer(
            mapping, dtype=dtype, count=size // torch.empty((), dtype=dtype).element_size()
        ).view(shape)

    @property
    def num_free(self) -> int:
        return int(self._free.numel())

    def alloc(self, count: int) -> torch.Tensor:
        """``count`` free slots (int64, CPU). The caller made room first (see RadixCache.evict)."""
        if count > self.num_free:
            raise RuntimeError(f"KV pool exhausted: need {count} slots, {self.num_free} free")
        if count == 0:
            return self._free[:0].clone()
        slots, self._free = self._free[-count:].flip(0), self._free[:-count]
        self._is_free[slots] = False
        return slots

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        assert not bool(self._is_free[slots].any()), "KV slot freed twice"
        self._is_free[slots] = True
        self._free = torch.cat((self._free, slots.flip(0)))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots [T] (on the pool's device); k, v [T, KVH, D]."""
        self.k[layer].index_copy_(0, slots, k.to(self.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.dtype))


class SlotTable:
    """``rows[r, p]``: the slot of token ``p`` of the sequence that holds row ``r``."""

    def __init__(self, *, max_rows: int, max_context_tokens: int, device: torch.device) -> None:
        self.rows = torch.zeros((max_rows, max_context_tokens), dtype=torch.int32, device=device)
        self._free_rows = list(range(max_rows - 1, -1, -1))

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """Set ``rows[rows[i], positions[i]] = slots[i]`` (all three [T], on the table's device)."""
        self.rows.index_put_((rows, positions), slots.to(torch.int32))

    def read(self, row: int, length: int) -> torch.Tensor:
        """The first ``length`` slots of a row, as int64 on the CPU."""
        return self.rows[row, :length].to(device="cpu", dtype=torch.int64)
