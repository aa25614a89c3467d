"""Turns detokenizer events into the GenerateResponse messages of one stream.

Pending events of an output are merged into one TokenDelta (a slow reader gets fewer, larger
deltas; STREAM-9). Every token reaches a delta before its output's OutputFinished (FINISH-2);
Usage rides on the terminal message only (USAGE-1).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from lmrpc.v1 import (
    FinishReason,
    GenerateResponse,
    OutputFinished,
    RequestError,
    StopMatch,
    TokenCandidate,
    TokenDelta,
    Usage,
)
from lmrpc.v1 import TokenLogprob as TokenLogprobMessage
from reference_server.ipc import Finish, OutputEvent, TokenLogprob

_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "aborted": FinishReason.ABORTED,
}


@dataclass
class _Pending:
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: Finish | None = None
    completion_tokens: int = 0


@dataclass
class StreamAssembler:
    request_id: str
    num_outputs: int
    prompt_tokens: int
    return_token_ids: bool
    return_logprobs: bool
    final_only: bool
    cached_prompt_tokens: int = 0
    _pending: dict[int, _Pending] = field(default_factory=dict)
    _completion: dict[int, int] = field(default_factory=dict)  # finished outputs -> their tokens

    @property
    def done(self) -> bool:
        return len(self._completion) == self.num_outputs

    def add(self, events: list[OutputEvent]) -> Iterator[GenerateResponse]:
        """Fold new events in and yield the messages they complete."""
        for event in events:
            if event.cached_prompt_tokens is not None:
                self.cached_prompt_tokens = event.cached_prompt_tokens
            if event.output_index in self._completion:
                continue
            pending = self._pending.setdefault(event.output_index, _Pending())
            pending.token_ids.extend(event.token_ids)
            pending.text.append(event.text)
            if event.logprobs:
                pending.logprobs.extend(event.logprobs)
            pending.completion_tokens = event.completion_tokens
            pending.finish = event.finish
        ready = sorted(
            index for index, p in self._pending.items() if not self.final_only or p.finish is not None
        )
        for index in ready:
            pending = self._pending.pop(index)
            delta = self._delta(index, pending)
            if delta is not None:
                yield delta
            if pending.finish is not None:
                self._completion[index] = pending.completion_tokens
                yield self._finished(index, pending)

    def abort_all(self) -> Iterator[GenerateResponse]:
        """Finish every output that is not finished yet as aborted (an abort that won before
        the request reached the engine)."""
        for index in range(self.num_outputs):
            if index not in self._completion:
                yield from self.add(
                    [OutputEvent(self.request_id, index, [], "", None, Finish("aborted"), 0, None)]
                )

    def error(self, code: int, message: str, *, retryable: bool) -> GenerateResponse:
        return GenerateResponse(
            request_id=self.request_id,
            error=RequestError(code=code, message=message, retryable=retryable),
            usage=self._usage(),
        )

    def _delta(self, index: int, pending: _Pending) -> GenerateResponse | None:
        text = "".join(pending.text)
        if not pending.token_ids and not text:
            return None
        logprobs = [_logprob_message(lp) for lp in pending.logprobs] if self.return_logprobs else []
        return GenerateResponse(
            request_id=self.request_id,
            delta=TokenDelta(
                output_index=index,
                token_ids=pending.token_ids if self.return_token_ids else [],
                text=text,
                logprobs=logprobs,
            ),
        )

    def _finished(self, index: int, pending: _Pending) -> GenerateResponse:
        finish = pending.finish
        assert finish is not None
        return GenerateResponse(
            request_id=self.request_id,
            finished=OutputFinished(
                output_index=index,
                reason=_REASONS[finish.reason],
                stop=_stop_match(finish),
                completion_tokens=pending.completion_tokens,
            ),
            usage=self._usage() if self.done else None,
        )

    def _usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=sum(self._completion.values()),
            cached_prompt_tokens=self.cached_prompt_tokens,
        )


def _stop_match(finish: Finish) -> StopMatch | None:
    if finish.reason != "stop":
        return None
    if finish.stop_string is not None:
        return StopMatch(stop_string=finish.stop_string)
    if finish.stop_token_id is not None:
        return StopMatch(stop_token_id=finish.stop_token_id)
    assert finish.eos_token_id is not None
    return StopMatch(eos_token_id=finish.eos_token_id)


def _logprob_message(lp: TokenLogprob) -> TokenLogprobMessage:
    return TokenLogprobMessage(
        token_id=lp.token_id,
        logprob=lp.logprob,
        rank=lp.rank,
        top=[TokenCandidate(token_id=t, logprob=v) for t, v in lp.top],
    )
