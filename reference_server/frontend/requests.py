"""The frontend's table of requests in flight, and the abort bookkeeping around it.

A request is known by two ids: the client's ``request_id`` and an internal ``rid`` that is unique
for the life of the server, so late events of a cancelled request can never reach a new request
that reuses its id. Client ids are scoped by owner (the authenticated principal; one anonymous
owner when authentication is off), so one client can neither see nor touch another's requests.

Abort memory (ABORT-6): an Abort for an id that is not in flight is remembered for the grace
period, so a Generate arriving with that id within it is aborted at once, unless the id belongs
to a request that ended within the grace period: the Abort then refers to that request (ABORT-1)
and a later reuse of the id is not affected.

Backpressure (FLOW-1) is credit-based: a request may produce ``window`` tokens beyond those its
stream handler has taken. The handler takes events as fast as its client reads; each time it has
taken another half window, the engine is granted more credit. A handler whose client stops
reading stops taking events, so its request runs out of credit in the engine itself, with at
most ``window`` tokens waiting here, however fast the engine or deep the pipeline.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from reference_server.ipc import OutputEvent

MAX_REMEMBERED_IDS = 10_000

Key = tuple[str, str]  # (owner, request_id)


class DuplicateRequestError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class FlowHooks:
    """How the table grants a request's engine more tokens (FLOW-1)."""

    grant: Callable[[str, int], None]  # (rid, credit: the tokens its outputs may have in all)
    window: int  # tokens a request may produce beyond what its handler has taken

    def initial_credit(self, num_outputs: int) -> int:
        return max(self.window, num_outputs)  # every output can always take its next step


@dataclass(eq=False)
class RequestState:
    request_id: str
    owner: str
    rid: str
    num_outputs: int
    flow: FlowHooks
    abort_requested: bool = False  # an Abort (or a stall) already ended, or will end, this request
    submitted: bool = False
    complete: bool = False  # the terminal message was produced
    failure: tuple[int, str] | None = None  # (grpc status code, message): end with a RequestError
    taken_tokens: int = 0  # tokens of events the stream handler has taken
    granted: int = 0  # the credit the engine has: tokens its outputs may produce in all
    _events: list[OutputEvent] = field(default_factory=list)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _discarding: bool = False

    def __post_init__(self) -> None:
        self.granted = self.flow.initial_credit(self.num_outputs)

    def push(self, event: OutputEvent) -> None:
        if self._discarding:
            return
        self._events.append(event)
        self._wakeup.set()

    def fail(self, code: int, message: str, *, discard_pending: bool = False) -> None:
        """End the stream with a RequestError once the events already here are sent, or at once
        (dropping them) with ``discard_pending``."""
        if self.failure is None:
            self.failure = (code, message)
        if discard_pending:
            self._discarding = True
            self._events.clear()
        self._wakeup.set()

    async def next_events(self) -> list[OutputEvent]:
        """Everything that arrived since the last call; waits if nothing did. Events pile up
        while the client reads slowly and are merged by the caller (STREAM-9)."""
        while not self._events and self.failure is None:
            self._wakeup.clear()
            await self._wakeup.wait()
        events, self._events = self._events, []
        self.taken_tokens += sum(len(e.token_ids) for e in events)
        window = self.flow.window
        if self.submitted and self.taken_tokens + window - self.granted >= window // 2:
            self.granted = self.taken_tokens + window
            self.flow.grant(self.rid, self.granted)
        return events


class RequestTable:
    def __init__(self, abort_grace_s: float, flow: FlowHooks) -> None:
        self._by_key: dict[Key, RequestState] = {}
        self._by_rid: dict[str, RequestState] = {}
        self._pending_aborts: OrderedDict[Key, float] = OrderedDict()  # key -> expiry
        self._recently_ended: OrderedDict[Key, float] = OrderedDict()  # key -> expiry
        self._abort_grace_s = abort_grace_s
        self._flow = flow
        self._counter = itertools.count()

    def __len__(self) -> int:
        return len(self._by_key)

    def states(self) -> list[RequestState]:
        return list(self._by_key.values())

    @staticmethod
    def new_request_id() -> str:
        return f"lmrpc-{uuid.uuid4().hex}"

    def register(self, owner: str, request_id: str, num_outputs: int) -> RequestState:
        key = (owner, request_id)
        if key in self._by_key:
            raise DuplicateRequestError(request_id)
        state = RequestState(request_id, owner, f"r{next(self._counter)}", num_outputs, self._flow)
        expiry = self._pending_aborts.pop(key, None)
        if expiry is not None and expiry >= time.monotonic():
            state.abort_requested = True  # the abort raced ahead of its request and still wins
        self._by_key[key] = state
        self._by_rid[state.rid] = state
        return state

    def mark_submitted(self, state: RequestState, prompt_tokens: int) -> None:
        """The request reached the engine with a prompt of ``prompt_tokens`` tokens."""
        state.submitted = True

    def unregister(self, state: RequestState) -> None:
        key = (state.owner, state.request_id)
        if self._by_key.get(key) is state:
            del self._by_key[key]
            _remember(self._recently_ended, key, time.monotonic() + self._abort_grace_s)
        self._by_rid.pop(state.rid, None)

    def dispatch(self, events: Iterable[OutputEvent]) -> None:
        for event in events:
            state = self._by_rid.get(event.rid)
            if state is not None:
                state.push(event)

    def fail_rid(self, rid: str, code: int, message: str) -> None:
        state = self._by_rid.get(rid)
        if state is not None:
            state.fail(code, message)

    def visible(self, owner: str, request_id: str, *, any_owner: bool) -> list[RequestState]:
        """The requests with this id that ``owner`` may act on (all owners' for an admin)."""
        if not any_owner:
            state = self._by_key.get((owner, request_id))
            return [] if state is None else [state]
        return [s for s in self._by_key.values() if s.request_id == request_id]

    def remember_abort(self, owner: str, request_id: str) -> None:
        """An Abort found no request with this id: let a Generate that arrives within the grace
        period with it lose (ABORT-6), unless the id belongs to a request that just ended."""
        key = (owner, request_id)
        expiry = self._recently_ended.get(key)
        if expiry is not None and expiry >= time.monotonic():
            return
        _remember(self._pending_aborts, key, time.monotonic() + self._abort_grace_s)

    def fail_all(self, code: int, message: str) -> None:
        for state in self._by_key.values():
            state.fail(code, message)


def _remember(memory: OrderedDict[Key, float], key: Key, expiry: float) -> None:
    now = time.monotonic()
    while memory and (len(memory) >= MAX_REMEMBERED_IDS or next(iter(memory.values())) < now):
        memory.popitem(last=False)
    memory[key] = expiry
    memory.move_to_end(key)
