"""What a case body gets: the target, budgets, a mismatch collector (connect-style: a case records every
difference, then fails once with all of them), and RPC helpers that record a transcript (replayed by
the repro script when the case fails).

Unary RPCs are typed: ``await ctx.call(ctx.control.abort, AbortRequest(...))`` returns an
``AbortResponse``, and mypy rejects a request of the wrong type.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import betterproto2
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from conformance.drivers.openai.calls import CaseHttp, HttpCall
from conformance.harness.session import Budgets, Session, Tuning
from conformance.spec.coverage import classes_sent
from conformance.stream.live import LiveStream, RawMessage
from conformance.stream.record import End, StreamRecord
from conformance.vocabulary import (
    Call,
    CaseFailed,
    Mismatch,
    Repro,
    RpcTimedOut,
    StreamHung,
    TargetInfo,
    mismatch,
)
from lmrpc.v1 import (
    ControlServiceStub,
    DetokenizeRequest,
    GenerateRequest,
    GetLoadRequest,
    InferenceServiceStub,
    Load,
    TokenizeRequest,
)

T = TypeVar("T")
Req = TypeVar("Req", bound=betterproto2.Message)
Resp = TypeVar("Resp", bound=betterproto2.Message)
_Req_contra = TypeVar("_Req_contra", bound=betterproto2.Message, contravariant=True)
_Resp_co = TypeVar("_Resp_co", bound=betterproto2.Message, covariant=True)


class Unary(Protocol[_Req_contra, _Resp_co]):
    """A method of a generated stub, such as ``ctx.control.abort`` or ``ctx.inference.embed``."""

    def __call__(self, message: _Req_contra, *, timeout: float | None = None) -> Awaitable[_Resp_co]: ...


class Checker:
    """Accumulates mismatches. ``fail_if_any()`` ends the case when there are some."""

    def __init__(self) -> None:
        self.mismatches: list[Mismatch] = []

    def __bool__(self) -> bool:
        return not self.mismatches

    def add(self, what: str, want: object, got: object) -> None:
        self.mismatches.append(mismatch(what, want, got))

    def equal(self, what: str, want: object, got: object) -> bool:
        if want == got:
            return True
        self.add(what, want, got)
        return False

    def that(self, ok: bool, what: str, want: str, got: object) -> bool:
        if not ok:
            self.add(what, want, got)
        return ok

    def extend(self, mismatches: Iterable[Mismatch]) -> None:
        self.mismatches.extend(mismatches)

    def fail_if_any(self) -> None:
        if self.mismatches:
            raise CaseFailed(self.mismatches)

    def fail(self, what: str, want: object, got: object) -> None:
        self.add(what, want, got)
        raise CaseFailed(self.mismatches)


@dataclass(slots=True)
class RpcOutcome(Generic[Resp]):
    status: Status | None  # None means OK
    message: str
    response: Resp | None = None

    @property
    def code(self) -> str:
        """The status name, ``OK`` included (for want/got lines)."""
        return self.status.name if self.status is not None else "OK"


@dataclass(slots=True)
class RawOutcome:
    status: Status | None  # None means OK
    message: str
    replies: list[bytes]

    @property
    def code(self) -> str:
        return self.status.name if self.status is not None else "OK"


ADMIN_METHODS = frozenset(
    {
        "flush_cache",
        "pause_generation",
        "resume_generation",
        "start_profile",
        "stop_profile",
        "update_weights",
    }
)

# Administrative RPCs that load or write files (a profiler, a trace, a checkpoint): they get the
# budget of file work, not of a lookup, so a busy machine's slow disk or import is not blamed.
FILE_WORK_RPCS = frozenset({"start_profile", "stop_profile", "update_weights"})


def _needs_admin(method: str, request: object) -> bool:
    return method in ADMIN_METHODS or (method == "abort" and getattr(request, "all", None) is not None)


class Ctx:
    def __init__(self, session: Session, case_id: str, params: dict[str, Any]) -> None:
        self.session = session
        self.case_id = case_id
        self.params = params
        self.check = Checker()
        self.transcript: list[Call] = []
        self.sent: set[str] = set()  # the input classes its calls belong to (spec/coverage.py)
        self.notes: list[str] = []
        self.loop = asyncio.get_running_loop()
        self._t0 = time.monotonic()
        self._streams: list[LiveStream] = []
        self._calls: dict[int, Call] = {}
        self.closed = False
        self.repro: Repro | None = None  # set by property and state-machine cases that shrank a failure
        self._http: CaseHttp | None = None

    @property
    def http(self) -> CaseHttp:
        """The OpenAI-compatible server's client for this case (``--protocol openai``), recording."""
        if self._http is None:
            self._http = CaseHttp(self.session.http, call_s=self.budgets.stream_s, idle_s=self.budgets.idle_s)
        return self._http

    @property
    def http_transcript(self) -> list[HttpCall]:
        return self._http.transcript if self._http is not None else []

    @property
    def info(self) -> TargetInfo:
        return self.session.info

    @property
    def budgets(self) -> Budgets:
        return self.session.budgets

    @property
    def tuning(self) -> Tuning:
        return self.session.tuning

    def uid(self, tag: str = "") -> str:
        return self.session.next_id(f"{self.case_id}{'-' + tag if tag else ''}")

    def note(self, text: str) -> None:
        self.notes.append(text)

    def _record(self, service: str, method: str, request: betterproto2.Message, **extra: Any) -> Call:
        call = Call(time.monotonic() - self._t0, service, method, request, **extra)
        self.transcript.append(call)
        self.sent |= classes_sent(method, request)
        return call

    # ── Generate ─────────────────────────────────────────────
    def open(
        self,
        request: GenerateRequest,
        *,
        deadline_s: float | None = None,
        channel: Channel | None = None,
        idle_s: float | None = None,
    ) -> LiveStream:
        """Start a Generate call in the background (``idle_s``: longest silence before it counts as hung)."""
        if self.closed:
            raise asyncio.CancelledError("case already ended")
        call = self._record("inference", "generate", request, deadline_s=deadline_s)
        driver = self.session.target.driver
        stream = LiveStream(
            channel or self.session.target.channel,
            driver,
            driver.express(request),
            deadline_s=deadline_s,
            idle_s=idle_s or self.budgets.idle_s,
        )
        self._streams.append(stream)
        self._calls[id(stream)] = call
        return stream

    async def generate(
        self,
        request: GenerateRequest,
        *,
        deadline_s: float | None = None,
        hung_ok: bool = False,
        total_s: float | None = None,
    ) -> StreamRecord:
        """Run one Generate call to its end. A call that hangs (silent for the idle budget, or open after
        ``total_s`` when given) raises StreamHung unless ``hung_ok``: a property search stops at once
        instead of shrinking through more hangs. A slow stream that keeps sending is not hung."""
        async with self.session.gate or contextlib.nullcontext():
            stream = self.open(request, deadline_s=deadline_s, idle_s=total_s)
            record = await stream.finish(total_s)
        self._calls[id(stream)].outcome = record.summary()
        if record.end is End.HUNG and not hung_ok:
            raise StreamHung(f"Generate({request.request_id!r}) hung: {record.detail}")
        return record

    async def answer(self, request: GenerateRequest) -> StreamRecord:
        """How the server answers a request the contract rejects: a status before any message, or a first
        message. An accepted call is cancelled at that first message: what it would stream is another
        clause's business, and a server that accepts a window-long request must not hold this case for
        the minutes it streams."""
        stream = self.open(request)
        if await stream.read_until(lambda event: True, self.budgets.prompt_s) is not None:
            await self.cancel(stream)
        record = await stream.finish(self.budgets.release_s)
        self._calls[id(stream)].outcome = record.summary()
        return record

    async def cancel(self, stream: LiveStream) -> None:
        """Cancel a call from the client side (RST_STREAM), recording after how many messages."""
        self._calls[id(stream)].cancel_after = len(stream.events)
        await stream.cancel()

    # ── unary RPCs ───────────────────────────────────────────
    @property
    def control(self) -> ControlServiceStub:
        return self.session.target.control

    @property
    def inference(self) -> InferenceServiceStub:
        return self.session.target.inference

    async def call(self, method: Unary[Req, Resp], request: Req, *, timeout_s: float | None = None) -> Resp:
        """Call a unary RPC of ``ctx.control`` or ``ctx.inference`` and record it in the transcript;
        raises GRPCError for a non-OK status."""
        service = (
            "inference" if isinstance(getattr(method, "__self__", None), InferenceServiceStub) else "control"
        )
        name = getattr(method, "__name__", "?")
        self._record(service, name, request)
        if getattr(method, "__self__", None) is self.control and _needs_admin(name, request):
            method = getattr(self.session.target.admin, name)  # AUTH-2: the admin token's channel
        deadline = timeout_s or (self.budgets.file_work_s if name in FILE_WORK_RPCS else self.budgets.rpc_s)
        try:
            return await method(request, timeout=deadline)
        except TimeoutError:
            raise RpcTimedOut(name, deadline) from None

    async def call_raw(self, path: str, body: bytes, *, channel: Channel | None = None) -> RawOutcome:
        """Send ``body`` as the one request message of ``path``, whatever the bytes (MALFORMED-*)."""
        cardinality = Cardinality.UNARY_STREAM if path.endswith("/Generate") else Cardinality.UNARY_UNARY
        replies: list[bytes] = []
        try:
            async with (channel or self.session.target.channel).request(
                path, cardinality, RawMessage, RawMessage, timeout=self.budgets.stream_s
            ) as stream:
                await stream.send_message(RawMessage(body), end=True)
                async for reply in stream:
                    replies.append(reply.data)
        except GRPCError as exc:
            return RawOutcome(exc.status, exc.message or "", replies)
        return RawOutcome(None, "", replies)

    async def call_status(self, method: Unary[Req, Resp], request: Req) -> RpcOutcome[Resp]:
        """Like ``call``, but a non-OK status is returned instead of raised."""
        try:
            return RpcOutcome(None, "", await self.call(method, request))
        except GRPCError as exc:
            return RpcOutcome(exc.status, exc.message or "")

    async def load(self) -> Load:
        response = await self.call(self.control.get_load, GetLoadRequest())
        return response.current or Load()

    async def tokenize(self, text: str, *, parse_special_tokens: bool | None = None) -> list[int]:
        request = TokenizeRequest(text=text, parse_special_tokens=parse_special_tokens)
        return list((await self.call(self.control.tokenize, request)).token_ids)

    async def detokenize(self, ids: list[int], skip_special_tokens: bool | None = None) -> str:
        request = DetokenizeRequest(token_ids=ids, skip_special_tokens=skip_special_tokens)
        return str((await self.call(self.control.detokenize, request)).text)

    async def wait_for(
        self,
        probe: Callable[[], Awaitable[T]],
        ok: Callable[[T], bool],
        budget_s: float,
        every_s: float = 0.05,
    ) -> tuple[bool, T]:
        """Poll ``probe`` until ``ok`` holds or the budget is spent; returns the last value."""
        give_up = time.monotonic() + budget_s
        while True:
            value = await probe()
            if ok(value) or time.monotonic() >= give_up:
                return ok(value), value
            await asyncio.sleep(every_s)

    # ── lifecycle and the thread bridge for hypothesis ───────
    def block(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """From a worker thread: run ``coro`` on the case's loop and wait for it."""
        if self.closed:
            coro.close()
            raise asyncio.CancelledError("case already ended")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    async def close(self) -> None:
        """Cancel whatever the case left running."""
        self.closed = True
        await asyncio.gather(
            *(s.cancel() for s in self._streams if not s.done.is_set()), return_exceptions=True
        )
