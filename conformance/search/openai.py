"""Hypothesis strategies for OpenAI chat and completions requests, drawn only from what the server
was found to support (drivers/openai/support.py), so every draw is one it must answer 200."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from conformance.drivers.openai.exchange import Api, OpenAIRequest
from conformance.drivers.openai.support import Support
from conformance.search.strategies import PROMPTS, STOPS


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def body_for(api: Api, prompt: str, **fields: Any) -> dict[str, Any]:
    head: dict[str, Any] = {"messages": messages(prompt)} if api == "chat" else {"prompt": prompt}
    return {**head, **{k: v for k, v in fields.items() if v is not None}}


@st.composite
def openai_requests(
    draw: st.DrawFn,
    support: Support,
    max_tokens: int,
    *,
    greedy: bool = False,
    prompts: tuple[str, ...] = PROMPTS,
) -> OpenAIRequest:
    """A request the server must answer 200; ``greedy`` draws temperature 0 and no stream field
    (the comparison cases set it)."""
    api: Api = draw(st.sampled_from(support.apis()))
    fields: dict[str, Any] = {"max_tokens": draw(st.integers(1, max_tokens))}
    fields["temperature"] = 0 if greedy else draw(st.sampled_from([0, 0.7, 1.0, None]))
    if not greedy and draw(st.booleans()):
        fields["top_p"] = draw(st.sampled_from([0.5, 0.9, 1.0]))
    if support.has(api, "n"):
        fields["n"] = draw(st.sampled_from([None, 1, 2]))
        if fields["n"] == 2 and fields["temperature"] == 0 and not support.has(api, "greedy_n"):
            # several greedy choices are an option of their own, which this server refuses
            if greedy:
                del fields["n"]
            else:
                fields["temperature"] = 1.0
    if support.has(api, "seed") and not greedy:
        fields["seed"] = draw(st.none() | st.integers(0, 2**31 - 1))
    if support.has(api, "stop") and draw(st.booleans()):
        fields["stop"] = draw(st.lists(st.sampled_from(STOPS), min_size=1, max_size=3, unique=True))
    if support.has(api, "logprobs") and draw(st.booleans()):
        top = draw(st.integers(0, 3))
        fields.update({"logprobs": True, "top_logprobs": top} if api == "chat" else {"logprobs": top})
    if not greedy and support.has(api, "stream") and draw(st.booleans()):
        fields["stream"] = True
        if support.has(api, "include_usage") and draw(st.booleans()):
            fields["stream_options"] = {"include_usage": True}
    return OpenAIRequest(api, body_for(api, draw(st.sampled_from(prompts)), **fields))
