"""Scaled dot-product attention in plain torch ops over the paged KV pool, batch invariant.

``F.scaled_dot_product_attention`` on CPU splits queries and keys into blocks whose size depends
on the sequence lengths, so a token's output changes (in the last bits) with the padding and
chunking around it, and greedy tokens then differ between a request alone and in a batch. This
backend computes each output row in an order that depends only on that row:

- keys are gathered per sequence and padded to a multiple of ``KV_BLOCK`` (padding masked);
- scores are one GEMM over head_dim (queries pre-scaled), with at least ``MIN_QUERY_ROWS``
  query rows (MKL uses another kernel for fewer rows);
- P·V is a GEMM per block of ``KV_BLOCK`` keys (fixed shape); the softmax denominator is a
  sum per block of keys (fixed length);
- block results are added in a pairwise tree fixed by block index (``_tree_sum``), so the zero
  blocks of padding never change a sum; ``Tensor.sum`` picks its order from the total length.

Decode rows (one new token) of all sequences share one gather and one GEMM per KV head.

Precision: scores and probabilities are in the KV cache's dtype, so both GEMMs run in it
(oneDNN's bf16 GEMMs are ~6x faster than float32 ones here, and per-row invariant like them);
the softmax's exp is computed in float32 and stored in that dtype, its sums and the sum of the
per-block outputs are float32. In bf16 the queries and keys are bf16 already, so a score's
products are exact and rounding it to bf16 adds an error of the size its inputs carry; a
float32 cache keeps every step float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference_server.engine.attention.base import AttentionBatch, SeqSpan
from reference_server.engine.kv_pool import KVPool, SlotTable

KV_BLOCK = 64
MIN_QUERY_ROWS = 4
PREFILL_TILE_TOKENS = 128  # query tokens of one prefill tile, at most
# Scores of one tile and KV head, at most: a long context gets shorter tiles, so the temporaries
# of a tile stay a few MB (larger ones are fresh mmaps whose page faults cost more than the math).
PREFILL_TILE_SCORES = 1 << 20


@dataclass(frozen=True, slots=True)
class _DecodePlan:
    q_index: torch.Tensor  # [B] rows of the flattened batch
    leading: bool  # q_index is 0..B-1: the decode rows come first, read and written as a slice
    queries: torch.Tensor  # [KVH, B, rows, D] zeros in the cache's dtype; each layer fills [:, :, :group]
    rows: torch.Tensor  # [KVH * B * L] pool rows to gather, head-major (padding: stale slots)
    hidden: torch.Tensor  # [1, B, 1, L - first_hidden] keys to mask, from first_hidden on
    first_hidden: int  # every key before this one is visible to every row
    batch: int
    length: int  # L, a multiple of KV_BLOCK


@dataclass(frozen=True, slots=True)
class _PrefillTile:
    q_start: int  # first row of the tile in the flattened batch
    q_len: int
    length: int  # keys visible to the tile, padded to a multiple of KV_BLOCK
    rows: int  # q_len * group, padded to MIN_QUERY_ROWS
    hidden: torch.Tensor  # [rows, length - first_hidden] keys to mask, from first_hidden on
    first_hidden: int


@dataclass(frozen=True, slots=True)
class _PrefillPlan:
    rows: torch.Tensor  # [KVH * L] pool rows of the sequence's keys, head-major
    tiles: list[_PrefillTile]


class SdpaBackend:
    name = "sdpa"

    def __init__(
        self, pool: KVPool, table: SlotTable, *, num_heads: int, num_kv_heads: int, head_dim: int
    ) -> None:
        self.pool = pool
        self.table = table
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.group = num_heads // num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.device = pool.k[0].device
        self.dtype = pool.dtype  # the dtype of both attention GEMMs
        self._batch: AttentionBatch | None = None
        self._decode: _DecodePlan | None = None
        self._prefills: list[_PrefillPlan] = []

    def plan(self, batch: AttentionBatch) -> None:
        self._batch = batch
        decodes = [s for s in batch.spans if s.q_len == 1]
        self._decode = self._plan_decode(decodes) if decodes else None
        self._prefills = [self._plan_prefill(s) for s in batch.spans if s.q_len > 1]

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self._batch is not None, "plan() must run before forward()"
        n = self._batch.num_tokens
        self.pool.write(layer, self._batch.new_slots, k[:n], v[:n])
        out = torch.zeros_like(q)
        if self._decode is not None:
            self._attend_decode(layer, q, self._decode, out)
        for plan in self._prefills:
            keys = self._gather(self.pool.k[layer], plan.rows)  # [KVH, L, D]
            values = self._gather(self.pool.v[layer], plan.rows)
            for tile in plan.tiles:
                rows = slice(tile.q_start, tile.q_start + tile.q_len)
                out[rows] = self._attend_prefill(q[rows], keys, values, tile).to(q.dtype)
        return out

    # ── planning ───────────────────────────────────────────────────────────────────────────

    def _plan_decode(self, spans: list[SeqSpan]) -> _DecodePlan:
        length = _padded(max(s.kv_len for s in spans))
        rows = torch.tensor([s.row for s in spans], device=self.device)
        kv_lens = torch.tensor([s.kv_len for s in spans], device=self.device)
        slots = self.table.rows.index_select(0, rows)[:, :length]
        first_hidden = min(s.kv_len for s in spans)
        positions = torch.arange(first_hidden, length, device=self.device)
        hidden = positions[None, :] >= kv_lens[:, None]
        q_starts = [s.q_start for s in spans]
        query_rows = max(self.group, MIN_QUERY_ROWS)
        queries = torch.zeros(
            (self.num_kv_heads, len(spans), query_rows, self.head_dim), dtype=self.dtype, device=self.device
        )
        return _DecodePlan(
            q_index=torch.tensor(q_starts, device=self.device),
            leading=q_starts == list(range(len(spans))),
            queries=queries,
            rows=self._head_major(slots.reshape(-1)),
            hidden=hidden[None, :, None, :],
            first_hidden=first_hidden,
            batch=len(spans),
            length=length,
        )

    def _plan_prefill(self, span: SeqSpan) -> _PrefillPlan:
        first_pos = span.kv_len - span.q_len
        tiles = []
        tile_tokens = max(MIN_QUERY_ROWS, min(PREFILL_TILE_TOKENS, self._tile_tokens(span.kv_len)))
        for start in range(0, span.q_len, tile_tokens):
            q_len = min(tile_tokens, span.q_len - start)
            length = _padded(first_pos + start + q_len)
            pos = torch.arange(first_pos + start, first_pos + start + q_len, device=self.device)
            pos = pos.repeat_interleave(self.group)
            pad = MIN_QUERY_ROWS - pos.numel()
            if pad > 0:
                pos = F.pad(pos, (0, pad), value=int(pos[-1]))
            first_hidden = first_pos + start + 1  # the tile's first query sees keys up to itself
            hidden = torch.arange(first_hidden, length, device=self.device)[None, :] > pos[:, None]
            tiles.append(_PrefillTile(span.q_start + start, q_len, length, pos.numel(), hidden, first_hidden))
        total = _padded(span.kv_len)
        slots = self.table.rows[span.row, :total]
        return _PrefillPlan(rows=self._head_major(slots), tiles=tiles)

    def _tile_tokens(self, kv_len: int) -> int:
        return PREFILL_TILE_SCORES // (self.group * _padded(kv_len))

    def _head_major(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows of the pool viewed as [slots * KVH, D] that gather ``slots`` as [KVH, n, D]: one
        contiguous [n, D] matrix per KV head, what the batched GEMMs take without a copy."""
        heads = torch.arange(self.num_kv_heads, device=self.device)[:, None]
        return (slots.to(torch.int64)[None, :] * self.num_kv_heads + heads).reshape(-1)

    def _gather(self, cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """cache [slots, KVH, D] → [KVH, n, D] for head-major ``rows``."""
        return cache.view(-1, self.head_dim).index_select(0, rows).view(self.num_kv_heads, -1, self.head_dim)

    # ── attention math ─────────────────────────────────────────────────────────────────────

    def _attend_decode(self, layer: int, q: torch.Tensor, plan: _DecodePlan, out: torch.Tensor) -> None:
        """Writes the decode rows of ``out`` [T, H, D]."""
        b, length, kvh, d, g = plan.batch, plan.length, self.num_kv_heads, self.head_dim, self.group
        keys = self._gather(self.pool.k[layer], plan.rows).view(kvh * b, length, d)
        values = self._gather(self.pool.v[layer], plan.rows).view(kvh, b, length // KV_BLOCK, KV_BLOCK, d)
        q_rows = q[:b] if plan.leading else q.index_select(0, plan.q_index)
        queries = plan.queries  # [KVH, B, rows, D]; the rows past the group stay zero
        torch.mul(q_rows.to(self.dtype).view(b, kvh, g, d).transpose(0, 1), self.scale, out=queries[:, :, :g])
        rows = queries.shape[2]
        scores = torch.bmm(queries.view(kvh * b, rows, d), keys.transpose(1, 2)).view(kvh, b, rows, length)
        probs, denom = _softmax(scores, plan.hidden, plan.first_hidden)
        blocks = length // KV_BLOCK
        prob_blocks = probs.view(kvh, b, rows, blocks, KV_BLOCK).transpose(2, 3)
        partial = torch.matmul(prob_blocks, values)  # [KVH, B, blocks, rows, D]
        summed = _tree_sum(partial.float(), 2) / denom[..., None]  # [KVH, B, rows, D]
        heads = summed[:, :, :g].permute(1, 0, 2, 3)  # [B, KVH, g, D]
        if plan.leading:
            out[:b].view(b, kvh, g, d).copy_(heads)  # one pass: permute and round to out's dtype
        else:
            out.index_copy_(0, plan.q_index, heads.reshape(b, self.num_heads, d).to(out.dtype))

    def _attend_prefill(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tile: _PrefillTile
    ) -> torch.Tensor:
        """q [n, H, D]; keys/values [KVH, L, D] in the cache's dtype → [n, H, D] float32."""
        n, kvh, g, d = tile.q_len, self.num_kv_heads, self.group, self.head_dim
        queries = (
            (q.to(self.dtype) * self.scale).view(n, kvh, g, d).permute(1, 0, 2, 3).reshape(kvh, n * g, d)
        )
        rows = tile.rows
        if rows > n * g:
            queries = F.pad(queries, (0, 0, 0, rows - n * g))
        length = tile.length
        scores = torch.bmm(queries, keys[:, :length].transpose(1, 2))
        probs, denom = _softmax(scores, tile.hidden, tile.first_hidden)
        blocks = length // KV_BLOCK
        prob_blocks = probs.view(kvh, rows, blocks, KV_BLOCK).transpose(1, 2)
        partial = torch.matmul(prob_blocks, values[:, :length].view(kvh, blocks, KV_BLOCK, d))
        out = _tree_sum(partial.float(), 1) / denom[..., None]  # [KVH, rows, D]
        return out[:, : n * g].view(kvh, n, g, d).permute(1, 0, 2, 3).reshape(n, self.num_heads, d)


def _softmax(
    scores: torch.Tensor, hidden: torch.Tensor, first_hidden: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalized probabilities, in place of ``scores`` [..., rows, L] (already scaled), and
    their row sums [..., rows]. Only keys from ``first_hidden`` on can be masked."""
    scores[..., first_hidden:].masked_fill_(hidden, float("-inf"))
    scores.sub_(scores.amax(-1, keepdim=True)).exp_()
    block_sums = scores.view(*scores.shape[:-1], -1, KV_BLOCK).sum(-1, dtype=torch.float32)  # fixed length
    return scores, _tree_sum(block_sums, -1)


def _tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over ``dim`` as a pairwise tree fixed by index: ((x0+x1)+(x2+x3))+... An odd last
    element moves up unchanged, which equals adding zeros, so trailing zero blocks never change
    the result."""
    dim %= x.dim()
    while x.shape[dim] > 1:
        n = x.shape[dim]
        even = x.narrow(dim, 0, n - 1) if n % 2 else x
        pairs = even.view(*x.shape[:dim], n // 2, 2, *x.shape[dim + 1 :])
        summed = pairs.select(dim + 1, 0) + pairs.select(dim + 1, 1)
        x = torch.cat((summed, x.narrow(dim, n - 1, 1)), dim) if n % 2 else summed
    return x.squeeze(dim)


def _padded(length: int) -> int:
    return -(-length // KV_BLOCK) * KV_BLOCK
