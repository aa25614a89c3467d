"""Mutants that rewrite the events of Generate streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from grpclib import GRPCError, Status

from conformance.stream.wire import length_field, split_fields
from lmrpc.v1 import FinishReason, GenerateResponse, PromptInfo, TokenDelta, Usage

from ..proxy import Call, Out
from .base import Mutant, clone, delta, finished, kind, prompt


class DoubleFinish(Mutant):
    name = "double-finish"
    fault = "output 0's OutputFinished is sent twice"
    expected = frozenset({"FINISH-1", "FINISH-3", "N-1[*]", "FINISH-1[stateful]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if kind(event) == "finished" and not finished(event).output_index:
                copy = clone(event)
                copy.usage = None
                yield copy
            yield event


class MissingFinish(Mutant):
    name = "missing-finish"
    fault = "an n=1 output that hits max_tokens gets no OutputFinished; Usage rides on its last delta"
    expected = frozenset(
        {
            "FINISH-1",
            "FINISH-1[stateful]",
            "FINISH-3",
            "SAMPLE-1[max_tokens-default]",
            "STOP-2[incomplete-end-suffix]",
            "STOP-2[incomplete-end]",
            "STOP-4[ignore_eos]",
            "USAGE-3",
            "USAGE-3[stateful]",
        }
    )

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        pending: GenerateResponse | None = None
        async for event in events:
            if (
                kind(event) == "finished"
                and call.n == 1
                and finished(event).reason == FinishReason.LENGTH
                and pending is not None
            ):
                pending.usage = event.usage
                yield pending
                pending = None
                continue
            if pending is not None:
                yield pending
                pending = None
            if kind(event) == "delta":
                pending = event
            else:
                yield event
        if pending is not None:
            yield pending


class CumulativeIds(Mutant):
    name = "cumulative-ids"
    fault = "TokenDelta.token_ids carries every token so far (cumulative), one delta per token"
    expected = frozenset(
        {
            "ABORT-1[mixed]",
            "ABORT-1[prefix-id]",
            "ABORT-2[mid-stream]",
            "ABORT-2[several-ids]",
            "ABORT-4[*]",
            "ABORT-5",
            "ADMIN-1[output_dir]",
            "ADMIN-2[refused-in-flight]",
            "CAP-2[combined]",
            "FINISH-6[eos-at-max-tokens]",
            "FINISH-6[stop-at-max-tokens]",
            "SAMPLE-8[skip_special_tokens]",
            "STOP-1[stop-token]",
            "STOP-2[incomplete-end-suffix]",
            "STOP-4[ignore_eos]",
            "STOP-6[inside-token-excluded]",
            "STOP-6[inside-token]",
            "STOP-7[eos]",
            "STOP-7[stop-token]",
            "STREAM-2",
            "STREAM-4",
            "STREAM-5",
            "STREAM-5[every-byte]",
            "STREAM-5[multibyte]",
            "STREAM-7",
            "STREAM-8[greedy]",
            "STREAM-8[seeded]",
            "USAGE-3[stateful]",
            "USAGE-5",
        }
    )
    # may also fail: how many tokens arrive before an abort at acceptance, or right after the send,
    # is timing (a busy machine lets a second token out before the Abort lands)
    tolerated = frozenset({"ABORT-2[before-first-token]", "ABORT-2[right-after-send]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        so_far: dict[int, list[int]] = {}
        final_only = call.request.response is not None and call.request.response.final_only
        async for event in events:
            if kind(event) != "delta" or not delta(event).token_ids or final_only:
                yield event
                continue
            ids = so_far.setdefault(delta(event).output_index or 0, [])
            for i, token in enumerate(delta(event).token_ids):  # one token per delta: the same in every run
                ids.append(token)
                yield GenerateResponse(
                    request_id=event.request_id,
                    usage=event.usage,
                    delta=TokenDelta(
                        output_index=delta(event).output_index,
                        token_ids=list(ids),
                        text=delta(event).text if i == 0 else "",
                        logprobs=delta(event).logprobs[i : i + 1],
                    ),
                )


class UsageOffByOne(Mutant):
    name = "usage-off-by-one"
    fault = "Usage.completion_tokens is one more than the tokens generated"
    expected = frozenset({"USAGE-3", "N-2", "USAGE-3[stateful]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if event.usage is not None:
                event.usage.completion_tokens += 1
            yield event


class PromptCountedNTimes(Mutant):
    name = "prompt-counted-n-times"
    fault = "Usage.prompt_tokens counts the prompt once per output"
    expected = frozenset({"USAGE-2", "N-2", "USAGE-2[tokenize]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if event.usage is not None:
                event.usage.prompt_tokens *= call.n
            yield event


class LostOutputIndex(Mutant):
    name = "lost-output-index"
    fault = "output_index is left unset for output 0 (proto3 default elision)"
    expected = frozenset({"STREAM-3"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            body = (
                event.delta
                if kind(event) == "delta"
                else event.finished
                if kind(event) == "finished"
                else None
            )
            if body is not None and body.output_index == 0:
                body.output_index = None
            yield event


class RequestIdNotEchoed(Mutant):
    name = "request-id-not-echoed"
    fault = "only the first message carries the request_id"
    expected = frozenset({"REQ-2", "REQ-2[server-assigned]", "REQ-4[id-128-bytes]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        first = True
        async for event in events:
            if not first:
                event.request_id = ""
            first = False
            yield event


def _split_text_bytes(event: GenerateResponse, cut: int) -> tuple[bytes, bytes]:
    """Two raw GenerateResponse messages: the delta's ids with text bytes [:cut], then the rest."""
    body = delta(event)
    raw = body.text.encode()
    head = clone(event)
    delta(head).text = ""
    tail = GenerateResponse(request_id=event.request_id, delta=TokenDelta(output_index=body.output_index))

    def with_text(message: GenerateResponse, text: bytes) -> bytes:
        out = b""
        for f in split_fields(bytes(message)):
            out += length_field(3, f.payload + length_field(3, text)) if f.number == 3 else f.raw
        return out

    return with_text(head, raw[:cut]), with_text(tail, raw[cut:])


