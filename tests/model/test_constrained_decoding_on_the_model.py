"""Constrained decoding on the real model, over gRPC (CONSTRAIN-1, CONSTRAIN-4): every output of a
JSON-Schema-constrained request, greedy and sampled, streamed and final_only, is a JSON document
valid against the schema, and constraints change no other request's tokens."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from lmrpc.client import GenerateResult, LmrpcClient, StreamAggregator
from lmrpc.v1 import (
    ChatInput,
    ChatMessage,
    Constraint,
    FinishReason,
    FlushCacheRequest,
    GenerateRequest,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
)
from reference_server.testing import ServerProcess

pytestmark = pytest.mark.model

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "employed": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "city", "employed", "color"],
    "additionalProperties": False,
}
ASK = "Describe a person as JSON with their name, age, city, whether they are employed and a color."
MAX_TOKENS = 96
TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ("--no-embedding", "--kv-tokens", "4096", "--max-running", "8")
    with ServerProcess(
        engine="model", args=args, startup_timeout_s=300, env={"OMP_NUM_THREADS": "1"}
    ) as running:
        yield running


def person_request(sampling: SamplingParams, *, final_only: bool = False) -> GenerateRequest:
    return GenerateRequest(
        chat=ChatInput(messages=[ChatMessage(role="user", content=ASK)]),
        constraint=Constraint(json_schema=json.dumps(PERSON)),
        sampling=sampling,
        stopping=StoppingCriteria(max_tokens=MAX_TOKENS),
        response=ResponseOptions(final_only=final_only),
    )


async def generate(client: LmrpcClient, request: GenerateRequest) -> GenerateResult:
    aggregator = StreamAggregator()
    async for response in client.stream(request, timeout=TIMEOUT_S):
        aggregator.feed(response)
    return aggregator.result


def run(server: ServerProcess, *requests: GenerateRequest, flush: bool = False) -> list[GenerateResult]:
    """The requests sent together (so the engine batches them), in order; ``flush``: on an empty
    prefix cache."""

    async def main() -> list[GenerateResult]:
        async with LmrpcClient.connect(server.target) as client:
            if flush:
                await client.control.flush_cache(FlushCacheRequest())
            return list(await asyncio.gather(*(generate(client, r) for r in requests)))

    return asyncio.run(main())


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_every_output_is_a_valid_document_streamed_and_final_only(
    server: ServerProcess, temperature: float
) -> None:
    sampling = SamplingParams(temperature=temperature, seed=11, n=2)
    streamed, final = run(server, person_request(sampling), person_request(sampling, final_only=True))
    for result in (streamed, final):
        assert result.error is None and len(result.outputs) == 2
        for out in result.outputs:
            assert out.finish_reason == FinishReason.STOP, out
            assert out.stop is not None and out.stop.eos_token_id is not None, out.stop
            jsonschema.validate(json.loads(out.text), PERSON)
    assert [o.token_ids for o in streamed.outputs] == [o.token_ids for o in final.outputs]


def test_a_constraint_changes_no_other_request(server: ServerProcess) -> None:
    """CONSTRAIN-4: an unconstrained request gets the same tokens beside constrained ones as
    alone, and a constrained one the same tokens beside others as alone."""
    plain = GenerateRequest(
        text="The capital of France is", sampling=SamplingParams(temperature=0.8, seed=5, n=2),
        stopping=StoppingCriteria(max_tokens=32, ignore_eos=True),
    )  # fmt: skip
    greedy = GenerateRequest(
        text="Once upon a time", sampling=SamplingParams(temperature=0.0),
        stopping=StoppingCriteria(max_tokens=32, ignore_eos=True),
    )  # fmt: skip
    constrained = person_request(SamplingParams(temperature=0.9, seed=3, n=2))
    (plain_alone,) = run(server, plain)
    (greedy_alone,) = run(server, greedy)
    (constrained_alone,) = run(server, constrained)
    plain_beside, constrained_beside, greedy_beside = run(server, plain, constrained, greedy, flush=True)
    for alone, beside in (
        (plain_alone, plain_beside),
        (greedy_alone, greedy_beside),
        (constrained_alone, constrained_beside),
    ):
        assert [o.token_ids for o in alone.outputs] == [o.token_ids for o in beside.outputs]
