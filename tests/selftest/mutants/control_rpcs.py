"""Mutants that rewrite requests, unary RPCs, or how calls are tied to the upstream server."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
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
)

from ..proxy import Call, Out
from .base import SELFTEST_BUDGETS, Mutant, delta, kind, prompt


def _ids(request: AbortRequest) -> list[str] | None:
    return list(request.request_ids.ids) if request.request_ids is not None else None


class IgnoredAbort(Mutant):
    name = "ignored-abort"
    fault = "Abort answers ABORTED but the request keeps generating"
    expected = frozenset(
        {
            "ABORT-1[duplicate-ids]",
            "ABORT-1[mixed]",
            "ABORT-1[prefix-id]",
            "ABORT-1[twice-while-ending]",
            "ABORT-2[*]",
            "ABORT-3[abort]",
            "ABORT-4[*]",
            "ABORT-5",
            "ABORT-5[waiting]",
            "ABORT-6",
            "ABORT-6[after-expiry]",
            "CAP-5[max_abort_request_ids]",
            "FINISH-1[stateful]",
        }
    )
    # may also fail: unaborted requests run until the harness cancels them; whether one is still running at a baseline is timing
    tolerated = frozenset({"ABORT-3[stateful]"})

    async def unary(self, method: str, request: Any) -> Any:
        if method != "abort":
            return await super().unary(method, request)
        ids = _ids(request)
        if ids == [] or (ids is None and request.all is None):
            return await super().unary(method, request)  # invalid requests are still rejected
        targets = list(self.calls) if ids is None else ids
        return AbortResponse(
            outcomes=[
                AbortOutcome(i, AbortStatus.ABORTED if i in self.calls else AbortStatus.NOT_IN_FLIGHT)
                for i in targets
            ]
        )


class AbortNotCoveringChildren(Mutant):
    name = "abort-not-covering-children"
    fault = "aborting an n>1 request ends only output 0; the other outputs keep generating"
    expected = frozenset({"ABORT-4[*]", "ABORT-3[abort]"})
    # may also fail: whether a random program aborts an n>1 request in time for the machine to see it is timing
    tolerated = frozenset({"FINISH-1[stateful]", "USAGE-3[stateful]"})

    async def unary(self, method: str, request: Any) -> Any:
        ids = _ids(request) if method == "abort" else None
        if not ids:
            return await super().unary(method, request)
        partial = [i for i in ids if i in self.calls and self.calls[i].n > 1]
        for rid in partial:
            self.calls[rid].flags["abort0"] = True
        rest = [i for i in ids if i not in partial]
        reply = (
            await super().unary(method, AbortRequest(request_ids=RequestIds(ids=rest)))
            if rest
            else AbortResponse()
        )
        return AbortResponse(
            outcomes=[*reply.outcomes, *(AbortOutcome(i, AbortStatus.ABORTED) for i in partial)]
        )

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        tokens0 = 0
        done0 = False
        async for event in events:
            if call.flags.get("abort0") and not done0:
                done0 = True
                yield GenerateResponse(
                    request_id=event.request_id,
                    finished=OutputFinished(
                        output_index=0, reason=FinishReason.ABORTED, completion_tokens=tokens0
                    ),
                )
            body = (
                event.delta
                if kind(event) == "delta"
                else event.finished
                if kind(event) == "finished"
                else None
            )
            if body is not None and not body.output_index:
                if done0:
                    continue
                if kind(event) == "delta":
                    tokens0 += len(delta(event).token_ids)
            yield event


class LeakAfterCancel(Mutant):
    name = "leak-after-cancel"
    fault = "a cancelled call (or one past its deadline) keeps generating upstream for 1.6 release budgets"
    expected = frozenset({"ABORT-3[stateful]", "CANCEL-1[*]", "CANCEL-2[deadline]", "CANCEL-2[held]"})
    # Long enough that every release check sees the leak, short enough that what the state machine's
    # many cancels leak has ended before the next case needs the capacity (or the liveness probe).
    leak_s = 1.6 * SELFTEST_BUDGETS.release_s

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.background: set[asyncio.Task[None]] = set()

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        request = await stream.recv_message()
        assert request is not None
        queue: asyncio.Queue[GenerateResponse | GRPCError | None] = asyncio.Queue()

        async def consume() -> None:  # not tied to the downstream call: outlives its cancellation
            try:
                async for event in self.upstream_events(request, None):
                    queue.put_nowait(event)
            except GRPCError as exc:
                queue.put_nowait(exc)
            finally:
                queue.put_nowait(None)

        task = asyncio.ensure_future(consume())
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, GRPCError):
                    raise GRPCError(item.status, item.message)
                await stream.send_message(RawMessage(bytes(item)))
        finally:
            if not task.done():  # the server notices the cancel, late: closing the call cancels it
                asyncio.get_running_loop().call_later(self.leak_s, task.cancel)


class WrongStatusCode(Mutant):
    name = "wrong-status-code"
    fault = "a negative or non-finite temperature crashes the sampler: INTERNAL instead of INVALID_ARGUMENT"
    expected = frozenset({"SAMPLE-5[temperature=*]", "ERR-1[generated]", "ERR-3"})

    def rewrite_request(self, request: GenerateRequest) -> GenerateRequest:
        t = request.sampling.temperature if request.sampling else None
        if t is not None and not 0 <= t < float("inf"):
            raise GRPCError(Status.INTERNAL, "sampler crashed")
        return request


class SeedIgnored(Mutant):
    name = "seed-ignored"
    fault = "SamplingParams.seed is dropped (the server picks one) but echoed in PromptInfo as if honoured"
    expected = frozenset(
        {
            "SAMPLE-1[defaults]",
            "SAMPLE-3",
            "SAMPLE-3[first-of-n]",
            "SAMPLE-3[per-output]",
            "SAMPLE-4[picked-n]",
            "SAMPLE-4[picked]",
            "STREAM-8[seeded]",
        }
    )
    # two unseeded runs of a constrained request may still agree: its grammar leaves few texts
    tolerated = frozenset({"CONSTRAIN-3[seeded]"})

    def rewrite_request(self, request: GenerateRequest) -> GenerateRequest:
        if request.sampling is not None:
            request.sampling.seed = None
        return request

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        original = call.original.sampling if call.original is not None else None
        seed = original.seed if original is not None else None
        async for event in events:
            if kind(event) == "prompt_info" and seed is not None:
                prompt(event).seed = seed
            yield event


class RequestRewrite(Mutant):
    """A mutant that only edits requests: subclasses set ``edit``."""

    def edit(self, request: GenerateRequest) -> None:
        raise NotImplementedError

    def rewrite_request(self, request: GenerateRequest) -> GenerateRequest:
        self.edit(request)
        return request


class TopKIgnored(RequestRewrite):
    name = "top-k-ignored"
    fault = "truncation_sampling is advertised but top_k is silently ignored"
    expected = frozenset({"SAMPLE-7", "SAMPLE-7[seeded-n]"})

    def edit(self, request: GenerateRequest) -> None:
        if request.sampling is not None:
            request.sampling.top_k = None


class TemperatureZeroAsUnset(RequestRewrite):
    name = "temperature-zero-as-unset"
    fault = "temperature=0 is read as 'unset' (the default, 1.0): greedy requests sample"
    # every case that compares greedy outputs of different requests sees sampled tokens
    expected = frozenset(
        {
            "ADMIN-1[output_dir]",
            "ADMIN-2[refused-in-flight]",
            "FINISH-5[stop-token-is-eos]",
            "FINISH-6[eos-at-max-tokens]",
            "FINISH-6[stop-at-max-tokens]",
            "SAMPLE-1[temperature=0]",
            "SAMPLE-2[n]",
            "SAMPLE-7",
            "SAMPLE-7[seeded-n]",
            "STOP-1[stop-string]",
            "STOP-1[stop-token]",
            "STOP-2[before-min-tokens]",
            "STOP-3",
            "STOP-3[n=2]",
            "STOP-4[eos]",
            "STOP-6[inside-token-excluded]",
            "STOP-6[inside-token]",
            "STOP-7[eos]",
            "STOP-7[stop-token]",
            "STREAM-8[greedy]",
        }
    )

    def edit(self, request: GenerateRequest) -> None:
        if request.sampling is not None and request.sampling.temperature == 0:
            request.sampling.temperature = None


class FinalOnlyIgnored(RequestRewrite):
    name = "final-only-ignored"
    fault = "final_only is advertised but the stream is delivered token by token anyway"
    expected = frozenset({"STREAM-8"})

    def edit(self, request: GenerateRequest) -> None:
        if request.response is not None:
            request.response.final_only = False


class InvalidIdAccepted(RequestRewrite):
    name = "invalid-id-accepted"
    fault = "a malformed request_id is sanitized and accepted instead of INVALID_ARGUMENT"
    expected = frozenset(
        {
            "ERR-1[generated]",
            "REQ-4[id-129-bytes]",
            "REQ-4[id-bang]",
            "REQ-4[id-non-ascii]",
            "REQ-4[id-space]",
        }
    )

    def edit(self, request: GenerateRequest) -> None:
        request.request_id = re.sub(r"[^A-Za-z0-9._:/-]", "-", request.request_id)[:128]


class DuplicateIdAccepted(Mutant):
    name = "duplicate-id-accepted"
    fault = "request ids are made unique upstream, so a duplicate in-flight id is accepted"
    expected = frozenset({"REQ-3", "ABORT-6", "ABORT-6[after-expiry]"})  # a remembered id never matches

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.serial = 0
        self.upstream_ids: dict[str, list[str]] = {}

    def rewrite_request(self, request: GenerateRequest) -> GenerateRequest:
        self.serial += 1
        unique = f"{request.request_id}.{self.serial}"
        if (
            request.request_id
            and len(unique) <= 128
            and re.fullmatch(r"[A-Za-z0-9._:/-]+", request.request_id)
        ):
            self.upstream_ids.setdefault(request.request_id, []).append(unique)
            request.request_id = unique
        return request

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        client_id = call.flags["client_id"]
        async for event in events:
            if client_id:
                event.request_id = client_id
            yield event

    async def unary(self, method: str, request: Any) -> Any:
        ids = _ids(request) if method == "abort" else None
        if method != "abort" or ids == [] or (ids is None and request.all is None):
            return await super().unary(method, request)
        back = {u: c for c, us in self.upstream_ids.items() for u in us}
        if ids is not None:
            back = {u: c for c in ids for u in self.upstream_ids.get(c, [c])}
            request = AbortRequest(request_ids=RequestIds(ids=list(back)))
        reply = await super().unary(method, request)
        best: dict[str, AbortStatus] = {}
        for outcome in reply.outcomes:
            client = back.get(outcome.request_id, outcome.request_id)
            if best.get(client) != AbortStatus.ABORTED:
                best[client] = outcome.status
        return AbortResponse(outcomes=[AbortOutcome(i, s) for i, s in best.items()])


CONTROL_MUTANTS: tuple[type[Mutant], ...] = (
    IgnoredAbort,
    AbortNotCoveringChildren,
    LeakAfterCancel,
    WrongStatusCode,
    SeedIgnored,
    TopKIgnored,
    TemperatureZeroAsUnset,
    FinalOnlyIgnored,
    InvalidIdAccepted,
    DuplicateIdAccepted,
)
