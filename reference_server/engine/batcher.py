"""The scheduling policy: which sequences run in the next step, and how many tokens each.

Continuous batching: one step mixes decode tokens (one per running output) with chunks of
prompt prefill, up to ``max_batch_tokens`` tokens in all. Waiting request groups are admitted
first come, first served, all ``n`` outputs at once, when the KV space and sequence rows they
may ever need are available; a group that does not fit waits, and so do the groups behind it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from reference_server.engine.sequence import RequestGroup, Sequence


class Admission(Protocol):
    def try_admit(self, group: RequestGroup) -> bool:
        """Reserve everything ``group`` may need (rows, cached prefix, worst-case KV) and return
        True, or change nothing and return False."""
        ...

    def suspend(self, group: RequestGroup) -> None:
        """Give back what a held group reserved but has not used."""
        ...

    def try_resume(self, group: RequestGroup) -> bool:
        """Reserve again what ``suspend`` gave back, or change nothing and return False."""
        ...


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    max_batch_tokens: int
    max_running_sequences: int

    def __post_init__(self) -> None:
        if self.max_running_sequences < 1:
            raise ValueError(f"max_running_sequences={self.max_running_sequences} must be >= 1")
        if self.max_batch_tokens < self.max_running_sequences:
            raise ValueError(
                f"max_batch_tokens={self.max_batch_tokens} must be >= "
                f"max_running_sequences={self.max_running_sequences} (every running output decodes each step)"
            )


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    seq: Sequence
    start: int  # position of the first token fed (the sequence's computed tokens at scheduling)
    num_tokens: int
    samples: bool  # the chunk reaches the sequence's last token: its logits give the next token

    @classmethod
    def next_for(cls, seq: Sequence, budget: int) -> ScheduledChunk:
        n = min(seq.num_pending_tokens, budget)
        return cls(seq, seq.num_computed_tokens, n, seq.num_computed_tokens + n == seq.num_tokens)


class Batcher:
    def __init__(self, config: BatcherConfig, admission: Admission) -> None:
        self.config = config
        self.admission = admission
        self.waiting: deque[RequestGroup] = deque()
        self.running: dict[str, RequestGroup] = {}
        self.held: set[str] = set()  # running groups out of token credit: their client is not reading
        self.resuming: set[str] = set()  # granted groups waiting to take their reservation back

    def add(self, group: RequestGroup) -> None:
        self.waiting.append(group)

    def pop(self, rid: str) -> RequestGroup | None:
        """Remove a group, waiting or running."""
        self.held.discard(rid)
        self.resuming.discard(rid)
        group = self.running.pop(rid, None)
        if group is not None:
            return group
        for waiting in self.waiting:
            if waiting.rid == rid:
                self.waiting.remove(waiting)
                return waiting
        return None

    @property
    def num_running_sequences(self) -> int:
        """Sequences that take part in steps: admitted and not held. Held ones keep their KV
        cache and table rows, but their batch slots go to others (FLOW-1)."""
        return sum(len(g.active_outputs()) for rid, g in self.running.items() if rid not in self.held)

    @property
    def num_admitted_sequences(self) -> int:
        return sum(len(g.active_outputs()) for g in self.running.values())

    @property
    def num_waiting_sequences(self) -> int:
        return sum(g.request.num_outputs for g in self.waiting)

    def grant(self, rid: str, credit: int) -> None:
        group = self.running.get(rid) or next((g for g in self.waiting if g.rid == rid), None)
        if group is not None and credit > group.token_credit:
            group.token_credit = credit
            if rid in self.held and not group.out_of_credit:
                self.resuming.add(rid)

    def _hold_starved(self) -> None:
        """Groups out of credit leave the batch (keeping KV and rows, giving back their unused
        reservation); granted ones queue to come back."""
        for rid, group in self.running.items():
            starved = group.forked and group.out_of_credit
            if starved and rid not in self.held:
                self.held.add(rid)
                self.admission.suspend(group)
            elif not starved and rid in self.held:
                self.resuming.add(rid)
            if starved:
                self.resuming.discard(rid)

    def has_runnable(self) -> bool:
        return bool(self.waiting) or bool(self.resuming) or len(self.held) < len(self.running)

    def schedule(self) -> list[ScheduledChunk]:
        self._hold_starved()
        for rid in list(self.resuming):  # before new admissions: they were running already
            group = self.running[rid]
            fits = (
                self.num_running_sequences + len(group.active_outputs()) <= self.config.max_running_sequences
            )
            if fits and self.admission.try_resume(group):
                self.resuming.discard(rid)
                self.held.discard(rid)
        budget = self.config.max_batch_tokens
        chunks: list[ScheduledChunk] = []
        active = [g for rid, g in self.running.items() if rid not in self.held]
        for group in active:
            if group.forked:
                for seq in group.active_outputs():
                    chunks.append(ScheduledChunk.next_for(seq, 1))
        budget -= len(chunks)  # >= 0: max_batch_tokens >= max_running_sequences
        for group in active:
            if not group.forked and budget > 0:
                chunk = self._prefill_chunk(group, budget)
                chunks.append(chunk)
                budget -= chunk.num_tokens
        running = self.num_running_sequences
        while self.waiting and budget > 0 and not self.resuming:  # released groups come back first
            group = self.waiting[0]
            if running + group.request.num_outputs > self.config.max_running_sequences:
                break
            if not self.admission.try_admit(group):
                break
            self.waiting.popleft()
            self.running[group.rid] = group
            running += group.request.num_outputs
            chunk = self._prefill_chunk(group, budget)
            chunks.append(chunk)
            budget -= chunk.num_tokens
        return chunks

    @staticmethod
    def _prefill_chunk(group: RequestGroup, budget: int) -> ScheduledChunk:
        return ScheduledChunk.next_for(group.prefill_sequence, budget)
