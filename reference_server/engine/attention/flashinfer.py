"""FlashInfer attention over the same token-slot pool (CUDA only; imported lazily).

The pool's per-layer ``[num_slots, KVH, D]`` tensors are viewed as a paged cache in ``NHD``
layout with one token per page (``[num_pages, 1, KVH, D]``), so a sequence's page list is
exactly its slot list. Steps with a multi-token chunk use the prefill wrapper (causal mask
aligned to the end of the keys, which is what chunked prefill needs); pure decode steps use
the decode wrapper with tensor cores (any GQA group size). Both run FlashAttention-2's kernels,
so one module, compiled once on first use (flashinfer builds its kernels just in time), serves them.

Decode steps replayed from CUDA graphs (engine/cuda_graphs.py) plan through ``plan_graphed``: one
decode wrapper per captured batch size, whose metadata lives in fixed device buffers that the
graph reads and each step's plan rewrites.
"""

from __future__ import annotations

from typing import Any

import torch

from reference_server.engine.attention.base import AttentionBatch, SeqSpan
from reference_server.engine.kv_pool import KVPool, SlotTable

WORKSPACE_BYTES = 128 * 1024 * 1024
PAGE_SIZE = 1
KERNELS = "fa2"  # the prefill wrapper's; the tensor-core decode wrapper picks fa2 for bf16/fp16 itself


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
        self._flashinfer: Any = flashinfer
        self.pool = pool
        self.table = table
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = pool.k[0].dtype
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._prefill: Any = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD", backend=KERNELS
        )
        self._decode: Any = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_tensor_cores=True
        )
        self._graph_decoders: dict[int, Any] = {}
        self._graph_pages: torch.Tensor | None = None  # every graphed wrapper's page list (one at a time)
        self._wrapper: Any = None
        self._batch: AttentionBatch | None = None
        self._build_kernels()

    def _build_kernels(self) -> None:
        """Have flashinfer build (or load from its disk cache) its kernels now, while the server
        starts, not in the first request's step: the first build takes about a minute. A
        two-token prefill and a one-token decode run over slot 0 of layer 0, which nothing holds
        yet and which the warm-up only writes zeros into, as the pool already holds."""
        slots = torch.zeros(2, dtype=torch.int64, device=self.device)
        for q_len in (2, 1):
            self.plan(
                AttentionBatch([SeqSpan(row=0, q_start=0, q_len=q_len, kv_len=q_len)], q_len, slots[:q_len])
            )
            q = torch.zeros((q_len, self.num_heads, self.head_dim), dtype=self.dtype, device=self.device)
            kv = torch.zeros((q_len, self.num_kv_heads, self.head_dim), dtype=self.dtype, device=self.device)
            self.forward(0, q, kv, kv)
        torch.cuda.synchronize(self.device)
        self._wrapper = self._batch = None

    def plan(self, batch: AttentionBatch) -> None:
        kv_indptr, kv_indices, last_page_len = self._pages(batch)
        if all(s.q_len == 1 for s in batch.spans):
            self._plan_decode(self._decode, batch, kv_indptr, kv_indices, last_page_len)
            return
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        q_lens = torch.tensor([s.q_len for s in batch.spans], dtype=torch.int32)
        self._prefill.plan(
            _indptr(q_lens), kv_indptr, kv_indices, last_page_len, h, kvh, d, PAGE_SIZE,
            causal=True, q_data_type=self.dtype, kv_data_type=self.dtype,
        )  # fmt: skip
        self._wrapper = self._prefill
        self._batch = batch

    def plan_graphed(self, batch: AttentionBatch) -> None:
        """Plan a decode batch (one new token per span) for the CUDA graph of its size: that
        size's wrapper reads fixed buffers, so a graph captured after this plan stays valid
        for every later plan of the same size."""
        size = len(batch.spans)
        assert batch.num_tokens == size, "a graphed step decodes one token per sequence"
        kv_indptr, kv_indices, last_page_len = self._pages(batch)
        if self._graph_pages is None:
            self._graph_pages = torch.empty(self.table.rows.numel(), dtype=torch.int32, device=self.device)
        wrapper = self._graph_decoders.get(size)
        if wrapper is None:
            wrapper = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=torch.empty(size + 1, dtype=torch.int32, device=self.device),
                paged_kv_indices_buffer=self._graph_pages,
                paged_kv_last_page_len_buffer=torch.empty(size, dtype=torch.int32, device=self.device),
            )  # fmt: skip
            self._graph_decoders[size] = wrapper
        self._plan_decode(wrapper, batch, kv_indptr, kv_indices, last_page_len)

    def _pages(self, batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Page (= slot) lists of the batch's sequences: indptr (CPU), indices, last page lengths."""
        spans = batch.spans
        expected = 0
        for span in spans:
            assert span.q_start == expected, "flashinfer needs the spans in batch order"
            expected += span.q_len
        kv_lens = torch.tensor([s.kv_len for s in spans], dtype=torch.int32)
        rows = torch.tensor([s.row for s in spans], device=self.device)
        width = int(kv_lens.max())
        table = self.table.rows.index_select(0, rows)[:, :width]
        mask = torch.arange(width, device=self.device)[None, :] < kv_lens.to(self.device)[:, None]
        kv_indices = table[mask].to(torch.int32)  # row-major: sequence after sequence
        return _indptr(kv_lens), kv_indices, torch.ones(len(spans), dtype=torch.int32)

    def _plan_decode(
        self,
        wrapper: Any,
        batch: AttentionBatch,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        last_page_len: torch.Tensor,
    ) -> None:
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        wrapper.plan(
            kv_indptr, kv_indices, last_page_len, h, kvh, d, PAGE_SIZE,
            q_data_type=self.dtype, kv_data_type=self.dtype,
        )  # fmt: skip
        self._wrapper = wrapper
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
