"""Sampler math on small tensors."""

from __future__ import annotations

import math

import torch

from reference_server.engine.sampler import SampleRow, sample
from reference_server.ipc import SamplingConfig


def cfg(temperature: float = 0.0, **options: float) -> SamplingConfig:
    base = dict(
        top_p=1.0, top_k=0, min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0
    )
    base.update(options)
    return SamplingConfig(temperature=temperature, seed=0, **base)  # type: ignore[arg-type]


def row(
    sampling: SamplingConfig,
    *,
    seed: int = 0,
    logits_row: int = 0,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    masked: tuple[int, ...] = (),
    top_logprobs: int | None = None,
    allowed: list[int] | None = None,
) -> SampleRow:
    return SampleRow(
        logits_row,
        sampling,
        torch.Generator().manual_seed(seed),
        prompt or [],
        output or [],
        masked,
        top_logprobs,
        None if allowed is None else allowed_mask(allowed),
    )


def allowed_mask(ids: list[int], vocab: int = 6) -> torch.Tensor:
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[ids] = True
    return mask


LOGITS = torch.tensor([[1.0, 3.0, 2.0, 3.0, -1.0, 0.5]])


def test_greedy_takes_the_first_maximum_and_masks_apply() -> None:
    assert sample(LOGITS, [row(cfg())])[0].token_id == 1
    assert sample(LOGITS, [row(cfg(), masked=(1, 3))])[0].token_id == 2
    assert sample(LOGITS, [row(cfg(0.7, top_k=1))])[0].token_id == 1  # top_k=1 is greedy at any temperature


def test_penalties() -> None:
    # repetition: positive logits divided, negative multiplied, over prompt and output tokens
    got = sample(LOGITS, [row(cfg(repetition_penalty=2.0), prompt=[1], output=[3])])
    assert got[0].token_id == 2
    # frequency and presence: subtracted per output occurrence / once
    got = sample(LOGITS, [row(cfg(frequency_penalty=0.6, presence_penalty=0.5), output=[1, 1, 3])])
    assert got[0].token_id == 2  # 1: 3 - 1.2 - 0.5, 3: 3 - 0.6 - 0.5 = 1.9 < 2


def test_truncation_leaves_only_allowed_tokens() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    for seed in range(30):
        assert sample(logits, [row(cfg(1.0, top_k=2), seed=seed)])[0].token_id in (0, 1)
        assert sample(logits, [row(cfg(1.0, top_p=0.5), seed=seed)])[0].token_id == 0  # p(0) = 0.64
        assert sample(logits, [row(cfg(1.0, min_p=0.3), seed=seed)])[0].token_id in (0, 1)  # p1/p0 = 0.37


def test_sampling_follows_the_distribution() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p = 0.25, 0.75
    counts = [0, 0]
    for seed in range(400):
        counts[sample(logits, [row(cfg(1.0), seed=seed)])[0].token_id] += 1
    assert 60 < counts[0] < 140


def test_a_row_does_not_depend_on_its_neighbours() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    target = row(cfg(0.9, top_p=0.9), seed=42, logits_row=2)
    alone = sample(logits, [target])[0].token_id
    for _ in range(3):
        target = row(cfg(0.9, top_p=0.9), seed=42, logits_row=2)
        others = [
            row(cfg(1.2), seed=1, logits_row=0),
            row(cfg(), logits_row=1),
            row(cfg(0.5, top_k=3), seed=2, logits_row=3),
        ]
        assert sample(logits, [others[0], target, *others[1:]])[1].token_id == alone


def test_logprobs_are_from_raw_logits() -> None:
    got = sample(LOGITS, [row(cfg(repetition_penalty=2.0), prompt=[1], top_logprobs=3)])[0]
    raw = torch.log_softmax(LOGITS[0], -1)
    assert got.token_id == 3  # 1 is penalized; 3 ties with it in the raw logits
    assert got.logprob is not None
    assert math.isclose(got.logprob.logprob, float(raw[3]), rel_tol=1e-6)
    assert got.logprob.rank == 1  # nothing is strictly more likely than 3 in the raw logits
    assert [t for t, _ in got.logprob.top] in ([1, 3, 2], [3, 1, 2])
    assert sample(LOGITS, [row(cfg(), top_logprobs=0)])[0].logprob.top == []  # type: ignore[union-attr]
    assert sample(LOGITS, [row(cfg())])[0].logprob is None


def test_a_constrained_row_samples_only_what_its_grammar_allows() -> None:
    assert sample(LOGITS, [row(cfg(), allowed=[0, 4])])[0].token_id == 0
    for seed in range(30):
        for options in ({}, {"top_k": 1}, {"top_p": 0.5}, {"min_p": 0.5}):
            got = sample(LOGITS, [row(cfg(1.5, **options), seed=seed, allowed=[2, 4, 5])])[0].token_id
            assert got in (2, 4, 5)


def test_min_tokens_masks_inside_the_grammar_but_never_empties_it() -> None:
    # EOS (4) is masked below min_tokens while the grammar allows something else...
    assert sample(LOGITS, [row(cfg(), masked=(4,), allowed=[4, 5])])[0].token_id == 5
    # ...and a grammar that allows only EOS (complete) ends the output anyway (CONSTRAIN-1)
    assert sample(LOGITS, [row(cfg(), masked=(4,), allowed=[4])])[0].token_id == 4
    assert sample(LOGITS, [row(cfg(1.0), masked=(4,), allowed=[4])])[0].token_id == 4


def test_a_constrained_neighbour_changes_no_other_row() -> None:
    """CONSTRAIN-4: an unconstrained row gets the same token beside a constrained row, and a
    constrained row the same token whatever its neighbours."""
    torch.manual_seed(1)
    logits = torch.randn(3, 50)
    allowed = list(range(0, 50, 7))

    def plain() -> SampleRow:
        return row(cfg(0.9, top_p=0.9), seed=42, logits_row=0, top_logprobs=2)

    def constrained() -> SampleRow:
        mask = allowed_mask(allowed, vocab=50)
        return SampleRow(1, cfg(1.0), torch.Generator().manual_seed(3), [], [], (7,), None, mask)

    together = sample(logits, [constrained(), plain(), row(cfg(), logits_row=2)])
    assert together[1] == sample(logits, [plain()])[0]
    assert together[0] == sample(logits, [constrained()])[0]
    assert together[0].token_id in allowed and together[0].token_id != 7
