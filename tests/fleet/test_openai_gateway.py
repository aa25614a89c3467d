"""OpenAI client -> smg -> two reference servers (fake engine) over their vLLM dialect; and
structured output and forced tool calls through smg to one reference server on the real model."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from gateway_fleet import CLIENT_TIMEOUT_S, FAKE_MODEL, Fleet, start_replica, wait_until

from lmrpc.client import LmrpcClient
from lmrpc.v1 import ChatInput, ChatMessage, GenerateRequest, SamplingParams, StoppingCriteria
from reference_server.models.source import DEFAULT_MODEL_ID
from reference_server.smg_gateway import SmgGateway

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def direct_chat(fleet: Fleet, max_tokens: int) -> tuple[str, int]:
    """The same greedy chat straight over lmrpc.v1: its text and prompt length."""

    async def call() -> tuple[str, int]:
        async with LmrpcClient.connect(fleet.replicas[0].server.target) as client:
            result = await client.generate(
                GenerateRequest(
                    chat=ChatInput(messages=[ChatMessage(role="user", content=QUESTION[0]["content"])]),
                    sampling=SamplingParams(temperature=0.0),
                    stopping=StoppingCriteria(max_tokens=max_tokens),
                )
            )
            return result.text, result.usage.prompt_tokens

    return asyncio.run(call())


def test_chat_answers_as_a_direct_lmrpc_call(fleet: Fleet) -> None:
    answer = fleet.client().chat.completions.create(
        model=FAKE_MODEL,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
    )
    text, prompt_tokens = direct_chat(fleet, 12)
    choice = answer.choices[0]
    assert choice.message.content == text and choice.finish_reason == "length"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt_tokens, 12)


def test_streaming_equals_non_streaming(fleet: Fleet) -> None:
    client = fleet.client()
    whole = client.chat.completions.create(
        model=FAKE_MODEL,
        messages=QUESTION,
        max_tokens=10,
        temperature=0,  # type: ignore[arg-type]
    )
    stream = client.chat.completions.create(
        model=FAKE_MODEL, messages=QUESTION, max_tokens=10, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert content == whole.choices[0].message.content and finish == ["length"]
    usage = chunks[-1].usage
    assert usage is not None and whole.usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, 10)
    # the second time round the prompt came from the prefix cache (smg shows lmrpc's count)
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens


def test_completions(fleet: Fleet) -> None:
    completion = fleet.client().completions.create(
        model=FAKE_MODEL, prompt="one two three four", max_tokens=5, temperature=0
    )
    # the fake engine echoes its prompt greedily
    assert completion.choices[0].text.startswith("one two three four"[:5])
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 5


def test_n_with_a_seed_is_reproducible(fleet: Fleet) -> None:
    client = fleet.client()

    def sample() -> list[str]:
        response = client.chat.completions.create(
            model=FAKE_MODEL,
            messages=QUESTION,
            max_tokens=12,
            n=2,
            seed=7,
            temperature=1.0,  # type: ignore[arg-type]
        )
        return [c.message.content or "" for c in sorted(response.choices, key=lambda c: c.index)]

    first = sample()
    assert len(first) == 2 and first[0] != first[1]  # two different samples
    assert sample() == first  # whichever replica serves it


def test_stop_strings(fleet: Fleet) -> None:
    client = fleet.client()
    free = client.chat.completions.create(
        model=FAKE_MODEL,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
    )
    text = free.choices[0].message.content or ""
    word = text.split()[2]
    stopped = client.chat.completions.create(
        model=FAKE_MODEL,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stop=[word],  # type: ignore[arg-type]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(word)]


def test_max_tokens_finishes_with_length(fleet: Fleet) -> None:
    response = fleet.client().chat.completions.create(
        model=FAKE_MODEL,
        messages=QUESTION,
        max_tokens=3,
        temperature=0,  # type: ignore[arg-type]
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None and response.usage.completion_tokens == 3


def test_a_bad_request_is_a_4xx_with_our_message(fleet: Fleet) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        fleet.client().chat.completions.create(
            model=FAKE_MODEL,
            messages=QUESTION,
            max_tokens=100_000,  # type: ignore[arg-type]
        )
    assert refused.value.status_code == 400
    assert "stopping.max_tokens=100000 plus the" in str(refused.value)


def test_a_client_disconnect_aborts_the_request(fleet: Fleet) -> None:
    aborts_before = sum(r.metric("lmrpc:grpc_requests_total", rpc="Abort") for r in fleet.replicas)
    # greedy over a plain prompt: the fake engine echoes it and never reaches EOS (sampled, it draws
    # EOS about one step in 50, and a chat prompt holds an EOS its greedy echo would stop at)
    stream = fleet.client().completions.create(
        model=FAKE_MODEL, prompt="one two three four", max_tokens=4000, temperature=0, stream=True
    )
    for received, _ in enumerate(stream, start=1):
        if received == 3:
            break
    stream.close()  # the HTTP client goes away mid-generation
    wait_until(
        lambda: (
            sum(r.metric("lmrpc:grpc_requests_total", rpc="Abort") for r in fleet.replicas) > aborts_before
        ),
        "smg's Abort to reach a replica",
    )

    def idle() -> bool:
        loads = [r.load() for r in fleet.replicas]
        return all(
            load.active_requests == load.running_sequences == load.waiting_sequences == 0 for load in loads
        )

    wait_until(idle, "every replica's GetLoad back at zero")


def test_both_replicas_receive_traffic(fresh_fleet: Fleet) -> None:
    """On a fleet of its own: on the shared one, CI once saw 32 distinct prompts in a row go to one
    replica after the disconnect test. smg's routing state there (per-worker load and request
    counts, cache trees) is whatever earlier tests left; which part of it did that is not known."""
    client = fresh_fleet.client()
    # Short distinct prompts share no cached block, so smg sends each to the least-loaded replica,
    # ties going to the one that has processed fewer requests: they alternate.
    for i in range(32):
        client.completions.create(model=FAKE_MODEL, prompt=f"{i} unrelated prompt {i * 7919}", max_tokens=2)
        served = [r.generate_calls() for r in fresh_fleet.replicas]
        if all(served):
            return
    pytest.fail(
        f"32 distinct prompts all went to one replica: {served}; smg's workers: {fresh_fleet.gateway.workers()}"
    )


def test_a_repeated_long_prefix_lands_on_the_replica_that_cached_it(fleet: Fleet) -> None:
    client, gateway = fleet.client(), fleet.gateway
    prefix = " ".join(f"clause{i}" for i in range(200))  # ~400 tokens: ~25 full blocks
    before = [r.generate_calls() for r in fleet.replicas]
    client.completions.create(model=FAKE_MODEL, prompt=prefix, max_tokens=2)
    served = [r.generate_calls() - b for r, b in zip(fleet.replicas, before, strict=True)]
    holder = served.index(1)

    def smg_has_applied_every_batch() -> bool:  # the KV events reach smg on their own stream
        return all(
            gateway.metric(
                "smg_kv_event_batches_total", worker=f"grpc://{r.server.target}", disposition="applied"
            )
            >= r.metric("lmrpc:kv_event_batches_total")
            for r in fleet.replicas
        )

    wait_until(smg_has_applied_every_batch, "smg to apply the replicas' KV events")
    hits_before = gateway.metric("smg_cache_aware_policy_branch_total", branch="event_hit")
    before = [r.generate_calls() for r in fleet.replicas]
    for i in range(6):
        client.completions.create(model=FAKE_MODEL, prompt=f"{prefix} and then {i}", max_tokens=2)
    served = [r.generate_calls() - b for r, b in zip(fleet.replicas, before, strict=True)]
    assert served[holder] == 6 and served[1 - holder] == 0
    # routed on the replica's exact KV events, not on smg's approximate tree
    assert gateway.metric("smg_cache_aware_policy_branch_total", branch="event_hit") - hits_before >= 6


def test_embeddings_reach_the_embedding_model(fleet: Fleet) -> None:
    """smg sends /v1/embeddings to the dialect's Embed: token ids of the generation model's
    tokenizer, decoded and embedded by the server's embedding model."""
    response = fleet.client().embeddings.create(model=FAKE_MODEL, input="a sentence to embed")
    vector = response.data[0].embedding
    assert len(vector) == 384 and abs(sum(x * x for x in vector) - 1.0) < 1e-3
    assert response.usage.prompt_tokens > 0


