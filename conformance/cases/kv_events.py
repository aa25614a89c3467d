"""The engine protocols' KV-cache events against what the harness did (SMG-6): the blocks of its
prompts stored and chained, the batches numbered without gaps, a replay from a cursor, and the
clear after a flush. smg's cache-aware routing places each request where these events say its
prefix is cached; a server whose events lie sends traffic to the wrong replica."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from conformance.cases.smg import smg_driver
from conformance.harness.context import Ctx
from conformance.harness.requests import request
from conformance.spec.descriptors import message_class
from conformance.spec.registry import case
from conformance.stream import wiretap
from conformance.stream.live import RawMessage
from conformance.vocabulary import CaseFailed, CaseSkipped, Mismatch
from lmrpc._gen.smg.grpc.common import SubscribeKvEventsRequest
from lmrpc.v1 import FlushCacheRequest

PROMPT_BLOCKS = 4  # full blocks each prompt fills at the usual block sizes (16, 32)
QUIET_S = 0.3  # no batch for this long: a subscription from 0 has sent the state it starts with

Block = tuple[int | None, tuple[int, ...]]  # (parent hash, token ids)
KvEventBatch = Any  # smg.grpc.common.KvEventBatch, decoded by protobuf (see spec/descriptors.py)


class KvSubscription:
    """One SubscribeKvEvents call, read in the background: ``batches`` as they arrive, ``error`` the
    status it ended with (None while open or after a clean end)."""

    def __init__(self, ctx: Ctx, start: int) -> None:
        self.batches: list[KvEventBatch] = []
        self.error: GRPCError | None = None
        self.ended = False
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._read(ctx, start))

    async def _read(self, ctx: Ctx, start: int) -> None:
        path = f"/{smg_driver(ctx).service}/SubscribeKvEvents"
        channel = ctx.session.target.channel
        try:
            parse = message_class("smg.grpc.common.KvEventBatch").FromString
            rpc = f"{smg_driver(ctx).service.rpartition('.')[2]}.SubscribeKvEvents"
            async with channel.request(
                path, Cardinality.UNARY_STREAM, RawMessage, RawMessage, timeout=ctx.budgets.case_s()
            ) as stream:
                request = SubscribeKvEventsRequest(start_sequence_number=start)
                wiretap.note_sent(request, f"{rpc} request")
                body = bytes(request)
                await stream.send_message(RawMessage(body), end=True)
                while (raw := await stream.recv_message()) is not None:
                    self.batches.append(wiretap.track_protobuf(parse(raw.data), f"{rpc} response"))
                    self._changed.set()
        except GRPCError as exc:
            self.error = exc
        finally:
            self.ended = True
            self._changed.set()

    async def until(self, done: Callable[[], bool], budget_s: float) -> bool:
        """Wait until ``done()`` holds, the call ends, or the budget is spent."""
        give_up = time.monotonic() + budget_s
        while not done() and not self.ended and (left := give_up - time.monotonic()) > 0:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                break
        return done()

    async def settled(self, budget_s: float) -> None:
        """Wait for the state a subscription from 0 starts with: the snapshot's last chunk, or quiet."""
        give_up = time.monotonic() + budget_s
        while time.monotonic() < give_up and not self.ended:
            if self.batches and self.batches[-1].HasField("snapshot"):
                chunk = self.batches[-1].snapshot
                if chunk.index + 1 >= chunk.count:
                    return
            seen = len(self.batches)
            await self.until(lambda seen=seen: len(self.batches) > seen, QUIET_S)  # type: ignore[misc]
            if len(self.batches) == seen and (not self.batches or not self.batches[-1].HasField("snapshot")):
                return

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    @property
    def last_sequence(self) -> int:
        return max((b.sequence_number for b in self.batches), default=0)


async def subscribed(ctx: Ctx, start: int = 0) -> KvSubscription:
    """A subscription that the server accepted; SKIP where the server does not serve KV events."""
    subscription = KvSubscription(ctx, start)
    await subscription.settled(ctx.budgets.rpc_s)
    error = subscription.error
    if error is not None and error.status is Status.UNIMPLEMENTED:
        raise CaseSkipped("SubscribeKvEvents answers UNIMPLEMENTED: the server publishes no KV events")
    if error is not None:
        raise CaseFailed(
            [Mismatch(f"SubscribeKvEvents from {start}", "accepted", f"{error.status.name}: {error.message}")]
        )
    return subscription


