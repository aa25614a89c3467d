"""lmrpc.v1 Generate events as TextGenerate and Generate responses (the walk over the events is
the base's, ``dialects/base/translator.py``).

SGLang's own gRPC server streams what its tokenizer manager yields, which is *cumulative* unless
the server runs with ``--incremental-streaming-output``: every response of an output carries all
of its text (TextGenerate) or all of its token ids (Generate) so far. This server does the same
(its GetServerInfo says ``"incremental_streaming_output": false``).

- streaming, each lmrpc TokenDelta of output i gives one response with output i's text or ids so
  far and ``finished = false``; the output's OutputFinished gives one more response with the same
  cumulative content, its finish reason and ``finished = true``. Every output ends with exactly one
  ``finished = true`` response; the stream ends after the last output's;
- final-only (``stream`` unset or false), each output is one response, ``finished = true``;
- Generate with ``return_text`` (SGLang 0.5.23) carries the output's text so far in ``text`` too;
- ``meta_info`` (``meta.py``) carries the output's ``index``: with n > 1 the outputs' responses
  interleave, and this protocol's messages have no other field to tell them apart.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import OutputFinished, TokenDelta
from reference_server.frontend.dialects.base import translator
from reference_server.frontend.dialects.base.translator import OutputSoFar
from reference_server.frontend.dialects.sglang_runtime.meta import (
    GenerationMeta,
    LogprobOptions,
    encoded,
    finish_reason,
)

Response = TypeVar("Response")


@dataclass
class CumulativeTranslator(translator.GenerateTranslator[Response]):
    logprobs: LogprobOptions | None = None
    received: float = field(default_factory=time.monotonic)

    complete_repeats_streamed_tokens: ClassVar[bool] = True  # every response is cumulative

    def chunk(self, request_id: str, index: int, delta: TokenDelta, output: OutputSoFar) -> Response:
        meta = GenerationMeta(request_id, index, self.prompt_tokens, len(output.token_ids), cached_tokens=0)
        return self.response(output, self._meta_info(meta, output), finished=False)

    def complete(
        self, request_id: str, finished: OutputFinished, output: OutputSoFar, cached_tokens: int
    ) -> Response:
        meta = GenerationMeta(
            request_id,
            finished.output_index or 0,
            self.prompt_tokens,
            finished.completion_tokens,
            cached_tokens,
            finish=finish_reason(finished),
            e2e_latency=time.monotonic() - self.received,
        )
        return self.response(output, self._meta_info(meta, output), finished=True)

    def _meta_info(self, meta: GenerationMeta, output: OutputSoFar) -> dict[str, str]:
        values: dict[str, Any] = meta.values()
        if self.logprobs is not None:
            values.update(self.logprobs.tuples(output.logprobs))
        return encoded(values)

    @abstractmethod
    def response(self, output: OutputSoFar, meta_info: dict[str, str], *, finished: bool) -> Response:
        """The protocol's message for output's content so far."""


class TextTranslator(CumulativeTranslator[rt.TextGenerateResponse]):
    def response(
        self, output: OutputSoFar, meta_info: dict[str, str], *, finished: bool
    ) -> rt.TextGenerateResponse:
        return rt.TextGenerateResponse(text=output.text, meta_info=meta_info, finished=finished)


@dataclass
class TokenTranslator(CumulativeTranslator[rt.GenerateResponse]):
    return_text: bool = False  # the request's return_text: the text so far in ``text`` too

    def response(
        self, output: OutputSoFar, meta_info: dict[str, str], *, finished: bool
    ) -> rt.GenerateResponse:
        return rt.GenerateResponse(
            output_ids=list(output.token_ids),
            meta_info=meta_info,
            finished=finished,
            text=output.text if self.return_text else None,
        )
