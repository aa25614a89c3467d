"""A Generate call as the harness saw it: every message with its arrival time, and how the call ended.

The record is deliberately tolerant: it never raises on a contract break (a second finish, a missing
``output_index``...), so that each case can judge only its own clause and report want/got.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import betterproto2
from grpclib.const import Status

from lmrpc.v1 import (
    GenerateRequest,
    GenerateResponse,
    OutputFinished,
    PromptInfo,
    RequestError,
    TokenDelta,
    TokenLogprob,
    Usage,
)


class End(StrEnum):
    OK = "ok"  # trailers with status OK
    STATUS = "status"  # trailers (or trailers-only) with a non-OK status
    DEADLINE = "deadline"  # the call's own deadline passed (client-side TimeoutError)
    HUNG = "hung"  # the harness gave up waiting: the stream neither ended nor progressed
    BROKEN = "broken"  # the connection or stream was reset, or bytes could not be decoded
    CANCELLED = "cancelled"  # the harness cancelled the call on purpose
    OPEN = "open"  # still running


@dataclass(slots=True)
class Event:
    seq: int
    t_s: float  # seconds since the call started
    kind: str  # prompt_info | delta | finished | error | none | invalid
    message: GenerateResponse
    text_is_utf8: bool = True
    text_bytes: bytes | None = None

    @property
    def delta(self) -> TokenDelta | None:
        return self.message.delta if self.kind == "delta" else None

    @property
    def finished(self) -> OutputFinished | None:
        return self.message.finished if self.kind == "finished" else None


def event_kind(message: GenerateResponse) -> str:
    try:
        kind, _ = betterproto2.which_one_of(message, "event")
    except RuntimeError:
        return "invalid"  # more than one member of the oneof set
    return kind or "none"


@dataclass(frozen=True, slots=True)
class Finding:
    """A contract break a protocol driver saw in the native messages themselves, where it leaves no
    trace in the normalised events (a count that is not cumulative, an in-band error, ...): filed
    under the clause whose protocol reading it breaks, and reported by that clause's validator."""

    clause: str
    what: str
    want: str
    got: str


@dataclass(slots=True)
class OutputView:
    """One output index as the stream delivered it (a missing ``output_index`` is read as 0)."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text_bytes: bytes = b""  # the text deltas' raw bytes, concatenated (a character may span deltas)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    deltas: list[TokenDelta] = field(default_factory=list)
    finishes: list[tuple[int, OutputFinished]] = field(default_factory=list)  # (seq, finish)
    ids_before_finish: int | None = None
    events_after_finish: int = 0

    @property
    def text(self) -> str:
        """The output's text; bytes that are not UTF-8 show up as surrogate escapes."""
        return self.text_bytes.decode("utf-8", "surrogateescape")

    @property
    def text_is_utf8(self) -> bool:
        try:
            self.text_bytes.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    @property
    def finish(self) -> OutputFinished | None:
        return self.finishes[0][1] if self.finishes else None


@dataclass(slots=True)
class StreamRecord:
    request: GenerateRequest
    events: list[Event] = field(default_factory=list)
    end: End = End.OPEN
    status: Status | None = None
    status_message: str = ""
    duration_s: float = 0.0
    detail: str = ""  # what broke, for BROKEN and HUNG
    findings: list[Finding] = field(default_factory=list)  # from the protocol driver (drivers/)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def messages(self) -> list[GenerateResponse]:
        return [e.message for e in self.events]

    @property
    def ended_ok(self) -> bool:
        return self.end is End.OK

    @property
    def accepted(self) -> bool:
        return bool(self.events)

    @property
    def prompt_info(self) -> PromptInfo | None:
        for e in self.events:
            if e.kind == "prompt_info":
                return e.message.prompt_info
        return None

    @property
    def error(self) -> RequestError | None:
        for e in self.events:
            if e.kind == "error":
                return e.message.error
        return None

    @property
    def usage(self) -> Usage | None:
        return self.events[-1].message.usage if self.events else None

    @property
    def n(self) -> int:
        """The number of outputs the request asked for."""
        return (self.request.sampling.n if self.request.sampling and self.request.sampling.n else None) or 1

    def outputs(self) -> dict[int, OutputView]:
        views: dict[int, OutputView] = {}
        for e in self.events:
            body: TokenDelta | OutputFinished | None = e.delta if e.delta is not None else e.finished
            if body is None:
                continue
            index = body.output_index or 0
            view = views.setdefault(index, OutputView(index))
            if view.finishes:
                view.events_after_finish += 1
            if isinstance(body, TokenDelta):
                view.deltas.append(body)
                if not view.finishes:
                    view.token_ids.extend(body.token_ids)
                    view.text_bytes += (
                        e.text_bytes
                        if e.text_bytes is not None
                        else body.text.encode("utf-8", "surrogateescape")
                    )
                    view.logprobs.extend(body.logprobs)
            else:
                if not view.finishes:
                    view.ids_before_finish = len(view.token_ids)
                view.finishes.append((e.seq, body))
        return dict(sorted(views.items()))

    def summary(self) -> str:
        kinds = [e.kind for e in self.events]
        return (
            f"{len(kinds)} messages {kinds[:12]}{'...' if len(kinds) > 12 else ''}, end={self.end.value}"
            + (
                f" {self.status.name if self.status else ''} {self.status_message!r}"
                if self.end is End.STATUS
                else ""
            )
        )
