"""Token sampling on the model device, one row per output, each with its own options.

Order of operations (the same rules as the fake engine's sampler): penalties on the raw
logits, EOS/stop-token masking below ``min_tokens``, the constraint's mask (a row whose grammar
allows only tokens that ``min_tokens`` masks keeps the grammar's: a complete constrained output
ends, CONSTRAIN-1), then greedy argmax, or temperature with top-k, top-p and min-p truncation and
a draw from the output's own generator. Every operation is row-wise, so a row's token does not
depend on the other rows in the batch (CONSTRAIN-4). A draw uses one
uniform number per token (inverse CDF), so the generator advances the same way whatever the
options. Logprobs are log-softmax of the raw logits, before any of the above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_server.ipc import SamplingConfig, TokenLogprob

DISALLOWED_LOGIT = torch.finfo(torch.float32).min  # added to a token its row's grammar does not allow


@dataclass(frozen=True, slots=True)
class SampleRow:
    logits_row: int  # several outputs may sample from one row (the n outputs' first token)
    sampling: SamplingConfig
    generator: torch.Generator | None  # CPU; used only when sampling
    prompt_ids: list[int]
    output_ids: list[int]
    masked_ids: tuple[int, ...]  # EOS/stop ids while the output is shorter than min_tokens
    top_logprobs: int | None
    allowed_tokens: torch.Tensor | None = None  # bool [V] (CPU): what a constrained output's grammar allows


@dataclass(frozen=True, slots=True)
class SampledToken:
    token_id: int
    logprob: TokenLogprob | None


def sample(logits: torch.Tensor, rows: list[SampleRow]) -> list[SampledToken]:
    """logits [R, V] float32 (raw) → one token per SampleRow."""
    if not rows:
        return []
    device = logits.device
    raw = logits.index_select(0, torch.tensor([r.logits_row for r in rows], device=device))
    processed = _apply_masks(raw, _apply_penalties(raw, rows), rows)
    tokens = processed.argmax(-1)
    for truncate in (False, True):
        drawn = [
            i for i, r in enumerate(rows) if not r.sampling.is_greedy and _truncates(r.sampling) == truncate
        ]
        if drawn:
            index = torch.tensor(drawn, device=device)
            tokens[index] = _draw(
                processed.index_select(0, index), [rows[i] for i in drawn], truncate=truncate
            )
    token_list: list[int] = tokens.tolist()
    logprobs = _logprobs(raw, tokens, token_list, rows)
    return [SampledToken(t, lp) for t, lp in zip(token_list, logprobs, strict=True)]


def _apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    penalized = [i for i, r in enumerate(rows) if _has_penalty(r.sampling)]
    if not penalized:
        return logits
    out = logits.clone()
    vocab = logits.shape[1]
    for i in penalized:
        s, row = rows[i].sampling, out[i]
        output = torch.tensor(rows[i].output_ids, dtype=torch.int64, device=logits.device)
        if s.repetition_penalty != 1.0:
            seen = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
            seen[torch.tensor(rows[i].prompt_ids, dtype=torch.int64, device=logits.device)] = True
            seen[output] = True
            scaled = torch.where(row > 0, row / s.repetition_penalty, row * s.repetition_penalty)
            row.copy_(torch.where(seen, scaled, row))
        if (s.frequency_penalty or s.presence_penalty) and output.numel():
            counts = torch.bincount(output, minlength=vocab).to(row.dtype)
            row.sub_(s.frequency_penalty * counts + s.presence_penalty * (counts > 0).to(row.dtype))
    return out


def _apply_masks(raw: torch.Tensor, processed: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """-inf for the ids ``min_tokens`` masks; a constrained row instead gets its grammar's bias."""
    masked = [
        (i, list(r.masked_ids)) for i, r in enumerate(rows) if r.masked_ids and r.allowed_tokens is None
    ]
    constrained = [(i, r.allowed_tokens) for i, r in enumerate(rows) if r.allowed_tokens is not None]
    if not masked and not constrained:
        return processed
    processed = processed.clone() if processed is raw else processed
    for i, ids in masked:
        processed[i, ids] = float("-inf")
    for i, allowed in constrained:
        processed[i].add_(_grammar_bias(allowed.to(processed.device), rows[i].masked_ids))
    return processed


