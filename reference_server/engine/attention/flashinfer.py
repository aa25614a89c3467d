"""FlashInfer attention over the same token-slot pool (CUDA only; imported lazily).

The pool's per-layer ``[num_slots, KVH, D]`` tensors are viewed as a paged cache in ``NHD``
layout with one token per page (``[num_pages, 1, KVH, D]``), so a sequence's page list is
exactly its slot list. Steps with a multi-token chunk use the prefill wrapper (causal mask
aligned to the end of the keys, which is what chunked prefill needs); pure decode steps use
the decode wrapper with tensor cores (any GQA group size).
"""

from __future__ import annotations

from typing import Any

import torch

from reference_server.engine.attention.base import AttentionBatch
from reference_server.engine.kv_pool import KVPool, SlotTable

WORKSPACE_BYTES = 128 * 1024 * 1024
PAGE_SIZE = 1


def flashinfer_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("flashinfer") is not None


class FlashInferBackend:
    name = "flashinfer"

    def __init__(
        self, pool: KVPool, table: SlotTable, *, num_heads: int, num_kv_heads: int, head_dim: int
    ) -> None:
        try:
            import flashinfer
        except ImportError as exc:
            raise RuntimeError("attention_backend='flashinfer' needs the flashinfer-python package") from exc
        self.device = pool.k[0].device
        if self.device.type != "cuda":
            raise RuntimeError(f"attention_backend='flashinfer' needs a CUDA device, not {self.device}")
        self.pool = pool
        self.table = table
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = pool.k[0].dtype
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._prefill: Any = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._decode: Any = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=True
        )
        self._wrapper: Any = None
        self._batch: AttentionBatch | None = None

    def plan(self, batch: AttentionBatch) -> None:
        spans = batch.spans
        expected = 0
        for span in spans:
            assert span.q_start == expected, "flashinfer needs the spans in batch order"
            expected += span.q_len
        q_lens = torch.tensor([s.q_len for s in spans], dtype=torch.int32)
        kv_lens = torch.tensor([s.kv_len for s in spans], dtype=torch.int32)
        rows = torch.tensor([s.row for s in spans], device=self.device)
        width = int(kv_lens.max())
        table = self.table.rows.index_select(0, rows)[:, :width]
        mask = torch.arange(width, device=self.device)[None, :] < kv_lens.to(self.device)[:, None]
        kv_indices = table[mask].to(torch.int32)  # row-major: sequence after sequence
        kv_indptr = _indptr(kv_lens)
        last_page_len = torch.ones(len(spans), dtype=torch.int32)
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        if all(s.q_len == 1 for s in spans):
            self._decode.plan(
                kv_indptr, kv_indices, last_page_len, h, kvh, d, PAGE_SIZE,
                q_data_type=self.dtype, kv_data_type=self.dtype,
            )  # fmt: skip
            self._wrapper = self._decode
        else:
            self._prefill.plan(
                _indptr(q_lens), kv_indptr, kv_indices, last_page_len, h, kvh, d, PAGE_SIZE,
                causal=True, q_data_type=self.dtype, kv_data_type=self.dtype,
            )  # fmt: skip
            self._wrapper = self._prefill
        self._batch = batch

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self._batch is not None and self._wrapper is not None, "plan() must run before forward()"
        n = self._batch.num_tokens
        self.pool.write(layer, self._batch.new_slots, k[:n], v[:n])
        paged = (self.pool.k[layer].unsqueeze(1), self.pool.v[layer].unsqueeze(1))  # [pages, 1, KVH, D]
        out: torch.Tensor = self._wrapper.run(q[:n].contiguous(), paged)
        if q.shape[0] > n:
            out = torch.cat((out, q.new_zeros((q.shape[0] - n, *q.shape[1:]))))
        return out


def _indptr(lengths: torch.Tensor) -> torch.Tensor:
    """[0, l0, l0+l1, ...] as int32 on the CPU (flashinfer plans on the host)."""
    return torch.cat((torch.zeros(1, dtype=torch.int32), lengths.cumsum(0, dtype=torch.int32)))
