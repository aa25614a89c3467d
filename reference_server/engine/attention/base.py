"""What every attention backend receives: where each sequence's new tokens sit in the
flattened batch and how many keys it attends to; its slots come from the slot table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True, slots=True)
class SeqSpan:
    row: int  # slot-table row of the sequence
    q_start: int  # first row of its new tokens in the flattened batch
    q_len: int  # new tokens this step
    kv_len: int  # keys its last new token attends to: cached tokens + q_len


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    spans: list[SeqSpan]
    num_tokens: int  # real rows of the flattened batch (the model may append padding rows)
    new_slots: torch.Tensor  # [num_tokens] int64 on the model device: where each new token's K/V goes


class AttentionBackend(Protocol):
    name: str

    def plan(self, batch: AttentionBatch) -> None:
        """Prepare per-step metadata; called once per step, before the forward pass."""
        ...

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T', H, D], k/v [T', KVH, D] with T' >= num_tokens (extra rows are padding).
        Writes the new K/V into the pool, then returns causal attention output [T', H, D]."""
        ...
