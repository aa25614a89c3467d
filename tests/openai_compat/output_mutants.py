"""One-fault mutants of structured output (``response_format``) and tool calls, each touching only
requests that ask for them, each declaring exactly the cases of cases/openai/structured.py and
tools.py that must catch it. Faults modelled on real servers: a format accepted and ignored, JSON
in a code fence, tool deltas whose ids and names repeat (the SDK's stream helper then doubles them),
arguments that lose or repeat a fragment, calls numbered from 1, a forced call answered as text.

They need an upstream that serves constrained decoding: one that declines it (smg answers 501 for a
worker without it) makes these cases skip, so every mutant here goes uncaught."""

from __future__ import annotations

from typing import Any

from .proxy import Call, Mutant, chunk, dump

PLAIN_TEXT = "Sure! The person is Ada, 36 years old, and a member."


def _choices(value: dict[str, Any]) -> list[dict[str, Any]]:
    found = value.get("choices")
    return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


def _holder(call: Call, choice: dict[str, Any], *, streamed: bool) -> dict[str, Any]:
    """What carries a choice's content: its delta (chat stream), its message (chat body), itself."""
    if not call.chat:
        return choice
    found = choice.get("delta" if streamed else "message")
    return found if isinstance(found, dict) else {}


def _tool_deltas(choice: dict[str, Any]) -> list[dict[str, Any]]:
    delta = choice.get("delta")
    found = delta.get("tool_calls") if isinstance(delta, dict) else None
    return [d for d in found if isinstance(d, dict)] if isinstance(found, list) else []


def _function(entry: dict[str, Any]) -> dict[str, Any]:
    found = entry.get("function")
    return found if isinstance(found, dict) else {}


class Shaped(Mutant):
    """A fault in the content of answers that asked for a response_format (``kinds``)."""

    kinds: frozenset[str] = frozenset({"json_schema", "json_object"})

    def applies(self, call: Call) -> bool:
        return call.response_format in self.kinds

    def content(self, call: Call, index: Any, text: str, first: bool, finished: str | None) -> str:
        raise NotImplementedError

    def body(self, call: Call, status: int, body: Any) -> tuple[int, Any]:
        if self.applies(call) and isinstance(body, dict):
            key = "content" if call.chat else "text"
            for choice in _choices(body):
                holder = _holder(call, choice, streamed=False)
                if isinstance(holder.get(key), str):
                    holder[key] = self.content(
                        call, choice.get("index"), holder[key], True, choice.get("finish_reason")
                    )
        return status, body

    def event(self, call: Call, data: str) -> list[str]:
        value = chunk(data)
        if value is None or not self.applies(call):
            return [data]
        key = "content" if call.chat else "text"
        for choice in _choices(value):
            holder = _holder(call, choice, streamed=True)
            piece = holder.get(key)
            finished = choice.get("finish_reason")
            if (isinstance(piece, str) and piece) or finished:
                first = choice.get("index") not in call.state
                call.state[choice.get("index")] = True
                holder[key] = self.content(call, choice.get("index"), piece or "", first, finished)
        return [dump(value)]


class SchemaIgnored(Shaped):
    """response_format is accepted and ignored: every choice is plain text."""

    name = "schema-ignored"
    expected = frozenset(
        {
            "CONSTRAIN-1[openai,json_schema]",
            "CONSTRAIN-1[openai,json_schema-nonstrict]",
            "CONSTRAIN-1[openai,json_object]",
        }
    )

    def content(self, call: Call, index: Any, text: str, first: bool, finished: str | None) -> str:
        return PLAIN_TEXT if first else ""  # the same text streamed and not


class SecondChoiceUnconstrained(Shaped):
    """With n > 1 only the first choice is decoded under the response_format: the others are
    plain text (a grammar state that is not forked per choice)."""

    name = "second-choice-unconstrained"
    expected = SchemaIgnored.expected

    def applies(self, call: Call) -> bool:
        return super().applies(call) and call.n > 1

    def content(self, call: Call, index: Any, text: str, first: bool, finished: str | None) -> str:
        if index == 0:
            return text
        return PLAIN_TEXT if first else ""


class JsonInCodeFence(Shaped):
    """json_object is answered with the JSON inside a markdown code fence, as a model only told to
    write JSON writes it (JSON mode left to the prompt)."""

    name = "json-in-code-fence"
    kinds = frozenset({"json_object"})
    expected = frozenset({"CONSTRAIN-1[openai,json_object]"})

    def content(self, call: Call, index: Any, text: str, first: bool, finished: str | None) -> str:
        return ("```json\n" if first else "") + text + ("\n```" if finished == "stop" else "")