# Structured output and forced tool calls on the real model (SmolLM2-135M): smg turns
# response_format and tool_choice required / a named function into the lmrpc.v1 constraint the
# reference server decodes under (contract revision 5), so every answer is valid against its
# schema, streamed and not, greedy and n = 2 sampled. Each answer is a few dozen tokens.

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PERSON_FORMAT: Any = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
}
PERSON_QUESTION: Any = [{"role": "user", "content": "Describe a person as JSON: their name and age."}]
PARAMETERS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "get_time": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": name, "description": f"{name} in a city", "strict": True, "parameters": schema},
    }
    for name, schema in PARAMETERS.items()
]
WEATHER_QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_CHOICES: Any = {"required": "required", "named": {"type": "function", "function": {"name": "get_time"}}}
SAMPLINGS = {"greedy": {"temperature": 0}, "n=2": {"n": 2, "temperature": 1.0, "seed": 3}}
REAL_TOKENS = 48
each_sampling = pytest.mark.parametrize("sampling", list(SAMPLINGS))


@pytest.fixture(scope="module")
def model_client() -> Iterator[openai.OpenAI]:
    """The official client -> smg -> one reference server on the real default model."""
    with contextlib.ExitStack() as stack:
        replica = start_replica(stack, engine="model", args=("--no-embedding", "--threads", "1"))
        gateway = stack.enter_context(SmgGateway([replica.server.target], model=DEFAULT_MODEL_ID))
        yield openai.OpenAI(
            base_url=gateway.base_url, api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT_S
        )


