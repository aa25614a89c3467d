"""``SubscribeKvEvents`` for smg's engine dialects: the hub's batches as ``smg.grpc.common``.

Served as a raw grpclib handler so that a refused cursor (OUT_OF_RANGE) is a trailers-only
answer, which smg reads as "the replay cursor expired", while an accepted subscription sends
its response headers at once, before the first batch (smg waits for them to count the stream
as connected, and an idle server may have nothing to send for a long time).
"""

from __future__ import annotations

import asyncio
from typing import assert_never

from grpclib import GRPCError, Status
from grpclib.server import Stream

from lmrpc._gen.smg.grpc.common import (
    KvBlock,
    KvBlocksRemoved,
    KvBlocksStored,
    KvCacheCleared,
    KvCacheEvent,
    KvCacheLocality,
    KvCacheTier,
    KvEventBatch,
    KvSnapshotChunk,
    SubscribeKvEventsRequest,
)
from reference_server import ipc
from reference_server.frontend.grpc_hooks import RawHandler
from reference_server.frontend.kv_events import (
    KvBatch,
    KvEventHub,
    KvEventRecord,
    ReplayUnavailableError,
    SubscriberOverflowError,
)


def kv_event_batch(batch: KvBatch) -> KvEventBatch:
    snapshot = None
    if batch.snapshot is not None:
        part = batch.snapshot
        snapshot = KvSnapshotChunk(index=part.index, count=part.count, blocks=part.blocks, unknown_before=0)
    return KvEventBatch(
        sequence_number=batch.sequence_number,
        timestamp=batch.timestamp,
        events=[_event(record, batch.block_size) for record in batch.records],
        snapshot=snapshot,
    )


def _event(record: KvEventRecord, block_size: int) -> KvCacheEvent:
    event = record.event
    match event:
        case ipc.KvBlocksStored():
            blocks = [
                KvBlock(block_hash=b.block_hash, token_ids=b.token_ids, block_size=block_size)
                for b in event.blocks
            ]
            stored = KvBlocksStored(
                blocks=blocks,
                parent_block_hash=event.parent_block_hash,
                tier=KvCacheTier.DEVICE,
                locality=KvCacheLocality.LOCAL,
            )
            return KvCacheEvent(event_id=record.event_id, stored=stored)
        case ipc.KvBlocksRemoved():
            removed = KvBlocksRemoved(
                block_hashes=event.block_hashes, tier=KvCacheTier.DEVICE, locality=KvCacheLocality.LOCAL
            )
            return KvCacheEvent(event_id=record.event_id, removed=removed)
        case ipc.KvCacheCleared():
            return KvCacheEvent(event_id=record.event_id, cleared=KvCacheCleared())
        case _:
            assert_never(event)


async def serve_kv_events(hub: KvEventHub, stream: Stream[SubscribeKvEventsRequest, KvEventBatch]) -> None:
    request = await stream.recv_message()
    assert request is not None
    try:
        subscription = hub.subscribe(request.start_sequence_number)
    except ReplayUnavailableError as exc:
        raise GRPCError(Status.OUT_OF_RANGE, str(exc)) from None
    try:
        await stream.send_initial_metadata()
        while True:
            try:
                batch = await subscription.next()
            except SubscriberOverflowError as exc:
                raise GRPCError(Status.DATA_LOSS, str(exc)) from None
            await stream.send_message(kv_event_batch(batch))
            await asyncio.sleep(0)  # a long backlog must not starve the other calls
    finally:
        hub.unsubscribe(subscription)


def kv_events_handler(hub: KvEventHub) -> RawHandler:
    async def handle(stream: Stream[SubscribeKvEventsRequest, KvEventBatch]) -> None:
        await serve_kv_events(hub, stream)

    return handle
