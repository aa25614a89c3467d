"""Paged KV cache with a page size of one token: a pool of token slots plus a slot table.

A *slot* holds the K and V of one token in every layer. Sequences own arbitrary, scattered
slots; the slot table maps (sequence row, position) → slot so attention can gather a
sequence's keys with one index operation.
"""

from __future__ import annotations

import math
import mmap

import torch


class KVPool:
    """Per layer K and V tensors ``[num_slots, num_kv_heads, head_dim]`` and a free list.

    ``kv_format="int8"`` holds each token's K (and V) row of each KV head as int8 codes of its
    largest value, with that value / 127 in ``k_scales`` (``v_scales``), one plane per KV head:
    codes ``[num_kv_heads, num_slots, head_dim]``, scales ``[num_kv_heads, num_slots]`` float32, so a
    KV head's keys of consecutive slots are consecutive 64-byte rows (one stream for the hardware's
    prefetch). The native kernels write and read that format (engine/native/forward.c).
    """

    def __init__(
        self,
        *,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        kv_format: str = "dense",
    ) -> None:
        if kv_format not in ("dense", "int8"):
            raise ValueError(f"kv_format={kv_format!r} must be 'dense' or 'int8'")
        dense = kv_format == "dense"
        shape = (num_slots, num_kv_heads, head_dim) if dense else (num_kv_heads, num_slots, head_dim)
        codes = dtype if dense else torch.int8
        # zeros, not empty: masked-out padding slots are still read, and 0 * NaN would poison sums
        self._mappings: list[mmap.mmap] = []
        self.k = [self._zeros(shape, codes, device) for _ in range(num_layers)]
        self.v = [self._zeros(shape, codes, device) for _ in range(num_layers)]
        scaled = 0 if dense else num_layers
        self.k_scales = [self._zeros((num_kv_heads, num_slots), torch.float32, device) for _ in range(scaled)]
        self.v_scales = [self._zeros((num_kv_heads, num_slots), torch.float32, device) for _ in range(scaled)]
        self.kv_format = kv_format
        self.num_slots = num_slots
        self.dtype = dtype
        # a stack: the most recently freed slots are used first (still in cache), and the pool's
        # low slots before its high ones, so the memory it touches stays that of its peak use
        self._free = torch.arange(num_slots - 1, -1, -1, dtype=torch.int64)
        self._is_free = torch.ones(num_slots, dtype=torch.bool)

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """On the CPU, a fresh anonymous mapping: zero-filled by the kernel, and resident only
        where slots were written (a large ``--kv-tokens`` costs no memory until it is used)."""
        if device.type != "cpu":
            return torch.zeros(shape, dtype=dtype, device=device)
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
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
        assert self.kv_format == "dense", "an int8 KV pool is written by the native kernels"
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