def stored_blocks(batches: list[KvEventBatch]) -> dict[Block, int]:
    """Every block the batches stored, as (parent, tokens) -> hash, chained as the events say."""
    found: dict[Block, int] = {}
    for batch in batches:
        for event in batch.events:
            if not event.HasField("stored"):
                continue
            parent = event.stored.parent_block_hash if event.stored.HasField("parent_block_hash") else None
            for block in event.stored.blocks:
                found[(parent, tuple(block.token_ids))] = block.block_hash
                parent = block.block_hash
    return found


def block_size(batches: list[KvEventBatch]) -> int:
    for batch in batches:
        for event in batch.events:
            for block in event.stored.blocks:
                return int(block.block_size or len(block.token_ids))
    return 0


def prompt_chain(prompt: list[int], batches: list[KvEventBatch]) -> tuple[int, int]:
    """``(found, full)``: how many of the prompt's ``full`` blocks are stored, chained from its first."""
    size = block_size(batches)
    if size <= 0:
        return 0, -1
    stored, parent, full = stored_blocks(batches), None, len(prompt) // size
    for index in range(full):
        found = stored.get((parent, tuple(prompt[index * size : (index + 1) * size])))
        if found is None:
            return index, full
        parent = found
    return full, full


def check_numbering(ctx: Ctx, subscription: KvSubscription, what: str) -> None:
    """Consecutive numbers; a batch without events may repeat the one before it."""
    previous: KvEventBatch | None = None
    for batch in subscription.batches:
        if previous is not None:
            number, before = batch.sequence_number, previous.sequence_number
            if not (number == before + 1 or (number == before and not batch.events)):
                ctx.check.add(
                    f"{what}: the batch after number {before}", f"number {before + 1}", f"number {number}"
                )
                return
        previous = batch


def check_removals(ctx: Ctx, subscription: KvSubscription, what: str) -> None:
    """Where the subscription began with the whole state (a snapshot), every removed hash is live."""
    if not subscription.batches or not subscription.batches[0].HasField("snapshot"):
        return
    live: set[int] = set()
    for batch in subscription.batches:
        for event in batch.events:
            if event.HasField("stored"):
                live.update(b.block_hash for b in event.stored.blocks)
            elif event.HasField("removed"):
                unknown = [h for h in event.removed.block_hashes if h not in live]
                if unknown:
                    ctx.check.add(
                        f"{what}: removed in batch {batch.sequence_number}",
                        "hashes stored before",
                        unknown[:3],
                    )
                    return
                live.difference_update(event.removed.block_hashes)
            elif event.HasField("cleared"):
                live.clear()


def fresh_prompt(ctx: Ctx) -> str:
    """A prompt no cache holds yet, long enough for PROMPT_BLOCKS blocks of 32 tokens."""
    words = " ".join(f"{ctx.uid('kv')} lantern river {i}" for i in range(PROMPT_BLOCKS * 4))
    return f"Remember this list: {words}."


async def prefilled(ctx: Ctx, subscription: KvSubscription, what: str, text: str | None = None) -> list[int]:
    """Send a prompt (by default a fresh one) and wait until the subscription reports its blocks,
    chained from its first; returns its token ids."""
    record = await ctx.generate(request(ctx, text or fresh_prompt(ctx), max_tokens=1))
    sent = record.request.token_ids  # the driver sends the prompt as token ids, as smg does
    prompt = [int(t) for t in sent.ids] if sent is not None else []
    await subscription.until(
        lambda: _complete(prompt_chain(prompt, subscription.batches)), ctx.budgets.release_s
    )
    found, full = prompt_chain(prompt, subscription.batches)
    if full < 0:
        raise CaseFailed(
            [
                *ctx.check.mismatches,
                Mismatch(f"{what}: events after a {len(prompt)}-token prompt", "stored blocks", "none"),
            ]
        )
    ctx.check.that(
        found == full,
        f"{what}: the {full} full blocks of a {len(prompt)}-token prompt",
        "each stored, with the prompt's tokens, chained from the first",
        f"block {found} missing or not chained" if found < full else "stored",
    )
    return prompt


def _complete(chain: tuple[int, int]) -> bool:
    found, full = chain
    return full > 0 and found == full


@case("SMG-6", tag="stored")
async def prompt_blocks_are_stored(ctx: Ctx) -> None:
    """A fresh prompt's full blocks are stored with its tokens, chained by parent hash, in batches
    numbered without gaps; a removed hash is always one stored before."""
    subscription = await subscribed(ctx)
    try:
        await prefilled(ctx, subscription, "SubscribeKvEvents")
        check_numbering(ctx, subscription, "SubscribeKvEvents")
        check_removals(ctx, subscription, "SubscribeKvEvents")
    finally:
        await subscription.close()


