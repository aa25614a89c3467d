"""Token-slot pool and slot table."""

from __future__ import annotations

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
