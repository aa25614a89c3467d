"""lmrpc.v1 Generate events as vLLM-dialect responses.

- ``PromptInfo``: remembered (prompt_tokens), sends nothing;
- ``TokenDelta`` of output i: streaming, one ``chunk`` with the new ids (every count in a chunk
  is per chunk, as the dialect's delta semantics say); final-only, folded into the output;
- ``OutputFinished`` of output i: one ``complete`` with "stop" / "length" / "abort", the matched
  EOS or stop token id or stop string, the output's completion tokens, and the cached prompt
  tokens once lmrpc reports them (on the last output's, with Usage). Final-only, it carries all
  of the output's ids and logprobs; streaming, none (the chunks had them);
- ``RequestError``: the call ends with that status and message, as the dialect wants errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import betterproto2
from grpclib import GRPCError, Status

from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import GenerateResponse, OutputFinished, StopMatch, TokenLogprob
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
    _outputs: dict[int, _Output] = field(default_factory=dict)  # final-only: what each output produced

    def translate(self, event: GenerateResponse) -> list[vllm.GenerateResponse]:
        kind, _ = betterproto2.which_one_of(event, "event")
        if kind == "prompt_info":
            assert event.prompt_info is not None
            self.prompt_tokens = event.prompt_info.prompt_tokens
            return []
        if kind == "delta":
            delta = event.delta
            assert delta is not None
            index = delta.output_index or 0
            if not self.stream:
                output = self._outputs.setdefault(index, _Output())
                output.token_ids += delta.token_ids
                output.logprobs += delta.logprobs
                return []
            chunk = vllm.GenerateStreamChunk(
                token_ids=list(delta.token_ids),
                prompt_tokens=self.prompt_tokens,
                completion_tokens=len(delta.token_ids),
                output_logprobs=_logprobs(delta.logprobs),
                index=index,
            )
            return [vllm.GenerateResponse(chunk=chunk)]
        if kind == "finished":
            assert event.finished is not None
            cached = event.usage.cached_prompt_tokens if event.usage is not None else 0
            return [vllm.GenerateResponse(complete=self._complete(event.finished, cached))]
        if kind == "error":
            assert event.error is not None
            raise status_of(event.error)
        raise GRPCError(Status.INTERNAL, f"unexpected Generate event {kind!r}")

    def _complete(self, finished: OutputFinished, cached_tokens: int) -> vllm.GenerateComplete:
        index = finished.output_index or 0
        output = self._outputs.pop(index, _Output())
        complete = vllm.GenerateComplete(
            output_ids=output.token_ids,
            finish_reason=finish_reason(finished.reason),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=finished.completion_tokens,
            cached_tokens=cached_tokens,
            output_logprobs=_logprobs(output.logprobs),
            index=index,
        )
        _set_matched_stop(complete, finished.stop)
        return complete


def _set_matched_stop(complete: vllm.GenerateComplete, stop: StopMatch | None) -> None:
    stop_string, token_id = matched_stop(stop)
    if stop_string is not None:
        complete.matched_stop_str = stop_string
    elif token_id is not None:
        complete.matched_token_id = token_id


def _logprobs(logprobs: list[TokenLogprob]) -> vllm.OutputLogProbs | None:
    return logprobs_message(vllm.OutputLogProbs, vllm.TopLogProbs, logprobs)