@pytest.mark.model
@pytest.mark.slow
@each_sampling
def test_response_format_json_schema_is_valid_against_the_schema(
    model_client: openai.OpenAI, sampling: str
) -> None:
    options = SAMPLINGS[sampling]
    n = options.get("n", 1)
    whole = model_client.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=PERSON_QUESTION, max_tokens=REAL_TOKENS,
        response_format=PERSON_FORMAT, **options,
    )  # fmt: skip
    assert sorted(c.index for c in whole.choices) == list(range(n))
    for choice in whole.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content or ""), PERSON)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in model_client.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=PERSON_QUESTION, max_tokens=REAL_TOKENS,
        response_format=PERSON_FORMAT, stream=True, **options,
    ):  # fmt: skip
        for delta in chunk.choices:
            texts[delta.index] = texts.get(delta.index, "") + (delta.delta.content or "")
            if delta.finish_reason:
                finishes[delta.index] = delta.finish_reason
    assert finishes == dict.fromkeys(range(n), "stop")
    for text in texts.values():
        jsonschema.validate(json.loads(text), PERSON)
    if sampling == "greedy":
        assert texts[0] == whole.choices[0].message.content


def assert_calls_valid(calls: list[tuple[str, str, str]], tool_choice: str) -> None:
    """(id, name, arguments) of one choice's calls: one call or more, of get_time when named, each
    with an id and arguments valid against its function's parameters."""
    assert calls, "a forced tool call made no call"
    for call_id, name, arguments in calls:
        assert call_id and name in PARAMETERS and (tool_choice != "named" or name == "get_time")
        jsonschema.validate(json.loads(arguments), PARAMETERS[name])


@pytest.mark.model
@pytest.mark.slow
@each_sampling
@pytest.mark.parametrize("tool_choice", list(TOOL_CHOICES))
def test_a_forced_tool_call_is_valid_against_the_function(
    model_client: openai.OpenAI, sampling: str, tool_choice: str
) -> None:
    options = {"tools": TOOLS, "tool_choice": TOOL_CHOICES[tool_choice], **SAMPLINGS[sampling]}
    n = options.get("n", 1)
    whole = model_client.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=WEATHER_QUESTION, max_tokens=REAL_TOKENS, **options
    )
    assert sorted(c.index for c in whole.choices) == list(range(n))
    for choice in whole.choices:
        assert choice.finish_reason in ("tool_calls", "stop"), choice  # OpenAI answers a named call "stop"
        calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        assert_calls_valid(calls, tool_choice)
    # streamed through the SDK's own stream helper, which joins each call's deltas as a client does
    # (a name sent twice comes out doubled, and fails) and parses the arguments of a strict function
    with model_client.chat.completions.stream(
        model=DEFAULT_MODEL_ID, messages=WEATHER_QUESTION, max_tokens=REAL_TOKENS, **options
    ) as stream:
        final = stream.get_final_completion()
    assert sorted(c.index for c in final.choices) == list(range(n))
    for choice in final.choices:
        assert choice.finish_reason in ("tool_calls", "stop"), choice
        calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        assert_calls_valid(calls, tool_choice)
        for call in choice.message.tool_calls or []:
            assert call.function.parsed_arguments == json.loads(call.function.arguments)
