"""Fuzzing the edge: thousands of damaged request bodies per message type, over real gRPC.

Whatever the bytes, the answer is a deliberate status (never UNKNOWN or INTERNAL, ERR-1), no
stream fails with an internal error, and afterwards the server is SERVING and generates (ERR-5).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest
from grpclib import Status
from grpclib.client import Channel
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from rawwire import GENERATE, raw_call

from conformance.search.malformed import Fault, mutants, named_faults
from conformance.spec.descriptors import message_descriptor
from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import (
    AbortRequest,
    AllRequests,
    ChatInput,
    ChatMessage,
    DetokenizeRequest,
    EmbedRequest,
    GenerateRequest,
    GenerateResponse,
    RequestIds,
    ResponseOptions,
    ResumeGenerationRequest,
    SamplingParams,
    StoppingCriteria,
    TokenIds,
    TokenizeRequest,
)
from reference_server.testing import ServerProcess

BODIES_PER_TYPE = 1000
CONCURRENCY = 8
FORBIDDEN = {Status.UNKNOWN, Status.INTERNAL}

CONTROL = "/lmrpc.v1.ControlService/"
SEED_GENERATES = [
    GenerateRequest(
        request_id="fz",
        text="hello",
        sampling=SamplingParams(temperature=0.5, seed=3, n=2),
        stopping=StoppingCriteria(max_tokens=4, stop_strings=["x"], stop_token_ids=[2]),
    ),
    GenerateRequest(
        token_ids=TokenIds(ids=[5, 6, 7]),
        stopping=StoppingCriteria(max_tokens=3),
        response=ResponseOptions(return_logprobs=True, top_logprobs=2, final_only=True),
    ),
    GenerateRequest(
        chat=ChatInput(messages=[ChatMessage(role="user", content="hi")]),
        stopping=StoppingCriteria(max_tokens=2),
    ),
]
SEED_ABORTS = [AbortRequest(request_ids=RequestIds(ids=["fz", "other"])), AbortRequest(all=AllRequests())]
HEALTH_SEED = HealthCheckRequest(service="lmrpc.v1.ControlService").SerializeToString()
VLLM = "/vllm.grpc.engine.VllmEngine/"
VLLM_GENERATE = vllm.GenerateRequest(
    request_id="fz-vllm",
    tokenized=vllm.TokenizedInput(input_ids=[5, 6, 7]),
    sampling_params=vllm.SamplingParams(temperature=0.0, max_tokens=3),
    stream=True,
)

# request message type -> (method path, valid seed bodies)
TARGETS: dict[str, tuple[str, list[bytes]]] = {
    "lmrpc.v1.GenerateRequest": (GENERATE, [bytes(m) for m in SEED_GENERATES]),
    "lmrpc.v1.EmbedRequest": ("/lmrpc.v1.InferenceService/Embed", [bytes(EmbedRequest(texts=["a", "bc"]))]),
    "lmrpc.v1.AbortRequest": (CONTROL + "Abort", [bytes(m) for m in SEED_ABORTS]),
    "lmrpc.v1.TokenizeRequest": (CONTROL + "Tokenize", [bytes(TokenizeRequest(text="hello"))]),
    "lmrpc.v1.DetokenizeRequest": (CONTROL + "Detokenize", [bytes(DetokenizeRequest(token_ids=[5, 6]))]),
    "lmrpc.v1.GetServerInfoRequest": (CONTROL + "GetServerInfo", [b""]),
    "lmrpc.v1.GetModelInfoRequest": (CONTROL + "GetModelInfo", [b""]),
    "lmrpc.v1.GetLoadRequest": (CONTROL + "GetLoad", [b""]),
    "lmrpc.v1.FlushCacheRequest": (CONTROL + "FlushCache", [b""]),
    "lmrpc.v1.ResumeGenerationRequest": (CONTROL + "ResumeGeneration", [b""]),
    "lmrpc.v1.PauseGenerationRequest": (CONTROL + "PauseGeneration", [b""]),
    "grpc.health.v1.HealthCheckRequest": ("/grpc.health.v1.Health/Check", [HEALTH_SEED]),
    # smg's vLLM worker protocol, served on the same port through the same edge
    "vllm.grpc.engine.GenerateRequest": (VLLM + "Generate", [bytes(VLLM_GENERATE)]),
    "vllm.grpc.engine.AbortRequest": (VLLM + "Abort", [bytes(vllm.AbortRequest(request_ids=["fz"]))]),
    "vllm.grpc.engine.GetLoadsRequest": (VLLM + "GetLoads", [b""]),
    "vllm.grpc.engine.HealthCheckRequest": (VLLM + "HealthCheck", [b""]),
}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(engine="fake") as server:
        yield server


def seeds_and_faults(type_name: str) -> tuple[list[bytes], list[Fault]]:
    descriptor = (
        HealthCheckRequest.DESCRIPTOR if type_name.startswith("grpc.") else message_descriptor(type_name)
    )
    return TARGETS[type_name][1], named_faults(descriptor)


async def fuzz_one_type(channel: Channel, type_name: str, seed: int) -> list[str]:
    path, _ = TARGETS[type_name]
    seeds, faults = seeds_and_faults(type_name)
    bodies = mutants(seeds, faults, random.Random(seed))
    problems: list[str] = []
    semaphore = asyncio.Semaphore(CONCURRENCY)

    async def one(body: bytes) -> None:
        async with semaphore:
            result = await raw_call(channel, path, body, timeout=20)
        if result.status in FORBIDDEN:
            problems.append(f"{type_name} {body!r}: {result.status.name} {result.message}")
        if path == GENERATE:
            for reply in result.replies:
                error = GenerateResponse.parse(reply).error
                if error is not None and error.code in (Status.UNKNOWN.value, Status.INTERNAL.value):
                    problems.append(f"{type_name} {body!r}: in-stream {error}")

    await asyncio.gather(*(one(next(bodies)) for _ in range(BODIES_PER_TYPE)))
    if path.endswith("/PauseGeneration"):  # a damaged body may still parse, as an empty request
        await raw_call(channel, "/lmrpc.v1.ControlService/ResumeGeneration", bytes(ResumeGenerationRequest()))
    return problems


@pytest.mark.parametrize("type_name", list(TARGETS))
def test_damaged_bodies_never_get_unknown_or_internal(server: ServerProcess, type_name: str) -> None:
    async def main() -> None:
        channel = Channel("127.0.0.1", server.port)
        try:
            problems = await fuzz_one_type(channel, type_name, seed=sum(map(ord, type_name)))
            assert not problems, "\n".join(problems[:10])
            health = await HealthStub(channel).Check(HealthCheckRequest(), timeout=10)
            assert health.status == HealthCheckResponse.SERVING
            normal = await raw_call(
                channel,
                GENERATE,
                bytes(
                    GenerateRequest(text="still", stopping=StoppingCriteria(max_tokens=3, ignore_eos=True))
                ),
            )
            assert normal.status is Status.OK
            finished = GenerateResponse.parse(normal.replies[-1]).finished
            assert finished is not None and finished.completion_tokens == 3
        finally:
            channel.close()

    asyncio.run(main())
