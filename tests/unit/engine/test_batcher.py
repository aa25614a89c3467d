"""The scheduling policy with fake token counts and a fake KV admission (no tensors)."""

from __future__ import annotations

from reference_server.engine.batcher import Batcher, BatcherConfig, ScheduledChunk
from reference_server.engine.sequence import RequestGroup
from reference_server.ipc import DetokenizeConfig, SamplingConfig, StoppingConfig, SubmitRequest

GREEDY = SamplingConfig(0.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0, 0)


def group(rid: str, prompt_len: int, *, n: int = 1, max_tokens: int = 4) -> RequestGroup:
    stopping = StoppingConfig(max_tokens, 0, (), True)
    detok = DetokenizeConfig(True, True, (), False, 0)
    return RequestGroup.create(SubmitRequest(rid, list(range(prompt_len)), n, GREEDY, stopping, None, detok))


class FakeAdmission:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    def try_admit(self, g: RequestGroup) -> bool:
        if g.kv_worst_case > self.capacity:
            return False
        self.capacity -= g.kv_worst_case
        g.kv_reserved = g.kv_worst_case
        return True

    def suspend(self, g: RequestGroup) -> None:
        self.capacity += g.kv_reserved
        g.kv_suspended, g.kv_reserved = g.kv_reserved, 0

    def try_resume(self, g: RequestGroup) -> bool:
        if g.kv_suspended > self.capacity:
            return False
        self.capacity -= g.kv_suspended
        g.kv_reserved, g.kv_suspended = g.kv_suspended, 0
        return True


def apply(chunks: list[ScheduledChunk], batcher: Batcher) -> None:
    """What the engine does after the forward pass: advance, fork finished prompts, append."""
    for chunk in chunks:
        chunk.seq.num_computed_tokens += chunk.num_tokens
        g = batcher.running[chunk.seq.rid]
        if chunk.samples and not g.forked:
            g.forked = True
            for seq in g.outputs:
                seq.num_computed_tokens = g.num_prompt_tokens
                seq.token_ids.append(0)
        elif chunk.samples:
            chunk.seq.token_ids.append(0)


def summary(chunks: list[ScheduledChunk]) -> list[tuple[str, int, int, int, bool]]:
    return [(c.seq.rid, c.seq.output_index, c.start, c.num_tokens, c.samples) for c in chunks]


def test_chunked_prefill_under_the_token_budget() -> None:
    batcher = Batcher(BatcherConfig(max_batch_tokens=10, max_running_sequences=4), FakeAdmission(1000))
    batcher.add(group("a", 25))
    steps = []
    for _ in range(4):
        chunks = batcher.schedule()
        steps.append(summary(chunks))
        apply(chunks, batcher)
    assert steps == [
        [("a", 0, 0, 10, False)],
        [("a", 0, 10, 10, False)],
        [("a", 0, 20, 5, True)],
        [("a", 0, 25, 1, True)],  # decode: one token, the sampled one
    ]


def test_decode_first_then_prefill_and_admission_share_the_budget() -> None:
    batcher = Batcher(BatcherConfig(max_batch_tokens=8, max_running_sequences=8), FakeAdmission(1000))
    batcher.add(group("a", 3, n=2))
    apply(batcher.schedule(), batcher)  # a: whole prompt, forks into 2 outputs
    batcher.add(group("b", 4))
    batcher.add(group("c", 9))
    chunks = batcher.schedule()
    assert summary(chunks) == [
        ("a", 0, 3, 1, True),
        ("a", 1, 3, 1, True),
        ("b", 0, 0, 4, True),
        ("c", 0, 0, 2, False),  # what is left of the budget
    ]


def test_groups_are_admitted_all_or_nothing_in_order() -> None:
    admission = FakeAdmission(capacity=40)
    batcher = Batcher(BatcherConfig(max_batch_tokens=64, max_running_sequences=8), admission)
    big = group("big", 10, n=4, max_tokens=9)  # 10 + 4 * 8 = 42 > 40
    small = group("small", 2)
    batcher.add(big)
    batcher.add(small)
    assert batcher.schedule() == []  # big cannot fit, small waits behind it
    assert batcher.num_waiting_sequences == 5 and batcher.num_running_sequences == 0
    admission.capacity = 42
    chunks = batcher.schedule()
    assert [c.seq.rid for c in chunks] == ["big"]  # small no longer fits the rest
    assert batcher.num_running_sequences == 4


def test_running_sequence_limit_counts_every_output() -> None:
    batcher = Batcher(BatcherConfig(max_batch_tokens=64, max_running_sequences=4), FakeAdmission(1000))
    batcher.add(group("a", 2, n=3))
    batcher.add(group("b", 2, n=2))
    apply(batcher.schedule(), batcher)
    assert list(batcher.running) == ["a"] and batcher.num_waiting_sequences == 2
    a = batcher.running["a"]
    a.outputs[0].finished = a.outputs[1].finished = True  # two outputs of a ended
    assert [c.seq.rid for c in batcher.schedule()] == ["a", "b"]


def test_pop_removes_waiting_and_running_groups() -> None:
    batcher = Batcher(BatcherConfig(max_batch_tokens=8, max_running_sequences=4), FakeAdmission(1000))
    batcher.add(group("a", 2))
    batcher.schedule()
    batcher.add(group("b", 2))
    assert batcher.pop("b") is not None and batcher.pop("a") is not None
    assert batcher.pop("a") is None
    assert not batcher.waiting and not batcher.running


def test_a_group_out_of_credit_leaves_the_batch_and_its_reservation_to_others() -> None:
    batcher = Batcher(BatcherConfig(max_batch_tokens=64, max_running_sequences=2), FakeAdmission(40))
    stalled = group("stalled", 4, n=2, max_tokens=9)
    stalled.token_credit = 4  # its client reads slowly: two tokens per output, then more credit
    other, late = group("other", 4, max_tokens=9), group("late", 4)
    batcher.add(stalled)
    apply(batcher.schedule(), batcher)  # prefilled and forked: one token per output so far
    batcher.add(other)
    chunks = batcher.schedule()
    assert [c.seq.rid for c in chunks] == ["stalled", "stalled"]  # no row left for `other`
    apply(chunks, batcher)  # two tokens per output: the credit is spent
    chunks = batcher.schedule()
    assert {c.seq.rid for c in chunks} == {"other"} and batcher.held == {"stalled"}
    apply(chunks, batcher)
    batcher.add(late)
    batcher.grant("stalled", 8)
    waiting = batcher.schedule()  # granted, it waits for room, and nothing new jumps ahead of it
    assert {c.seq.rid for c in waiting} == {"other"} and batcher.held == {"stalled"}
    batcher.pop("other")
    assert [c.seq.rid for c in batcher.schedule()] == ["stalled", "stalled"]
    assert not batcher.held and [g.rid for g in batcher.waiting] == ["late"]
