"""The frontend's table of requests in flight, and the abort bookkeeping around it.

A request is known by two ids: the client's ``request_id`` (unique among requests in flight,
REQ-3) and an internal ``rid`` that is unique for the life of the server, so late events of a
cancelled request can never reach a new request that reuses its id.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from reference_server.ipc import OutputEvent

MAX_TOMBSTONES = 10_000


class DuplicateRequestError(Exception):
    pass


@dataclass(eq=False)
class RequestState:
    request_id: str
    rid: str
    num_outputs: int
    abort_requested: bool = False  # an abort arrived before the request reached the engine
    submitted: bool = False
    complete: bool = False  # the terminal message was produced
    failure: tuple[int, str] | None = None  # (grpc status code, message): end with a RequestError
    _events: list[OutputEvent] = field(default_factory=list)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def push(self, event: OutputEvent) -> None:
        self._events.append(event)
        self._wakeup.set()

    def fail(self, code: int, message: str) -> None:
        if self.failure is None:
            self.failure = (code, message)
        self._wakeup.set()

    async def next_events(self) -> list[OutputEvent]:
        """Everything that arrived since the last call; waits if nothing did. Events pile up
        while the client reads slowly and are merged by the caller (bounded by the output)."""
        while not self._events and self.failure is None:
            self._wakeup.clear()
            await self._wakeup.wait()
        events, self._events = self._events, []
        return events


class RequestTable:
    def __init__(self, abort_grace_s: float) -> None:
        self._by_request_id: dict[str, RequestState] = {}
        self._by_rid: dict[str, RequestState] = {}
        self._tombstones: OrderedDict[str, float] = OrderedDict()  # request_id -> expiry
        self._abort_grace_s = abort_grace_s
        self._counter = itertools.count()

    def __len__(self) -> int:
        return len(self._by_request_id)

    def states(self) -> list[RequestState]:
        return list(self._by_request_id.values())

    @staticmethod
    def new_request_id() -> str:
        return f"lmrpc-{uuid.uuid4().hex}"

    def register(self, request_id: str, num_outputs: int) -> RequestState:
        if request_id in self._by_request_id:
            raise DuplicateRequestError(request_id)
        state = RequestState(request_id, f"r{next(self._counter)}", num_outputs)
        expiry = self._tombstones.pop(request_id, None)
        if expiry is not None and expiry >= time.monotonic():
            state.abort_requested = True  # the abort raced ahead of its request and still wins
        self._by_request_id[request_id] = state
        self._by_rid[state.rid] = state
        return state

    def unregister(self, state: RequestState) -> None:
        if self._by_request_id.get(state.request_id) is state:
            del self._by_request_id[state.request_id]
        self._by_rid.pop(state.rid, None)

    def dispatch(self, events: Iterable[OutputEvent]) -> None:
        for event in events:
            state = self._by_rid.get(event.rid)
            if state is not None:
                state.push(event)

    def get(self, request_id: str) -> RequestState | None:
        return self._by_request_id.get(request_id)

    def remember_abort(self, request_id: str) -> None:
        now = time.monotonic()
        while self._tombstones and (
            len(self._tombstones) >= MAX_TOMBSTONES or next(iter(self._tombstones.values())) < now
        ):
            self._tombstones.popitem(last=False)
        self._tombstones[request_id] = now + self._abort_grace_s
        self._tombstones.move_to_end(request_id)

    def fail_all(self, code: int, message: str) -> None:
        for state in self._by_request_id.values():
            state.fail(code, message)