class BadSchemaAs500(Mutant):
    """A response_format the server refuses is answered HTTP 500 instead of a 4xx."""

    name = "bad-schema-as-500"
    expected = frozenset({"CONSTRAIN-2[openai,response_format]"})

    def body(self, call: Call, status: int, body: Any) -> tuple[int, Any]:
        if call.response_format is not None and 400 <= status < 500:
            return 500, {"error": {"message": "Internal Server Error", "type": "server_error"}}
        return status, body


class ToolStream(Mutant):
    """A fault in the tool_call deltas of a stream that offered tools (``whole_stream``: the
    deltas of one call are changed together)."""

    buffered = True

    def buffers(self, call: Call) -> bool:
        # only streams that offered tools: any other (a slow constrained one) flows as it comes
        return call.tool_choice is not None

    def whole_stream(self, call: Call, events: list[str]) -> list[str]:
        if call.tool_choice is None:
            return events
        values = [chunk(e) for e in events]
        self.change(call, values)
        return [dump(v) if v is not None else e for v, e in zip(values, events, strict=True)]

    def change(self, call: Call, values: list[dict[str, Any] | None]) -> None:
        raise NotImplementedError

    @staticmethod
    def by_call(
        values: list[dict[str, Any] | None],
    ) -> dict[tuple[Any, Any], list[tuple[int, dict[str, Any]]]]:
        """Each call's deltas, (event number, delta), keyed by (choice index, call index)."""
        out: dict[tuple[Any, Any], list[tuple[int, dict[str, Any]]]] = {}
        for number, value in enumerate(values):
            for choice in _choices(value or {}):
                for entry in _tool_deltas(choice):
                    out.setdefault((choice.get("index"), entry.get("index")), []).append((number, entry))
        return out


class ArgumentFragmentLost(ToolStream):
    """A streamed call's last argument fragment is lost."""

    name = "argument-fragment-lost"
    expected = frozenset(
        {
            "CONSTRAIN-1[openai,tool_choice=required]",
            "CONSTRAIN-1[openai,tool_choice=named]",
            "STREAM-2[openai,tool-arguments]",
        }
    )
    tolerated = frozenset({"CONSTRAIN-1[openai,tool_choice=auto]"})

    def change(self, call: Call, values: list[dict[str, Any] | None]) -> None:
        for deltas in self.by_call(values).values():
            fragments = [entry for _, entry in deltas if _function(entry).get("arguments")]
            if fragments:
                _function(fragments[-1])["arguments"] = ""


class ArgumentFragmentTwice(ToolStream):
    """A streamed call's first argument fragment is sent twice."""

    name = "argument-fragment-twice"
    expected = ArgumentFragmentLost.expected
    tolerated = ArgumentFragmentLost.tolerated

    def change(self, call: Call, values: list[dict[str, Any] | None]) -> None:
        for deltas in self.by_call(values).values():
            fragments = [entry for _, entry in deltas if _function(entry).get("arguments")]
            if fragments:
                function = _function(fragments[0])
                function["arguments"] = function["arguments"] * 2


class ToolIndexDropped(ToolStream):
    """The deltas of a streamed call after its first carry no index."""

    name = "tool-index-dropped"
    expected = frozenset({"STREAM-3[openai,tool-calls]"})

    def change(self, call: Call, values: list[dict[str, Any] | None]) -> None:
        for deltas in self.by_call(values).values():
            for _, entry in deltas[1:]:
                entry.pop("index", None)


class ToolIndexFromOne(ToolStream):
    """Streamed calls are numbered from 1."""

    name = "tool-index-from-one"
    expected = frozenset({"STREAM-3[openai,tool-calls]"})

    def change(self, call: Call, values: list[dict[str, Any] | None]) -> None:
        for deltas in self.by_call(values).values():
            for _, entry in deltas:
                if isinstance(entry.get("index"), int):
                    entry["index"] += 1


class ToolIdentityRepeated(ToolStream):
    """Every delta of a streamed call repeats its id, type and function name."""

    name = "tool-identity-repeated"
    expected = frozenset({"STREAM-2[openai,tool-calls]"})

    def change(self, call: Call, values: list[dict[str, Any] | None]) -> None:
        for deltas in self.by_call(values).values():
            first = deltas[0][1]
            for _, entry in deltas[1:]:
                entry["id"], entry["type"] = first.get("id"), first.get("type")
                entry.setdefault("function", {})["name"] = _function(first).get("name")


