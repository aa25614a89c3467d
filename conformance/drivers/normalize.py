"""smg engine-protocol Generate messages as lmrpc.v1 events, following each protocol's own semantics.

Both protocols answer with ``chunk`` and ``complete`` messages; they differ in what a chunk's
counts mean, which is what smg keys its accounting on (``ChunkSemantics``,
``model_gateway/src/routers/grpc/proto_wrapper.rs``, and ``CompletionTokenTracker`` in
``common/response_formatting.rs``):

- vLLM (*delta*): every count in a chunk is the chunk's own; smg counts an output's tokens from
  its chunks' ids and reads neither ``output_ids`` nor ``completion_tokens`` of a streaming
  ``complete`` (vLLM's servicer repeats the last delta there, smg-project/smg#282);
- SGLang (*cumulative*): chunk ids are new ids, but chunk counts are the output's totals so far,
  and the ``complete``'s ``completion_tokens`` is the output's count.

What the events get:

- the first message of the call is preceded by a ``PromptInfo`` (the protocols send nothing
  before the first token; ``prompt_tokens`` rides on every message);
- a chunk is a ``TokenDelta`` of its ``index``, logprobs included (the protocols carry no rank:
  it is the token's position in ``top``, or one past it);
- a ``complete`` is an ``OutputFinished``: ``finish_reason`` "stop"/"length"/"abort"; a matched
  token id is a ``stop_token_id`` when the request asked for it, else an ``eos_token_id``; a "stop"
  without a match is an EOS finish when the output's last token is an EOS id (vLLM reports no
  match for EOS), read the same way: a stop token when the request asked for that id too, since
  the protocol cannot say which of the two ended it. With ``stream = false`` its ``output_ids``
  come first as the one delta;
- the ``complete`` that finishes the last output carries the ``Usage`` smg builds: the prompt
  once (the maximum), the outputs' completion tokens summed, the largest ``cached_tokens``;
- a status after the first message (the protocols' errors) is a terminal ``RequestError``.

Breaks that leave no trace in those events are filed as findings under the clause whose
reading they break (a count of the wrong kind, a message with neither member, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from grpclib.const import Status

from conformance.stream.record import Finding
from lmrpc.v1 import (
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    OutputFinished,
    PromptInfo,
    RequestError,
    StopMatch,
    TokenCandidate,
    TokenDelta,
    TokenLogprob,
    Usage,
)

REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORTED}
MAX_FINDINGS_PER_CLAUSE = 5


class NativeTop(Protocol):
    @property
    def values(self) -> Sequence[float]: ...

    @property
    def token_ids(self) -> Sequence[int]: ...


class NativeLogprobs(Protocol):
    @property
    def token_logprobs(self) -> Sequence[float]: ...

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def top_logprobs(self) -> Sequence[NativeTop]: ...


class NativeChunk(Protocol):
    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...

    @property
    def index(self) -> int: ...

    @property
    def output_logprobs(self) -> NativeLogprobs | None: ...


class NativeComplete(Protocol):
    @property
    def output_ids(self) -> Sequence[int]: ...

    @property
    def finish_reason(self) -> str: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...

    @property
    def index(self) -> int: ...

    @property
    def output_logprobs(self) -> NativeLogprobs | None: ...

    @property
    def matched_token_id(self) -> int | None: ...

    @property
    def matched_stop_str(self) -> str | None: ...


def logprobs(native: NativeLogprobs | None) -> list[TokenLogprob]:
    if native is None:
        return []
    out = []
    for i, (token, value) in enumerate(zip(native.token_ids, native.token_logprobs, strict=False)):
        top = native.top_logprobs[i] if i < len(native.top_logprobs) else None
        candidates = [
            TokenCandidate(token_id=t, logprob=v) for t, v in zip(top.token_ids, top.values, strict=False)
        ] if top is not None else []  # fmt: skip
        ids = [c.token_id for c in candidates]
        rank = ids.index(token) + 1 if token in ids else len(ids) + 1
        out.append(TokenLogprob(token_id=token, logprob=value, rank=rank, top=candidates))
    return out


@dataclass
class _Output:
    ids: list[int] = field(default_factory=list)
    completes: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class Normalizer:
    request: GenerateRequest  # as the driver expressed it: token ids, the options the protocol carries
    cumulative: bool  # SGLang's counts; vLLM's are per chunk
    eos_ids: tuple[int, ...]
    findings: list[Finding]
    _outputs: dict[int, _Output] = field(default_factory=dict)
    _started: bool = False
    _usage_sent: bool = False

    @property
    def n(self) -> int:
        return (self.request.sampling.n if self.request.sampling else None) or 1

    @property
    def streaming(self) -> bool:
        return not (self.request.response is not None and self.request.response.final_only)

    @property
    def prompt_len(self) -> int:
        return len(self.request.token_ids.ids) if self.request.token_ids is not None else 0

    def note(self, clause: str, what: str, want: object, got: object) -> None:
        if sum(f.clause == clause for f in self.findings) < MAX_FINDINGS_PER_CLAUSE:
            self.findings.append(Finding(clause, what, str(want), str(got)))

    # ── messages ─────────────────────────────────────────────
    def start(self, request_id: str, prompt_tokens: int) -> list[GenerateResponse]:
        if self._started:
            return []
        self._started = True
        sampling = self.request.sampling
        seed = sampling.seed if sampling is not None and sampling.seed is not None else 0
        info = PromptInfo(prompt_tokens=prompt_tokens, num_outputs=self.n, seed=seed)
        return [GenerateResponse(request_id=request_id, prompt_info=info)]

    def chunk(self, request_id: str, chunk: NativeChunk) -> list[GenerateResponse]:
        out = self.start(request_id, chunk.prompt_tokens)
        output = self._outputs.setdefault(chunk.index, _Output())
        ids = list(chunk.token_ids)
        output.ids += ids
        self._counts("chunk", chunk.index, chunk.prompt_tokens, chunk.cached_tokens)
        want = len(output.ids) if self.cumulative else len(ids)
        if chunk.completion_tokens != want:
            kind = "the output's tokens so far (cumulative)" if self.cumulative else "its own ids (delta)"
            self.note(
                "USAGE-5",
                f"chunk of output {chunk.index}: completion_tokens ({kind})",
                want,
                chunk.completion_tokens,
            )
        delta = TokenDelta(output_index=chunk.index, token_ids=ids, logprobs=logprobs(chunk.output_logprobs))
        out.append(GenerateResponse(request_id=request_id, delta=delta))
        return out

    def complete(self, request_id: str, complete: NativeComplete) -> list[GenerateResponse]:
        out = self.start(request_id, complete.prompt_tokens)
        index = complete.index
        output = self._outputs.setdefault(index, _Output())
        output.completes += 1
        self._counts("complete", index, complete.prompt_tokens, complete.cached_tokens)
        if complete.finish_reason == "error":
            self.note(
                "ERR-2",
                f"complete of output {index}: finish_reason",
                "a failure ends the call with a non-OK status",
                "'error', and the call goes on (status OK)",
            )
            error = RequestError(code=Status.INTERNAL.value, message="finish_reason 'error'")
            return [*out, GenerateResponse(request_id=request_id, error=error)]
        if not self.streaming and output.completes == 1:
            output.ids = list(complete.output_ids)
            delta = TokenDelta(
                output_index=index, token_ids=output.ids, logprobs=logprobs(complete.output_logprobs)
            )
            out.append(GenerateResponse(request_id=request_id, delta=delta))
        elif self.streaming:
            self._streaming_complete(index, output, complete)
        counted = complete.completion_tokens if self.cumulative or not self.streaming else len(output.ids)
        if output.completes == 1:
            output.completion_tokens, output.prompt_tokens = counted, complete.prompt_tokens
            output.cached_tokens = complete.cached_tokens
        finished = OutputFinished(
            output_index=index,
            reason=REASONS.get(complete.finish_reason, FinishReason.UNSPECIFIED),
            stop=self._stop(complete, output.ids),
            completion_tokens=counted,
        )
        message = GenerateResponse(request_id=request_id, finished=finished)
        if not self._usage_sent and all(
            i in self._outputs and self._outputs[i].completes for i in range(self.n)
        ):
            self._usage_sent = True
            message.usage = self._usage()
        return [*out, message]

    def failure(self, request_id: str, status: Status, message: str) -> GenerateResponse:
        """A non-OK status after the first message: how these protocols end a failed request."""
        return GenerateResponse(request_id=request_id, error=RequestError(code=status.value, message=message))

    def nothing(self, request_id: str) -> list[GenerateResponse]:
        """A response with neither member: the in-band error these protocols removed."""
        self.note(
            "ERR-2",
            "a GenerateResponse",
            "a chunk or a complete (errors use gRPC status)",
            "neither: an in-band message the protocol no longer has",
        )
        return self.start(request_id, 0)

    # ── checks ───────────────────────────────────────────────
    def _counts(self, what: str, index: int, prompt_tokens: int, cached_tokens: int) -> None:
        if prompt_tokens != self.prompt_len:
            self.note("USAGE-2", f"{what} of output {index}: prompt_tokens (the prompt ids sent)", self.prompt_len,
                      prompt_tokens)  # fmt: skip
        if cached_tokens > prompt_tokens:
            self.note("USAGE-4", f"{what} of output {index}: cached_tokens", f"<= prompt_tokens={prompt_tokens}",
                      cached_tokens)  # fmt: skip

    def _streaming_complete(self, index: int, output: _Output, complete: NativeComplete) -> None:
        """A streaming complete adds no token: its ``output_ids`` (all of them, or the last delta,
        as the servicers send) are ids the chunks already carried."""
        tail = list(complete.output_ids)
        if tail and output.ids[-len(tail) :] != tail:
            self.note(
                "FINISH-2",
                f"complete of output {index}: output_ids",
                f"ids its chunks carried (a suffix of {output.ids[-8:]})",
                tail[-8:],
            )
        if not self.cumulative and complete.completion_tokens > len(output.ids):
            self.note(
                "FINISH-2",
                f"complete of output {index}: completion_tokens",
                f"<= {len(output.ids)}, the ids its chunks carried",
                complete.completion_tokens,
            )

    def _stop(self, complete: NativeComplete, ids: list[int]) -> StopMatch | None:
        if complete.matched_stop_str is not None:
            return StopMatch(stop_string=complete.matched_stop_str)
        stop_ids = self.request.stopping.stop_token_ids if self.request.stopping else []
        token = complete.matched_token_id
        if token is not None:
            return StopMatch(stop_token_id=token) if token in stop_ids else StopMatch(eos_token_id=token)
        if complete.finish_reason != "stop":
            return None
        if ids and ids[-1] in self.eos_ids:  # vLLM reports no match for an EOS token
            last = ids[-1]
            return StopMatch(stop_token_id=last) if last in stop_ids else StopMatch(eos_token_id=last)
        return StopMatch()  # "stop" with nothing that stopped it: FINISH-5 reports it

    def _usage(self) -> Usage:
        outputs = [self._outputs[i] for i in range(self.n)]
        return Usage(
            prompt_tokens=max(o.prompt_tokens for o in outputs),
            completion_tokens=sum(o.completion_tokens for o in outputs),
            cached_prompt_tokens=max(o.cached_tokens for o in outputs),
        )
