"""A chat or completions answer, streamed or not, as one shape the validators read: per choice its
text, the pieces it came in, its roles, its finish reasons and its logprob entries; the usage and
where it came; and for a stream, its framing (``[DONE]``, events after it, error events, chunks
that are not JSON).

Chat chunks carry ``choices[].delta.content``, legacy completions ``choices[].text``; chat
logprobs are ``logprobs.content[]`` entries, legacy ones the parallel lists ``tokens`` /
``token_logprobs`` / ``top_logprobs`` (dicts). Both become ``TokenEntry`` values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conformance.drivers.openai.exchange import Exchange

FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})


@dataclass(frozen=True, slots=True)
class TokenEntry:
    token: str
    logprob: float | None
    top: tuple[tuple[str, float], ...]  # the alternatives, in the order the server sent them
    top_is_dict: bool = False  # legacy completions: a dict, so equal strings collapse into one


@dataclass(slots=True)
class ChoiceView:
    index: int
    pieces: list[str] = field(default_factory=list)  # content of each chunk that carried some
    roles: list[tuple[int, str]] = field(default_factory=list)  # (chunk number within the choice, role)
    finishes: list[str] = field(default_factory=list)  # every non-null finish_reason, in order
    after_finish: list[str] = field(default_factory=list)  # content that came after the first finish
    entries: list[TokenEntry] = field(default_factory=list)
    chunks: int = 0
    logprobs_seen: bool = False  # some chunk (or the body) carried a logprobs object for this choice

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def finish(self) -> str | None:
        return self.finishes[0] if self.finishes else None


@dataclass(slots=True)
class UsageSeen:
    position: int  # the chunk's number among the stream's JSON chunks (0 for a body)
    usage: Any
    choices: Any  # the chunk's ``choices`` beside it


@dataclass(slots=True)
class CompletionView:
    streamed: bool
    choices: dict[int, ChoiceView] = field(default_factory=dict)
    bad_indices: list[Any] = field(default_factory=list)  # choice indices that are not ints >= 0
    usages: list[UsageSeen] = field(default_factory=list)  # non-null usage values, in order
    chunks: int = 0  # JSON chunks (stream) or 1 (body)
    ids: list[Any] = field(default_factory=list)
    objects: list[Any] = field(default_factory=list)
    done_at: int | None = None  # the event number of [DONE]
    events_after_done: int = 0
    error_events: list[Any] = field(default_factory=list)  # `event: error`, or chunks with a non-null "error"
    unparsable: list[str] = field(default_factory=list)  # event data that is neither JSON nor [DONE]
    not_objects: int = 0  # JSON chunks that are not objects

    @property
    def usage(self) -> Any:
        """The usage the answer reports: the body's, or the stream's last non-null one."""
        return self.usages[-1].usage if self.usages else None

    @property
    def done(self) -> bool:
        return self.done_at is not None

    def texts(self) -> dict[int, str]:
        return {i: c.text for i, c in sorted(self.choices.items())}


def view_of(exchange: Exchange) -> CompletionView:
    """The answer of a chat or completions call (a stream when the server sent an event stream)."""
    chat = exchange.request is None or exchange.request.api == "chat"
    if not exchange.is_event_stream:
        out = CompletionView(streamed=False)
        body = exchange.json()
        if isinstance(body, dict):
            _body(out, body, chat)
        return out
    out = CompletionView(streamed=True)
    for number, event in enumerate(exchange.events):
        if out.done_at is not None:
            out.events_after_done += 1
            continue
        if event.done:
            out.done_at = number
            continue
        try:
            chunk = event.json()
        except ValueError:
            if event.event == "error":  # an error event whose data is plain text is still one
                out.error_events.append(event.data[:200])
            else:
                out.unparsable.append(event.data[:200])
            continue
        if event.event == "error" or (isinstance(chunk, dict) and chunk.get("error") is not None):
            out.error_events.append(chunk)
            continue
        if not isinstance(chunk, dict):
            out.not_objects += 1
            continue
        _chunk(out, chunk, chat)
    return out


def _body(out: CompletionView, body: dict[str, Any], chat: bool) -> None:
    out.chunks = 1
    out.ids.append(body.get("id"))
    out.objects.append(body.get("object"))
    if body.get("usage") is not None:
        out.usages.append(UsageSeen(0, body["usage"], body.get("choices")))
    for raw in _list(body.get("choices")):
        choice = _choice(out, raw)
        if choice is None:
            continue
        choice.chunks += 1
        message = raw.get("message") if chat else raw
        if chat and isinstance(message, dict) and isinstance(message.get("role"), str):
            choice.roles.append((0, message["role"]))
        content = message.get("content" if chat else "text") if isinstance(message, dict) else None
        if isinstance(content, str):
            choice.pieces.append(content)
        _finish(choice, raw.get("finish_reason"))
        _logprobs(choice, raw.get("logprobs"), chat)


def _chunk(out: CompletionView, chunk: dict[str, Any], chat: bool) -> None:
    position = out.chunks
    out.chunks += 1
    out.ids.append(chunk.get("id"))
    out.objects.append(chunk.get("object"))
    if chunk.get("usage") is not None:
        out.usages.append(UsageSeen(position, chunk["usage"], chunk.get("choices")))
    for raw in _list(chunk.get("choices")):
        choice = _choice(out, raw)
        if choice is None:
            continue
        number = choice.chunks
        choice.chunks += 1
        delta = raw.get("delta") if chat else raw
        if not isinstance(delta, dict):
            delta = {}
        if chat and isinstance(delta.get("role"), str):
            choice.roles.append((number, delta["role"]))
        content = delta.get("content" if chat else "text")
        if isinstance(content, str) and content:
            (choice.after_finish if choice.finishes else choice.pieces).append(content)
        _finish(choice, raw.get("finish_reason"))
        _logprobs(choice, raw.get("logprobs"), chat)


def _choice(out: CompletionView, raw: Any) -> ChoiceView | None:
    if not isinstance(raw, dict):
        out.bad_indices.append(raw)
        return None
    index = raw.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        out.bad_indices.append(index)
        return None
    return out.choices.setdefault(index, ChoiceView(index))


def _finish(choice: ChoiceView, reason: Any) -> None:
    if reason is not None:
        choice.finishes.append(reason if isinstance(reason, str) else repr(reason))


def _logprobs(choice: ChoiceView, logprobs: Any, chat: bool) -> None:
    if not isinstance(logprobs, dict):
        return
    choice.logprobs_seen = True
    if chat:
        for raw in _list(logprobs.get("content")):
            if isinstance(raw, dict):
                top = tuple(
                    (str(t.get("token")), _float(t.get("logprob")))
                    for t in _list(raw.get("top_logprobs"))
                    if isinstance(t, dict)
                )
                choice.entries.append(
                    TokenEntry(str(raw.get("token")), _float_or_none(raw.get("logprob")), top)
                )
        return
    tokens, values, tops = (_list(logprobs.get(k)) for k in ("tokens", "token_logprobs", "top_logprobs"))
    for i, token in enumerate(tokens):
        alternatives = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        choice.entries.append(
            TokenEntry(
                str(token),
                _float_or_none(values[i]) if i < len(values) else None,
                tuple((str(t), _float(v)) for t, v in alternatives.items()),
                top_is_dict=True,
            )
        )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _float(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else float("nan")


def _float_or_none(value: Any) -> float | None:
    return None if value is None else _float(value)
