"""Mutants for the blind-spot classes of issue 13 that need more than a request rewrite: checks looser
than their clause, excuses without a cause, states never observed, the harness blaming itself, and
faults that used to be caught by the wrong case."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from grpclib import GRPCError, Status
from grpclib.const import Cardinality, Handler
from grpclib.health.v1.health_pb2 import HealthCheckResponse
from grpclib.server import Stream

from conformance.stream.live import RawMessage
from lmrpc.v1 import (
    AbortOutcome,
    AbortRequest,
    AbortResponse,
    AbortStatus,
    DetokenizeRequest,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    GetLoadRequest,
    GetModelInfoRequest,
    OutputFinished,
    RequestIds,
    TokenDelta,
    Usage,
)

from ..proxy import Call, Out, Replayed
from .base import Mutant, delta, finished, kind
from .control import _ids
from .unary import UnaryMutant


def _forward_abort(ids: list[str]) -> AbortRequest:
    return AbortRequest(request_ids=RequestIds(ids=ids))


# ── a check looser than its clause ───────────────────────────────────────────────────────────


class StopPrefixLeaked(Mutant):
    name = "stop-prefix-leaked"
    fault = "all but the last character of a matched stop string is streamed before the finish (no holdback)"
    expected = frozenset(
        {"STOP-1[stop-string]", "STOP-2[before-min-tokens]", "STOP-2[later-entry]", "STREAM-4"}
    )
    tolerated = frozenset({"STREAM-8*", "STREAM-10"})  # when a pooled final_only or text-less stream stops

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        include = call.request.stopping is not None and call.request.stopping.include_stop_in_output
        async for event in events:
            stop = finished(event).stop if kind(event) == "finished" else None
            if stop is not None and stop.stop_string and len(stop.stop_string) > 1 and not include:
                yield GenerateResponse(
                    request_id=event.request_id,
                    delta=TokenDelta(output_index=finished(event).output_index, text=stop.stop_string[:-1]),
                )
            yield event


class RankClaimsTop(Mutant):
    name = "rank-claims-top"
    fault = "a sampled token that is not the top candidate is reported with rank 1 and the top logprob"
    expected = frozenset({"STREAM-7"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            for lp in delta(event).logprobs if kind(event) == "delta" else []:
                if lp.top and lp.top[0].token_id != lp.token_id:
                    lp.rank, lp.logprob = 1, lp.top[0].logprob
            yield event


class LogprobsShortWithoutIds(Mutant):
    name = "logprobs-short-without-ids"
    fault = "with return_token_ids=false every second delta's TokenLogprobs are dropped"
    expected = frozenset({"STREAM-7"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        response = call.request.response
        without_ids = response is not None and response.return_token_ids is False
        count = 0
        async for event in events:
            if without_ids and kind(event) == "delta":
                count += 1
                if count % 2 == 0:
                    delta(event).logprobs = []
            yield event


class AbortLags(Mutant):
    name = "abort-lags"
    fault = "Abort answers ABORTED at once but reaches the engine only 200 tokens per output later"
    expected = frozenset({"ABORT-2[*]", "ABORT-4[*]"})
    lag_tokens = 200

    async def unary(self, method: str, request: Any) -> Any:
        ids = _ids(request) if method == "abort" else None
        if not ids:
            return await super().unary(method, request)
        ordered = list(dict.fromkeys(ids))
        live = [i for i in ordered if i in self.calls]
        for rid in live:
            call = self.calls[rid]
            call.flags["abort_after"] = call.flags.get("tokens", 0) + self.lag_tokens * call.n
        rest = [i for i in ordered if i not in live]
        reply = await super().unary(method, _forward_abort(rest)) if rest else AbortResponse()
        status = {o.request_id: o.status for o in reply.outcomes} | dict.fromkeys(live, AbortStatus.ABORTED)
        return AbortResponse(outcomes=[AbortOutcome(i, status[i]) for i in ordered if i in status])

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        sent = False
        async for event in events:
            if kind(event) == "delta":
                call.flags["tokens"] = call.flags.get("tokens", 0) + len(delta(event).token_ids)
            after = call.flags.get("abort_after")
            if after is not None and not sent and call.flags["tokens"] >= after:
                sent = True
                await super().unary("abort", _forward_abort([call.flags["client_id"]]))
            yield event


class AbortOutcomesDuplicated(Mutant):
    name = "abort-outcomes-duplicated"
    fault = "every Abort outcome is listed twice"
    expected = frozenset(
        {"ABORT-1[*]", "ABORT-2[*]", "ABORT-4[*]", "ABORT-5", "ABORT-5[waiting]", "ABORT-6", "EMBED-3"}
    )

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "abort":
            reply.outcomes = [o for outcome in reply.outcomes for o in (outcome, outcome)]
        return reply


# ── an excuse too broad ──────────────────────────────────────────────────────────────────────


class LengthReportedAborted(Mutant):
    name = "length-reported-aborted"
    fault = "output 1 of an n>1 request that reaches max_tokens is reported ABORTED (a failure hidden as a finish)"
    expected = frozenset({"FINISH-7", "FINISH-6[ignore_eos]"})
    tolerated = frozenset({"FINISH-6", "STREAM-8*", "SAMPLE-*", "N-1*", "STREAM-6[concurrent]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if kind(event) == "finished" and finished(event).output_index == 1:
                if finished(event).reason == FinishReason.LENGTH:
                    finished(event).reason = FinishReason.ABORTED
            yield event


class DeadlineAsAborted(Mutant):
    name = "deadline-as-aborted"
    fault = "just before a call's deadline the server ends it itself, with ABORTED finishes and status OK"
    expected = frozenset({"CANCEL-2[deadline]"})

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


# ── a state never observed ───────────────────────────────────────────────────────────────────


class ActiveCountsProducingOnly(Mutant):
    name = "active-counts-producing-only"
    fault = "GetLoad counts only requests that have produced tokens as active (not those still waiting)"
    expected = frozenset({"LOAD-1[waiting]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if kind(event) == "delta":
                call.flags["producing"] = True
            yield event

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "get_load" and reply.current is not None:
            waiting = sum(1 for c in self.calls.values() if not c.flags.get("producing"))
            reply.current.active_requests = max(0, reply.current.active_requests - waiting)
        return reply


class CachedNeverZero(Mutant):
    name = "cached-never-zero"
    fault = "Usage.cached_prompt_tokens is at least 1 for every prompt of 2 or more tokens, cold ones too"
    expected = frozenset({"USAGE-7[after-flush]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            usage = event.usage
            if usage is not None and usage.prompt_tokens >= 2:
                usage.cached_prompt_tokens = max(1, usage.cached_prompt_tokens)
            yield event


class ReuseBlocked(Mutant):
    name = "reuse-blocked"
    fault = "the id of an accepted request that ended is refused (ALREADY_EXISTS) for 3 s"
    expected = frozenset({"REQ-3", "REQ-3[reuse-after-finish]"})
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


# ── the harness blaming itself ───────────────────────────────────────────────────────────────


class WatchClosesEarly(Mutant):
    name = "watch-closes-early"
    fault = "Health/Watch ends at once with status OK and no message"
    expected = frozenset({"HEALTH-2[watch]"})

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()

        async def watch(stream: Stream[Any, Any]) -> None:
            await stream.recv_message()

        mapping["/grpc.health.v1.Health/Watch"] = Handler(
            watch, Cardinality.UNARY_STREAM, RawMessage, RawMessage
        )
        return mapping


class NotServingWhilePaused(Mutant):
    name = "not-serving-while-paused"
    fault = "Health/Check answers NOT_SERVING while generation is paused (the server still accepts requests)"
    expected = frozenset({"HEALTH-1[paused]"})

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.paused = False

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method in ("pause_generation", "resume_generation"):
            self.paused = method == "pause_generation"
        return reply

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()
        forward = mapping["/grpc.health.v1.Health/Check"].func

        async def check(stream: Stream[Any, Any]) -> None:
            if not self.paused:
                await forward(stream)
                return
            await stream.recv_message()
            reply = HealthCheckResponse(status=HealthCheckResponse.NOT_SERVING)
            await stream.send_message(RawMessage(reply.SerializeToString()))

        mapping["/grpc.health.v1.Health/Check"] = Handler(
            check, Cardinality.UNARY_UNARY, RawMessage, RawMessage
        )
        return mapping


# ── right bug, wrong case ────────────────────────────────────────────────────────────────────


class EmbedReversed(UnaryMutant):
    name = "embed-reversed"
    fault = "Embed returns the embeddings in reverse input order"
    expected = frozenset({"EMBED-1"})
    method = "embed"

    def edit(self, reply: Any) -> Any:
        reply.embeddings = list(reversed(reply.embeddings))
        return reply


class WindowOffByOne(Mutant):
    name = "window-off-by-one"
    fault = "a token_ids prompt whose max_tokens fills the context window exactly is rejected"
    expected = frozenset({"REQ-6[exact-fit]", "REQ-7", "REQ-7[waits-for-capacity]"})

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        request = await stream.recv_message()
        assert request is not None
        stopping = request.stopping
        if request.token_ids is not None and stopping is not None and stopping.max_tokens is not None:
            model = (await self.control.get_model_info(GetModelInfoRequest())).model
            window = model.max_context_tokens if model is not None else 0
            if len(request.token_ids.ids) + stopping.max_tokens >= window:
                raise GRPCError(
                    Status.INVALID_ARGUMENT, "stopping.max_tokens plus the prompt exceeds the window"
                )
        await super()._generate(Replayed(stream, request))


class FffdForMultibyte(Mutant):
    name = "fffd-for-multibyte"
    fault = "the first multi-byte character of each text delta is sent as U+FFFD"
    expected = frozenset({"STREAM-5", "STREAM-5[multibyte]", "STREAM-4"})
    tolerated = frozenset({"STREAM-8*", "STOP-*", "TOK-2", "FINISH-5*", "SAMPLE-8*"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if kind(event) == "delta":
                text = delta(event).text
                at = next((i for i, c in enumerate(text) if ord(c) > 0x7F), None)
                if at is not None:
                    delta(event).text = text[:at] + "\ufffd" + text[at + 1 :]
            yield event


# ── rules revision 2 added ───────────────────────────────────────────────────────────────────


class EmbedIdNotEchoed(UnaryMutant):
    name = "embed-id-not-echoed"
    fault = "EmbedResponse.request_id is always a server-assigned id"
    expected = frozenset({"EMBED-3"})
    method = "embed"

    def edit(self, reply: Any) -> Any:
        reply.request_id = "assigned-by-server"
        return reply


class StopStringLimitMisreported(UnaryMutant):
    name = "stop-string-limit-misreported"
    fault = "ServerInfo.limits.max_stop_string_bytes is 10 more than the limit the server enforces"
    expected = frozenset({"CAP-5[max_stop_string_bytes]"})
    method = "get_server_info"

    def edit(self, reply: Any) -> Any:
        if reply.server.limits is not None:
            reply.server.limits.max_stop_string_bytes += 10
        return reply


class LengthBeatsStop(Mutant):
    name = "length-beats-stop"
    fault = "a stop token that is also the max_tokens-th token is reported as LENGTH"
    expected = frozenset({"FINISH-6[stop-at-max-tokens]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        limit = call.request.stopping.max_tokens if call.request.stopping is not None else None
        async for event in events:
            if kind(event) == "finished":
                body = finished(event)
                if body.reason == FinishReason.STOP and body.completion_tokens == limit:
                    body.reason, body.stop = FinishReason.LENGTH, None
            yield event


class StopTailKept(Mutant):
    name = "stop-tail-kept"
    fault = "with include_stop_in_output, the rest of the token that completed a stop string is sent too"
    expected = frozenset({"STOP-6[inside-token]"})
    tolerated = frozenset({"STOP-1[include]", "STREAM-4", "STREAM-8*", "STREAM-10"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        stopping = call.request.stopping
        include = stopping is not None and stopping.include_stop_in_output
        ids: dict[int, list[int]] = {}
        texts: dict[int, str] = {}
        async for event in events:
            if kind(event) == "delta":
                index = delta(event).output_index or 0
                ids.setdefault(index, []).extend(delta(event).token_ids)
                texts[index] = texts.get(index, "") + delta(event).text
            stop = finished(event).stop if kind(event) == "finished" else None
            if include and stop is not None and stop.stop_string:
                index = finished(event).output_index or 0
                skip = call.request.response.skip_special_tokens if call.request.response else None
                with contextlib.suppress(GRPCError):
                    full = (await self.control.detokenize(DetokenizeRequest(ids.get(index, []), skip))).text
                    sent = texts.get(index, "")
                    if full.startswith(sent) and len(full) > len(sent):
                        yield GenerateResponse(
                            request_id=event.request_id,
                            delta=TokenDelta(output_index=index, text=full[len(sent) :]),
                        )
            yield event


# ── inputs the cases never sent, that need the proxy's state ─────────────────────────────────


class AbortStopsAtUnknown(Mutant):
    name = "abort-stops-at-unknown"
    fault = "Abort handles its ids in order and gives up at the first unknown one (later ids: NOT_IN_FLIGHT)"
    expected = frozenset({"ABORT-1[mixed]", "ABORT-6"})

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


class CapacityWaitRefused(Mutant):
    name = "capacity-wait-refused"
    fault = "a token_ids request that would have to wait for KV capacity is refused RESOURCE_EXHAUSTED"
    expected = frozenset({"REQ-7[waits-for-capacity]"})

    async def _generate(self, stream: Stream[GenerateRequest, RawMessage]) -> None:
        request = await stream.recv_message()
        assert request is not None
        need = _reservation(request)
        if need:
            load = (await self.control.get_load(GetLoadRequest())).current
            held = sum(_reservation(c.request) for c in self.calls.values())
            if load is not None and held + need > load.kv_tokens_total:
                raise GRPCError(Status.RESOURCE_EXHAUSTED, "the KV cache is full")
        await super()._generate(Replayed(stream, request))


def _reservation(request: GenerateRequest) -> int:
    """prompt + n * max_tokens of a token_ids request (what the reference reserves), else 0."""
    stopping, sampling = request.stopping, request.sampling
    if request.token_ids is None or stopping is None or stopping.max_tokens is None:
        return 0
    n = (sampling.n if sampling is not None and sampling.n else None) or 1
    return len(request.token_ids.ids) + n * stopping.max_tokens


BLIND_SPOT_MUTANTS: tuple[type[Mutant], ...] = (
    CapacityWaitRefused,
    StopPrefixLeaked,
    RankClaimsTop,
    LogprobsShortWithoutIds,
    AbortLags,
    AbortOutcomesDuplicated,
    LengthReportedAborted,
    DeadlineAsAborted,
    ActiveCountsProducingOnly,
    CachedNeverZero,
    ReuseBlocked,
    WatchClosesEarly,
    NotServingWhilePaused,
    EmbedReversed,
    WindowOffByOne,
    FffdForMultibyte,
    EmbedIdNotEchoed,
    StopStringLimitMisreported,
    LengthBeatsStop,
    StopTailKept,
    AbortStopsAtUnknown,
    AbortAllSkipsWaiting,
    CancelTakesSamePrompt,
)
