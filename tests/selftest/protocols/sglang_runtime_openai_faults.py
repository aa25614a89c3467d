"""One-fault mutants of the OpenAI API that SGLang's native service carries (``ChatComplete``,
``Complete``), judged by the OpenAI profile through ``--target sglang-runtime://HOST:PORT``: the
transport hides nothing the OpenAI cases would see over HTTP. Served by the sglang-runtime zoo
beside its own mutants (whose OpenAI RPCs pass through untouched)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from .engine_proxy import RuntimeProxy

OPENAI_RPCS = ("chat_complete", "complete")


def _chunk(message: Any) -> dict[str, Any] | None:
    try:
        value = json.loads(message.json_chunk) if message.json_chunk else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _only_choice(message: Any) -> dict[str, Any] | None:
    """The one choice of a streamed chunk, or None (a usage chunk, a whole body, the end)."""
    chunk = _chunk(message)
    choices = (
        chunk.get("choices") if chunk is not None and str(chunk.get("object", "")).endswith("chunk") else None
    )
    if not isinstance(choices, list) and chunk is not None and chunk.get("object") == "text_completion":
        choices = chunk.get("choices")  # completions stream text_completion objects
    return (
        choices[0]
        if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict)
        else None
    )


class TailLost(RuntimeProxy):
    """A streamed answer loses each choice's last content chunk before its finish (the last
    tokens lost, as SGLang's and Dynamo's OpenAI layers once did)."""

    name = "runtime-openai-tail-lost"
    expected = frozenset(
        {"FINISH-2[openai,greedy]", "STOP-2[openai,later-entry]", "STOP-2[openai,word]",
         "STOP-2[openai,before-multibyte]", "STOP-6[openai]",
         "STREAM-7[openai,pool]", "STREAM-2[openai,response_format]"}
    )  # fmt: skip
    # a streamed document cut short is STREAM-2[openai,response_format]'s finding; CONSTRAIN-1 sees
    # it too where the document would have closed within max_tokens, which the fake engine's does not
    tolerated = frozenset({"CONSTRAIN-1[openai,json_object]", "CONSTRAIN-1[openai,json_schema]",
                           "CONSTRAIN-1[openai,json_schema-nonstrict]"})  # fmt: skip

    async def replies(self, method: str, replies: AsyncIterator[Any]) -> AsyncIterator[Any]:
        held: dict[int, Any] = {}  # each choice's newest content chunk, not yet sent
        async for message in replies:
            choice = _only_choice(message) if method in OPENAI_RPCS else None
            if choice is None:
                yield message
                continue
            index = choice.get("index", 0)
            if choice.get("finish_reason") is not None:
                held.pop(index, None)  # the choice's last content never comes
            elif (choice.get("delta") or {}).get("content") or choice.get("text"):
                if index in held:
                    yield held.pop(index)
                held[index] = message
                continue
            yield message
        for message in held.values():
            yield message


class UsageOffByOne(RuntimeProxy):
    """``usage.completion_tokens`` (and the total) counts one token more than the choices hold."""

    name = "runtime-openai-usage-off-by-one"
    expected = frozenset(
        {
            "FINISH-6[openai,pool]",
            "N-2[openai]",
            "USAGE-3[openai,pool]",
            "USAGE-5[openai,pool]",
            "CAP-1[openai,max_completion_tokens]",  # 2 tokens counted as 3: past the limit
        }
    )
    # may also fail: the pool counts a choice's logprob entries against usage where the choice ended
    # "stop", which a sampled choice does only when it meets EOS (seen once in four busy runs)
    tolerated = frozenset({"STREAM-7[openai,pool]"})

    async def replies(self, method: str, replies: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for message in replies:
            chunk = _chunk(message)
            usage = chunk.get("usage") if chunk is not None else None
            if method in OPENAI_RPCS and isinstance(usage, dict):
                usage["completion_tokens"] += 1
                usage["total_tokens"] += 1
                message.json_chunk = json.dumps(chunk).encode()
            yield message


SGLANG_RUNTIME_OPENAI_MUTANTS: tuple[type[RuntimeProxy], ...] = (TailLost, UsageOffByOne)
