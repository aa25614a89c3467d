"""One-fault mutants of an OpenAI-compatible server, each modelled on a bug real servers have had,
each declaring exactly the cases of the OpenAI profile that must catch it (``expected``) and those
that may see the same fault too (``tolerated``)."""

from __future__ import annotations

from typing import Any, ClassVar

from .output_mutants import OUTPUT_MUTANTS
from .proxy import DONE, Call, Mutant, chunk, dump


def _choices(value: dict[str, Any]) -> list[dict[str, Any]]:
    found = value.get("choices")
    return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


def _content_key(call: Call) -> str:
    return "content" if call.chat else "text"


def _delta(call: Call, choice: dict[str, Any]) -> dict[str, Any]:
    if not call.chat:
        return choice
    delta = choice.setdefault("delta", {})
    return delta if isinstance(delta, dict) else {}


class EveryAnswer(Mutant):
    """A fault in what answers say: ``fix`` changes each JSON body and each chunk of a stream
    (``in_bodies = False``: streams only)."""

    in_bodies: ClassVar[bool] = True

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        raise NotImplementedError

    def body(self, call: Call, status: int, body: Any) -> tuple[int, Any]:
        if self.in_bodies and isinstance(body, dict):
            self.fix(call, body)
        return status, body

    def event(self, call: Call, data: str) -> list[str]:
        value = chunk(data)
        if value is None:
            return [data]
        self.fix(call, value)
        return [dump(value)]


class UsageOneChoice(EveryAnswer):
    """usage.completion_tokens counts one choice of n (llama.cpp's n>1 usage)."""

    name = "usage-one-choice"
    expected = frozenset({"USAGE-3[openai,pool]", "N-2[openai]"})

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        usage = value.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int) and call.n > 1:
            usage["completion_tokens"] //= call.n
            usage["total_tokens"] = usage.get("prompt_tokens", 0) + usage["completion_tokens"]


class UsageChunkMissing(Mutant):
    """stream_options.include_usage is accepted and no usage chunk comes."""

    name = "usage-chunk-missing"
    # one cause, one verdict: the usage cases that need the chunk are n/a, CAP-1 holds the finding
    expected = frozenset({"CAP-1[openai,include_usage]"})

    def event(self, call: Call, data: str) -> list[str]:
        value = chunk(data)
        if value is not None and value.get("usage") is not None and not _choices(value):
            return []
        return [data]


class UsageChunkTwice(Mutant):
    """The usage chunk is sent twice."""

    name = "usage-chunk-twice"
    expected = frozenset({"USAGE-1[openai,pool]", "USAGE-1[openai,stream]"})

    def event(self, call: Call, data: str) -> list[str]:
        value = chunk(data)
        if value is not None and value.get("usage") is not None and not _choices(value):
            return [data, data]
        return [data]


class UsageNotLast(Mutant):
    """The usage chunk comes before the last choice chunk."""

    name = "usage-not-last"
    buffered = True
    expected = frozenset({"USAGE-1[openai,pool]", "USAGE-1[openai,stream]"})

    def whole_stream(self, call: Call, events: list[str]) -> list[str]:
        usage = [
            i for i, e in enumerate(events) if (c := chunk(e)) is not None and c.get("usage") is not None
        ]
        if not usage or usage[0] < 2:
            return events
        moved = events.pop(usage[0])
        events.insert(usage[0] - 1, moved)
        return events


class UsageWithChoices(Mutant):
    """The usage rides on the last choice chunk instead of a chunk of its own with empty choices
    (llama.cpp's completions stream)."""

    name = "usage-with-choices"
    buffered = True
    expected = frozenset({"USAGE-1[openai,pool]", "USAGE-1[openai,stream]"})

    def whole_stream(self, call: Call, events: list[str]) -> list[str]:
        usage = [
            i for i, e in enumerate(events) if (c := chunk(e)) is not None and c.get("usage") is not None
        ]
        if not usage or usage[0] < 1:
            return events
        value, previous = chunk(events[usage[0]]), chunk(events[usage[0] - 1])
        if value is None or previous is None:
            return events
        previous["usage"] = value["usage"]
        events[usage[0] - 1] = dump(previous)
        del events[usage[0]]
        return events


class DoneMissing(Mutant):
    """The stream ends without data: [DONE] and without an error event."""

    name = "done-missing"
    expected = frozenset({"FINISH-3[openai,pool]", "ERR-2[openai,pool]"})

    def event(self, call: Call, data: str) -> list[str]:
        return [] if data.strip() == DONE else [data]