class ToolIdentityLate(ToolStream):
    """A streamed call's id and function name come in its second delta instead of its first."""

    name = "tool-identity-late"
    expected = frozenset({"STREAM-2[openai,tool-calls]"})

    def change(self, call: Call, values: list[dict[str, Any] | None]) -> None:
        for deltas in self.by_call(values).values():
            if len(deltas) < 2:
                continue
            first, second = deltas[0][1], deltas[1][1]
            second["id"] = first.pop("id", None)
            second.setdefault("function", {})["name"] = _function(first).pop("name", None)


class ToolCallAsText(Mutant):
    """A forced tool call is answered as plain text: the call's name and arguments in the content,
    no tool_calls, finish_reason stop."""

    name = "tool-call-as-text"
    expected = frozenset(
        {"CONSTRAIN-1[openai,tool_choice=required]", "CONSTRAIN-1[openai,tool_choice=named]"}
    )
    # the body's arguments and the stream's fragments read as content may differ in whitespace
    tolerated = frozenset({"STREAM-2[openai,tool-arguments]", "CONSTRAIN-1[openai,tool_choice=auto]"})

    def hits(self, call: Call, choice: dict[str, Any]) -> bool:
        """Whether this choice's calls are answered as text."""
        return True

    def body(self, call: Call, status: int, body: Any) -> tuple[int, Any]:
        if call.tool_choice is None or not isinstance(body, dict):
            return status, body
        for choice in _choices(body):
            if not self.hits(call, choice):
                continue
            message = choice.get("message")
            calls = message.pop("tool_calls", None) if isinstance(message, dict) else None
            if isinstance(message, dict) and isinstance(calls, list) and calls:
                message["content"] = "".join(
                    f"{_function(c).get('name')}{_function(c).get('arguments')}"
                    for c in calls
                    if isinstance(c, dict)
                )
                choice["finish_reason"] = "stop"
        return status, body

    def event(self, call: Call, data: str) -> list[str]:
        value = chunk(data)
        if value is None or call.tool_choice is None:
            return [data]
        for choice in _choices(value):
            if not self.hits(call, choice):
                continue
            deltas = _tool_deltas(choice)
            if deltas:
                choice["delta"].pop("tool_calls")
                choice["delta"]["content"] = "".join(
                    f"{_function(d).get('name') or ''}{_function(d).get('arguments') or ''}" for d in deltas
                )
            if choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "stop"
        return [dump(value)]


class SecondChoiceCallAsText(ToolCallAsText):
    """With n > 1 only the first choice is bound to the forced call: the others answer it as text
    (a constraint that is not forked per choice)."""

    name = "second-choice-call-as-text"
    expected = frozenset({"CONSTRAIN-1[openai,tool_choice=named]"})
    # required too where a sampled choice completes its call; on the fake engine both sampled
    # choices write past max_tokens into a second call (smg does not bind parallel_tool_calls
    # false), so no complete call is there to turn into text
    tolerated = frozenset(
        {"CONSTRAIN-1[openai,tool_choice=required]", "CONSTRAIN-1[openai,tool_choice=auto]"}
    )

    def hits(self, call: Call, choice: dict[str, Any]) -> bool:
        return call.n > 1 and choice.get("index") != 0


class FinishReason(Mutant):
    """A fault in the finish_reason of answers that offered tools: ``reason`` maps (called a tool,
    finish_reason) to the finish_reason sent."""

    def reason(self, call: Call, called: bool, finish: str) -> str:
        raise NotImplementedError

    def body(self, call: Call, status: int, body: Any) -> tuple[int, Any]:
        if call.tool_choice is not None and isinstance(body, dict):
            for choice in _choices(body):
                message = choice.get("message")
                called = isinstance(message, dict) and bool(message.get("tool_calls"))
                if isinstance(choice.get("finish_reason"), str):
                    choice["finish_reason"] = self.reason(call, called, choice["finish_reason"])
        return status, body

    def event(self, call: Call, data: str) -> list[str]:
        value = chunk(data)
        if value is None or call.tool_choice is None:
            return [data]
        for choice in _choices(value):
            if _tool_deltas(choice):
                call.state[choice.get("index")] = True
            if isinstance(choice.get("finish_reason"), str):
                called = bool(call.state.get(choice.get("index")))
                choice["finish_reason"] = self.reason(call, called, choice["finish_reason"])
        return [dump(value)]


