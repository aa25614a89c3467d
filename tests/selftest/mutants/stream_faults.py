"""Mutants of stream contents that checks of contract revision 1 were looser than their clauses for."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from grpclib import GRPCError

from lmrpc.v1 import (
    DetokenizeRequest,
    FinishReason,
    GenerateResponse,
    TokenDelta,
)

from ..proxy import Call, Out
from .base import Mutant, delta, finished, kind


class StopPrefixLeaked(Mutant):
    name = "stop-prefix-leaked"
    fault = "all but the last character of a matched stop string is streamed before the finish (no holdback)"
    expected = frozenset(
        {
            "STOP-1[stop-string]",
            "STOP-2[before-min-tokens]",
            "STOP-2[later-entry]",
            "STOP-6[inside-token-excluded]",
            "STREAM-4",
        }
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
    expected = frozenset({"STREAM-7", "CAP-2[combined]"})

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


class FffdForMultibyte(Mutant):
    name = "fffd-for-multibyte"
    fault = "the first multi-byte character of each text delta is sent as U+FFFD"
    expected = frozenset({"STREAM-5*", "STREAM-4"})
    tolerated = frozenset({"STREAM-8*", "STOP-*", "TOK-2", "FINISH-5*", "SAMPLE-8*"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if kind(event) == "delta":
                text = delta(event).text
                at = next((i for i, c in enumerate(text) if ord(c) > 0x7F), None)
                if at is not None:
                    delta(event).text = text[:at] + "\ufffd" + text[at + 1 :]
            yield event


class LengthBeatsStop(Mutant):
    name = "length-beats-stop"
    fault = "a stop token that is also the max_tokens-th token is reported as LENGTH"
    expected = frozenset({"FINISH-6[eos-at-max-tokens]", "FINISH-6[stop-at-max-tokens]"})

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


class CachedNeverZero(Mutant):
    name = "cached-never-zero"
    fault = "Usage.cached_prompt_tokens is at least 1 for every prompt of 2 or more tokens, cold ones too"
    expected = frozenset({"USAGE-7[after-flush]", "USAGE-7[fresh-prompt]", "USAGE-7[never-ran]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            usage = event.usage
            if usage is not None and usage.prompt_tokens >= 2:
                usage.cached_prompt_tokens = max(1, usage.cached_prompt_tokens)
            yield event


class CachedWhileWaiting(Mutant):
    name = "cached-while-waiting"
    fault = "a request that ends before it ran a step reports its whole prompt as cached (the count is set at queueing)"
    expected = frozenset({"USAGE-7[never-ran]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        ran = False
        async for event in events:
            ran = ran or (kind(event) == "delta" and bool(delta(event).token_ids))
            if event.usage is not None and not ran:
                event.usage.cached_prompt_tokens = event.usage.prompt_tokens
            yield event


class TextAtTheEnd(Mutant):
    name = "text-at-the-end"
    fault = "an output's text is kept back and sent in one text-only delta just before its finish"
    expected = frozenset({"STREAM-11", "STREAM-11[before-min-tokens]", "STREAM-5[multibyte]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        kept: dict[int, str] = {}
        final_only = call.request.response is not None and call.request.response.final_only
        async for event in events:
            if kind(event) == "delta" and not final_only:  # final_only sends one delta anyway
                index = delta(event).output_index or 0
                kept[index] = kept.get(index, "") + delta(event).text
                delta(event).text = ""
            elif kind(event) == "finished" and kept.get(index := finished(event).output_index or 0):
                yield GenerateResponse(
                    request_id=event.request_id, delta=TokenDelta(output_index=index, text=kept.pop(index))
                )
            yield event


STREAM_FAULTS: tuple[type[Mutant], ...] = (
    StopPrefixLeaked,
    RankClaimsTop,
    LogprobsShortWithoutIds,
    LengthReportedAborted,
    FffdForMultibyte,
    LengthBeatsStop,
    StopTailKept,
    CachedNeverZero,
    CachedWhileWaiting,
    TextAtTheEnd,
)
