"""Decode steps on a GPU replayed from CUDA graphs: one graph per batch size, captured on first use.

An eager decode step of a small model is bound by the host launching its few hundred kernels,
not by the GPU. A captured graph launches them all at once. Batch sizes are rounded up to a few
sizes (``graph_batch_size``); the extra rows repeat the batch's last sequence: the same token
at the same position writes the same keys and values into the same slot, so the padding
changes nothing, and its rows are dropped.

Only the flashinfer backend runs under a graph (its decode plan writes fixed buffers that the
graph reads); prefill steps and batches larger than the largest size stay eager.
"""

from __future__ import annotations

import torch

from reference_server.engine.attention.base import AttentionBatch, SeqSpan
from reference_server.engine.attention.flashinfer import FlashInferBackend
from reference_server.models.llama import LlamaModel

SMALL_SIZES = (1, 2, 4, 8)
SIZE_STEP = 8  # above SMALL_SIZES, every multiple of this


def graph_batch_size(rows: int, max_rows: int) -> int | None:
    """The captured size that holds ``rows`` decode rows, or None when none does."""
    if rows < 1 or rows > max_rows:
        return None
    for size in SMALL_SIZES:
        if rows <= size:
            return min(size, max_rows)
    return min(-(-rows // SIZE_STEP) * SIZE_STEP, max_rows)


def padded_spans(spans: list[SeqSpan], size: int) -> list[SeqSpan]:
    """The batch's spans (one row each), then copies of the last one up to ``size`` rows."""
    last = spans[-1]
    extra = [SeqSpan(last.row, len(spans) + i, 1, last.kv_len) for i in range(size - len(spans))]
    return [*spans, *extra]


def padded_rows(values: torch.Tensor, size: int) -> torch.Tensor:
    """``values`` [rows] followed by its last entry repeated up to ``size`` entries."""
    return torch.cat((values, values[-1:].expand(size - values.shape[0])))


class DecodeGraphs:
    def __init__(self, model: LlamaModel, attention: FlashInferBackend, max_rows: int) -> None:
        self.model = model
        self.attention = attention
        self.max_rows = max_rows
        device = attention.device
        self._token_ids = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self._positions = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self._slots = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._memory = torch.cuda.graph_pool_handle()

    @property
    def captured_sizes(self) -> list[int]:
        return sorted(self._graphs)

    def runs(self, batch: AttentionBatch) -> bool:
        """Whether this step replays a graph: one new token per sequence, and a size for it."""
        return (
            batch.num_tokens == len(batch.spans)
            and graph_batch_size(batch.num_tokens, self.max_rows) is not None
        )

    def forward(
        self, token_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor:
        """What ``LlamaModel.forward`` returns for this decode batch: hidden states [rows, hidden],
        in the graph's own output memory (valid until the next replay)."""
        rows = batch.num_tokens
        size = graph_batch_size(rows, self.max_rows)
        assert size is not None and rows == len(batch.spans)
        self._token_ids[:size].copy_(padded_rows(token_ids, size))
        self._positions[:size].copy_(padded_rows(positions, size))
        self._slots[:size].copy_(padded_rows(batch.new_slots, size))
        self.attention.plan_graphed(AttentionBatch(padded_spans(batch.spans, size), size, self._slots[:size]))
        graph = self._graphs.get(size)
        if graph is None:
            graph = self._graphs[size] = self._capture(size)
        graph[0].replay()
        return graph[1][:rows]

    def _capture(self, size: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture the model on the static inputs, as planned for this step. The warm-up pass
        outside the capture runs each kernel's one-time set-up; it computes this step's
        keys and values, which the replay then writes again."""
        token_ids, positions = self._token_ids[:size], self._positions[:size]
        stream = torch.cuda.Stream(self.attention.device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.model(token_ids, positions, self.attention)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._memory):
            hidden = self.model(token_ids, positions, self.attention)
        return graph, hidden
