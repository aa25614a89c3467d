"""The option values a request runs with: what it sent, or the advertised default (SAMPLE-1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmrpc.v1 import GenerateRequest, ResponseOptions, SamplingParams, StoppingCriteria

if TYPE_CHECKING:
    from conformance.vocabulary import TargetInfo


@dataclass(frozen=True, slots=True)
class Effective:
    n: int
    max_tokens: int | None  # None: absent and the prompt length is not known
    max_tokens_explicit: bool
    min_tokens: int
    ignore_eos: bool
    stop_strings: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    include_stop: bool
    return_text: bool
    return_token_ids: bool
    return_logprobs: bool
    top_logprobs: int
    skip_special_tokens: bool
    final_only: bool
    return_prompt_token_ids: bool
    seed: int | None
    temperature: float | None

    @property
    def has_stop_conditions(self) -> bool:
        return bool(self.stop_strings or self.stop_token_ids)


def effective(request: GenerateRequest, info: TargetInfo, prompt_tokens: int | None = None) -> Effective:
    sampling = request.sampling or SamplingParams()
    stopping = request.stopping or StoppingCriteria()
    response = request.response or ResponseOptions()
    if stopping.max_tokens is not None:
        max_tokens: int | None = stopping.max_tokens
    elif prompt_tokens is not None:
        default = info.model.defaults.max_tokens if info.model.defaults else 0
        max_tokens = min(default or info.max_context, info.max_context - prompt_tokens)
    else:
        max_tokens = None
    return Effective(
        n=sampling.n or 1,
        max_tokens=max_tokens,
        max_tokens_explicit=stopping.max_tokens is not None,
        min_tokens=stopping.min_tokens or 0,
        ignore_eos=stopping.ignore_eos,
        stop_strings=tuple(stopping.stop_strings),
        stop_token_ids=tuple(stopping.stop_token_ids),
        include_stop=stopping.include_stop_in_output,
        return_text=response.return_text is not False,
        return_token_ids=response.return_token_ids is not False,
        return_logprobs=response.return_logprobs,
        top_logprobs=response.top_logprobs,
        skip_special_tokens=response.skip_special_tokens is not False,
        final_only=response.final_only,
        return_prompt_token_ids=response.return_prompt_token_ids,
        seed=sampling.seed,
        temperature=sampling.temperature,
    )
