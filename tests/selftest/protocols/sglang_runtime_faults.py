"""The sglang-runtime mutant zoo: the reference server's ``sglang.runtime.v1.SglangService`` behind a
proxy with exactly one fault, each declaring the cases that must fail against it, no more and no
fewer. The faults are the ways SGLang's native stream has hurt its clients (notes/protocols.md):
cumulative read as delta and back, the last ids lost, stringly-typed ``meta_info`` gone wrong, a
finish flag that lies, an Abort that misses outputs; and in the RPCs beside Generate: stop strings
on the text path, the embeddings, Score and Rerank, and the administration (FlushCache, the pause
modes, the profiler, weight updates). Controls are correct variants that must pass every case."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from grpclib import GRPCError, Status

from lmrpc._gen.sglang.runtime import v1 as rt

from .engine_faults import COMPARES_RUNS, CONSTRAINT_DROPPED
from .engine_faults import ConstraintDropped as ConstraintDroppedFault
from .engine_proxy import EngineCall, RuntimeProxy

# The state machine's random programs race aborts, cancels and deadlines against generation: a
# fault in how outputs end may trip one of its invariants in a run, or not.
STATE_MACHINE = frozenset({"*[stateful]"})


def meta(response: Any) -> dict[str, Any]:
    return {key: json.loads(text) for key, text in response.meta_info.items()}


def set_meta(response: Any, values: dict[str, Any]) -> Any:
    response.meta_info = {key: json.dumps(value) for key, value in values.items()}
    return response


def finished_reason(response: Any) -> dict[str, Any] | None:
    reason = meta(response).get("finish_reason")
    return reason if isinstance(reason, dict) else None


def index_of(response: Any) -> int:
    return int(meta(response).get("index", 0))


# ── constraints, however they are carried ───────────────────────
class TextGenerateRewrite(RuntimeProxy):
    """Edits every TextGenerate's sampling_params (``edit``) before forwarding it."""

    def edit(self, params: rt.SamplingParams) -> None:
        raise NotImplementedError

    async def upstream_stream(self, method: str, request: Any, deadline: Any) -> AsyncIterator[Any]:
        if method == "text_generate" and request.sampling_params is not None:
            self.edit(request.sampling_params)
        async for reply in super().upstream_stream(method, request, deadline):
            yield reply


class LegacyConstraintDropped(TextGenerateRewrite):
    """The deprecated regex and json_schema fields are read as nothing: only guided_decoding binds."""

    name = "runtime-legacy-constraint-dropped"
    # a legacy field beside guided_decoding is then gone too: the two are no longer refused
    expected = frozenset({"CONSTRAIN-1[legacy-fields]", "CONSTRAIN-2[legacy-with-guided]"})

    def edit(self, params: rt.SamplingParams) -> None:
        params.regex = params.json_schema = None


class TextGenerateUnconstrained(TextGenerateRewrite):
    """TextGenerate forgets guided_decoding (only Generate's path reads it); a legacy field still binds."""

    name = "runtime-text-generate-unconstrained"
    # without its guided_decoding, a request that also carried a legacy field has one constraint
    expected = frozenset({"CONSTRAIN-1[text-generate]", "CONSTRAIN-2[legacy-with-guided]"})

    def edit(self, params: rt.SamplingParams) -> None:
        params.guided_decoding = None


class LegacyBesideGuidedTaken(TextGenerateRewrite):
    """A legacy field beside guided_decoding is silently dropped instead of refused."""

    name = "runtime-legacy-beside-guided-taken"
    expected = frozenset({"CONSTRAIN-2[legacy-with-guided]"})

    def edit(self, params: rt.SamplingParams) -> None:
        if params.guided_decoding is not None:
            params.regex = params.json_schema = None


# ── cumulative or delta ──────────────────────────────────────
class DeltaIds(RuntimeProxy):
    """Generate's streamed responses carry only their new ids while the server declares nothing
    (incremental_streaming_output false): the delta/cumulative mix-up."""

    name = "runtime-delta-ids"
    expected = frozenset({"SRT-1[ids]"})

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        sent: dict[int, int] = {}
        async for response in events:
            index = index_of(response)
            if call.streaming:
                ids = list(response.output_ids)
                response.output_ids = ids[sent.get(index, 0) :]
                sent[index] = len(ids)
            yield response


