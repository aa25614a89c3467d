"""One HTTP call to an OpenAI-compatible server as the harness saw it: the request, the status and
headers, and either the JSON body or every server-sent event with its arrival time.

Like the gRPC stream record, an exchange never raises on a broken answer (a body that is not JSON,
an event after ``[DONE]``, a stream cut short): it keeps what came, and each case judges only its
own clause from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from conformance.stream import wiretap

Api = Literal["chat", "completions"]
DONE = "[DONE]"
PATHS: Mapping[Api, str] = {"chat": "/chat/completions", "completions": "/completions"}


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    """A chat or legacy completions request: which endpoint, and the JSON body as sent (``model``
    is filled in by the client when the body has none)."""

    api: Api
    body: Mapping[str, Any]

    @property
    def path(self) -> str:
        return PATHS[self.api]

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def n(self) -> int:
        n = self.body.get("n", 1)
        return n if isinstance(n, int) and n >= 1 else 1

    @property
    def max_tokens(self) -> int | None:
        value = self.body.get("max_tokens", self.body.get("max_completion_tokens"))
        return value if isinstance(value, int) else None

    @property
    def stops(self) -> list[str]:
        stop = self.body.get("stop")
        if isinstance(stop, str):
            return [stop]
        return [s for s in stop if isinstance(s, str)] if isinstance(stop, list) else []

    @property
    def top_logprobs(self) -> int | None:
        """The number of alternatives asked per token, or None when logprobs were not asked."""
        if self.api == "chat":
            if self.body.get("logprobs") is not True:
                return None
            top = self.body.get("top_logprobs", 0)
            return top if isinstance(top, int) else 0
        top = self.body.get("logprobs")
        return top if isinstance(top, int) and not isinstance(top, bool) else None

    @property
    def include_usage(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    @property
    def greedy(self) -> bool:
        return self.body.get("temperature") == 0

    def with_body(self, **changes: Any) -> OpenAIRequest:
        """A copy with body fields replaced (a value of None removes the field)."""
        body = {k: v for k, v in {**self.body, **changes}.items() if v is not None}
        return OpenAIRequest(self.api, body)

    def __repr__(self) -> str:
        return f"OpenAIRequest({self.api!r}, {json.dumps(self.body, ensure_ascii=False, sort_keys=True)})"


class End(StrEnum):
    OK = "ok"  # the body (or the event stream) was read to its end
    BROKEN = "broken"  # the connection failed or closed inside the body
    HUNG = "hung"  # the harness gave up waiting
    CANCELLED = "cancelled"  # the harness closed the connection on purpose


@dataclass(frozen=True, slots=True)
class SseEvent:
    t_s: float  # seconds since the request was sent
    event: str  # the SSE event name ("" for the default "message")
    data: str

    @property
    def done(self) -> bool:
        return self.data.strip() == DONE

    def json(self) -> Any:
        """The data as JSON; raises ValueError when it is not."""
        return wiretap.track_json(json.loads(self.data))


@dataclass(slots=True)
class Exchange:
    request: OpenAIRequest | None  # None for calls outside chat and completions (models, tokenize)
    method: str
    url: str
    status: int = 0  # 0 when no response arrived
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names
    text: str = ""  # the body of a response that is not an event stream
    events: list[SseEvent] = field(default_factory=list)
    end: End = End.OK
    detail: str = ""
    duration_s: float = 0.0

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()

    @property
    def is_event_stream(self) -> bool:
        return self.content_type == "text/event-stream"

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return wiretap.track_json(json.loads(self.text))
        except ValueError:
            return None

    def error_object(self) -> dict[str, Any] | None:
        """OpenAI's ``{"error": {"message": ..., "type": ...}}``, when the body is one."""
        body = self.json()
        if not isinstance(body, dict):
            return None
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error
        return None

    def summary(self) -> str:
        """One line for want/got: status, what came, how it ended."""
        what = f"{len(self.events)} events" if self.is_event_stream else f"{len(self.text)} bytes"
        head = f"HTTP {self.status}" if self.status else "no response"
        tail = f" ({self.detail})" if self.detail else ""
        return f"{head}, {self.content_type or 'no content-type'}, {what}, ended {self.end.value}{tail}"
