"""How a decode batch is rounded up to a captured CUDA graph's size (engine/cuda_graphs.py).

The capture and replay themselves need a GPU: tests/model/test_cuda_engine.py."""

from __future__ import annotations

import torch

from reference_server.engine.attention.base import SeqSpan
from reference_server.engine.cuda_graphs import graph_batch_size, padded_rows, padded_spans


def test_a_batch_takes_the_smallest_size_that_holds_it() -> None:
    sizes = {rows: graph_batch_size(rows, 64) for rows in range(1, 65)}
    assert [sizes[r] for r in (1, 2, 3, 4, 5, 8, 9, 16, 17, 63, 64)] == [1, 2, 4, 4, 8, 8, 16, 16, 24, 64, 64]
    assert len(set(sizes.values())) == 11  # graphs captured at most, whatever the traffic
    assert all(size is not None and rows <= size for rows, size in sizes.items())


def test_no_size_beyond_the_running_limit() -> None:
    assert graph_batch_size(0, 64) is None
    assert graph_batch_size(65, 64) is None
    assert graph_batch_size(3, 3) == 3  # the limit itself is a size, not a multiple above it
    assert graph_batch_size(10, 12) == 12


def test_padding_repeats_the_last_sequence_in_new_rows() -> None:
    spans = [SeqSpan(row=5, q_start=0, q_len=1, kv_len=40), SeqSpan(row=2, q_start=1, q_len=1, kv_len=7)]
    padded = padded_spans(spans, 4)
    assert padded[:2] == spans
    assert padded[2:] == [SeqSpan(2, 2, 1, 7), SeqSpan(2, 3, 1, 7)]
    slots = torch.tensor([11, 12])
    assert padded_rows(slots, 4).tolist() == [11, 12, 12, 12]
    assert padded_rows(slots, 2).tolist() == [11, 12]
