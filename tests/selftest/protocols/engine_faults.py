"""One-fault behaviours for an engine-protocol proxy, each modelled on a bug users met in these
protocols (notes/protocols.md section 4). Both protocols answer Generate with ``chunk`` and
``complete`` messages of the same field names, so a behaviour works on either;
``vllm_engine_faults.py`` and ``sglang_scheduler_faults.py`` declare the mutants (name, fault, the cases that must
fail) per protocol."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import betterproto2
from grpclib import GRPCError
from grpclib.const import Cardinality, Handler
from grpclib.server import Stream

from conformance.stream.live import RawMessage
from lmrpc._gen.sglang.grpc import scheduler as sglang

from .engine_proxy import EngineCall, EngineProxy


def kind(response: Any) -> str:
    return str(betterproto2.which_one_of(response, "response")[0])


def body(response: Any) -> Any:
    return betterproto2.which_one_of(response, "response")[1]


def clone(response: Any) -> Any:
    return type(response).parse(bytes(response))


def logprobs_requested(call: EngineCall) -> bool:
    request = call.request
    if hasattr(request, "return_logprob"):
        return bool(request.return_logprob)
    return request.sampling_params is not None and request.sampling_params.logprobs is not None


# A fault that changes how many tokens an output shows by how the engine happened to batch its
# steps into chunks (the last chunk lost) shows in every case that compares the tokens of two runs
# of a request, or counts them against a minimum: that class of case, declared once for the fault,
# instead of one more tolerance each time a busy machine batches differently.
COMPARES_RUNS = frozenset(
    {
        "SAMPLE-*",
        "STREAM-6[concurrent]",
        "CANCEL-3*",
        "USAGE-6[*]",
        "STOP-5",
        "STOP-5[no-max-tokens]",
        "STOP-5[eos]",
    }
)


# A fault that repeats every earlier token in each chunk (cumulative ids read as deltas) makes a
# stream's work grow with the square of its length: the state machine's programs, which run long
# requests, may then meet their budget on a busy machine instead of the fault they would report.
GROWS_WITH_TOKENS = frozenset({"*[stateful]"})


# ── Generate streams ─────────────────────────────────────────
class LastChunkLost(EngineProxy):
    """The last chunk before each output's complete is dropped (sgl-project/sglang#19895,
    ai-dynamo/dynamo#3531: the final token batch went only into the complete)."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        held: dict[int, Any] = {}
        async for event in events:
            index = body(event).index if body(event) is not None else 0
            if kind(event) == "chunk" and call.streaming:
                if index in held:
                    yield held.pop(index)
                held[index] = event
                continue
            if kind(event) == "complete":
                held.pop(index, None)
            yield event
        for event in held.values():
            yield event


class CumulativeIds(EngineProxy):
    """Chunk token_ids carry every id of the output so far (ai-dynamo/dynamo#12249,
    NVIDIA/srt-slurm#437: cumulative output ids read as deltas). Chunks are cut to one token
    first, so that the fault shows the same in every run, however the engine batched the steps."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        so_far: dict[int, list[int]] = {}
        async for event in one_token_chunks(self.protocol, events):
            if kind(event) == "chunk":
                chunk = body(event)
                ids = so_far.setdefault(chunk.index, [])
                ids += chunk.token_ids
                chunk.token_ids = list(ids)
            yield event


class CompletionCountsPrompt(EngineProxy):
    """completion_tokens counts the prompt too (the usage that came out as 120 for max_tokens 32)."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in events:
            if body(event) is not None:
                body(event).completion_tokens += body(event).prompt_tokens
            yield event