class TwoFinishReasons(Mutant):
    """A choice gets a finish_reason twice (a second, empty chunk repeats it)."""

    name = "two-finish-reasons"
    expected = frozenset({"FINISH-1[openai,pool]"})

    def event(self, call: Call, data: str) -> list[str]:
        value = chunk(data)
        if value is None or not any(c.get("finish_reason") for c in _choices(value)):
            return [data]
        repeat = dict(value)
        repeat["choices"] = [
            {
                "index": c.get("index"),
                "finish_reason": c["finish_reason"],
                **({"delta": {}} if call.chat else {"text": ""}),
            }
            for c in _choices(value)
            if c.get("finish_reason")
        ]
        return [data, dump(repeat)]


class ContentAfterFinish(Mutant):
    """The last piece of content arrives after its choice's finish_reason."""

    name = "content-after-finish"
    buffered = True
    expected = frozenset({"FINISH-1[openai,pool]", "FINISH-2[openai,greedy]"})
    tolerated = frozenset(
        {"STOP-2[openai,*]", "STOP-6[openai]", "CANCEL-3[openai]", "STREAM-2[openai,response_format]"}
    )

    def whole_stream(self, call: Call, events: list[str]) -> list[str]:
        key = _content_key(call)
        for i in range(len(events) - 1, 0, -1):
            value = chunk(events[i])
            if value is None or not any(c.get("finish_reason") for c in _choices(value)):
                continue
            for j in range(i - 1, -1, -1):
                earlier = chunk(events[j])
                pieces = [_delta(call, c) for c in _choices(earlier or {})]
                if earlier is not None and any(p.get(key) for p in pieces):
                    events.insert(i, events.pop(j))  # after the finish chunk, which moved up to i - 1
                    return events
        return events


