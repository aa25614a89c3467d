"""The frontend's KV event hub: sequence numbers, snapshots, replay from a cursor, slow subscribers."""

from __future__ import annotations

import asyncio

import pytest

from reference_server import ipc
from reference_server.frontend.kv_events import (
    KvBatch,
    KvEventHub,
    KvSubscription,
    ReplayUnavailableError,
    SubscriberOverflowError,
)


def stored(*hashes: int, parent: int | None = None) -> ipc.KvEvents:
    return ipc.KvEvents(4, [ipc.KvBlocksStored(parent, [ipc.KvBlock(h, [h] * 4) for h in hashes])])


def removed(*hashes: int) -> ipc.KvEvents:
    return ipc.KvEvents(4, [ipc.KvBlocksRemoved(list(hashes))])


def drain(subscription: KvSubscription) -> list[KvBatch]:
    async def take() -> list[KvBatch]:
        batches = []
        while subscription._batches:
            batches.append(await subscription.next())
        return batches

    return asyncio.run(take())


def test_batches_are_numbered_and_fanned_out() -> None:
    hub = KvEventHub()
    early = hub.subscribe(0)
    hub.publish(stored(1, 2))
    late = hub.subscribe(1)  # nothing missed yet
    hub.publish(removed(2))
    assert [b.sequence_number for b in drain(early)] == [1, 2]
    assert [b.sequence_number for b in drain(late)] == [2]
    records = [r.event_id for b in (hub._history[0], hub._history[1]) for r in b.records]
    assert records == [1, 2]


def test_a_new_subscriber_gets_the_live_blocks_as_a_snapshot_ending_at_the_current_sequence() -> None:
    hub = KvEventHub(snapshot_chunk_blocks=2)
    hub.publish(stored(1, 2, 3))
    hub.publish(stored(4, parent=2))
    hub.publish(removed(3))
    hub.publish(stored(5))
    snapshot = drain(hub.subscribe(0))
    assert [b.sequence_number for b in snapshot] == [3, 4]  # consecutive, ending at the current one
    assert [(b.snapshot.index, b.snapshot.count, b.snapshot.blocks) for b in snapshot if b.snapshot] == [
        (0, 2, 4),
        (1, 2, 4),
    ]
    events = [r.event for b in snapshot for r in b.records]
    assert isinstance(events[0], ipc.KvCacheCleared) and all(
        r.event_id == 0 for b in snapshot for r in b.records
    )
    blocks = [
        (e.parent_block_hash, e.blocks[0].block_hash) for e in events[1:] if isinstance(e, ipc.KvBlocksStored)
    ]
    assert blocks == [(None, 1), (1, 2), (2, 4), (None, 5)]  # parents first, with their parents
    hub.publish(removed(5))
    assert hub.live_blocks == 3


def test_snapshot_chunks_never_outnumber_the_sequence() -> None:
    hub = KvEventHub(snapshot_chunk_blocks=1)
    hub.publish(stored(1, 2, 3))  # three blocks, one batch so far
    (only,) = drain(hub.subscribe(0))
    assert only.sequence_number == 1 and only.snapshot is not None and only.snapshot.count == 1
    assert drain(KvEventHub().subscribe(0)) == []  # nothing cached, nothing to send


def test_replay_needs_a_cursor_the_history_still_reaches() -> None:
    hub = KvEventHub(history_batches=2)
    for h in range(1, 5):
        hub.publish(stored(h))
    assert [b.sequence_number for b in drain(hub.subscribe(2))] == [3, 4]
    assert drain(hub.subscribe(4)) == []
    with pytest.raises(ReplayUnavailableError, match="older than"):
        hub.subscribe(1)
    with pytest.raises(ReplayUnavailableError, match="ahead"):
        hub.subscribe(5)


def test_a_slow_subscriber_is_dropped_not_buffered_forever() -> None:
    hub = KvEventHub(queue_batches=2)
    slow = hub.subscribe(0)
    for h in range(1, 4):
        hub.publish(stored(h))
    assert slow.overflowed and slow not in hub._subscribers

    async def read_all() -> None:
        while True:
            await slow.next()

    with pytest.raises(SubscriberOverflowError):
        asyncio.run(read_all())


def test_unsubscribed_streams_get_nothing_more() -> None:
    hub = KvEventHub()
    subscription = hub.subscribe(0)
    hub.unsubscribe(subscription)
    hub.publish(stored(1))
    assert drain(subscription) == []
