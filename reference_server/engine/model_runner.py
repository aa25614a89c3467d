"""One forward pass for a scheduled batch: flatten the chunks, run the model, return logits.

With a ``NativeDecoder``, the generated tokens fed back (one-token chunks past the prompt) go
through it and everything else through the torch model: the split is by token, never by what
else is in the step (see native/decoder.py)."""

from __future__ import annotations

import torch

from reference_server.engine.attention import AttentionBackend, AttentionBatch, SeqSpan
from reference_server.engine.batcher import ScheduledChunk
from reference_server.engine.kv_pool import SlotTable
from reference_server.engine.native.decoder import NativeDecoder
from reference_server.models.llama import LlamaModel


def is_decode(chunk: ScheduledChunk) -> bool:
    """The chunk feeds back one generated token."""
    return chunk.num_tokens == 1 and chunk.start >= chunk.seq.num_prompt_tokens


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        table: SlotTable,
        attention: AttentionBackend,
        decoder: NativeDecoder | None = None,
    ) -> None:
        self.model = model
        self.table = table
        self.attention = attention
        self.decoder = decoder
        self.device = table.rows.device

    def forward(self, chunks: list[ScheduledChunk], slots: torch.Tensor) -> torch.Tensor:
        """Feed every chunk's tokens; ``slots`` [sum of num_tokens] (CPU int64) are their new KV
        slots, in chunk order. Returns float32 logits, one row per chunk that samples."""
        rows: list[int] = []
        positions: list[int] = []
        for chunk in chunks:
            assert chunk.seq.row is not None
            rows.extend([chunk.seq.row] * chunk.num_tokens)
            positions.extend(range(chunk.start, chunk.start + chunk.num_tokens))
        device = self.device
        new_slots = slots.to(device)
        self.table.write(torch.tensor(rows, device=device), torch.tensor(positions, device=device), new_slots)
        if self.decoder is None:
            return self._forward_model(chunks, new_slots)
        native = [is_decode(c) for c in chunks]
        if not any(native):
            return self._forward_model(chunks, new_slots)
        offsets = [0]
        for chunk in chunks:
            offsets.append(offsets[-1] + chunk.num_tokens)
        decodes = [c for c, n in zip(chunks, native, strict=True) if n]
        decode_slots = torch.tensor([offsets[i] for i, n in enumerate(native) if n])
        assert all(c.samples for c in decodes)
        decode_logits = self.decoder.step(
            [c.seq.token_ids[c.start] for c in decodes],
            [c.start for c in decodes],
            [c.seq.row for c in decodes if c.seq.row is not None],
            slots.index_select(0, decode_slots),
        )
        if all(native):
            return decode_logits
        others = [c for c, n in zip(chunks, native, strict=True) if not n]
        other_slots = torch.cat(
            [new_slots[offsets[i] : offsets[i + 1]] for i, n in enumerate(native) if not n]
        )
        other_logits = self._forward_model(others, other_slots)
        # back into chunk order, one row per sampling chunk
        sampling = [n for c, n in zip(chunks, native, strict=True) if c.samples]
        order = torch.empty(len(sampling), dtype=torch.int64)
        is_native = torch.tensor(sampling)
        order[is_native] = torch.arange(len(decodes))
        order[~is_native] = torch.arange(len(decodes), len(sampling))
        return torch.cat((decode_logits, other_logits)).index_select(0, order)

    def _forward_model(self, chunks: list[ScheduledChunk], new_slots: torch.Tensor) -> torch.Tensor:
        token_ids: list[int] = []
        positions: list[int] = []
        spans: list[SeqSpan] = []
        last_rows: list[int] = []
        for chunk in chunks:
            seq, start, n = chunk.seq, chunk.start, chunk.num_tokens
            assert seq.row is not None
            spans.append(SeqSpan(row=seq.row, q_start=len(token_ids), q_len=n, kv_len=start + n))
            token_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            if chunk.samples:
                last_rows.append(len(token_ids) - 1)
        device = self.device
        self.attention.plan(AttentionBatch(spans, len(token_ids), new_slots))
        hidden: torch.Tensor = self.model(
            torch.tensor(token_ids, device=device), torch.tensor(positions, device=device), self.attention
        )
        if not last_rows:
            return hidden.new_empty((0, self.model.config.vocab_size), dtype=torch.float32)
        return self.model.compute_logits(hidden.index_select(0, torch.tensor(last_rows, device=device)))