class ToolCallsFinishWithoutCall(FinishReason):
    """With tools offered, a choice that called none reads finish_reason tool_calls."""

    name = "tool-calls-finish-without-call"
    expected = frozenset({"CAP-1[openai,tool_choice=none]", "CONSTRAIN-1[openai,tool_choice=auto]"})
    # required too where a choice is cut before its first call (a "length" made "tool_calls")
    tolerated = frozenset({"CONSTRAIN-1[openai,tool_choice=required]"})

    def reason(self, call: Call, called: bool, finish: str) -> str:
        return finish if called else "tool_calls"


class RequiredCallReadsStop(FinishReason):
    """Calls made under tool_choice required end with finish_reason stop."""

    name = "required-call-reads-stop"
    expected = frozenset({"CONSTRAIN-1[openai,tool_choice=required]"})

    def reason(self, call: Call, called: bool, finish: str) -> str:
        return "stop" if called and call.tool_choice == "required" and finish == "tool_calls" else finish


class NamedChoiceIgnored(Mutant):
    """A named tool_choice is accepted and ignored: the model picks as under auto (llama.cpp reads
    only a string tool_choice)."""

    name = "named-choice-ignored"
    expected = frozenset({"CONSTRAIN-1[openai,tool_choice=named]"})
    # under auto a model may call another function, or none: the greedy comparison sees auto's calls
    tolerated = frozenset(
        {"STREAM-2[openai,tool-arguments]", "STREAM-2[openai,tool-calls]", "STREAM-3[openai,tool-calls]"}
    )

    def request(self, call: Call) -> Any:
        if call.tool_choice == "named":
            call.body["tool_choice"] = "auto"
        return call.body


class ToolCallsCountedAsNothing(Mutant):
    """An answer whose choices made tool calls reports 0 completion tokens (the count is of the
    message's content, which a call leaves empty)."""

    name = "tool-calls-counted-as-nothing"
    expected = frozenset(
        {"CONSTRAIN-1[openai,tool_choice=required]", "CONSTRAIN-1[openai,tool_choice=named]"}
    )
    # auto judges its usage where the model called
    tolerated = frozenset({"CONSTRAIN-1[openai,tool_choice=auto]"})

    @staticmethod
    def _zeroed(usage: Any) -> None:
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            usage["completion_tokens"], usage["total_tokens"] = 0, usage["prompt_tokens"]

    def body(self, call: Call, status: int, body: Any) -> tuple[int, Any]:
        if call.tool_choice is not None and isinstance(body, dict):
            messages = [c.get("message") for c in _choices(body)]
            if any(isinstance(m, dict) and m.get("tool_calls") for m in messages):
                self._zeroed(body.get("usage"))
        return status, body

    def event(self, call: Call, data: str) -> list[str]:
        value = chunk(data)
        if value is None or call.tool_choice is None:
            return [data]
        if any(_tool_deltas(c) for c in _choices(value)):
            call.state["called"] = True
        if call.state.get("called") and value.get("usage") is not None:
            self._zeroed(value["usage"])
            return [dump(value)]
        return [data]


class NoneChoiceIgnored(Mutant):
    """tool_choice none is accepted and ignored: the model is made to call a tool anyway. Its case
    ended in a harness error (no finish rule for calls under none), not a FAIL, before the fix."""

    name = "none-choice-ignored"
    expected = frozenset({"CAP-1[openai,tool_choice=none]"})

    def request(self, call: Call) -> Any:
        if call.tool_choice == "none":
            call.body["tool_choice"] = "required"
        return call.body


OUTPUT_MUTANTS: tuple[type[Mutant], ...] = (
    SchemaIgnored,
    SecondChoiceUnconstrained,
    JsonInCodeFence,
    BadSchemaAs500,
    ArgumentFragmentLost,
    ArgumentFragmentTwice,
    ToolIndexDropped,
    ToolIndexFromOne,
    ToolIdentityRepeated,
    ToolIdentityLate,
    ToolCallAsText,
    SecondChoiceCallAsText,
    ToolCallsFinishWithoutCall,
    RequiredCallReadsStop,
    NamedChoiceIgnored,
    NoneChoiceIgnored,
    ToolCallsCountedAsNothing,
)