def _grammar_bias(allowed: torch.Tensor, masked_ids: tuple[int, ...]) -> torch.Tensor:
    """0 for each token the grammar allows, the lowest float32 for the others (as good as -inf
    after softmax; a bool-masked fill is 30x slower on CPU); the ids ``min_tokens`` masks are left
    out too, unless that would leave the row nothing."""
    keep = allowed
    if masked_ids:
        keep = allowed.clone()
        keep[list(masked_ids)] = False
        if not bool(keep.any()):
            keep = allowed
    return keep.to(torch.float32).sub_(1.0).mul_(-DISALLOWED_LOGIT)


def _has_penalty(s: SamplingConfig) -> bool:
    return s.repetition_penalty != 1.0 or s.frequency_penalty != 0.0 or s.presence_penalty != 0.0


def _truncates(s: SamplingConfig) -> bool:
    return s.top_k > 0 or s.top_p < 1.0


def _draw(logits: torch.Tensor, rows: list[SampleRow], *, truncate: bool) -> torch.Tensor:
    """Sampled token per row of ``logits`` [S, V] (penalized, masked, not yet temperature-scaled).
    Rows with top-k/top-p draw in descending-probability order, the others in vocabulary order;
    the split depends only on the row's own options, never on its neighbours."""
    device = logits.device
    vocab = logits.shape[1]
    temperature = torch.tensor([r.sampling.temperature for r in rows], device=device)[:, None]
    order: torch.Tensor | None = None  # sorted position → token id
    if truncate:
        # a stable sort keeps the lowest id first among equal logits, as argmax does
        logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        top_k = torch.tensor([r.sampling.top_k or vocab for r in rows], device=device)[:, None]
        beyond_k = torch.arange(vocab, device=device)[None, :] >= top_k
        logits = logits.masked_fill(beyond_k, float("-inf"))
    probs = torch.softmax(logits / temperature, dim=-1)
    if truncate:
        top_p = torch.tensor([r.sampling.top_p for r in rows], device=device, dtype=torch.float64)[:, None]
        mass_before = probs.cumsum(-1, dtype=torch.float64) - probs
        probs = probs.masked_fill(mass_before >= top_p, 0.0)
    min_p = torch.tensor([r.sampling.min_p for r in rows], device=device)[:, None]
    probs = probs.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), 0.0)
    uniform = torch.cat([_uniform(r.generator) for r in rows]).to(device)
    cdf = probs.cumsum(-1, dtype=torch.float64)
    picked = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True)
    # u * total can round up to the total itself; fall back to the last token with mass
    last_kept = vocab - 1 - (probs > 0).flip(-1).to(torch.int8).argmax(-1, keepdim=True)
    picked = torch.minimum(picked, last_kept)
    if order is not None:
        picked = order.gather(-1, picked)
    return picked.squeeze(-1)


def _uniform(generator: torch.Generator | None) -> torch.Tensor:
    assert generator is not None, "a sampled output needs its generator"
    return torch.rand(1, generator=generator, dtype=torch.float64)


def _logprobs(
    raw: torch.Tensor, tokens: torch.Tensor, token_list: list[int], rows: list[SampleRow]
) -> list[TokenLogprob | None]:
    wanted = [i for i, r in enumerate(rows) if r.top_logprobs is not None]
    result: list[TokenLogprob | None] = [None] * len(rows)
    if not wanted:
        return result
    index = torch.tensor(wanted, device=raw.device)
    logprobs = torch.log_softmax(raw.index_select(0, index), dim=-1)
    chosen = logprobs.gather(-1, tokens.index_select(0, index)[:, None])
    ranks = ((logprobs > chosen).sum(-1) + 1).tolist()
    k = max(rows[i].top_logprobs or 0 for i in wanted)
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long())
    chosen_list, values, ids = chosen.squeeze(-1).tolist(), top_values.tolist(), top_ids.tolist()
    for j, i in enumerate(wanted):
        n = rows[i].top_logprobs or 0
        top = list(zip(ids[j][:n], values[j][:n], strict=True))
        result[i] = TokenLogprob(token_list[i], chosen_list[j], ranks[j], top)
    return result
