"""flashinfer against the torch backend on the same pool (needs CUDA and flashinfer-python)."""

from __future__ import annotations

import pytest
import torch

from reference_server.engine.attention import AttentionBatch, SeqSpan
from reference_server.engine.attention.sdpa import SdpaBackend
from reference_server.engine.kv_pool import KVPool, SlotTable

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="flashinfer needs CUDA"),
]

H, KVH, D = 8, 2, 64
SLOTS = 8192
LENGTHS = (300, 71, 5, 190)


def run_backend(name: str, dtype: torch.dtype, chunks: list[tuple[int, int, int]]) -> list[torch.Tensor]:
    """chunks: (sequence, start, length); every sequence's earlier tokens are already cached."""
    device = torch.device("cuda")
    pool = KVPool(num_slots=SLOTS, num_layers=1, num_kv_heads=KVH, head_dim=D, dtype=dtype, device=device)
    table = SlotTable(max_rows=8, max_context_tokens=1024, device=device)
    if name == "flashinfer":
        from reference_server.engine.attention.flashinfer import FlashInferBackend

        backend: SdpaBackend | FlashInferBackend = FlashInferBackend(
            pool, table, num_heads=H, num_kv_heads=KVH, head_dim=D
        )
    else:
        backend = SdpaBackend(pool, table, num_heads=H, num_kv_heads=KVH, head_dim=D)
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(SLOTS, generator=gen)
    seqs, offset = [], 0
    for row, length in enumerate(LENGTHS):
        q = torch.randn(length, H, D, generator=gen).to(device, dtype)
        k = torch.randn(length, KVH, D, generator=gen).to(device, dtype)
        v = torch.randn(length, KVH, D, generator=gen).to(device, dtype)
        slots = perm[offset : offset + length].to(device)
        offset += length
        table.write(torch.full_like(slots, row), torch.arange(length, device=device), slots)
        pool.write(0, slots, k, v)  # the whole history is cached; the chunks recompute their part
        seqs.append((q, k, v, slots))
    spans, qs, ks, vs, new = [], [], [], [], []
    pos = 0
    for seq, start, length in chunks:
        q, k, v, slots = seqs[seq]
        spans.append(SeqSpan(row=seq, q_start=pos, q_len=length, kv_len=start + length))
        qs.append(q[start : start + length])
        ks.append(k[start : start + length])
        vs.append(v[start : start + length])
        new.append(slots[start : start + length])
        pos += length
    backend.plan(AttentionBatch(spans, pos, torch.cat(new)))
    out = backend.forward(0, torch.cat(qs), torch.cat(ks), torch.cat(vs))
    return list(out.split([c[2] for c in chunks]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "chunks",
    [
        [(0, 0, 300)],  # one prefill
        [(0, 299, 1), (1, 70, 1), (2, 4, 1), (3, 189, 1)],  # pure decode (decode wrapper)
        [(1, 0, 60), (0, 120, 97), (3, 189, 1), (2, 4, 1)],  # chunked prefill + decode (prefill wrapper)
    ],
)
def test_flashinfer_matches_sdpa(dtype: torch.dtype, chunks: list[tuple[int, int, int]]) -> None:
    pytest.importorskip("flashinfer")
    expected = run_backend("sdpa", dtype, chunks)
    got = run_backend("flashinfer", dtype, chunks)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
