"""Small building blocks shared by the case modules."""

from __future__ import annotations

from collections.abc import Iterable

from grpclib.const import Status

from conformance.check import CaseFailed
from conformance.context import Ctx
from conformance.live import LiveStream
from conformance.results import Mismatch
from conformance.streams import End, StreamRecord
from lmrpc.v1 import (
    GenerateRequest,
    Load,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
)

LOAD_FIELDS = ("active_requests", "running_sequences", "waiting_sequences", "kv_tokens_in_use")


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
        ctx, text, max_tokens=long_tokens(ctx), ignore_eos=True, n=n, temperature=0.0, request_id=request_id
    )


def long_tokens(ctx: Ctx) -> int:
    """max_tokens of a request that must stay in flight: as long as the window allows, but small enough
    that several at once fit a KV cache that reserves each request's worst case up front."""
    limit = min(ctx.tuning.long_tokens, ctx.info.max_context - 64)
    if ctx.info.kv_tokens_total:
        limit = min(limit, max(64, ctx.info.kv_tokens_total // 16))
    return max(1, limit)


def ok(ctx: Ctx, record: StreamRecord, what: str = "the stream") -> StreamRecord:
    """Fail the case unless the call was accepted and ended with status OK and no RequestError."""
    if record.ended_ok and record.events and record.error is None:
        return record
    detail = record.summary() + (f" error={record.error}" if record.error else "")
    raise CaseFailed([*ctx.check.mismatches, Mismatch(what, "accepted, then status OK", detail)])


def status_of(record: StreamRecord) -> str:
    if record.end is End.STATUS and record.status is not None:
        return f"{record.status.name} after {len(record.events)} messages"
    return record.summary()


def expect_rejected(ctx: Ctx, record: StreamRecord, codes: Iterable[Status], what: str) -> bool:
    """A request the contract rejects: a non-OK status with one of ``codes`` and no messages (ERR-1)."""
    codes = tuple(codes)
    names = " or ".join(c.name for c in codes)
    good = record.end is End.STATUS and record.status in codes and not record.events
    return ctx.check.that(good, what, f"{names} and no messages", status_of(record))


def outputs_tokens(record: StreamRecord) -> list[list[int]]:
    return [v.token_ids for v in record.outputs().values()]


def load_counts(load: Load) -> dict[str, int]:
    return {name: int(getattr(load, name)) for name in LOAD_FIELDS}


async def quiet_load(ctx: Ctx) -> Load:
    """The load to compare against: once the target is idle, or once its counts stop changing (what
    earlier cases left may still be ending; a server that never reports idle is LOAD-1's business)."""
    history: list[dict[str, int]] = []

    def settled(load: Load) -> bool:
        history.append(load_counts(load))
        return not any(history[-1].values()) or (
            len(history) >= 4 and all(h == history[-1] for h in history[-4:])
        )

    _, load = await ctx.wait_for(ctx.load, settled, ctx.budgets.release_s, every_s=0.1)
    return load


async def expect_released(ctx: Ctx, baseline: Load, what: str) -> bool:
    """ABORT-3: the load returns to (at most) its baseline within the release budget."""
    base = load_counts(baseline)
    released, load = await ctx.wait_for(
        ctx.load, lambda lo: all(v <= base[k] for k, v in load_counts(lo).items()), ctx.budgets.release_s
    )
    return ctx.check.that(
        released,
        f"GetLoad {ctx.budgets.release_s:.1f}s after {what}",
        f"back to the baseline {base}",
        load_counts(load),
    )


async def first_delta(ctx: Ctx, stream: LiveStream) -> None:
    """Read until the stream delivered a token (the request is certainly running)."""
    event = await stream.read_until(
        lambda e: (
            e.kind == "delta"
            and bool(e.message.delta and (e.message.delta.token_ids or e.message.delta.text))
        ),
        ctx.budgets.prompt_s,
    )
    if event is None:
        raise CaseFailed(
            [
                *ctx.check.mismatches,
                Mismatch("a long request", "in flight with tokens streaming", stream.record.summary()),
            ]
        )


async def accepted(ctx: Ctx, stream: LiveStream) -> None:
    event = await stream.next(ctx.budgets.prompt_s)
    if event is None:
        raise CaseFailed(
            [
                *ctx.check.mismatches,
                Mismatch("the request", "accepted (a first message)", stream.record.summary()),
            ]
        )