class DeltaText(RuntimeProxy):
    """TextGenerate's streamed responses carry only their new text (Generate's stay cumulative)."""

    name = "runtime-delta-text"
    expected = frozenset({"SRT-1[text]", "STOP-1[text-generate]"})  # the output's text read as cumulative

    async def replies(self, method: str, replies: AsyncIterator[Any]) -> AsyncIterator[Any]:
        sent: dict[int, int] = {}
        async for response in replies:
            if method == "text_generate":
                index = index_of(response)
                text = response.text
                response.text = text[sent.get(index, 0) :]
                sent[index] = len(text)
            yield response


class DeclaresIncremental(RuntimeProxy):
    """GetServerInfo declares incremental_streaming_output while every stream is cumulative."""

    name = "runtime-declares-incremental"
    expected = frozenset({"SRT-1[ids]", "SRT-1[text]", "STOP-1[text-generate]"})
    # the logprob lists of an output streamed over several responses, read as the declared deltas,
    # come out doubled: a case that drew such a request (the pool's STREAM-7) sees it
    triggered_by = frozenset({"generate.return_logprobs"})

    async def unary(self, method: str, request: Any) -> Any:
        reply = await self.forward(method, request)
        if method == "get_server_info":
            info = json.loads(reply.json_info)
            info["incremental_streaming_output"] = True
            reply.json_info = json.dumps(info)
        return reply


class LastIdsLost(RuntimeProxy):
    """The last id of every output reaches no response: the finished response repeats the ids of the
    one before it (the last tokens lost, sgl-project/sglang#19895)."""

    name = "runtime-last-ids-lost"
    expected = frozenset(
        {
            "ABORT-2[mid-stream]",
            "ABORT-4[n=2]",
            "ABORT-4[n=4]",
            "ABORT-5",
            "ADMIN-2[native-refused]",
            "FINISH-2",
            "LIFE-3[native-flush]",
            "LIFE-3[pause-abort]",
            "LIFE-3[pause-retract]",
            "N-1",
            "SRT-1[ids]",
            "SRT-4[abort_all]",
            "SRT-4[one-of-two]",
            "SRT-4[rid]",
            "STOP-3",
            "STOP-3[n=2]",
            "STREAM-7",
            "STREAM-8[greedy]",
            "USAGE-5",
        }
    )
    tolerated = (
        COMPARES_RUNS
        | STATE_MACHINE
        | {
            "ABORT-2[before-first-token]",
            "ABORT-2[right-after-send]",
            "FINISH-5",
            "N-1[n=2]",
            "N-1[n=4]",
            "STOP-5[default]",
        }
    )  # which outputs of an unseeded n > 1 request end at EOS (and lose their last id) varies

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        held: dict[int, Any] = {}
        async for response in events:
            index = index_of(response)
            if not call.streaming:
                yield response
                continue
            if finished_reason(response) is None:
                if index in held:
                    yield held.pop(index)
                held[index] = response
                continue
            previous = held.pop(index, None)
            response.output_ids = list(previous.output_ids)[:-1] if previous is not None else []
            yield response


class LogprobsNotCumulative(RuntimeProxy):
    """output_token_logprobs carries only the new tokens' entries while the ids are cumulative."""

    name = "runtime-logprobs-delta"
    expected = frozenset({"STREAM-7"})

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        sent: dict[int, int] = {}
        async for response in events:
            values = meta(response)
            tuples = values.get("output_token_logprobs")
            if call.streaming and isinstance(tuples, list) and finished_reason(response) is None:
                index = index_of(response)
                values["output_token_logprobs"] = tuples[sent.get(index, 0) :]
                sent[index] = len(tuples)
                set_meta(response, values)
            yield response


