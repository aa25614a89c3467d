"""Token-slot pool and slot table."""

from __future__ import annotations

import sys

import pytest
import torch

from reference_server.engine.kv_pool import KVPool, SlotTable

CPU = torch.device("cpu")


def make_pool(slots: int = 16) -> KVPool:
    return KVPool(num_slots=slots, num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32, device=CPU)


def test_alloc_and_free_round_trip() -> None:
    pool = make_pool()
    a, b = pool.alloc(5), pool.alloc(11)
    assert pool.num_free == 0
    assert sorted(torch.cat((a, b)).tolist()) == list(range(16))
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.alloc(1)
    pool.free(a)
    assert pool.num_free == 5
    assert sorted(pool.alloc(5).tolist()) == sorted(a.tolist())


def test_double_free_is_caught() -> None:
    pool = make_pool()
    slots = pool.alloc(3)
    pool.free(slots)
    with pytest.raises(AssertionError, match="twice"):
        pool.free(slots[:1])


def test_write_stores_per_layer() -> None:
    pool = make_pool()
    slots = torch.tensor([3, 7])
    k = torch.randn(2, 2, 4)
    pool.write(1, slots, k, -k)
    assert torch.equal(pool.k[1][slots], k) and torch.equal(pool.v[1][slots], -k)
    assert not pool.k[0].any()


def test_slot_table_rows() -> None:
    table = SlotTable(max_rows=2, max_context_tokens=8, device=CPU)
    r0, r1 = table.alloc_row(), table.alloc_row()
    assert {r0, r1} == {0, 1} and table.num_free_rows == 0
    table.write(torch.tensor([r1, r1, r1]), torch.tensor([0, 1, 2]), torch.tensor([9, 4, 6]))
    assert table.read(r1, 3).tolist() == [9, 4, 6]
    table.free_row(r0)
    assert table.num_free_rows == 1 and table.alloc_row() == r0


def resident_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_cpu_pool_costs_memory_only_where_slots_were_written() -> None:
    """1 GiB of K and V: zero, and resident only as slots are used (low slots first)."""
    before = resident_mb()
    pool = KVPool(
        num_slots=1 << 16, num_layers=32, num_kv_heads=4, head_dim=64, dtype=torch.bfloat16, device=CPU
    )
    assert resident_mb() - before < 64
    slots = pool.alloc(256)
    assert slots.tolist() == list(range(256))
    k = torch.ones(256, 4, 64)
    for layer in range(32):
        pool.write(layer, slots, k, k)
    assert float(pool.k[31][:256].float().sum()) == 256 * 4 * 64
    assert float(pool.k[31][256:1024].float().abs().sum()) == 0.0
    assert resident_mb() - before < 64  # 256 slots of 64 layers' K/V: 8 MiB


def coded_pool(kv_format: str = "int8", layers: int = 2) -> KVPool:
    return KVPool(
        num_slots=8,
        num_layers=layers,
        num_kv_heads=3,
        head_dim=64,
        dtype=torch.bfloat16,
        device=CPU,
        kv_format=kv_format,
    )


def test_an_int8_pool_holds_codes_and_a_scale_per_row() -> None:
    pool = coded_pool()
    # one plane per KV head
    assert all(t.dtype == torch.int8 and t.shape == (3, 8, 64) for t in pool.k + pool.v)
    assert all(t.dtype == torch.float32 and t.shape == (3, 8) for t in pool.k_scales + pool.v_scales)
    assert len(pool.k_scales) == len(pool.v_scales) == 2
    assert make_pool().k_scales == []
    with pytest.raises(AssertionError, match="native kernels"):  # the torch model never writes one
        pool.write(0, torch.tensor([0]), torch.zeros(1, 3, 64), torch.zeros(1, 3, 64))
    with pytest.raises(ValueError, match="kv_format='fp8'"):
        coded_pool("fp8", layers=1)
