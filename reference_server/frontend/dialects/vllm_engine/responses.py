"""lmrpc.v1 Generate events as vLLM-dialect responses (the walk over the events is the base's,
``dialects/base/translator.py``).

- a ``chunk`` (streaming) has the new ids, and every count in it is per chunk, as the dialect's
  delta semantics say;
- a ``complete`` has "stop" / "length" / "abort", the matched EOS or stop token id or stop
  string, the output's completion tokens and the cached prompt tokens. Final-only, it carries all
  of the output's ids and logprobs; streaming, none (the chunks had them).
"""

from __future__ import annotations

from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import OutputFinished, StopMatch, TokenDelta, TokenLogprob
from reference_server.frontend.dialects.base import translator
from reference_server.frontend.dialects.base.events import logprobs_message, matched_stop
from reference_server.frontend.dialects.base.translator import OutputSoFar


class GenerateTranslator(translator.GenerateTranslator[vllm.GenerateResponse]):
    def chunk(
        self, request_id: str, index: int, delta: TokenDelta, output: OutputSoFar
    ) -> vllm.GenerateResponse:
        chunk = vllm.GenerateStreamChunk(
            token_ids=list(delta.token_ids),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=len(delta.token_ids),
            output_logprobs=_logprobs(delta.logprobs),
            index=index,
        )
        return vllm.GenerateResponse(chunk=chunk)

    def complete(
        self, request_id: str, finished: OutputFinished, output: OutputSoFar, cached_tokens: int
    ) -> vllm.GenerateResponse:
        complete = vllm.GenerateComplete(
            **self.complete_counts(finished, output, cached_tokens),
            output_logprobs=_logprobs(output.logprobs),
        )
        _set_matched_stop(complete, finished.stop)
        return vllm.GenerateResponse(complete=complete)


def _set_matched_stop(complete: vllm.GenerateComplete, stop: StopMatch | None) -> None:
    stop_string, token_id = matched_stop(stop)
    if stop_string is not None:
        complete.matched_stop_str = stop_string
    elif token_id is not None:
        complete.matched_token_id = token_id


def _logprobs(logprobs: list[TokenLogprob]) -> vllm.OutputLogProbs | None:
    return logprobs_message(vllm.OutputLogProbs, vllm.TopLogProbs, logprobs)