# ── meta_info ────────────────────────────────────────────────
class BareId(RuntimeProxy):
    """meta_info's id is written as bare text, not as JSON (a client's json.loads fails)."""

    name = "runtime-meta-bare-id"
    expected = frozenset({"SRT-1[text]", "SRT-2", "SRT-4[abort_all]", "SRT-4[one-of-two]", "SRT-4[rid]"})

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            response.meta_info["id"] = meta(response)["id"]
            yield response

    async def replies(self, method: str, replies: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in replies:
            if method == "text_generate":
                response.meta_info["id"] = meta(response)["id"]
            yield response


class NumbersAsStrings(RuntimeProxy):
    """meta_info's token counts are JSON strings ("12" quoted), not numbers."""

    name = "runtime-meta-numbers-as-strings"
    expected = frozenset({"SRT-2", "SRT-4[abort_all]", "SRT-4[one-of-two]", "SRT-4[rid]"})

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            values = meta(response)
            for key in ("prompt_tokens", "completion_tokens", "cached_tokens"):
                values[key] = str(values[key])
            yield set_meta(response, values)


class CompletionTokensPerResponse(RuntimeProxy):
    """completion_tokens counts the response's new ids, not the output's so far."""

    name = "runtime-completion-tokens-delta"
    expected = frozenset({"SRT-2", "USAGE-5"})

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        sent: dict[int, int] = {}
        async for response in events:
            index = index_of(response)
            total = len(response.output_ids)
            values = meta(response)
            if call.streaming and finished_reason(response) is None:
                values["completion_tokens"] = total - sent.get(index, 0)
                sent[index] = total
            yield set_meta(response, values)


class PromptTokensPlusOne(RuntimeProxy):
    """prompt_tokens counts a BOS token the server never ran."""

    name = "runtime-prompt-tokens-plus-one"
    expected = frozenset({"SRT-2", "USAGE-2"})

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            values = meta(response)
            values["prompt_tokens"] += 1
            yield set_meta(response, values)


class CachedOverPrompt(RuntimeProxy):
    """cached_tokens on the finished response exceeds prompt_tokens (a count of cached blocks' slots)."""

    name = "runtime-cached-over-prompt"
    expected = frozenset(
        {"LIFE-3[native-flush]", "SRT-2", "USAGE-4", "USAGE-7[after-flush]", "USAGE-7[fresh-prompt]"}
    )

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            values = meta(response)
            if finished_reason(response) is not None:
                values["cached_tokens"] = values["prompt_tokens"] + 16
            yield set_meta(response, values)


class IndexMissing(RuntimeProxy):
    """meta_info has no index: the outputs of an n > 1 request cannot be told apart."""

    name = "runtime-index-missing"
    expected = frozenset(
        {
            "ABORT-4[n=2]",
            "ABORT-4[n=4]",
            "ABORT-5",
            "FINISH-1",
            "FINISH-3",
            "LIFE-3[pause-abort]",
            "N-1",
            "N-1[n=2]",
            "N-1[n=4]",
            "SAMPLE-2[n]",
            "SRT-1[text]",
            "SRT-3",
            "SRT-4[abort_all]",
            "SRT-4[rid]",
            "STREAM-2",
            "STREAM-7",
            "USAGE-5",
        }
    )
    tolerated = STATE_MACHINE

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            values = meta(response)
            values.pop("index", None)
            yield set_meta(response, values)

    async def replies(self, method: str, replies: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in replies:
            if method == "text_generate":
                values = meta(response)
                values.pop("index", None)
                set_meta(response, values)
            yield response


class FinishReasonString(RuntimeProxy):
    """finish_reason is a bare string ("stop") instead of SGLang's object."""

    name = "runtime-finish-reason-string"
    expected = frozenset(
        {
            "FINISH-5",
            "FINISH-6[stop-at-max-tokens]",
            "SRT-2",
            "SRT-4[abort_all]",
            "SRT-4[one-of-two]",
            "SRT-4[rid]",
            "STOP-3",
            "STOP-3[n=2]",
            "STOP-5[default]",
        }
    )
    tolerated = STATE_MACHINE

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            values = meta(response)
            reason = values.get("finish_reason")
            if isinstance(reason, dict):
                values["finish_reason"] = reason.get("type")
            yield set_meta(response, values)


class RidNotEchoed(RuntimeProxy):
    """meta_info's id is an id the server made up, not the rid the client sent."""

    name = "runtime-rid-not-echoed"
    expected = frozenset({"SRT-2", "SRT-4[abort_all]", "SRT-4[one-of-two]", "SRT-4[rid]"})

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            values = meta(response)
            values["id"] = f"srv-{values['id']}"
            yield set_meta(response, values)


# ── finished ─────────────────────────────────────────────────
class FinishedFlagMissing(RuntimeProxy):
    """An output's finished response (finish_reason set) says finished = false."""

    name = "runtime-finished-flag-missing"
    expected = frozenset({"SRT-3", "SRT-4[abort_all]", "SRT-4[one-of-two]", "SRT-4[rid]"})

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            response.finished = False
            yield response


class FinishedOnEveryResponse(RuntimeProxy):
    """Every response says finished = true, also before its output's finish reason."""

    name = "runtime-finished-early"
    expected = frozenset({"SRT-3", "SRT-4[abort_all]", "SRT-4[one-of-two]", "SRT-4[rid]"})

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            response.finished = True
            yield response


class FinishRepeated(RuntimeProxy):
    """Output 0's finished response is sent twice."""

    name = "runtime-finish-repeated"
    expected = frozenset(
        {
            "ABORT-2[before-first-token]",
            "ABORT-2[mid-stream]",
            "ABORT-2[right-after-send]",
            "ABORT-5",
            "FINISH-1",
            "FINISH-3",
            "N-1[n=2]",
            "N-1[n=4]",
            "SRT-3",
            "SRT-4[abort_all]",
            "SRT-4[one-of-two]",
            "SRT-4[rid]",
            "USAGE-7[after-flush]",
            "USAGE-7[fresh-prompt]",
        }
    )
    tolerated = STATE_MACHINE

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            yield response
            if finished_reason(response) is not None and index_of(response) == 0:
                yield rt.GenerateResponse.parse(bytes(response))


# ── abort ────────────────────────────────────────────────────
class AbortSuccessFalse(RuntimeProxy):
    """Abort(rid) carries out the abort but answers success = false."""

    name = "runtime-abort-success-false"
    expected = frozenset({"SRT-4[one-of-two]", "SRT-4[rid]"})

    async def unary(self, method: str, request: Any) -> Any:
        reply = await self.forward(method, request)
        if method == "abort" and request.rid:
            reply.success = False
        return reply


class AbortAllNoop(RuntimeProxy):
    """abort_all answers success and aborts nothing."""

    name = "runtime-abort-all-noop"
    expected = frozenset({"SRT-4[abort_all]", "ABORT-5"})

    async def unary(self, method: str, request: Any) -> Any:
        if method == "abort" and request.abort_all:
            return rt.AbortResponse(success=True)
        return await self.forward(method, request)


class AbortMissesOutputs(RuntimeProxy):
    """An aborted n > 1 request ends output 0 only: the other outputs' abort finish never comes
    (sgl-project/sglang#32588: abort not reaching n > 1 outputs)."""

    name = "runtime-abort-misses-outputs"
    expected = frozenset(
        {"ABORT-4[n=2]", "ABORT-4[n=4]", "ABORT-5", "LIFE-3[pause-abort]", "SRT-4[abort_all]", "SRT-4[rid]"}
    )
    tolerated = STATE_MACHINE

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            reason = finished_reason(response)
            if reason is not None and reason.get("type") == "abort" and index_of(response) > 0:
                continue
            yield response


class AbortAsStop(RuntimeProxy):
    """An aborted output's finish reason says "stop"."""

    name = "runtime-abort-as-stop"
    expected = frozenset(
        {
            "ABORT-2[before-first-token]",
            "ABORT-2[mid-stream]",
            "ABORT-2[right-after-send]",
            "ABORT-4[n=2]",
            "ABORT-4[n=4]",
            "ABORT-5",
            "LIFE-3[pause-abort]",
            "SRT-4[abort_all]",
            "SRT-4[one-of-two]",
            "SRT-4[rid]",
        }
    )
    tolerated = STATE_MACHINE

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            values = meta(response)
            reason = values.get("finish_reason")
            if isinstance(reason, dict) and reason.get("type") == "abort":
                values["finish_reason"] = {"type": "stop", "matched": None}
                set_meta(response, values)
            yield response


# ── the other RPCs ───────────────────────────────────────────
class LoadNeverIdle(RuntimeProxy):
    """GetLoad counts one running request more than there is (a gateway never sees it idle)."""

    name = "runtime-load-never-idle"
    expected = frozenset({"LOAD-1[idle]"})

    async def unary(self, method: str, request: Any) -> Any:
        reply = await self.forward(method, request)
        if method == "get_load":
            ranks = json.loads(reply.json_info)
            for rank in ranks:
                rank["num_running_reqs"] += 1
            reply.json_info = json.dumps(ranks)
        return reply


class LoadTokensUnreported(RuntimeProxy):
    """GetLoad says no KV token is in use whatever runs (an unknown count read as 0)."""

    name = "runtime-load-tokens-unreported"
    expected = frozenset({"LOAD-1[ground-truth]"})

    async def unary(self, method: str, request: Any) -> Any:
        reply = await self.forward(method, request)
        if method == "get_load":
            ranks = json.loads(reply.json_info)
            for rank in ranks:
                rank["num_used_tokens"] = 0
            reply.json_info = json.dumps(ranks)
        return reply


class PauseIgnored(RuntimeProxy):
    """PauseGeneration answers and pauses nothing."""

    name = "runtime-pause-ignored"
    expected = frozenset({"LIFE-3[pause]", "LIFE-3[pause-abort]", "LIFE-3[pause-retract]"})

    async def unary(self, method: str, request: Any) -> Any:
        if method == "pause_generation":
            return rt.PauseGenerationResponse(message="paused")
        return await self.forward(method, request)


# ── stop strings on the text path (TextGenerate) ─────────────
def _matched_string(response: Any) -> str | None:
    reason = finished_reason(response)
    matched = reason.get("matched") if reason is not None and reason.get("type") == "stop" else None
    return matched if isinstance(matched, str) else None


class TextStopKept(RuntimeProxy):
    """TextGenerate keeps the matched stop string in the output's text (no_stop_trim read as true)."""

    name = "runtime-text-stop-kept"
    expected = frozenset({"STOP-1[text-generate]", "STOP-2[text-generate]"})

    async def replies(self, method: str, replies: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in replies:
            matched = _matched_string(response) if method == "text_generate" else None
            if matched is not None:
                response.text += matched
            yield response


class TextFirstStopOnly(RuntimeProxy):
    """TextGenerate honours only the first entry of its stop list (later stop strings dropped)."""

    name = "runtime-text-first-stop-only"
    expected = frozenset({"STOP-2[text-generate]"})

    def upstream_stream(self, method: str, request: Any, deadline: Any) -> AsyncGenerator[Any]:
        if method == "text_generate" and request.sampling_params is not None:
            request.sampling_params.stop = list(request.sampling_params.stop)[:1]
        return super().upstream_stream(method, request, deadline)


class TextStopMatchedNull(RuntimeProxy):
    """TextGenerate's finish reason for a stop string says "stop" and matched null."""

    name = "runtime-text-stop-matched-null"
    expected = frozenset({"FINISH-5[text-generate]"})

    async def replies(self, method: str, replies: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in replies:
            if method == "text_generate" and _matched_string(response) is not None:
                values = meta(response)
                values["finish_reason"] = {"type": "stop", "matched": None}
                set_meta(response, values)
            yield response


# ── embeddings ───────────────────────────────────────────────
def _body(reply: Any) -> Any:
    return json.loads(reply.json_body)


def _with_body(reply: Any, body: Any) -> Any:
    reply.json_body = json.dumps(body).encode()
    return reply


class OpenAIEmbedReversed(RuntimeProxy):
    """OpenAIEmbed answers a batch in reverse order, each entry's index renumbered to its place."""

    name = "runtime-openai-embed-reversed"
    expected = frozenset({"EMBED-1"})

    async def unary(self, method: str, request: Any) -> Any:
        reply = await self.forward(method, request)
        if method == "open_a_i_embed" and reply.status_code == 200:  # the proxy's name of OpenAIEmbed
            body = _body(reply)
            body["data"] = [{**d, "index": i} for i, d in enumerate(reversed(body["data"]))]
            _with_body(reply, body)
        return reply


class TextEmbedUnnormalized(RuntimeProxy):
    """TextEmbed answers the vector scaled by 2 (a pooler that does not normalize), unlike OpenAIEmbed."""

    name = "runtime-text-embed-unnormalized"
    expected = frozenset({"EMBED-1[native]"})

    async def unary(self, method: str, request: Any) -> Any:
        reply = await self.forward(method, request)
        if method == "text_embed":
            reply.embedding = [2 * v for v in reply.embedding]
        return reply


class EmbedRidNotEchoed(RuntimeProxy):
    """TextEmbed's and Embed's meta_info id is one the server made up, not the rid sent."""

    name = "runtime-embed-rid-not-echoed"
    expected = frozenset({"EMBED-3[native]"})

    async def unary(self, method: str, request: Any) -> Any:
        reply = await self.forward(method, request)
        if method in ("text_embed", "embed"):
            values = meta(reply)
            values["id"] = f"srv-{values['id']}"
            set_meta(reply, values)
        return reply


# ── Score and Rerank ─────────────────────────────────────────
class ScoreReversed(RuntimeProxy):
    """Score answers its items' scores in reverse order."""

    name = "runtime-score-reversed"
    expected = frozenset({"SCORE-1[native]"})

    async def unary(self, method: str, request: Any) -> Any:
        reply = await self.forward(method, request)
        if method == "score" and reply.status_code == 200:
            body = _body(reply)
            body["scores"] = list(reversed(body["scores"]))
            _with_body(reply, body)
        return reply


class RerankTiesByHigherIndex(RuntimeProxy):
    """Rerank orders documents of equal score by the higher index first."""

    name = "runtime-rerank-ties-reversed"
    expected = frozenset({"SCORE-2[native]"})

    async def unary(self, method: str, request: Any) -> Any:
        reply = await self.forward(method, request)
        if method == "rerank" and reply.status_code == 200:
            results = _body(reply)
            _with_body(reply, sorted(results, key=lambda r: (-r["score"], -r["index"])))
        return reply


# ── administration ───────────────────────────────────────────
class FlushAbortsRequests(RuntimeProxy):
    """FlushCache ends every request in flight (it frees their KV cache too)."""

    name = "runtime-flush-aborts"
    expected = frozenset({"LIFE-3[native-flush]"})

    async def unary(self, method: str, request: Any) -> Any:
        if method == "flush_cache":
            await self.forward("abort", rt.AbortRequest(abort_all=True))
        return await self.forward(method, request)


class FlushNoop(RuntimeProxy):
    """FlushCache answers success and flushes nothing."""

    name = "runtime-flush-noop"
    expected = frozenset({"LIFE-3[native-flush]"})
    tolerated = frozenset({"USAGE-7[after-flush]"})  # fails where an earlier case left its prompt cached

    async def unary(self, method: str, request: Any) -> Any:
        if method == "flush_cache":
            return rt.FlushCacheResponse(success=True, message="Cache flushed.")
        return await self.forward(method, request)


class PauseAbortKeepsRequests(RuntimeProxy):
    """PauseGeneration(mode="abort") pauses the requests in flight in place instead of ending them."""

    name = "runtime-pause-abort-in-place"
    expected = frozenset({"LIFE-3[pause-abort]"})

    async def unary(self, method: str, request: Any) -> Any:
        if method == "pause_generation" and request.mode == "abort":
            request.mode = "in_place"
        return await self.forward(method, request)


class PauseRetractAborts(RuntimeProxy):
    """PauseGeneration(mode="retract") ends the requests in flight (as mode "abort" does)."""

    name = "runtime-pause-retract-aborts"
    expected = frozenset({"LIFE-3[pause-retract]"})

    async def unary(self, method: str, request: Any) -> Any:
        if method == "pause_generation" and request.mode == "retract":
            request.mode = "abort"
        return await self.forward(method, request)


class ProfileStartedTwice(RuntimeProxy):
    """StartProfile while a recording runs answers OK (as if it had started one)."""

    name = "runtime-profile-started-twice"
    expected = frozenset({"ADMIN-1[native]"})

    async def unary(self, method: str, request: Any) -> Any:
        try:
            return await self.forward(method, request)
        except GRPCError as exc:  # FAILED_PRECONDITION, or SGLang's INTERNAL: already recording
            if method == "start_profile" and exc.status is not Status.UNIMPLEMENTED:
                return rt.StartProfileResponse(message="Profiling started.")
            raise


class UpdateRefusalAsSuccess(RuntimeProxy):
    """UpdateWeightsFromDisk answers success = true for a path it refused (the failure swallowed)."""

    name = "runtime-update-refusal-as-success"
    expected = frozenset({"ADMIN-2[native-refused]"})

    async def unary(self, method: str, request: Any) -> Any:
        try:
            reply = await self.forward(method, request)
        except GRPCError as exc:
            if method != "update_weights_from_disk" or exc.status is Status.UNIMPLEMENTED:
                raise
            return rt.UpdateWeightsResponse(success=True, message="Succeeded to update model weights.")
        if method == "update_weights_from_disk":
            reply.success = True
        return reply


class UpdateLoadFails(RuntimeProxy):
    """UpdateWeightsFromDisk of a loadable checkpoint answers success = false (and loads nothing)."""

    name = "runtime-update-load-fails"
    expected = frozenset({"ADMIN-2[native-reload]"})

    async def unary(self, method: str, request: Any) -> Any:
        if method == "update_weights_from_disk":
            return rt.UpdateWeightsResponse(success=False, message="Failed to load the checkpoint.")
        return await self.forward(method, request)


# ── controls ─────────────────────────────────────────────────
class MetaInOtherOrder(RuntimeProxy):
    """Control: meta_info's keys in another order (a map has none); must pass everything."""

    name = "runtime-control-meta-order"
    is_control = True

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for response in events:
            response.meta_info = dict(sorted(response.meta_info.items(), reverse=True))
            yield response


class LastIdsInFinished(RuntimeProxy):
    """Control: an output's last ids arrive only in its finished response (SGLang's own server sends
    the last token with the finish); the stream is cumulative, so nothing is lost."""

    name = "runtime-control-last-ids-in-finished"
    is_control = True

    async def transform(self, call: EngineCall, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        held: dict[int, Any] = {}
        async for response in events:
            index = index_of(response)
            if call.streaming and finished_reason(response) is None:
                if index in held:
                    yield held.pop(index)
                held[index] = response
                continue
            held.pop(index, None)
            yield response
        for response in held.values():
            yield response


class ConstraintDropped(ConstraintDroppedFault, RuntimeProxy):
    name = "runtime-constraint-dropped"
    # no seed: CONSTRAIN-3[n=4] skips; TextGenerate's constraints, however carried, are dropped too
    expected = (CONSTRAINT_DROPPED - {"CONSTRAIN-3[n=4]"}) | {
        "CONSTRAIN-1[legacy-fields]",
        "CONSTRAIN-1[text-generate]",
        "CONSTRAIN-2[legacy-with-guided]",
    }


SGLANG_RUNTIME_MUTANTS: tuple[type[RuntimeProxy], ...] = (
    LegacyConstraintDropped,
    TextGenerateUnconstrained,
    LegacyBesideGuidedTaken,
    DeltaIds,
    DeltaText,
    DeclaresIncremental,
    LastIdsLost,
    LogprobsNotCumulative,
    BareId,
    NumbersAsStrings,
    CompletionTokensPerResponse,
    PromptTokensPlusOne,
    CachedOverPrompt,
    IndexMissing,
    FinishReasonString,
    RidNotEchoed,
    FinishedFlagMissing,
    FinishedOnEveryResponse,
    FinishRepeated,
    AbortSuccessFalse,
    AbortAllNoop,
    AbortMissesOutputs,
    AbortAsStop,
    LoadNeverIdle,
    LoadTokensUnreported,
    PauseIgnored,
    TextStopKept,
    TextFirstStopOnly,
    TextStopMatchedNull,
    OpenAIEmbedReversed,
    TextEmbedUnnormalized,
    EmbedRidNotEchoed,
    ScoreReversed,
    RerankTiesByHigherIndex,
    FlushAbortsRequests,
    FlushNoop,
    PauseAbortKeepsRequests,
    PauseRetractAborts,
    ProfileStartedTwice,
    UpdateRefusalAsSuccess,
    UpdateLoadFails,
    MetaInOtherOrder,
    LastIdsInFinished,
    ConstraintDropped,
)