class StopLeaked(Mutant):
    """A matched stop string leaks into the content, split across two chunks (a holdback that
    forgets text already sent)."""

    name = "stop-leaked"
    expected = frozenset(
        {"STOP-1[openai,pool]", "STOP-2[openai,word]", "STOP-2[openai,later-entry]", "STOP-6[openai]"}
    )
    tolerated = frozenset({"STREAM-2[openai,greedy]"})

    def event(self, call: Call, data: str) -> list[str]:
        value = chunk(data)
        stops = [s for s in call.stops if s]
        if value is None or not stops:
            return [data]
        out = []
        for choice in _choices(value):
            if choice.get("finish_reason") == "stop":
                stop = stops[0]
                first = {**value, "choices": [self._piece(call, choice, stop[: len(stop) // 2])]}
                second = {**value, "choices": [self._piece(call, choice, stop[len(stop) // 2 :])]}
                out += [dump(first), dump(second)]
        return [*out, data]

    def _piece(self, call: Call, choice: dict[str, Any], text: str) -> dict[str, Any]:
        if call.chat:
            return {"index": choice.get("index", 0), "delta": {"content": text}, "finish_reason": None}
        return {"index": choice.get("index", 0), "text": text, "finish_reason": None}

    def body(self, call: Call, status: int, body: Any) -> tuple[int, Any]:
        stops = [s for s in call.stops if s]
        if isinstance(body, dict) and stops:
            for choice in _choices(body):
                if choice.get("finish_reason") == "stop":
                    holder = choice.get("message") if call.chat else choice
                    if isinstance(holder, dict) and isinstance(holder.get(_content_key(call)), str):
                        holder[_content_key(call)] += stops[0]
        return status, body


class IndexReused(EveryAnswer):
    """Every choice of n>1 is reported as index 0."""

    name = "index-reused"
    expected = frozenset({"N-1[openai,pool]", "CAP-1[openai,n]"})
    # Two choices' chunks read as one choice's: roles, finishes, texts and token counts merge.
    tolerated = frozenset(
        {
            "STREAM-1[openai,pool]",
            "FINISH-1[openai,pool]",
            "USAGE-3[openai,pool]",
            "USAGE-5[openai,pool]",
            "STREAM-7[openai,pool]",
            "STREAM-2[openai,greedy]",
            "FINISH-2[openai,greedy]",
            "SAMPLE-6[openai]",
            "CONSTRAIN-1[openai,*]",  # two choices' documents read as one: no document
        }
    )

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        for choice in _choices(value):
            choice["index"] = 0


class IndexSkipped(EveryAnswer):
    """Choice 1 of n>1 is reported as index 2."""

    name = "index-skipped"
    expected = frozenset({"N-1[openai,pool]", "STREAM-3[openai,pool]", "CAP-1[openai,n]"})
    tolerated = frozenset({"USAGE-3[openai,pool]", "SAMPLE-2[openai]"})

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        for choice in _choices(value):
            if choice.get("index") == 1:
                choice["index"] = 2


class ErrorAs200(Mutant):
    """A refused request is answered HTTP 200 with the error object as its body."""

    name = "error-as-200"
    expected = frozenset(
        {
            "SAMPLE-5[openai,*]",
            "ERR-3[openai]",
            "REQ-1[openai,*]",
            "REQ-5[openai]",
            "REQ-6[openai]",
            "MALFORMED-1[openai,*]",
            "ERR-4[openai,unknown-model]",
        }
    )
    tolerated = frozenset({"ERR-1[openai,stream]", "CONSTRAIN-2[openai,*]"})

    def body(self, call: Call, status: int, body: Any) -> tuple[int, Any]:
        return (200 if 400 <= status < 500 else status), body


class RoleMissing(EveryAnswer):
    """A chat stream's first chunk carries no role."""

    name = "role-missing"
    expected = frozenset({"STREAM-1[openai,pool]"})

    in_bodies = False

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        for choice in _choices(value) if call.chat else []:
            delta = choice.get("delta")
            if isinstance(delta, dict):
                delta.pop("role", None)


class CompletionCountsPrompt(EveryAnswer):
    """usage.completion_tokens includes the prompt tokens."""

    name = "completion-counts-prompt"
    expected = frozenset(
        {"USAGE-3[openai,pool]", "USAGE-5[openai,pool]", "FINISH-6[openai,pool]", "N-2[openai]"}
    )
    tolerated = frozenset({"STREAM-7[openai,pool]"})

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        usage = value.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            usage["completion_tokens"] = usage.get("completion_tokens", 0) + usage["prompt_tokens"]
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]


class CumulativeStream(EveryAnswer):
    """Each delta carries the choice's whole text so far (a cumulative stream read as deltas)."""

    name = "cumulative-stream"
    expected = frozenset({"STREAM-2[openai,greedy]"})
    tolerated = frozenset(
        {
            "STOP-2[openai,*]",
            "STOP-6[openai]",
            "STOP-1[openai,pool]",
            "CANCEL-3[openai]",
            "STREAM-6[openai]",
            "CONSTRAIN-1[openai,*]",  # a streamed document repeated: no document
            "STREAM-2[openai,response_format]",
        }
    )

    in_bodies = False

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        key = _content_key(call)
        for choice in _choices(value):
            piece = _delta(call, choice).get(key)
            if isinstance(piece, str) and piece:
                so_far = call.state.get(choice.get("index"), "") + piece
                call.state[choice.get("index")] = so_far
                _delta(call, choice)[key] = so_far


class LastChunkLost(Mutant):
    """The last content of a choice, sent with its finish_reason, is dropped (the tail lost)."""

    name = "last-chunk-lost"
    buffered = True
    expected = frozenset({"FINISH-2[openai,greedy]"})
    tolerated = frozenset(
        {
            "STOP-2[openai,*]",
            "STOP-6[openai]",
            "CANCEL-3[openai]",
            "FINISH-6[openai,pool]",
            "STREAM-7[openai,pool]",
            "CONSTRAIN-1[openai,*]",  # a document that ended "stop" without its tail
            "STREAM-2[openai,response_format]",
        }
    )

    def whole_stream(self, call: Call, events: list[str]) -> list[str]:
        key = _content_key(call)
        last: dict[Any, int] = {}
        for i, data in enumerate(events):
            for choice in _choices(chunk(data) or {}):
                if _delta(call, choice).get(key):
                    last[choice.get("index")] = i
        for index, i in last.items():
            value = chunk(events[i])
            if value is None:
                continue
            for choice in _choices(value):
                if choice.get("index") == index:
                    _delta(call, choice)[key] = ""
            events[i] = dump(value)
        return events


class SplitCharacter(EveryAnswer):
    """A character outside ASCII is sent as U+FFFD pieces (bytes decoded token by token)."""

    name = "split-character"
    expected = frozenset({"STREAM-5[openai,greedy]"})

    in_bodies = False

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        key = _content_key(call)
        for choice in _choices(value):
            piece = _delta(call, choice).get(key)
            if isinstance(piece, str) and any(ord(ch) > 127 for ch in piece):
                _delta(call, choice)[key] = "".join("\ufffd\ufffd" if ord(ch) > 127 else ch for ch in piece)


class FinishReasonUnknown(EveryAnswer):
    """A natural end reads finish_reason "eos" (an engine's own word leaking out)."""

    name = "finish-reason-unknown"
    expected = frozenset({"FINISH-4[openai,pool]", "FINISH-5[openai]"})
    tolerated = frozenset({"STOP-2[openai,*]", "STOP-6[openai]"})

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        for choice in _choices(value):
            if choice.get("finish_reason") == "stop":
                choice["finish_reason"] = "eos"


class StopReadsLength(EveryAnswer):
    """A choice that ended at a stop string reads "length"."""

    name = "stop-reads-length"
    expected = frozenset(
        {"FINISH-5[openai]", "STOP-2[openai,word]", "STOP-2[openai,later-entry]", "STOP-6[openai]"}
    )
    # A "length" that is not one counts as max_tokens tokens wherever a count is needed.
    tolerated = frozenset({"FINISH-6[openai,pool]", "USAGE-3[openai,pool]", "STREAM-7[openai,pool]"})

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        for choice in _choices(value) if call.stops else []:
            if choice.get("finish_reason") == "stop":
                choice["finish_reason"] = "length"


class StopEndedMiscounted(EveryAnswer):
    """completion_tokens of a choice that ended on its own (not at max_tokens) counts 3 tokens too many."""

    name = "stop-ended-miscounted"
    expected = frozenset({"USAGE-5[openai,pool]"})

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        usage = value.get("usage")
        choices = _choices(value)
        ended = [c.get("finish_reason") for c in choices]
        if isinstance(usage, dict) and call.n == 1 and ended and ended[0] not in (None, "length"):
            usage["completion_tokens"] = usage.get("completion_tokens", 0) + 3
            usage["total_tokens"] = usage.get("prompt_tokens", 0) + usage["completion_tokens"]


class LengthReadsStop(EveryAnswer):
    """A choice cut at max_tokens reads "stop", as if it had ended on its own."""

    name = "length-reads-stop"
    expected = frozenset({"FINISH-6[openai,continues]"})
    # a document cut at max_tokens that reads "stop" is judged whole, and is none
    tolerated = frozenset({"CONSTRAIN-1[openai,*]"})

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        for choice in _choices(value):
            if choice.get("finish_reason") == "length":
                choice["finish_reason"] = "stop"


class IdsDiffer(EveryAnswer):
    """Every chunk of a stream carries an id of its own."""

    name = "ids-differ"
    expected = frozenset({"REQ-2[openai,pool]"})
    tolerated = frozenset({"STREAM-6[openai]"})

    in_bodies = False

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        call.state["count"] = call.state.get("count", 0) + 1
        value["id"] = f"{value.get('id')}-{call.state['count']}"


class NIgnored(Mutant):
    """n is accepted and ignored: one choice comes."""

    name = "n-ignored"
    # one cause, one verdict: the cases that need n are n/a, CAP-1 holds the finding
    expected = frozenset({"CAP-1[openai,n]"})
    # A server that drops n can neither refuse a bad one nor answer two choices.
    tolerated = frozenset(
        {
            "SAMPLE-5[openai,n=0]",
            "ERR-3[openai]",
            "MALFORMED-1[openai,wrong-type]",
            "SAMPLE-6[openai]",
            "N-2[openai]",
            "USAGE-3[openai,pool]",
            "SAMPLE-2[openai]",
        }
    )

    def request(self, call: Call) -> Any:
        if isinstance(call.body, dict):
            call.body.pop("n", None)
        return call.body


class LogprobsIgnored(Mutant):
    """Chat logprobs are accepted and ignored."""

    name = "logprobs-ignored"
    expected = frozenset({"CAP-1[openai,logprobs]"})
    # A server that drops logprobs can neither refuse a bad top_logprobs nor show greedy choices.
    tolerated = frozenset(
        {
            "SAMPLE-1[openai,greedy-is-argmax]",
            "SAMPLE-5[openai,top_logprobs=21]",
            "SAMPLE-5[openai,top_logprobs=-1]",
        }
    )

    def request(self, call: Call) -> Any:
        if isinstance(call.body, dict) and call.chat:
            call.body.pop("logprobs", None)
            call.body.pop("top_logprobs", None)
        return call.body


class MaxCompletionTokensIgnored(Mutant):
    """``max_completion_tokens`` is accepted and ignored: only ``max_tokens`` limits a chat."""

    name = "max-completion-tokens-ignored"
    expected = frozenset({"CAP-1[openai,max_completion_tokens]"})

    def request(self, call: Call) -> Any:
        if isinstance(call.body, dict) and call.chat:
            call.body.pop("max_completion_tokens", None)
        return call.body


class ContentPartsStringified(Mutant):
    """A message whose content is a list of parts reaches the model as the list's Python text
    (a chat template that renders ``content`` with ``str``), not as the parts' text."""

    name = "content-parts-stringified"
    expected = frozenset({"CAP-1[openai,content_parts]"})

    def request(self, call: Call) -> Any:
        messages = call.body.get("messages") if isinstance(call.body, dict) else None
        for message in messages if isinstance(messages, list) else ():
            if isinstance(message, dict) and isinstance(message.get("content"), list):
                message["content"] = str(message["content"])
        return call.body


class UnknownModelServed(Mutant):
    """A model the server does not list is answered by the one it has."""

    name = "unknown-model-served"
    expected = frozenset({"ERR-4[openai,unknown-model]"})

    def request(self, call: Call) -> Any:
        if isinstance(call.body, dict) and call.body.get("model") not in (None, call.served_model):
            call.body["model"] = call.served_model
        return call.body


class StreamsItsErrors(Mutant):
    """A refused request that asked to stream gets HTTP 200 and an event stream with an error event."""

    name = "streams-its-errors"
    expected = frozenset({"ERR-1[openai,stream]", "REQ-6[openai]", "SAMPLE-5[openai,max_tokens=-1]"})
    tolerated = frozenset({"ERR-5[openai]"})

    def refused_stream(self, call: Call, status: int, body: Any) -> list[str] | None:
        return [dump(body), DONE]


class TopLogprobsUnsorted(EveryAnswer):
    """top_logprobs come lowest first."""

    name = "top-logprobs-unsorted"
    expected = frozenset({"STREAM-7[openai,pool]"})
    tolerated = frozenset({"SAMPLE-1[openai,greedy-is-argmax]"})

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        for choice in _choices(value):
            logprobs = choice.get("logprobs")
            entries = logprobs.get("content") if isinstance(logprobs, dict) else None
            for entry in entries if isinstance(entries, list) else []:
                if isinstance(entry, dict) and isinstance(entry.get("top_logprobs"), list):
                    entry["top_logprobs"].reverse()


class PromptCountedPerChoice(EveryAnswer):
    """prompt_tokens is charged once per choice of n>1."""

    name = "prompt-counted-per-choice"
    expected = frozenset({"USAGE-2[openai]"})

    def fix(self, call: Call, value: dict[str, Any]) -> None:
        usage = value.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int) and call.n > 1:
            usage["prompt_tokens"] *= call.n
            usage["total_tokens"] = usage["prompt_tokens"] + usage.get("completion_tokens", 0)


class KeepsGeneratingAfterDisconnect(Mutant):
    """A stream whose client left keeps its slot until it has generated everything."""

    name = "keeps-generating-after-disconnect"
    keeps_slot_after_disconnect = True
    expected = frozenset({"CANCEL-1[openai]"})


class BlocksOnSlowReader(Mutant):
    """Every stream waits while one client does not read (one writer for all streams)."""

    name = "blocks-on-slow-reader"
    blocks_on_slow_reader = True
    expected = frozenset({"FLOW-1[openai]"})


class StallsOnce(Mutant):
    """A correct server on a host that pauses once for everyone (a CI machine did, 2026-11-28: the
    pause landed in FLOW-1's measurement and outlasted its unread stream): neither FLOW-1's verdict
    nor the run's liveness may blame the server for it."""

    name = "stalls-once"
    stalls_once_s = 15.0  # past FLOW-1's limit, past one liveness probe's 10 s
    runs = frozenset({"FLOW-1[openai]"})


CONTROLS: tuple[type[Mutant], ...] = (Mutant, StallsOnce)  # must pass every case they run

MUTANTS: tuple[type[Mutant], ...] = (
    UsageOneChoice,
    UsageChunkMissing,
    UsageChunkTwice,
    UsageNotLast,
    UsageWithChoices,
    DoneMissing,
    TwoFinishReasons,
    ContentAfterFinish,
    StopLeaked,
    IndexReused,
    IndexSkipped,
    ErrorAs200,
    RoleMissing,
    CompletionCountsPrompt,
    CumulativeStream,
    LastChunkLost,
    SplitCharacter,
    FinishReasonUnknown,
    StopReadsLength,
    LengthReadsStop,
    StopEndedMiscounted,
    IdsDiffer,
    NIgnored,
    LogprobsIgnored,
    MaxCompletionTokensIgnored,
    ContentPartsStringified,
    UnknownModelServed,
    StreamsItsErrors,
    TopLogprobsUnsorted,
    PromptCountedPerChoice,
    KeepsGeneratingAfterDisconnect,
    BlocksOnSlowReader,
    *OUTPUT_MUTANTS,  # structured output and tool calls
)
