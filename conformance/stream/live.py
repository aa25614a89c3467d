"""One Generate call driven by a background task, so a case can read, wait, abort or cancel it.

The protocol driver (``conformance.drivers``) makes the call and hands over lmrpc.v1 events: for
lmrpc.v1 itself, raw bytes decoded by ``conformance.stream.wire`` (invalid UTF-8 is recorded, not
fatal). The call ends in exactly one ``End`` state; cancelling the task resets the HTTP/2 stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from grpclib.client import Channel
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from conformance.stream.record import End, Event, Finding, StreamRecord, event_kind
from conformance.stream.wire import Decoded
from lmrpc.v1 import GenerateRequest

GENERATE = "/lmrpc.v1.InferenceService/Generate"


class RawMessage:
    """A message type for grpclib's codec that keeps the bytes as they came."""

    __slots__ = ("data",)

    def __init__(self, data: bytes = b"") -> None:
        self.data = data

    @classmethod
    def FromString(cls, data: bytes) -> RawMessage:
        return cls(data)

    def SerializeToString(self) -> bytes:
        return self.data


class EventSource(Protocol):
    """What makes the call: a protocol driver (``conformance.drivers``, the layer above this one)."""

    def events(
        self, channel: Channel, request: GenerateRequest, deadline_s: float | None, findings: list[Finding]
    ) -> AsyncGenerator[Decoded]: ...


class StreamStalled(Exception):
    """No message arrived within the wait budget."""


class LiveStream:
    def __init__(
        self,
        channel: Channel,
        driver: EventSource,
        request: GenerateRequest,
        *,
        deadline_s: float | None,
        idle_s: float,
    ) -> None:
        self.driver = driver
        self.record = StreamRecord(request)
        self.idle_s = idle_s
        self._deadline_s = deadline_s
        self._changed = asyncio.Event()
        self._cursor = 0
        self._t0 = time.monotonic()
        self.started_at = self._t0  # time.monotonic() when the call began; events' t_s count from it
        self._last_progress = self._t0
        self.done = asyncio.Event()
        self._task = asyncio.create_task(self._run(channel))

    @property
    def events(self) -> list[Event]:
        return self.record.events

    async def _run(self, channel: Channel) -> None:
        record = self.record
        try:
            messages = self.driver.events(channel, record.request, self._deadline_s, record.findings)
            async with contextlib.aclosing(messages) as decoded_messages:
                async for decoded in decoded_messages:
                    now = time.monotonic()
                    self._last_progress = now
                    event = Event(
                        len(record.events),
                        now - self._t0,
                        event_kind(decoded.message),
                        decoded.message,
                        decoded.text_is_utf8,
                        decoded.text_bytes,
                    )
                    record.events.append(event)
                    self._changed.set()
            record.end = End.OK
        except GRPCError as exc:
            record.end, record.status, record.status_message = End.STATUS, exc.status, exc.message or ""
        except TimeoutError:
            record.end = End.DEADLINE
        except asyncio.CancelledError:
            if record.end is End.OPEN:
                record.end = End.CANCELLED
        except (StreamTerminatedError, ProtocolError, ConnectionError, OSError, ValueError) as exc:
            record.end, record.detail = End.BROKEN, f"{type(exc).__name__}: {exc}"
        finally:
            record.duration_s = time.monotonic() - self._t0
            self.done.set()
            self._changed.set()

    async def next(self, wait_s: float | None = None) -> Event | None:
        """The next message, or None once the call has ended. Raises StreamStalled after ``wait_s``."""
        while self._cursor >= len(self.record.events):
            if self.done.is_set():
                return None
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), wait_s or self.idle_s)
            except TimeoutError:
                raise StreamStalled(f"no message for {wait_s or self.idle_s:.1f}s") from None
        self._cursor += 1
        return self.record.events[self._cursor - 1]

    async def read_until(
        self, predicate: Callable[[Event], bool], wait_s: float | None = None
    ) -> Event | None:
        """Read until a message satisfies ``predicate``; None if the call ended first."""
        while (event := await self.next(wait_s)) is not None:
            if predicate(event):
                return event
        return None

    async def finish(self, total_s: float | None = None) -> StreamRecord:
        """Wait for the call to end. A call silent for ``idle_s`` is HUNG; so is one still open after
        ``total_s``, when the caller gives one (it expects the end promptly: an aborted request). Without
        it a stream that keeps sending is waited for: slow is not hung."""
        give_up = time.monotonic() + total_s if total_s is not None else float("inf")
        while not self.done.is_set():
            now = time.monotonic()
            wait = min(give_up - now, self._last_progress + self.idle_s - now)
            if wait <= 0:
                self.record.end = End.HUNG
                self.record.detail = (
                    f"no message for {now - self._last_progress:.1f}s"
                    if now < give_up
                    else f"still open after {total_s:.1f}s"
                )
                await self.cancel()
                break
            try:
                await asyncio.wait_for(self.done.wait(), wait)
            except TimeoutError:
                continue
        return self.record

    async def cancel(self) -> None:
        """Reset the stream from the client side (RST_STREAM) and wait until the task is gone."""
        if not self.done.is_set():
            if self.record.end is End.OPEN:
                self.record.end = End.CANCELLED
            self._task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(self.done.wait()), 5.0)
        except TimeoutError:
            pass