@case("SMG-6", tag="extended")
async def an_extension_is_chained_to_its_cached_prefix(ctx: Ctx) -> None:
    """A prompt that extends a cached one stores only its new blocks, and the first of them names
    the cached prefix's last block as its parent: the chain runs across events (a server that drops
    parent hashes passes when a prompt's blocks come in one event, and fails here)."""
    subscription = await subscribed(ctx)
    try:
        first = fresh_prompt(ctx)
        await prefilled(ctx, subscription, "a fresh prompt", first)
        await prefilled(
            ctx, subscription, "the same prompt extended", f"{first} And then: {fresh_prompt(ctx)}"
        )
        check_numbering(ctx, subscription, "SubscribeKvEvents")
    finally:
        await subscription.close()


@case("SMG-6", tag="replay")
async def replay_from_a_cursor(ctx: Ctx) -> None:
    """A subscription from a cursor delivers again exactly the batches after it (or OUT_OF_RANGE
    where the server keeps none), the same events in the same batches, then goes on."""
    first = await subscribed(ctx)
    try:
        await prefilled(ctx, first, "the first subscription")
        cursor = first.last_sequence
        await prefilled(ctx, first, "the first subscription")
        check_numbering(ctx, first, "the first subscription")
        end = first.last_sequence
        if cursor <= 0 or end <= cursor:
            raise CaseFailed(
                [
                    *ctx.check.mismatches,
                    Mismatch("batches after a prompt", "numbered from 1", f"{cursor}..{end}"),
                ]
            )
        wanted = [
            (b.sequence_number, list(b.events))
            for b in first.batches
            if cursor < b.sequence_number <= end and b.events
        ]
    finally:
        await first.close()
    second = KvSubscription(ctx, cursor)
    try:
        await second.until(lambda: second.last_sequence >= end, ctx.budgets.release_s)
        if second.error is not None and second.error.status is Status.OUT_OF_RANGE:
            ctx.note(f"the replay from {cursor} was refused OUT_OF_RANGE: the server keeps no history")
            return
        got = [
            (b.sequence_number, list(b.events))
            for b in second.batches
            if b.sequence_number <= end and b.events
        ]
        ctx.check.that(
            got == wanted,
            f"SubscribeKvEvents from {cursor}",
            f"batches {cursor + 1}..{end} again, the same events",
            f"batches {[n for n, _ in got][:8]}"
            + ("" if [n for n, _ in got] != [n for n, _ in wanted] else ", other events"),
        )
        check_numbering(ctx, second, f"SubscribeKvEvents from {cursor}")
    finally:
        await second.close()


def _cleared(batches: list[KvEventBatch]) -> bool:
    return any(e.HasField("cleared") for b in batches for e in b.events)


@case("SMG-6", tag="cleared", exclusive=True, sends=("admin.flush",))
async def flush_is_cleared(ctx: Ctx) -> None:
    """FlushCache on a cache that holds a prompt is followed by a cleared event (else the router
    keeps sending that prefix to a replica that lost it), and a router that reconnects from a cursor
    before the flush is replayed that event too (or refused OUT_OF_RANGE)."""
    subscription = await subscribed(ctx)
    try:
        await prefilled(ctx, subscription, "SubscribeKvEvents")
        flushed_after, cursor = len(subscription.batches), subscription.last_sequence
        await ctx.call(ctx.control.flush_cache, FlushCacheRequest())
        seen = await subscription.until(
            lambda: _cleared(subscription.batches[flushed_after:]), ctx.budgets.release_s
        )
        ctx.check.that(
            seen,
            "SubscribeKvEvents after FlushCache",
            "a cleared event",
            f"{len(subscription.batches) - flushed_after} batches, none cleared",
        )
        check_numbering(ctx, subscription, "SubscribeKvEvents")
    finally:
        await subscription.close()
    if not seen or cursor <= 0:
        return
    replay = KvSubscription(ctx, cursor)
    try:
        replayed = await replay.until(lambda: _cleared(replay.batches), ctx.budgets.release_s)
        if replay.error is not None and replay.error.status is Status.OUT_OF_RANGE:
            ctx.note(f"the replay from {cursor} was refused OUT_OF_RANGE: the server keeps no history")
            return
        ctx.check.that(
            replayed,
            f"SubscribeKvEvents from {cursor}, the last batch before the flush",
            "the cleared event again",
            f"{len(replay.batches)} batches, none cleared",
        )
    finally:
        await replay.close()
