"""Watching GetLoad: the in-flight counts, a quiet baseline, and the check that a request's resources
were released (ABORT-3, LOAD-1)."""

from __future__ import annotations

from conformance.harness.context import Ctx
from lmrpc.v1 import Load

LOAD_FIELDS = ("active_requests", "running_sequences", "waiting_sequences", "kv_tokens_in_use")


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


async def idle_load(ctx: Ctx) -> Load:
    """Wait, at most twice the release budget, for the target to hold nothing in flight: a case that
    fills the server's capacity starts from an empty server, not from what earlier cases left ending
    (a server that never reads idle is LOAD-1's business, so the case goes on after the wait)."""
    _, load = await ctx.wait_for(
        ctx.load, lambda lo: not any(load_counts(lo).values()), 2 * ctx.budgets.release_s, every_s=0.1
    )
    return load


async def released(ctx: Ctx, baseline: Load) -> tuple[bool, Load]:
    """Wait (within the release budget) until GetLoad is back at (at most) ``baseline``."""
    base = load_counts(baseline)
    return await ctx.wait_for(
        ctx.load, lambda lo: all(v <= base[k] for k, v in load_counts(lo).items()), ctx.budgets.release_s
    )


async def expect_released(ctx: Ctx, baseline: Load, what: str) -> bool:
    """ABORT-3: the load returns to (at most) its baseline within the release budget."""
    ok, load = await released(ctx, baseline)
    return ctx.check.that(
        ok,
        f"GetLoad {ctx.budgets.release_s:.1f}s after {what}",
        f"back to the baseline {load_counts(baseline)}",
        load_counts(load),
    )
