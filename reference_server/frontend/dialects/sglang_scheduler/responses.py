"""lmrpc.v1 Generate events as SGLang-scheduler responses.

SGLang's chunks carry *delta* token ids but *cumulative* counts (the proto: "Generated tokens
(incremental chunk)", "Cumulative counts"); smg's ``ChunkSemantics::Cumulative`` takes an
output's completion tokens from its ``complete``. Every response echoes the request id.

- ``PromptInfo``: remembered (prompt_tokens), sends nothing;
- ``TokenDelta`` of output i: streaming, one ``chunk`` with the new ids, ``completion_tokens``
  the output's count so far, and the new tokens' logprobs; ``stream = false``, folded into the
  output;
- ``OutputFinished`` of output i: one ``complete`` with all of the output's ids and logprobs
  (cumulative, in both modes), "stop" / "length" / "abort", the matched EOS or stop token id or
  stop string, the output's completion tokens, and the cached prompt tokens once lmrpc reports
  them (on the last output's, with Usage);
- ``RequestError``: the call ends with that status and message (errors use gRPC status).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import betterproto2
from grpclib import GRPCError, Status

from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc.v1 import GenerateResponse, OutputFinished, TokenLogprob
from reference_server.frontend.dialects.base.events import (
    finish_reason,
    logprobs_message,
    matched_stop,
    status_of,
)


@dataclass
class _Output:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class GenerateTranslator:
    stream: bool
    prompt_tokens: int = 0
    _outputs: dict[int, _Output] = field(default_factory=dict)  # what each output produced so far

    def translate(self, event: GenerateResponse) -> list[sglang.GenerateResponse]:
        kind, _ = betterproto2.which_one_of(event, "event")
        if kind == "prompt_info":
            assert event.prompt_info is not None
            self.prompt_tokens = event.prompt_info.prompt_tokens
            return []
        if kind == "delta":
            delta = event.delta
            assert delta is not None
            index = delta.output_index or 0
            output = self._outputs.setdefault(index, _Output())
            output.token_ids += delta.token_ids
            output.logprobs += delta.logprobs
            if not self.stream:
                return []
            chunk = sglang.GenerateStreamChunk(
                token_ids=list(delta.token_ids),
                prompt_tokens=self.prompt_tokens,
                completion_tokens=len(output.token_ids),  # cumulative
                output_logprobs=_logprobs(delta.logprobs),  # incremental
                index=index,
            )
            return [sglang.GenerateResponse(request_id=event.request_id, chunk=chunk)]
        if kind == "finished":
            assert event.finished is not None
            cached = event.usage.cached_prompt_tokens if event.usage is not None else 0
            complete = self._complete(event.finished, cached)
            return [sglang.GenerateResponse(request_id=event.request_id, complete=complete)]
        if kind == "error":
            assert event.error is not None
            raise status_of(event.error)
        raise GRPCError(Status.INTERNAL, f"unexpected Generate event {kind!r}")

    def _complete(self, finished: OutputFinished, cached_tokens: int) -> sglang.GenerateComplete:
        index = finished.output_index or 0
        output = self._outputs.pop(index, _Output())
        stop_string, token_id = matched_stop(finished.stop)
        return sglang.GenerateComplete(
            output_ids=output.token_ids,
            finish_reason=finish_reason(finished.reason),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=finished.completion_tokens,
            cached_tokens=cached_tokens,
            output_logprobs=_logprobs(output.logprobs),
            matched_stop_str=stop_string,
            matched_token_id=token_id,
            index=index,
        )


def _logprobs(logprobs: list[TokenLogprob]) -> sglang.OutputLogProbs | None:
    return logprobs_message(sglang.OutputLogProbs, sglang.TopLogProbs, logprobs)
