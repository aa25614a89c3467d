"""Scaled dot-product attention in plain torch ops over the paged KV pool, batch invariant.

``F.scaled_dot_product_attention`` on CPU splits queries and keys into blocks whose size depends
on the sequence lengths, so a token's output changes (in the last bits) with the padding and
chunking around it, and greedy tokens then differ between a request alone and in a batch. This
backend computes each output row in an order that depends only on that row:

- keys are gathered per sequence and padded to a multiple of ``KV_BLOCK`` (padding masked);
- scores are one float32 GEMM over head_dim (queries pre-scaled), with at least
  ``MIN_QUERY_ROWS`` query rows (MKL uses another kernel for fewer rows);
- P·V is a GEMM per block of ``KV_BLOCK`` keys (fixed shape); the softmax denominator is a
  sum per block of keys (fixed length);
- block results are added in a pairwise tree fixed by block index (``_tree_sum``), so the zero
  blocks of padding never change a sum; ``Tensor.sum`` picks its order from the total length.

Decode rows (one new token) of all sequences share one gather and one GEMM per KV head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference_server.engine.attention.base import AttentionBatch, SeqSpan
from reference_server.engine.kv_pool import KVPool, SlotTable

KV_BLOCK = 64
MIN_QUERY_ROWS = 4
PREFILL_TILE_TOKENS = 128  # bounds the [rows, keys] score matrix of a long prefill chunk


@dataclass(frozen=True, slots=True)
class _DecodePlan:
    q_index: torch.Tensor  # [B] rows of the flattened batch
    slots: torch.Tensor  # [B * L] slots to gather (padding points at stale slots)
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
    slots: torch.Tensor  # [L] slots of the sequence's keys
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
            out.index_copy_(0, self._decode.q_index, self._attend_decode(layer, q, self._decode))
        for plan in self._prefills:
            keys = self.pool.k[layer].index_select(0, plan.slots).float()  # [L, KVH, D]
            values = self.pool.v[layer].index_select(0, plan.slots).float()
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
        return _DecodePlan(
            q_index=torch.tensor([s.q_start for s in spans], device=self.device),
            slots=slots.reshape(-1),
            hidden=hidden[None, :, None, :],
            first_hidden=first_hidden,
            batch=len(spans),
            length=length,
        )

    def _plan_prefill(self, span: SeqSpan) -> _PrefillPlan:
        first_pos = span.kv_len - span.q_len
        tiles = []
        for start in range(0, span.q_len, PREFILL_TILE_TOKENS):
            q_len = min(PREFILL_TILE_TOKENS, span.q_len - start)
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
        return _PrefillPlan(slots=slots, tiles=tiles)

    # ── attention math ─────────────────────────────────────────────────────────────────────

    def _attend_decode(self, layer: int, q: torch.Tensor, plan: _DecodePlan) -> torch.Tensor:
        b, length, kvh, d, g = plan.batch, plan.length, self.num_kv_heads, self.head_dim, self.group
        keys = self.pool.k[layer].index_select(0, plan.slots).view(b, length, kvh, d).float()
        values = self.pool.v[layer].index_select(0, plan.slots).view(b, length, kvh, d).float()
        queries = (q.index_select(0, plan.q_index).float() * self.scale).view(b, kvh, g, d)
        rows = max(g, MIN_QUERY_ROWS)
        if rows > g:
            queries = F.pad(queries, (0, 0, 0, rows - g))
        scores = torch.empty((kvh, b, rows, length), device=q.device)
        for h in range(kvh):
            torch.bmm(queries[:, h], keys[:, :, h].transpose(1, 2), out=scores[h])
        probs, denom = _softmax(scores, plan.hidden, plan.first_hidden)
        blocks = length // KV_BLOCK
        prob_blocks = probs.view(kvh, b, rows, blocks, KV_BLOCK).transpose(2, 3)
        partial = torch.empty((kvh, b, blocks, rows, d), device=q.device)
        for h in range(kvh):
            torch.matmul(prob_blocks[h], values[:, :, h].view(b, blocks, KV_BLOCK, d), out=partial[h])
        out = _tree_sum(partial, 2) / denom[..., None]  # [KVH, B, rows, D]
        return out[:, :, :g].permute(1, 0, 2, 3).reshape(b, self.num_heads, d).to(q.dtype)

    def _attend_prefill(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tile: _PrefillTile
    ) -> torch.Tensor:
        """q [n, H, D]; keys/values [L, KVH, D] float32 → [n, H, D] float32."""
        n, kvh, g, d = tile.q_len, self.num_kv_heads, self.group, self.head_dim
        queries = (q.float() * self.scale).view(n, kvh, g, d).permute(1, 0, 2, 3).reshape(kvh, n * g, d)
        rows = tile.rows
        if rows > n * g:
            queries = F.pad(queries, (0, 0, 0, rows - n * g))
        length = tile.length
        k = keys[:length].permute(1, 2, 0)  # [KVH, D, L]
        scores = torch.bmm(queries, k)
        probs, denom = _softmax(scores, tile.hidden, tile.first_hidden)
        blocks = length // KV_BLOCK
        prob_blocks = probs.view(kvh, rows, blocks, KV_BLOCK).transpose(1, 2)
        v = values[:length].view(blocks, KV_BLOCK, kvh, d).permute(2, 0, 1, 3)  # [KVH, blocks, S, D]
        partial = torch.matmul(prob_blocks, v)  # [KVH, blocks, rows, D]
        out = _tree_sum(partial, 1) / denom[..., None]  # [KVH, rows, D]
        return out[:, : n * g].view(kvh, n, g, d).permute(1, 0, 2, 3).reshape(n, self.num_heads, d)


def _softmax(
    scores: torch.Tensor, hidden: torch.Tensor, first_hidden: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalized probabilities, in place of ``scores`` [..., rows, L] (already scaled), and
    their row sums [..., rows]. Only keys from ``first_hidden`` on can be masked."""
    scores[..., first_hidden:].masked_fill_(hidden, float("-inf"))
    scores.sub_(scores.amax(-1, keepdim=True)).exp_()
    block_sums = scores.view(*scores.shape[:-1], -1, KV_BLOCK).sum(-1)  # fixed-length sums
    return scores, _tree_sum(block_sums, -1)


def _tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over ``dim`` as a pairwise tree fixed by index: ((x0+x1)+(x2+x3))+... An odd last
    element moves up unchanged, which equals adding zeros, so trailing zero blocks never change
    the result."""
    dim %= x.dim()
    while x.shape[dim] > 1:
        n = x.shape[dim]
        pairs = x.narrow(dim, 0, n - n % 2).reshape(*x.shape[:dim], n // 2, 2, *x.shape[dim + 1 :])
        summed = pairs.select(dim + 1, 0) + pairs.select(dim + 1, 1)
        x = torch.cat((summed, x.narrow(dim, n - 1, 1)), dim) if n % 2 else summed
    return x.squeeze(dim)


def _padded(length: int) -> int:
    return -(-length // KV_BLOCK) * KV_BLOCK
