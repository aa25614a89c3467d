"""lmrpc.v1 Generate events as a dialect's Generate responses: the walk every dialect shares.

- ``PromptInfo``: remembered (prompt_tokens), sends nothing;
- ``TokenDelta`` of output i: streaming, one chunk (the dialect's ``chunk``); final-only, folded
  into the output;
- ``OutputFinished`` of output i: one ``complete`` (the dialect's), with the output's ids and
  logprobs so far and the cached prompt tokens once lmrpc reports them (on the last output's,
  with Usage);
- ``RequestError``: the call ends with that status and message (the dialects have no in-band
  error).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypedDict, TypeVar

import betterproto2
from grpclib import GRPCError, Status

from lmrpc.v1 import GenerateResponse, OutputFinished, TokenDelta, TokenLogprob
from reference_server.frontend.dialects.base.events import finish_reason, status_of

Response = TypeVar("Response")


@dataclass
class OutputSoFar:
    """What one output produced, kept for its ``complete``."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text: str = ""  # empty unless the lmrpc.v1 request asked for text

    def add(self, delta: TokenDelta) -> None:
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs
        self.text += delta.text


class CompleteCounts(TypedDict):
    """The fields of a ``GenerateComplete`` that every smg engine protocol has, logprobs and the
    matched stop aside (their message types and setters are the dialect's)."""

    output_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    index: int


@dataclass
class GenerateTranslator(ABC, Generic[Response]):
    stream: bool
    prompt_tokens: int = 0
    _outputs: dict[int, OutputSoFar] = field(default_factory=dict)

    #: Whether a streamed output's ids and logprobs are kept for its ``complete`` too (a
    #: dialect whose ``complete`` is cumulative in both modes). A final-only output's always are.
    complete_repeats_streamed_tokens: ClassVar[bool] = False

    def translate(self, event: GenerateResponse) -> list[Response]:
        kind, _ = betterproto2.which_one_of(event, "event")
        if kind == "prompt_info":
            assert event.prompt_info is not None
            self.prompt_tokens = event.prompt_info.prompt_tokens
            return []
        if kind == "delta":
            assert event.delta is not None
            return self._delta(event.request_id, event.delta)
        if kind == "finished":
            assert event.finished is not None
            cached = event.usage.cached_prompt_tokens if event.usage is not None else 0
            index = event.finished.output_index or 0
            output = self._outputs.pop(index, OutputSoFar())
            return [self.complete(event.request_id, event.finished, output, cached)]
        if kind == "error":
            assert event.error is not None
            raise status_of(event.error)
        raise GRPCError(Status.INTERNAL, f"unexpected Generate event {kind!r}")

    def _delta(self, request_id: str, delta: TokenDelta) -> list[Response]:
        index = delta.output_index or 0
        output = self._outputs.setdefault(index, OutputSoFar())
        if not self.stream or self.complete_repeats_streamed_tokens:
            output.add(delta)
        if not self.stream:
            return []
        return [self.chunk(request_id, index, delta, output)]

    def complete_counts(
        self, finished: OutputFinished, output: OutputSoFar, cached_tokens: int
    ) -> CompleteCounts:
        return CompleteCounts(
            output_ids=output.token_ids,
            finish_reason=finish_reason(finished.reason),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=finished.completion_tokens,
            cached_tokens=cached_tokens,
            index=finished.output_index or 0,
        )

    @abstractmethod
    def chunk(self, request_id: str, index: int, delta: TokenDelta, output: OutputSoFar) -> Response:
        """A streamed delta of output ``index``; ``output`` is what it produced so far."""

    @abstractmethod
    def complete(
        self, request_id: str, finished: OutputFinished, output: OutputSoFar, cached_tokens: int
    ) -> Response:
        """The end of an output."""
