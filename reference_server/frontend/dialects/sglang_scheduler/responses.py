"""lmrpc.v1 Generate events as SGLang-scheduler responses (the walk over the events is the
base's, ``dialects/base/translator.py``).

SGLang's chunks carry *delta* token ids but *cumulative* counts (the proto: "Generated tokens
(incremental chunk)", "Cumulative counts"); smg's ``ChunkSemantics::Cumulative`` takes an
output's completion tokens from its ``complete``. Every response echoes the request id.

- a ``chunk`` (streaming) has the new ids, ``completion_tokens`` the output's count so far, and
  the new tokens' logprobs;
- a ``complete`` has all of the output's ids and logprobs (cumulative, in both modes), "stop" /
  "length" / "abort", the matched EOS or stop token id or stop string, the output's completion
  tokens and the cached prompt tokens.
"""

from __future__ import annotations

from typing import ClassVar

from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc.v1 import OutputFinished, TokenDelta, TokenLogprob
from reference_server.frontend.dialects.base import translator
from reference_server.frontend.dialects.base.events import logprobs_message, matched_stop
from reference_server.frontend.dialects.base.translator import OutputSoFar


class GenerateTranslator(translator.GenerateTranslator[sglang.GenerateResponse]):
    complete_repeats_streamed_tokens: ClassVar[bool] = True

    def chunk(
        self, request_id: str, index: int, delta: TokenDelta, output: OutputSoFar
    ) -> sglang.GenerateResponse:
        chunk = sglang.GenerateStreamChunk(
            token_ids=list(delta.token_ids),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=len(output.token_ids),  # cumulative
            output_logprobs=_logprobs(delta.logprobs),  # incremental
            index=index,
        )
        return sglang.GenerateResponse(request_id=request_id, chunk=chunk)

    def complete(
        self, request_id: str, finished: OutputFinished, output: OutputSoFar, cached_tokens: int
    ) -> sglang.GenerateResponse:
        stop_string, token_id = matched_stop(finished.stop)
        complete = sglang.GenerateComplete(
            **self.complete_counts(finished, output, cached_tokens),
            output_logprobs=_logprobs(output.logprobs),
            matched_stop_str=stop_string,
            matched_token_id=token_id,
        )
        return sglang.GenerateResponse(request_id=request_id, complete=complete)


def _logprobs(logprobs: list[TokenLogprob]) -> sglang.OutputLogProbs | None:
    return logprobs_message(sglang.OutputLogProbs, sglang.TopLogProbs, logprobs)
