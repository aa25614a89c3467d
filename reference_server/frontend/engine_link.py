"""The frontend's side of the ZMQ pipeline: sends to the scheduler, receives from both workers.

Replies to queries (load, flush, pause, embed, administration) are matched to their asyncio
futures by query id. Output batches are dispatched to the request table. If a worker reports a
failure, or dies, ``on_failure`` is called once. Nothing is dropped silently: the queue to the
scheduler has no size limit (what the frontend admits bounds it), and a send that fails raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import assert_never

import msgspec
import zmq
import zmq.asyncio
from grpclib import Status

from reference_server import ipc
from reference_server.config import IpcAddresses
from reference_server.frontend.requests import RequestTable

log = logging.getLogger("lmrpc.frontend")

MAX_FRAMES_PER_WAKEUP = 64

Reply = ipc.LoadReply | ipc.FlushReply | ipc.PausedReply | ipc.EmbedReply | ipc.AdminReply


class WorkerUnavailableError(Exception):
    pass


class EngineLink:
    def __init__(self, addresses: IpcAddresses, table: RequestTable) -> None:
        self._context = zmq.asyncio.Context()
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.bind(addresses.frontend)
        self._inbox_now: zmq.Socket[bytes] = zmq.Socket.shadow(
            self._inbox.underlying
        )  # same socket, NOBLOCK reads
        self._push = self._context.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)  # never refuse: what the frontend admits bounds the queue
        self._push.connect(addresses.scheduler)
        # Sends go through a synchronous view of the socket, so a refused send raises here
        # instead of vanishing into a future nobody awaits.
        self._to_scheduler: zmq.Socket[bytes] = zmq.Socket.shadow(self._push.underlying)
        self._table = table
        self._queries: dict[int, asyncio.Future[Reply]] = {}
        self._query_ids = itertools.count(1)
        self._ready: dict[str, ipc.Ready] = {}
        self._ready_event = asyncio.Event()
        self._receiver: asyncio.Task[None] | None = None
        self.failure: str | None = None
        self.on_failure: Callable[[str], None] = lambda message: None
        self.on_kv_events: Callable[[ipc.KvEvents], None] = lambda message: None

    # ── lifecycle ───────────────────────────────────────────────────────────────────────────

    def start(self) -> None:
        self._receiver = asyncio.get_running_loop().create_task(
            self._receive_loop(), name="lmrpc-engine-link"
        )

    async def wait_ready(self, workers: tuple[str, ...]) -> ipc.EngineInfo:
        """Wait until every worker said Ready; raise WorkerUnavailableError if one failed first."""
        while not all(w in self._ready for w in workers):
            if self.failure is not None:
                raise WorkerUnavailableError(self.failure)
            self._ready_event.clear()
            await self._ready_event.wait()
        if self.failure is not None:
            raise WorkerUnavailableError(self.failure)
        engine = self._ready["scheduler"].engine
        assert engine is not None
        return engine

    def fail(self, message: str) -> None:
        """A worker failed or died: fail every pending query and notify once."""
        if self.failure is not None:
            return
        self.failure = message
        self._ready_event.set()
        for future in self._queries.values():
            if not future.done():
                future.set_exception(WorkerUnavailableError(message))
        self._queries.clear()
        self.on_failure(message)

    def close(self) -> None:
        if self._receiver is not None:
            self._receiver.cancel()
        self._context.destroy(linger=0)

    # ── sending ─────────────────────────────────────────────────────────────────────────────

    def send(self, message: msgspec.Struct) -> None:
        """Queue a message for the scheduler (never blocks the event loop). Raises
        WorkerUnavailableError if the workers failed or the message cannot be queued."""
        self.send_encoded(ipc.encode(message))

    def send_encoded(self, frame: bytes) -> None:
        if self.failure is not None:
            raise WorkerUnavailableError(self.failure)
        try:
            self._to_scheduler.send(frame, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            raise WorkerUnavailableError(f"cannot queue a message for the scheduler: {exc}") from None

    def abort(self, rids: list[str]) -> None:
        """Best effort: once the workers have failed there is nothing left to abort."""
        if rids and self.failure is None:
            self.send(ipc.AbortRequests(rids))

    def grant_tokens(self, rid: str, credit: int) -> None:
        if self.failure is None:
            self.send(ipc.GrantTokens(rid, credit))

    async def query(self, make: Callable[[int], msgspec.Struct], timeout_s: float = 30.0) -> Reply:
        """Ask the scheduler; WorkerUnavailableError if it failed or did not answer in time."""
        if self.failure is not None:
            raise WorkerUnavailableError(self.failure)
        query_id = next(self._query_ids)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._queries[query_id] = future
        try:
            self.send(make(query_id))
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise WorkerUnavailableError(f"the scheduler did not answer within {timeout_s:g} s") from None
        finally:
            self._queries.pop(query_id, None)

    # ── receiving ───────────────────────────────────────────────────────────────────────────

    async def _receive_loop(self) -> None:
        while True:
            frames = [await self._inbox.recv()]
            with contextlib.suppress(zmq.Again):
                while len(frames) < MAX_FRAMES_PER_WAKEUP:
                    frames.append(self._inbox_now.recv(zmq.NOBLOCK))
            for frame in frames:
                try:
                    message = ipc.frontend_decoder.decode(frame)
                except msgspec.DecodeError as exc:
                    self._fail_undecodable(frame, exc)
                    continue
                self._handle(message)
            # recv() does not suspend while frames are queued: let the streams run in between.
            # Under load each stream then sends what piled up as one delta (STREAM-9).
            await asyncio.sleep(0)

    def _fail_undecodable(self, frame: bytes, error: msgspec.DecodeError) -> None:
        """A worker's frame the frontend cannot read fails the requests it names at once (their
        streams would otherwise wait out the stall timeout for events that never come), and the
        engine drops them; a frame that names none is only logged. Called while handling ``error``."""
        rids = ipc.rids_of(frame)
        if not rids:
            log.exception("undecodable message from a worker")
            return
        log.error("undecodable message from a worker for request(s) %s: %s", ", ".join(rids), error)
        message = f"the frontend could not decode a worker's message for the request: {error}"
        for rid in rids:
            self._table.fail_rid(rid, Status.INTERNAL.value, message)
        with contextlib.suppress(WorkerUnavailableError):  # nothing is left to drop then
            self.abort(rids)

    def _handle(self, message: ipc.FRONTEND_INBOX) -> None:
        match message:
            case ipc.OutputBatch():
                self._table.dispatch(message.events)
            case ipc.Ready():
                self._ready[message.process] = message
                self._ready_event.set()
            case ipc.KvEvents():
                self.on_kv_events(message)
            case ipc.WorkerFailed():
                log.error("%s failed: %s", message.process, message.message)
                self.fail(f"{message.process} failed: {message.message}")
            case ipc.RequestFailed():
                log.error("request %s failed in the %s: %s", message.rid, message.process, message.message)
                self._table.fail_rid(message.rid, Status.INTERNAL.value, message.message)
            case ipc.LoadReply() | ipc.FlushReply() | ipc.PausedReply() | ipc.EmbedReply() | ipc.AdminReply():
                future = self._queries.pop(message.query_id, None)
                if future is not None and not future.done():
                    future.set_result(message)
            case _:
                assert_never(message)
