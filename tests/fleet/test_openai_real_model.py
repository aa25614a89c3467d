"""The real default model (SmolLM2-135M on CPU) behind smg: the OpenAI answer is lmrpc's answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from gateway_fleet import CLIENT_TIMEOUT_S, Replica, start_replica
from openai import OpenAI

from lmrpc.client import LmrpcClient
from lmrpc.v1 import ChatInput, ChatMessage, GenerateRequest, SamplingParams, StoppingCriteria
from reference_server.models.source import DEFAULT_MODEL_ID
from reference_server.smg_gateway import SmgGateway

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(600)]

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def model_replica() -> Iterator[tuple[Replica, SmgGateway]]:
    with contextlib.ExitStack() as stack:
        replica = start_replica(stack, engine="model", args=("--no-embedding", "--threads", "1"))
        gateway = stack.enter_context(SmgGateway([replica.server.target], model=DEFAULT_MODEL_ID))
        yield replica, gateway


def test_greedy_chat_through_smg_equals_the_direct_lmrpc_answer(
    model_replica: tuple[Replica, SmgGateway],
) -> None:
    replica, gateway = model_replica

    async def direct() -> str:
        async with LmrpcClient.connect(replica.server.target) as client:
            result = await client.generate(
                GenerateRequest(
                    chat=ChatInput(messages=[ChatMessage(role="user", content=QUESTION)]),
                    sampling=SamplingParams(temperature=0.0),
                    stopping=StoppingCriteria(max_tokens=16),
                )
            )
            return result.text

    client = OpenAI(base_url=gateway.base_url, api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT_S)
    answer = client.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, temperature=0
    )
    text = answer.choices[0].message.content or ""
    assert "Paris" in text
    assert text == asyncio.run(direct())
    again = client.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(again)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1  # all but the last token