class Utf8Split(Mutant):
    name = "utf8-split"
    fault = "a text delta is split inside a multi-byte UTF-8 character"
    expected = frozenset({"STREAM-5*", "STREAM-8"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if kind(event) == "delta":
                raw = delta(event).text.encode()
                cut = next((i + 1 for i, b in enumerate(raw) if b >= 0xC0), None)  # just after a lead byte
                if cut is not None:
                    for part in _split_text_bytes(event, cut):
                        yield part
                    continue
            yield event


class StopStringLeaked(Mutant):
    name = "stop-string-leaked"
    fault = "the matched stop string is streamed as a last text delta (include_stop_in_output unset)"
    tolerated = frozenset({"STREAM-8*", "STREAM-10"})  # when a pooled final_only or text-less stream stops
    expected = frozenset(
        {
            "STOP-1[stop-string]",
            "STOP-2[before-min-tokens]",
            "STOP-2[later-entry]",
            "STOP-6[inside-token-excluded]",
            "STREAM-4",
        }
    )

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        include = call.request.stopping is not None and call.request.stopping.include_stop_in_output
        async for event in events:
            stop = finished(event).stop if kind(event) == "finished" else None
            if stop is not None and stop.stop_string and not include:
                yield GenerateResponse(
                    request_id=event.request_id,
                    delta=TokenDelta(output_index=finished(event).output_index, text=stop.stop_string),
                )
            yield event


class UsageOnEveryMessage(Mutant):
    name = "usage-on-every-message"
    fault = "every TokenDelta carries a running Usage"
    expected = frozenset({"USAGE-1"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        prompt_tokens, generated = 0, 0
        async for event in events:
            if kind(event) == "prompt_info":
                prompt_tokens = prompt(event).prompt_tokens
            elif kind(event) == "delta":
                generated += len(delta(event).token_ids)
                event.usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=generated)
            yield event


class PromptInfoTwice(Mutant):
    name = "prompt-info-twice"
    fault = "PromptInfo is sent again after the first delta"
    expected = frozenset({"STREAM-1"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        prompt: PromptInfo | None = None
        async for event in events:
            yield event
            if kind(event) == "prompt_info":
                prompt = event.prompt_info
            elif kind(event) == "delta" and prompt is not None:
                yield GenerateResponse(request_id=event.request_id, prompt_info=prompt)
                prompt = None


class UnspecifiedReason(Mutant):
    name = "unspecified-reason"
    fault = "LENGTH finishes are sent as FINISH_REASON_UNSPECIFIED"
    expected = frozenset(
        {
            "FINISH-4",
            "FINISH-6",
            "FINISH-6[ignore_eos]",
            "SAMPLE-1[max_tokens-default]",
            "STOP-2[incomplete-end-suffix]",
            "STOP-2[incomplete-end]",
            "STOP-4[ignore_eos]",
        }
    )

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if kind(event) == "finished" and finished(event).reason == FinishReason.LENGTH:
                finished(event).reason = FinishReason.UNSPECIFIED
            yield event


class HangMidStream(Mutant):
    name = "hang-mid-stream"
    fault = "a final_only request with n >= 4 stalls after its first output finishes"
    expected = frozenset({"CAP-2[combined]", "FINISH-3"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        final_only = call.request.response is not None and call.request.response.final_only
        async for event in events:
            yield event
            if final_only and call.n >= 4 and kind(event) == "finished":
                await asyncio.Event().wait()  # until the client gives up


class CrashMidStream(Mutant):
    name = "crash-mid-stream"
    fault = "a request with top_logprobs > 5 dies with INTERNAL after its second message"
    expected = frozenset({"CAP-2[combined]", "ERR-2", "CAP-2[max_top_logprobs]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        logprobs = call.request.response is not None and call.request.response.top_logprobs > 5
        sent = 0
        async for event in events:
            yield event
            sent += 1
            if logprobs and sent == 2:
                raise GRPCError(Status.INTERNAL, "worker crashed")


class LogprobsDropped(Mutant):
    name = "logprobs-dropped"
    fault = "return_logprobs is accepted but no TokenLogprob is sent"
    expected = frozenset({"CAP-2[combined]", "STREAM-7", "CAP-2[max_top_logprobs]"})

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        async for event in events:
            if kind(event) == "delta":
                delta(event).logprobs = []
            yield event


STREAM_MUTANTS: tuple[type[Mutant], ...] = (
    DoubleFinish,
    MissingFinish,
    CumulativeIds,
    UsageOffByOne,
    PromptCountedNTimes,
    LostOutputIndex,
    RequestIdNotEchoed,
    Utf8Split,
    StopStringLeaked,
    UsageOnEveryMessage,
    PromptInfoTwice,
    UnspecifiedReason,
    HangMidStream,
    CrashMidStream,
    LogprobsDropped,
)
