"""The torch attention backend: correct against F.scaled_dot_product_attention, and each output
row bitwise independent of chunking, padding and batch composition (random tensors, no model)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reference_server.engine.attention import AttentionBatch, SeqSpan
from reference_server.engine.attention.sdpa import SdpaBackend
from reference_server.engine.kv_pool import KVPool, SlotTable

H, KVH, D = 9, 3, 64
SLOTS = 4096


class Harness:
    """One layer of attention over a pool; sequences are (row, q, k, v) with slots assigned."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        cpu = torch.device("cpu")
        self.pool = KVPool(
            num_slots=SLOTS, num_layers=1, num_kv_heads=KVH, head_dim=D, dtype=dtype, device=cpu
        )
        self.table = SlotTable(max_rows=8, max_context_tokens=1024, device=cpu)
        self.backend = SdpaBackend(self.pool, self.table, num_heads=H, num_kv_heads=KVH, head_dim=D)
        gen = torch.Generator().manual_seed(0)
        perm = torch.randperm(SLOTS, generator=gen)  # scattered, disjoint slots per sequence
        self.seqs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        offset = 0
        for row, length in enumerate((300, 71, 5, 190)):
            q = torch.randn(length, H, D, generator=gen).to(dtype)
            k = torch.randn(length, KVH, D, generator=gen).to(dtype)
            v = torch.randn(length, KVH, D, generator=gen).to(dtype)
            slots = perm[offset : offset + length]
            offset += length
            self.seqs.append((q, k, v, slots))
            self.table.write(torch.full_like(slots, row), torch.arange(length), slots)

    def step(self, chunks: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        """chunks: (sequence, start, length). Returns each chunk's output rows."""
        spans, qs, ks, vs, slots = [], [], [], [], []
        offset = 0
        for seq, start, length in chunks:
            q, k, v, s = self.seqs[seq]
            spans.append(SeqSpan(row=seq, q_start=offset, q_len=length, kv_len=start + length))
            qs.append(q[start : start + length])
            ks.append(k[start : start + length])
            vs.append(v[start : start + length])
            slots.append(s[start : start + length])
            offset += length
        self.backend.plan(AttentionBatch(spans, offset, torch.cat(slots)))
        out = self.backend.forward(0, torch.cat(qs), torch.cat(ks), torch.cat(vs))
        return list(out.split([c[2] for c in chunks]))

    def reference(self, seq: int) -> torch.Tensor:
        q, k, v, _ = self.seqs[seq]
        out = F.scaled_dot_product_attention(
            q.float().transpose(0, 1)[None], k.float().transpose(0, 1)[None], v.float().transpose(0, 1)[None],
            is_causal=True, enable_gqa=True,
        )  # fmt: skip
        return out[0].transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_sdpa(dtype: torch.dtype) -> None:
    h = Harness(dtype)
    (out,) = h.step([(0, 0, 300)])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), h.reference(0), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_do_not_depend_on_chunking_or_batch(dtype: torch.dtype) -> None:
    h = Harness(dtype)
    (whole,) = h.step([(0, 0, 300)])
    # the same sequence in chunks of different sizes, next to other sequences' prefill and decode
    parts = h.step([(1, 0, 60), (0, 0, 97), (3, 0, 150)])
    parts += h.step([(2, 0, 5), (0, 97, 130), (1, 60, 1)])
    parts += h.step([(3, 150, 1), (0, 227, 72), (1, 61, 1)])
    chunked = torch.cat([parts[1], parts[4], parts[7]])
    assert torch.equal(chunked, whole[:299])
    # the last token as a decode step: alone, and batched with longer and shorter sequences
    (alone,) = h.step([(0, 299, 1)])
    batched = h.step([(3, 151, 1), (0, 299, 1), (2, 4, 1), (1, 62, 1)])[1]
    assert torch.equal(alone, whole[299:])
    assert torch.equal(batched, whole[299:])


def test_rows_do_not_depend_on_the_prefill_tile_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long contexts get shorter prefill tiles (PREFILL_TILE_SCORES); a row's output must not move."""
    h = Harness(torch.bfloat16)
    (whole,) = h.step([(0, 0, 300)])  # tiles of 128 tokens
    monkeypatch.setattr("reference_server.engine.attention.sdpa.PREFILL_TILE_SCORES", 3 * 320 * 7)
    (small_tiles,) = h.step([(0, 0, 300)])  # tiles of 7 tokens
    assert torch.equal(small_tiles, whole)
