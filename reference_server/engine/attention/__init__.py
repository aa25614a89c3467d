"""Attention backends over the token-slot KV pool: ``sdpa`` (torch, CPU and CUDA, batch
invariant) and ``flashinfer`` (CUDA). ``auto`` picks flashinfer on CUDA when it is installed."""

from __future__ import annotations

from typing import Literal

import torch

from reference_server.engine.attention.base import AttentionBackend, AttentionBatch, SeqSpan
from reference_server.engine.attention.flashinfer import FlashInferBackend, flashinfer_available
from reference_server.engine.attention.sdpa import SdpaBackend
from reference_server.engine.kv_pool import KVPool, SlotTable

BackendName = Literal["auto", "sdpa", "flashinfer"]

__all__ = [
    "AttentionBackend",
    "AttentionBatch",
    "BackendName",
    "SeqSpan",
    "create_attention_backend",
    "resolve_backend",
]


def resolve_backend(name: str, device: torch.device) -> Literal["sdpa", "flashinfer"]:
    if name == "auto":
        return "flashinfer" if device.type == "cuda" and flashinfer_available() else "sdpa"
    if name == "sdpa":
        return "sdpa"
    if name == "flashinfer":
        return "flashinfer"
    raise ValueError(f"attention_backend={name!r} must be one of auto, sdpa, flashinfer")


def create_attention_backend(
    name: Literal["sdpa", "flashinfer"],
    pool: KVPool,
    table: SlotTable,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> AttentionBackend:
    if name == "flashinfer":
        return FlashInferBackend(
            pool, table, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim
        )
    return SdpaBackend(pool, table, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)
