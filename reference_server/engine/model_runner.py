"""One forward pass for a scheduled batch: flatten the chunks, run the model, return logits.

With a ``NativeModel`` (engine/native/) the whole step is one native call; otherwise the torch
model runs it with the attention backend, or a CUDA graph of it replays a decode step
(engine/cuda_graphs.py)."""

from __future__ import annotations

import torch

from reference_server.engine.attention import AttentionBackend, AttentionBatch, SeqSpan
from reference_server.engine.batcher import ScheduledChunk
from reference_server.engine.cuda_graphs import DecodeGraphs
from reference_server.engine.kv_pool import SlotTable
from reference_server.engine.native.model import NativeModel
from reference_server.models.llama import LlamaModel


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        table: SlotTable,
        attention: AttentionBackend,
        native: NativeModel | None = None,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model = model
        self.table = table
        self.attention = attention
        self.native = native
        self.graphs = graphs
        self.device = table.rows.device

    def forward(self, chunks: list[ScheduledChunk], slots: torch.Tensor) -> torch.Tensor:
        """Feed every chunk's tokens; ``slots`` [sum of num_tokens] (CPU int64) are their new KV
        slots, in chunk order. Returns float32 logits, one row per chunk that samples."""
        token_ids: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        spans: list[SeqSpan] = []
        last_rows: list[int] = []
        for chunk in chunks:
            seq, start, n = chunk.seq, chunk.start, chunk.num_tokens
            assert seq.row is not None
            spans.append(SeqSpan(row=seq.row, q_start=len(token_ids), q_len=n, kv_len=start + n))
            token_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            rows.extend([seq.row] * n)
            if chunk.samples:
                last_rows.append(len(token_ids) - 1)
        device = self.device
        position_t = torch.tensor(positions, device=device)
        new_slots = slots.to(device)
        self.table.write(torch.tensor(rows, device=device), position_t, new_slots)
        if self.native is not None:
            starts = [span.q_start for span in spans] + [len(token_ids)]
            return self.native.forward(token_ids, positions, starts, [s.row for s in spans], slots, last_rows)
        batch = AttentionBatch(spans, len(token_ids), new_slots)
        token_t = torch.tensor(token_ids, device=device)
        hidden: torch.Tensor
        if self.graphs is not None and self.graphs.runs(batch):
            hidden = self.graphs.forward(token_t, position_t, batch)
        else:
            self.attention.plan(batch)
            hidden = self.model(token_t, position_t, self.attention)
        if not last_rows:
            return hidden.new_empty((0, self.model.config.vocab_size), dtype=torch.float32)
        return self.model.compute_logits(hidden.index_select(0, torch.tensor(last_rows, device=device)))
