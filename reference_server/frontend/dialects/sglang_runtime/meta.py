"""``meta_info``: SGLang's stringly-typed map of facts about a generation or an embedding.

SGLang's gRPC server encodes every value of the tokenizer manager's ``meta_info`` dict as JSON
("so clients can recover numbers, booleans, arrays, and objects losslessly"), strings included:
``prompt_tokens`` is ``"12"``, ``id`` is ``"\\"req-1\\""``, ``finish_reason`` is ``"null"`` until
the output ends and then an object such as ``{"type": "stop", "matched": 2}``. This module builds
the same keys with the same JSON types; ``docs/protocols/sglang-runtime.md`` lists them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmrpc.v1 import FinishReason, OutputFinished, TokenLogprob

WEIGHT_VERSION = "default"  # SGLang's until a client names a version (this protocol cannot)
ABORT_MESSAGE = "the request was aborted (Abort, PauseGeneration mode=abort, or shutdown)"

TokenText = Callable[[int], str | None]  # a token's text for logprob tuples, or None


def encoded(values: dict[str, Any]) -> dict[str, str]:
    """Each value as JSON text, the way SGLang's gRPC bridge writes meta_info."""
    return {key: json.dumps(value) for key, value in values.items()}


def finish_reason(finished: OutputFinished) -> dict[str, Any]:
    """SGLang's finish reason object: what ended the output and what matched."""
    if finished.reason == FinishReason.STOP:
        stop = finished.stop
        matched: str | int | None = None
        if stop is not None:
            matched = stop.stop_string if stop.stop_string is not None else stop.stop_token_id
            if matched is None:
                matched = stop.eos_token_id
        return {"type": "stop", "matched": matched}
    if finished.reason == FinishReason.LENGTH:
        return {"type": "length", "length": finished.completion_tokens}
    return {"type": "abort", "message": ABORT_MESSAGE}


@dataclass(frozen=True, slots=True)
class LogprobOptions:
    """What a request asked of logprobs: ``top`` candidates per token, token texts or None."""

    top: int
    token_text: TokenText

    def tuples(self, logprobs: list[TokenLogprob]) -> dict[str, Any]:
        """The output logprob keys, cumulative: ``[logprob, token_id, text]`` per token (text
        null unless asked for), and the top candidates per token when ``top`` > 0. There are no
        prompt logprobs (``input_token_logprobs`` is always empty)."""
        values: dict[str, Any] = {
            "input_token_logprobs": [],
            "output_token_logprobs": [
                [lp.logprob, lp.token_id, self.token_text(lp.token_id)] for lp in logprobs
            ],
            "output_token_logprobs_length": len(logprobs),
        }
        if self.top > 0:
            values["input_top_logprobs"] = []
            values["output_top_logprobs"] = [
                [[c.logprob, c.token_id, self.token_text(c.token_id)] for c in lp.top] for lp in logprobs
            ]
        return values


@dataclass(frozen=True, slots=True)
class GenerationMeta:
    """The meta_info of one response of one output."""

    rid: str
    index: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish: dict[str, Any] | None = None
    e2e_latency: float | None = None  # seconds since the request arrived; on the finish only

    def values(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish,
            "prompt_tokens": self.prompt_tokens,
            "weight_version": WEIGHT_VERSION,
            "total_retractions": 0,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "index": self.index,
        }
        if self.e2e_latency is not None:
            values["e2e_latency"] = self.e2e_latency
        return values


def embedding_meta(rid: str, prompt_tokens: int) -> dict[str, str]:
    return encoded(
        {
            "id": rid,
            "finish_reason": {"type": "length", "length": 0},
            "prompt_tokens": prompt_tokens,
            "weight_version": WEIGHT_VERSION,
            "total_retractions": 0,
        }
    )