class PromptTokensPlusOne(EngineProxy):
    """prompt_tokens counts a BOS token the server prepended to the ids it was sent."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in events:
            if body(event) is not None:
                body(event).prompt_tokens += 1
            yield event


class CachedTokensDropped(EngineProxy):
    """cached_tokens is always 0, prefix cache hits or not (sgl-project/sglang#25228)."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in events:
            if body(event) is not None:
                body(event).cached_tokens = 0
            yield event


class DuplicateComplete(EngineProxy):
    """Output 0's complete is sent twice."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in events:
            yield event
            if kind(event) == "complete" and not body(event).index:
                yield clone(event)


class LengthAsStop(EngineProxy):
    """An output cut at max_tokens reports finish_reason "stop"."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in events:
            if kind(event) == "complete" and body(event).finish_reason == "length":
                body(event).finish_reason = "stop"
            yield event


class MatchedTokenOnLength(EngineProxy):
    """A "length" complete reports its output's last token as matched_token_id."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        last: dict[int, int] = {}
        async for event in events:
            part = body(event)
            if kind(event) == "chunk" and part.token_ids:
                last[part.index] = part.token_ids[-1]
            if kind(event) == "complete" and part.finish_reason == "length":
                ids = list(part.output_ids) or ([last[part.index]] if part.index in last else [])
                if ids:
                    part.matched_token_id = ids[-1]
            yield event


class IndexCollapsed(EngineProxy):
    """Every chunk and complete says index 0 (the choice index lost in fan-out)."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in events:
            if body(event) is not None:
                body(event).index = 0
            yield event


class ErrorInBand(EngineProxy):
    """A request asking for logprobs fails at its first complete, and the failure is sent in band:
    that complete says finish_reason "error" and the call ends with status OK
    (vllm-project/vllm#56405; smg removed the in-band error for the status code it needs)."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in events:
            if logprobs_requested(call) and kind(event) == "complete":
                body(event).finish_reason = "error"
                yield event
                return
            yield event


class LogprobsDropped(EngineProxy):
    """Logprobs are accepted but never sent."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in events:
            if body(event) is not None:
                body(event).output_logprobs = None
            yield event


class OneTokenPastMax(EngineProxy):
    """An output cut at max_tokens gets one token more: the step after the limit still streams."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in events:
            part = body(event)
            if kind(event) == "chunk" and part.token_ids and call.streaming:
                call.flags[part.index] = event
            if kind(event) == "complete" and part.finish_reason == "length" and part.index in call.flags:
                extra = clone(call.flags[part.index])
                chunk = body(extra)
                chunk.token_ids = chunk.token_ids[-1:]
                chunk.output_logprobs = None
                cumulative = self.protocol == "sglang-scheduler"  # its chunk counts are totals so far
                chunk.completion_tokens = chunk.completion_tokens + 1 if cumulative else 1
                yield extra
            yield event


class AbortMissesOutputs(EngineProxy):
    """Abort of an n>1 request ends output 0 only; the others run to their end
    (smg-project/smg#1351, sgl-project/sglang#32588: children of a fan-out not aborted)."""

    async def unary(self, method: str, request: Any) -> Any:
        if method == "abort":
            ids = list(getattr(request, "request_ids", None) or [request.request_id])
            mine = [rid for rid in ids if rid in self.calls and self.calls[rid].n > 1]
            for rid in mine:
                self.calls[rid].aborted.set()
            rest = [rid for rid in ids if rid not in mine]
            if mine and not rest:
                return self.abort_reply(True)
            if mine:
                request = type(request)(request_ids=rest) if hasattr(request, "request_ids") else request
        return await super().unary(method, request)

    def abort_reply(self, success: bool) -> Any:
        reply = self.module.AbortResponse()
        if hasattr(reply, "success"):
            reply.success = success
        return reply

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        done: set[int] = set()
        counts: dict[int, int] = {}
        async for event in events:
            part = body(event)
            if part is None:
                yield event
                continue
            if call.aborted.is_set() and 0 not in done:
                done.add(0)
                complete = self.module.GenerateComplete(
                    finish_reason="abort",
                    index=0,
                    prompt_tokens=part.prompt_tokens,
                    completion_tokens=counts.get(0, 0),
                )
                yield self.module.GenerateResponse(request_id=event.request_id, complete=complete)
            if part.index in done:
                continue
            if kind(event) == "chunk":
                counts[part.index] = counts.get(part.index, 0) + len(part.token_ids)
            else:
                done.add(part.index)
            yield event


# Over twice the release budget the cases allow (10 s times the self-test's --time-scale).
LINGER_S = 25.0 * float(os.environ.get("LMRPC_SELFTEST_TIME_SCALE", "0.5"))


class CancelNotPropagated(EngineProxy):
    """A client's reset does not reach the engine: the request generates on
    (sgl-project/sglang#11399, no abort on drop), for LINGER_S at most."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.detached: set[asyncio.Future[None]] = set()  # upstream calls nobody reads any more

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.ensure_future(self._drain(call, queue))
        self.detached.add(task)
        task.add_done_callback(self.detached.discard)
        while (event := await queue.get()) is not None:
            if isinstance(event, GRPCError):
                raise event
            yield event

    async def _drain(self, call: EngineCall, queue: asyncio.Queue[Any]) -> None:
        try:
            async with contextlib.aclosing(self.upstream_stream("generate", call.request, None)) as events:
                async with asyncio.timeout(LINGER_S):
                    async for event in events:
                        queue.put_nowait(event)
        except GRPCError as exc:
            queue.put_nowait(exc)
        except TimeoutError:
            pass  # the engine found out at last (it bounds what one self-test run spends waiting)
        finally:
            queue.put_nowait(None)


# ── unary calls ──────────────────────────────────────────────
class LoadStuckAfterEnd(EngineProxy):
    """GetLoads keeps counting every request that a cancel or an abort ended (its slot is
    never released: vllm-project/vllm#57062, #46289)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.leaked = 0

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        ended = False
        try:
            async for event in events:
                if kind(event) == "complete" and body(event).finish_reason == "abort":
                    ended = True
                yield event
            if ended:
                self.leaked += 1
        except (GeneratorExit, asyncio.CancelledError):
            self.leaked += 1
            raise

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "get_loads" and reply.loads:
            reply.loads[0].num_running_reqs += self.leaked
            reply.loads[0].num_total_reqs += self.leaked
        return reply


class LoadsHideRunning(EngineProxy):
    """GetLoads reports no running request, whatever runs."""

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "get_loads":
            for load in reply.loads:
                load.num_running_reqs = load.num_waiting_reqs = load.num_total_reqs = 0
                load.num_used_tokens = 0
        return reply


class EosIdsWrong(EngineProxy):
    """GetModelInfo names an end-of-sequence id that is not the one that ends outputs (a model
    whose config.json and generation_config.json disagree)."""

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "get_model_info":
            reply.eos_token_ids = [i + 1 for i in reply.eos_token_ids]
        return reply


def _abort_ids(request: Any) -> list[str]:
    """The ids an engine protocol's Abort names: vLLM's a list, SGLang's one."""
    return list(getattr(request, "request_ids", None) or [request.request_id])


class AbortMatchesPrefix(EngineProxy):
    """An Abort of an id also aborts every request in flight whose id starts with it (SGLang once
    matched request ids by prefix)."""

    async def unary(self, method: str, request: Any) -> Any:
        if method == "abort":
            ids = _abort_ids(request)
            for rid in [r for r in self.calls if any(r != i and r.startswith(i) for i in ids)]:
                await super().unary(method, self.abort_request(rid))
        return await super().unary(method, request)

    def abort_request(self, rid: str) -> Any:
        request = self.module.AbortRequest()
        if hasattr(request, "request_ids"):
            request.request_ids = [rid]
        else:
            request.request_id = rid
        return request


class AbortFirstIdOnly(EngineProxy):
    """vLLM's Abort takes a list; this one aborts its first id only."""

    async def unary(self, method: str, request: Any) -> Any:
        if method == "abort" and len(getattr(request, "request_ids", None) or []) > 1:
            request = type(request)(request_ids=list(request.request_ids)[:1])
        return await super().unary(method, request)


class AbortAlwaysSucceeds(EngineProxy):
    """SGLang's Abort answers success = true for every id, in flight or not."""

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "abort":
            reply.success = True
        return reply


class RequestIdNotEchoed(EngineProxy):
    """Only the first response carries the request id."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        first = True
        async for event in events:
            if not first:
                event.request_id = ""
            first = False
            yield event


class Unhealthy(EngineProxy):
    """HealthCheck answers healthy = false while the server serves."""

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "health_check":
            reply.healthy = False
        return reply


class HealthCheckSlow(EngineProxy):
    """HealthCheck answers healthy, after 3 s: a probe with a short deadline takes the server out."""

    async def unary(self, method: str, request: Any) -> Any:
        if method == "health_check":
            await asyncio.sleep(3.0)
        return await super().unary(method, request)


# what a dropped constraint fails: every shape, every refusal, the combinations that end in a shape;
# CONSTRAIN-3[greedy] and [seeded] compare runs, which agree without a constraint as well
CONSTRAINT_DROPPED = frozenset(
    {
        "CONSTRAIN-1[choice]",
        "CONSTRAIN-1[choice-literal]",
        "CONSTRAIN-1[ebnf]",
        "CONSTRAIN-1[json_object]",
        "CONSTRAIN-1[json_schema]",
        "CONSTRAIN-1[regex]",
        "CONSTRAIN-2[constraint.choice=empty-string]",
        "CONSTRAIN-2[constraint.choice=none]",
        "CONSTRAIN-2[constraint.ebnf=no-root]",
        "CONSTRAIN-2[constraint.ebnf=unterminated]",
        "CONSTRAIN-2[constraint.json_schema=not-json]",
        "CONSTRAIN-2[constraint.regex=unbalanced]",
        "CONSTRAIN-3[ignore_eos]",
        "CONSTRAIN-3[n=4]",
        "CONSTRAIN-3[stop-string]",
        "CONSTRAIN-4[remote-ref]",
    }
)


class ConstraintDropped(EngineProxy):
    """The request's structured-output constraint is dropped before the engine sees it (the dialect
    forgets the field): outputs are free text, and an invalid constraint is accepted."""

    async def upstream_stream(self, method: str, request: Any, deadline: Any) -> AsyncGenerator[Any]:
        params = getattr(request, "sampling_params", None)
        if params is not None:
            drop_constraint(params)
        async for reply in super().upstream_stream(method, request, deadline):
            yield reply


def drop_constraint(params: Any) -> None:
    """Clear the constraint oneof (vLLM, SGLang's scheduler) and SGLang's runtime fields."""
    with contextlib.suppress(ValueError, KeyError):
        member, _ = betterproto2.which_one_of(params, "constraint")
        if member:
            setattr(params, member, None)
    for name in ("guided_decoding", "json_schema", "regex"):
        if hasattr(params, name) and getattr(params, name) is not None and not _in_oneof(params, name):
            setattr(params, name, None)


def _in_oneof(params: Any, name: str) -> bool:
    with contextlib.suppress(ValueError, KeyError):
        return betterproto2.which_one_of(params, "constraint")[0] == name
    return False


class UnhealthyWhileBusy(EngineProxy):
    """HealthCheck answers healthy = false whenever a request is in flight (busy read as broken)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.in_flight = 0

    async def _generate(self, stream: Stream[Any, Any]) -> None:
        self.in_flight += 1
        try:
            await super()._generate(stream)
        finally:
            self.in_flight -= 1

    async def unary(self, method: str, request: Any) -> Any:
        reply = await super().unary(method, request)
        if method == "health_check" and self.in_flight:
            reply.healthy = False
        return reply


class TokenizerDigestWrong(EngineProxy):
    """The tokenizer bundle's sha256 is not the digest of its bytes (computed before a re-pack)."""

    async def replies(self, method: str, replies: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for reply in replies:
            if method == "get_tokenizer" and reply.sha256:
                reply.sha256 = hashlib.sha256(reply.sha256.encode()).hexdigest()
            yield reply


class TokenizerLastChunkEmpty(EngineProxy):
    """The bundle's last chunk carries its sha256 and none of its bytes, as a server that sends the
    digest in a chunk of its own after losing the last data: the zip arrives cut short."""

    async def replies(self, method: str, replies: AsyncIterator[Any]) -> AsyncIterator[Any]:
        chunks = [reply async for reply in replies]
        if method == "get_tokenizer" and chunks:
            chunks[-1].data = b""
        for chunk in chunks:
            yield chunk


# ── KV-cache events (SMG-6) ──────────────────────────────────
class KvBatchSkipped(EngineProxy):
    """Every KV event batch after a subscription's first is numbered one past its place, as a
    publisher that lost a batch under backpressure reports it: a gap the router cannot tell from a
    lost store."""

    async def upstream_stream(self, method: str, request: Any, deadline: Any) -> AsyncIterator[Any]:
        first = True
        async for reply in super().upstream_stream(method, request, deadline):
            if method == "subscribe_kv_events" and not first:
                reply.sequence_number += 1
            first = False
            yield reply


class KvParentsDropped(EngineProxy):
    """Stored events carry no parent hash: within one event the blocks still chain by order, but a
    prompt extending a cached prefix stores its new blocks as if they began a prompt."""

    async def upstream_stream(self, method: str, request: Any, deadline: Any) -> AsyncIterator[Any]:
        async for reply in super().upstream_stream(method, request, deadline):
            if method == "subscribe_kv_events":
                for event in reply.events:
                    if event.HasField("stored"):
                        event.stored.ClearField("parent_block_hash")
            yield reply


class KvReplayIgnoresCursor(EngineProxy):
    """A subscription's start_sequence_number is ignored: every subscriber gets the current state,
    so a router that resumes after a reconnect sees the snapshot instead of what it missed."""

    async def upstream_stream(self, method: str, request: Any, deadline: Any) -> AsyncIterator[Any]:
        if method == "subscribe_kv_events":
            request.start_sequence_number = 0
        async for reply in super().upstream_stream(method, request, deadline):
            yield reply


class KvClearedDropped(EngineProxy):
    """A flush is published as nothing: the cleared event is dropped (the router keeps routing the
    flushed prefixes to this replica)."""

    async def upstream_stream(self, method: str, request: Any, deadline: Any) -> AsyncIterator[Any]:
        async for reply in super().upstream_stream(method, request, deadline):
            if method == "subscribe_kv_events" and not reply.HasField("snapshot"):
                kept = [e for e in reply.events if not e.HasField("cleared")]
                del reply.events[:]
                reply.events.extend(kept)
            yield reply


class KvBlocksReversed(EngineProxy):
    """A stored event lists its blocks child first (the order of a cache walked from the leaf), so
    the chain the router rebuilds from the list is upside down."""

    async def upstream_stream(self, method: str, request: Any, deadline: Any) -> AsyncIterator[Any]:
        async for reply in super().upstream_stream(method, request, deadline):
            if method == "subscribe_kv_events":
                for event in reply.events:
                    if event.HasField("stored") and len(event.stored.blocks) > 1:
                        blocks = list(reversed(event.stored.blocks))
                        del event.stored.blocks[:]
                        event.stored.blocks.extend(blocks)
            yield reply


class AnswersSglangHealth(EngineProxy):
    """The port also answers SGLang's HealthCheck OK, so smg (which probes SGLang first) takes it for
    an SGLang worker."""

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()

        async def healthy(stream: Stream[Any, Any]) -> None:
            await stream.recv_message()
            await stream.send_message(RawMessage(bytes(sglang.HealthCheckResponse(healthy=True))))

        mapping["/sglang.grpc.scheduler.SglangScheduler/HealthCheck"] = Handler(
            healthy, Cardinality.UNARY_UNARY, RawMessage, RawMessage
        )
        return mapping


# ── correct variants ─────────────────────────────────────────
def _split_logprobs(native: Any, i: int) -> Any:
    if native is None:
        return None
    return type(native)(
        token_logprobs=native.token_logprobs[i : i + 1],
        token_ids=native.token_ids[i : i + 1],
        top_logprobs=native.top_logprobs[i : i + 1],
    )


async def one_token_chunks(protocol: str, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The same stream with one chunk per token, each with its counts in the protocol's own
    semantics (vLLM: the chunk's; SGLang: the output's so far)."""
    cumulative = protocol == "sglang-scheduler"
    async for event in events:
        part = body(event)
        if kind(event) != "chunk" or len(part.token_ids) < 2:
            yield event
            continue
        before = part.completion_tokens - len(part.token_ids)
        for i, token in enumerate(part.token_ids):
            one = clone(event)
            chunk = body(one)
            chunk.token_ids = [token]
            chunk.output_logprobs = _split_logprobs(part.output_logprobs, i)
            chunk.completion_tokens = before + i + 1 if cumulative else 1
            yield one


class OneTokenChunks(EngineProxy):
    """Correct, but chunked differently: one chunk per token."""

    def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        return one_token_chunks(self.protocol, events)


class CompleteRepeatsAll(EngineProxy):
    """Correct, but a streaming complete repeats every id of its output and their count (what the
    SGLang servicer does; smg reads neither for vLLM)."""

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        ids: dict[int, list[int]] = {}
        async for event in events:
            part = body(event)
            if kind(event) == "chunk":
                ids.setdefault(part.index, []).extend(part.token_ids)
            elif kind(event) == "complete" and call.streaming:
                part.output_ids = list(ids.get(part.index, []))
                part.completion_tokens = len(part.output_ids)
            yield event
