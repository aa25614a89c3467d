"""Mutants of aborts, cancels, deadlines and id reuse (issue 13: inputs never sent, excuses too
broad, states never observed)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from grpclib import GRPCError, Status
from grpclib.server import Stream

from conformance.stream.live import RawMessage
from lmrpc.v1 import (
    AbortOutcome,
    AbortRequest,
    AbortResponse,
    AbortStatus,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    OutputFinished,
    RequestIds,
    Usage,
)

from ..proxy import Call, Out, Replayed
from .base import Mutant, delta, finished, kind
from .control_rpcs import _ids


def _forward_abort(ids: list[str]) -> AbortRequest:
    return AbortRequest(request_ids=RequestIds(ids=ids))


class AbortLags(Mutant):
    name = "abort-lags"
    fault = "Abort answers ABORTED at once but reaches the engine only 800 tokens per output later"
    expected = frozenset({"ABORT-2[*]", "ABORT-4[*]"})
    # Past ABORT-2's allowance (2 x (16 + limits.max_parked_tokens 256) = 544 tokens an output), and at
    # 2 ms a token well within the release budget that time_scale doubles, so only the tail count fails.
    lag_tokens = 800
    time_scale = 2.0

    async def unary(self, method: str, request: Any) -> Any:
        ids = _ids(request) if method == "abort" else None
        if not ids:
            return await super().unary(method, request)
        ordered = list(dict.fromkeys(ids))
        live = [i for i in ordered if i in self.calls]
        status: dict[str, AbortStatus] = {}
        for rid in live:  # a request already aborted is no longer in flight (ABORT-1)
            call = self.calls[rid]
            status[rid] = AbortStatus.NOT_IN_FLIGHT if "abort_after" in call.flags else AbortStatus.ABORTED
            call.flags.setdefault("abort_after", call.flags.get("tokens", 0) + self.lag_tokens * call.n)
        rest = [i for i in ordered if i not in live]
        reply = await super().unary(method, _forward_abort(rest)) if rest else AbortResponse()
        status |= {o.request_id: o.status for o in reply.outcomes}
        return AbortResponse(outcomes=[AbortOutcome(i, status[i]) for i in ordered if i in status])

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        sent = False
        async for event in events:
            if kind(event) == "delta":
                call.flags["tokens"] = call.flags.get("tokens", 0) + len(delta(event).token_ids)
            after = call.flags.get("abort_after")
            if after is not None and not sent and call.flags.get("tokens", 0) >= after:
                sent = True
                await super().unary("abort", _forward_abort([call.flags["client_id"]]))
            yield event


class AbortOutcomesDuplicated(Mutant):
    name = "abort-outcomes-duplicated"
    fault = "every Abort outcome is listed twice"
    expected = frozenset(
        {
            "ABORT-1[*]",
            "ABORT-2[*]",
            "ABORT-4[*]",
            "ABORT-5",
            "ABORT-5[waiting]",
            "ABORT-6",
            "CAP-5[max_abort_request_ids]",
            "EMBED-3",
            "EMBED-3[generate-id]",
        }
    )

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "abort":
            reply.outcomes = [o for outcome in reply.outcomes for o in (outcome, outcome)]
        return reply


class AbortStopsAtUnknown(Mutant):
    name = "abort-stops-at-unknown"
    fault = "Abort handles its ids in order and gives up at the first unknown one (later ids: NOT_IN_FLIGHT)"
    expected = frozenset(
        {"ABORT-1[mixed]", "ABORT-6", "ABORT-6[after-expiry]", "CAP-5[max_abort_request_ids]"}
    )  # unknown ids: not remembered

    async def unary(self, method: str, request: Any) -> Any:
        ids = _ids(request) if method == "abort" else None
        if not ids:
            return await super().unary(method, request)
        ordered = list(dict.fromkeys(ids))
        cut = next((k for k, i in enumerate(ordered) if i not in self.calls), len(ordered))
        reply = await super().unary(method, _forward_abort(ordered[:cut])) if cut else AbortResponse()
        return AbortResponse(
            outcomes=[*reply.outcomes, *(AbortOutcome(i, AbortStatus.NOT_IN_FLIGHT) for i in ordered[cut:])]
        )


class AbortAllSkipsWaiting(Mutant):
    name = "abort-all-skips-waiting"
    fault = "Abort(all) covers only requests that have produced tokens, not those still waiting"
    expected = frozenset({"ABORT-5[waiting]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if kind(event) == "delta":
                call.flags["producing"] = True
            yield event

    async def unary(self, method: str, request: Any) -> Any:
        if method != "abort" or request.all is None:
            return await super().unary(method, request)
        producing = [rid for rid, c in self.calls.items() if c.flags.get("producing")]
        return await super().unary(method, _forward_abort(producing)) if producing else AbortResponse()


class CancelTakesSamePrompt(Mutant):
    name = "cancel-takes-same-prompt"
    fault = "a client cancel also aborts every other request with the same (long) prompt"
    expected = frozenset({"CANCEL-3[shared-prefix]"})

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        request = await stream.recv_message()
        assert request is not None
        try:
            await super()._generate(Replayed(stream, request))
        except asyncio.CancelledError:
            prompt = request.text or ""
            twins = [
                rid
                for rid, call in self.calls.items()
                if len(prompt) >= 100 and rid != request.request_id and (call.request.text or "") == prompt
            ]
            if twins:
                with contextlib.suppress(GRPCError):
                    await asyncio.shield(super().unary("abort", _forward_abort(twins)))
            raise


class DeadlineAsAborted(Mutant):
    name = "deadline-as-aborted"
    fault = "just before a call's deadline the server ends it itself, with ABORTED finishes and status OK"
    expected = frozenset({"CANCEL-2[deadline]", "CANCEL-2[held]"})

    async def upstream_events(
        self, request: GenerateRequest, deadline: Any
    ) -> AsyncGenerator[GenerateResponse]:
        call = self.calls.get(request.request_id)
        if call is not None:
            call.flags["deadline"] = deadline
        async for event in super().upstream_events(request, deadline):
            yield event

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        iterator = aiter(events)
        first = await anext(iterator, None)  # the upstream call (and its deadline) starts with it
        if first is None:
            return
        yield first
        deadline = call.flags.get("deadline")
        if deadline is None:
            async for event in iterator:
                yield event
            return
        tokens: dict[int, int] = {}
        ended: set[int] = set()
        prompt_tokens = first.prompt_info.prompt_tokens if first.prompt_info is not None else 0
        while True:
            try:
                event = await asyncio.wait_for(anext(iterator), max(deadline.time_remaining() - 0.05, 0.001))
            except StopAsyncIteration:
                return
            except TimeoutError:
                break
            if kind(event) == "prompt_info" and event.prompt_info is not None:
                prompt_tokens = event.prompt_info.prompt_tokens
            elif kind(event) == "delta":
                index = delta(event).output_index or 0
                tokens[index] = tokens.get(index, 0) + len(delta(event).token_ids)
            elif kind(event) == "finished":
                ended.add(finished(event).output_index or 0)
            yield event
        left = [i for i in range(call.n) if i not in ended]
        for k, index in enumerate(left):
            last = k == len(left) - 1
            yield GenerateResponse(
                request_id=call.flags["client_id"],
                finished=OutputFinished(
                    output_index=index, reason=FinishReason.ABORTED, completion_tokens=tokens.get(index, 0)
                ),
                usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=sum(tokens.values()))
                if last
                else None,
            )


class ReuseBlocked(Mutant):
    name = "reuse-blocked"
    fault = "the id of an accepted request that ended is refused (ALREADY_EXISTS) for 3 s"
    expected = frozenset({"REQ-3", "REQ-3[reuse-after-finish]", "ABORT-1[finished-then-reused]"})
    blocked_s = 3.0

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.ended: dict[str, float] = {}

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        request = await stream.recv_message()
        assert request is not None
        rid = request.request_id
        if rid and time.monotonic() - self.ended.get(rid, -1e9) < self.blocked_s:
            raise GRPCError(Status.ALREADY_EXISTS, f"request_id={rid!r} is already in flight")
        replayed = Replayed(stream, request)
        try:
            await super()._generate(replayed)
        finally:
            if rid and replayed.sent:  # accepted (a message went out), then ended
                self.ended[rid] = time.monotonic()


class DuplicateEndsTheFirst(Mutant):
    name = "duplicate-ends-the-first"
    fault = "a Generate with the id of a request in flight is refused (ALREADY_EXISTS), and the request in flight is aborted"
    expected = frozenset({"REQ-3"})

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        request = await stream.recv_message()
        assert request is not None
        try:
            await super()._generate(Replayed(stream, request))
        except GRPCError as exc:
            if exc.status is Status.ALREADY_EXISTS and request.request_id:
                await super().unary("abort", _forward_abort([request.request_id]))
            raise


class AbortMatchesPrefix(Mutant):
    name = "abort-matches-prefix"
    fault = "Abort of an id also aborts every request in flight whose id it is a prefix of (SGLang's match)"
    expected = frozenset({"ABORT-1[prefix-id]"})

    async def unary(self, method: str, request: Any) -> Any:
        ids = _ids(request) if method == "abort" else None
        if not ids:
            return await super().unary(method, request)
        wider = [rid for rid in self.calls if any(rid != i and rid.startswith(i) for i in ids)]
        if wider:
            await super().unary(method, _forward_abort(wider))
        return await super().unary(method, request)


class AbortFirstIdOnly(Mutant):
    name = "abort-first-id-only"
    fault = "an Abort naming several ids reaches the first only, and answers ABORTED for every one in flight"
    expected = frozenset({"ABORT-1[mixed]", "ABORT-2[several-ids]"})

    async def unary(self, method: str, request: Any) -> Any:
        ids = _ids(request) if method == "abort" else None
        if not ids or len(set(ids)) < 2:
            return await super().unary(method, request)
        ordered = list(dict.fromkeys(ids))
        reply = await super().unary(method, _forward_abort(ordered[:1]))
        first = {o.request_id: o.status for o in reply.outcomes}
        return AbortResponse(
            outcomes=[
                AbortOutcome(
                    i, first.get(i, AbortStatus.ABORTED if i in self.calls else AbortStatus.NOT_IN_FLIGHT)
                )
                for i in ordered
            ]
        )


class AbortAnswerLostNowAndThen(Mutant):
    name = "abort-answer-lost-now-and-then"
    fault = "every second Abort reaches the engine but its answer never comes (an interleaving the abort path deadlocks on)"
    # Which case makes the second Abort is the order the cases' calls interleave in; the state machine
    # always makes several, so it must say so (a FAIL naming Abort's deadline, never a harness ERROR)
    expected = frozenset({"ABORT-3[stateful]", "FINISH-1[stateful]", "STREAM-6[stateful]"})
    triggered_by = frozenset({"abort.ids=1", "abort.ids>1", "abort.duplicate-ids", "abort.all"})
    every = 2

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.aborts = 0

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "abort":
            self.aborts += 1
            if self.aborts % self.every == 0:
                await asyncio.Event().wait()
        return reply


ABORT_FAULTS: tuple[type[Mutant], ...] = (
    AbortLags,
    AbortOutcomesDuplicated,
    AbortStopsAtUnknown,
    AbortAllSkipsWaiting,
    CancelTakesSamePrompt,
    DeadlineAsAborted,
    ReuseBlocked,
    DuplicateEndsTheFirst,
    AbortMatchesPrefix,
    AbortFirstIdOnly,
    AbortAnswerLostNowAndThen,
)
