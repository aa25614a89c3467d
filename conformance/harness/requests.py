"""Request builders shared by the cases and the state machine: a text request with a fresh id, and a
long request that stays in flight until it is aborted or cancelled."""

from __future__ import annotations

from collections.abc import Iterable

from conformance.harness.context import Ctx
from lmrpc.v1 import GenerateRequest, ResponseOptions, SamplingParams, StoppingCriteria


def request(
    ctx: Ctx,
    text: str = "Hello",
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    n: int | None = None,
    ignore_eos: bool = False,
    min_tokens: int | None = None,
    stop_strings: Iterable[str] = (),
    stop_token_ids: Iterable[int] = (),
    include_stop: bool = False,
    response: ResponseOptions | None = None,
    request_id: str | None = None,
) -> GenerateRequest:
    """A text request with a fresh request id; ``max_tokens`` defaults to the level's cap."""
    return GenerateRequest(
        request_id=ctx.uid() if request_id is None else request_id,
        text=text,
        sampling=SamplingParams(temperature=temperature, seed=seed, n=n),
        stopping=StoppingCriteria(
            max_tokens=max_tokens or ctx.tuning.max_tokens,
            min_tokens=min_tokens,
            stop_strings=list(stop_strings),
            stop_token_ids=list(stop_token_ids),
            ignore_eos=ignore_eos,
            include_stop_in_output=include_stop,
        ),
        response=response,
    )


def long_request(
    ctx: Ctx, text: str = "Once upon a time", *, n: int | None = None, request_id: str | None = None
) -> GenerateRequest:
    """A request that stays in flight until it is aborted or cancelled (ignore_eos, all the window allows)."""
    return request(
        ctx,
        text,
        max_tokens=long_tokens(ctx),
        ignore_eos=True,
        n=n,
        temperature=sampled_for(n),
        request_id=request_id,
    )


def sampled_for(n: int | None) -> float:
    """The temperature of a request that needs no particular one: greedy for one output, sampled for
    several. Greedy with n > 1 is a choice of its own that servers may refuse (vLLM does, by design):
    only the clauses about it send it."""
    return 0.0 if (n or 1) == 1 else 1.0


def long_tokens(ctx: Ctx) -> int:
    """max_tokens of a request that must stay in flight: as long as the window allows, but small enough
    that several at once fit a KV cache that reserves each request's worst case up front."""
    limit = min(ctx.tuning.long_tokens, ctx.info.max_context - 64)
    if ctx.info.kv_tokens_total:
        limit = min(limit, max(64, ctx.info.kv_tokens_total // 16))
    return max(1, limit)
