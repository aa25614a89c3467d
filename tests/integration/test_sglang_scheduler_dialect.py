"""The SGLang scheduler protocol (sglang.grpc.scheduler.SglangScheduler) on its own port
(``--sglang-scheduler-port``), driven by the official stubs of the pinned smg-grpc-proto package over grpcio
(an independent client)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import grpc
import pytest
from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from rawwire import raw_call
from smg_grpc_proto import (
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)
from smg_grpc_proto.generated import common_pb2

from lmrpc.client import LmrpcClient
from lmrpc.v1 import GenerateRequest, GetLoadRequest, SamplingParams, StoppingCriteria, TokenIds
from reference_server.models.tokenizer import TokenizerBundle
from reference_server.testing import ServerProcess

T = TypeVar("T")
pb = sglang_scheduler_pb2
TIMEOUT_S = 30.0
SERVICE = "sglang.grpc.scheduler.SglangScheduler"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(
        engine="fake", args=("--sglang-scheduler-port", "0", "--fake-token-delay", "0.01")
    ) as running:
        yield running


def run(target: str, body: Callable[[sglang_scheduler_pb2_grpc.SglangSchedulerStub], Awaitable[T]]) -> T:
    async def main() -> T:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)
            return await asyncio.wait_for(body(stub), TIMEOUT_S)

    return asyncio.run(main())


def sampling(**values: Any) -> Any:
    """Every value sent, as smg does for SGLang (the proto warns against default-constructed ones)."""
    explicit = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
    return pb.SamplingParams(**{**explicit, **values})


def generate_request(request_id: str, ids: list[int], *, stream: bool = True, **values: Any) -> Any:
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=sampling(**values),
        stream=stream,
        logprob_start_len=-1,
    )


async def responses(stub: Any, request: Any) -> list[Any]:
    return [r async for r in stub.Generate(request)]


async def lmrpc_tokens(target: str, request: GenerateRequest) -> list[list[int]]:
    async with LmrpcClient.connect(target) as client:
        result = await client.generate(request)
        return [list(output.token_ids) for output in result.outputs]


def test_detection_health_and_reflection(server: ServerProcess) -> None:
    """smg probes SGLang's HealthCheck first: it answers here, and only SGLang is served here."""

    async def body(stub: Any) -> None:
        health = await stub.HealthCheck(pb.HealthCheckRequest())
        assert health.healthy and health.message == "serving"
        async with grpc.aio.insecure_channel(server.sglang_scheduler_target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await vllm_engine_pb2_grpc.VllmEngineStub(channel).HealthCheck(
                    vllm_engine_pb2.HealthCheckRequest()
                )
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
            # grpcio's own health stubs would register the same proto symbols a second time
            check = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=HealthCheckRequest.SerializeToString,
                response_deserializer=HealthCheckResponse.FromString,
            )
            for name in ("", SERVICE):
                reply = await check(HealthCheckRequest(service=name))
                assert reply.status == HealthCheckResponse.SERVING
        async with LmrpcClient.connect(server.sglang_scheduler_target) as client:
            with pytest.raises(GRPCError) as lmrpc:
                await client.control.get_load(GetLoadRequest())
            assert lmrpc.value.status is Status.UNIMPLEMENTED

    run(server.sglang_scheduler_target, body)


def test_model_server_and_load_info(server: ServerProcess, tokenizer: TokenizerBundle) -> None:
    async def body(stub: Any) -> tuple[Any, Any, Any]:
        return (
            await stub.GetModelInfo(pb.GetModelInfoRequest()),
            await stub.GetServerInfo(pb.GetServerInfoRequest()),
            await stub.GetLoads(pb.GetLoadsRequest(include=["core", "disagg", "queues", "memory"])),
        )

    model, info, loads = run(server.sglang_scheduler_target, body)
    assert model.served_model_name == model.model_path == "fake-SmolLM2-135M-Instruct"
    assert model.is_generation and model.vocab_size == tokenizer.vocab_size
    assert list(model.eos_token_ids) == list(tokenizer.eos_token_ids) and model.pad_token_id == -1
    assert model.max_req_input_len == model.max_context_length - 1
    assert json.loads(model.default_sampling_params_json)["temperature"] == 1.0
    args = dict(info.server_args.items())
    assert args["served_model_name"] == model.served_model_name
    assert args["context_length"] == model.max_context_length and args["dp_size"] == 1
    assert info.max_total_num_tokens == loads.loads[0].max_total_num_tokens > 0
    assert loads.dp_rank_count == 1 and loads.aggregate.total_reqs == loads.loads[0].num_total_reqs


def test_the_tokenizer_bundle_is_the_vllm_ports(server: ServerProcess) -> None:
    async def bundle(target: str, stub_type: Any) -> tuple[bytes, str]:
        async with grpc.aio.insecure_channel(target) as channel:
            chunks = [c async for c in stub_type(channel).GetTokenizer(common_pb2.GetTokenizerRequest())]
        return b"".join(c.data for c in chunks), chunks[-1].sha256

    async def both() -> tuple[tuple[bytes, str], tuple[bytes, str]]:
        return (
            await bundle(server.sglang_scheduler_target, sglang_scheduler_pb2_grpc.SglangSchedulerStub),
            await bundle(server.target, vllm_engine_pb2_grpc.VllmEngineStub),
        )

    (data, sha), (vllm_data, vllm_sha) = asyncio.run(both())
    assert sha == hashlib.sha256(data).hexdigest() == vllm_sha and data == vllm_data


def test_chunks_carry_delta_ids_and_cumulative_counts(server: ServerProcess) -> None:
    ids = list(range(300, 330))
    expected = asyncio.run(
        lmrpc_tokens(
            server.target,
            GenerateRequest(
                token_ids=TokenIds(ids=ids),
                sampling=SamplingParams(temperature=0.0, n=2),
                stopping=StoppingCriteria(max_tokens=9, ignore_eos=True),
            ),
        )
    )

    async def body(stub: Any) -> tuple[list[Any], list[Any]]:
        args = {"temperature": 0.0, "n": 2, "max_new_tokens": 9, "ignore_eos": True}
        streamed = await responses(stub, generate_request("s-1", ids, **args))
        final = await responses(stub, generate_request("f-1", ids, stream=False, **args))
        return streamed, final

    streamed, final = run(server.sglang_scheduler_target, body)
    assert {r.request_id for r in streamed} == {"s-1"} and {r.request_id for r in final} == {"f-1"}
    for index in (0, 1):
        chunks = [r.chunk for r in streamed if r.HasField("chunk") and r.chunk.index == index]
        tokens: list[int] = []
        for chunk in chunks:
            tokens += chunk.token_ids
            assert chunk.completion_tokens == len(tokens) and chunk.prompt_tokens == len(ids)
        assert tokens == expected[index]
        (complete,) = [r.complete for r in streamed if r.HasField("complete") and r.complete.index == index]
        assert list(complete.output_ids) == tokens and complete.completion_tokens == 9
        assert complete.finish_reason == "length"
    assert all(r.HasField("complete") for r in final) and len(final) == 2
    assert {r.complete.index: list(r.complete.output_ids) for r in final} == dict(enumerate(expected))
    assert max(r.complete.cached_tokens for r in final) == len(ids) - 1  # the same prompt, again


def test_values_are_taken_as_sent(server: ServerProcess) -> None:
    """No presence in this protocol: temperature 0 is greedy, top_p 0 is out of range; a request
    without sampling_params runs with the server's defaults."""
    ids = [11, 12, 13, 14]
    greedy = asyncio.run(
        lmrpc_tokens(
            server.target,
            GenerateRequest(
                token_ids=TokenIds(ids=ids),
                sampling=SamplingParams(temperature=0.0),
                stopping=StoppingCriteria(max_tokens=6, ignore_eos=True),
            ),
        )
    )

    async def body(stub: Any) -> tuple[Any, grpc.aio.AioRpcError, grpc.aio.AioRpcError, list[Any]]:
        sent = await responses(
            stub,
            generate_request("t0", ids, stream=False, temperature=0.0, max_new_tokens=6, ignore_eos=True),
        )
        with pytest.raises(grpc.aio.AioRpcError) as top_p:
            await responses(stub, generate_request("p0", ids, top_p=0.0))
        with pytest.raises(grpc.aio.AioRpcError) as top_k:
            await responses(stub, generate_request("k2", ids, top_k=-2))
        defaults = await responses(
            stub, pb.GenerateRequest(request_id="d", tokenized=pb.TokenizedInput(input_ids=ids))
        )
        return sent[-1].complete, top_p.value, top_k.value, defaults

    complete, top_p, top_k, defaults = run(server.sglang_scheduler_target, body)
    assert [list(complete.output_ids)] == greedy
    assert top_p.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_p=0" in (top_p.details() or "")
    assert top_k.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_k=-2" in (top_k.details() or "")
    assert defaults[-1].complete.finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("request_fields", "sampling_fields", "field"),
    [
        ({}, {"structural_tag": "{}"}, "sampling_params.structural_tag"),
        ({}, {"logit_bias": {"5": 1.0}}, "sampling_params.logit_bias"),
        ({}, {"max_new_tokens": 0}, "max_new_tokens=0"),
        ({"return_logprob": True, "logprob_start_len": 0}, {}, "logprob_start_len=0"),
        ({"token_ids_logprob": [3]}, {}, "token_ids_logprob"),
        ({"return_hidden_states": True}, {}, "return_hidden_states"),
        ({"disaggregated_params": pb.DisaggregatedParams(bootstrap_host="h")}, {}, "disaggregated_params"),
        ({"custom_logit_processor": "x"}, {}, "custom_logit_processor"),
        ({"lora_id": "adapter-1"}, {}, "lora_id"),
        ({"input_embeds": [0.5]}, {}, "input_embeds"),
        ({"mm_inputs": pb.MultimodalInputs()}, {}, "mm_inputs"),
    ],
)
def test_unsupported_options_are_unimplemented(
    server: ServerProcess, request_fields: dict[str, Any], sampling_fields: dict[str, Any], field: str
) -> None:
    request = pb.GenerateRequest(
        request_id="u",
        tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
        sampling_params=sampling(**sampling_fields),
        logprob_start_len=-1,
    )
    for name, value in request_fields.items():
        if isinstance(value, list):
            getattr(request, name).extend(value)
        elif hasattr(value, "SerializeToString"):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)

    async def body(stub: Any) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await responses(stub, request)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert field in (refused.value.details() or "")

    run(server.sglang_scheduler_target, body)


def test_abort_covers_every_output_and_frees_the_engine(server: ServerProcess) -> None:
    async def body(stub: Any) -> tuple[list[Any], Any, Any]:
        call = stub.Generate(
            generate_request("to-abort", [7, 8, 9], max_new_tokens=4000, ignore_eos=True, n=3)
        )
        received = [await call.read()]  # generation is under way
        aborted = await stub.Abort(pb.AbortRequest(request_id="to-abort", reason="Stream dropped"))
        while (message := await call.read()) is not grpc.aio.EOF:
            received.append(message)
        unknown = await stub.Abort(pb.AbortRequest(request_id="never-seen", reason="test"))
        return received, aborted, unknown

    received, aborted, unknown = run(server.sglang_scheduler_target, body)
    assert aborted.success and not unknown.success
    completes = [r.complete for r in received if r.HasField("complete")]
    assert sorted(c.index for c in completes) == [0, 1, 2]
    assert all(c.finish_reason == "abort" and c.completion_tokens < 4000 for c in completes)

    async def load() -> Any:
        async with grpc.aio.insecure_channel(server.sglang_scheduler_target) as channel:
            stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)
            for _ in range(100):
                loads = await stub.GetLoads(pb.GetLoadsRequest())
                if not loads.loads[0].num_total_reqs:
                    break
                await asyncio.sleep(0.05)
            return loads.loads[0]

    idle = asyncio.run(load())
    assert idle.num_total_reqs == idle.num_running_reqs == idle.num_waiting_reqs == idle.num_used_tokens == 0


def test_the_edge_guard_decodes_strictly_on_this_port(server: ServerProcess) -> None:
    """Invalid UTF-8 in a string field is refused naming the field, before anything acts on it."""
    body = b"\x0a\x02\xff\xfe"  # request_id (field 1, a string) holding two bytes that are not UTF-8

    async def call() -> Any:
        channel = Channel("127.0.0.1", server.sglang_scheduler_port)
        try:
            return await raw_call(channel, f"/{SERVICE}/Generate", body)
        finally:
            channel.close()

    result = asyncio.run(call())
    assert result.status.name == "INVALID_ARGUMENT" and "request_id" in result.message and not result.replies


def test_health_turns_false_while_draining() -> None:
    """SMG-5: both dialects say healthy=false (status OK) while the server drains, so smg takes the
    worker out of rotation; HealthCheck itself keeps answering."""
    with ServerProcess(
        engine="fake",
        args=("--sglang-scheduler-port", "0", "--fake-token-delay", "0.02", "--drain-timeout", "20"),
    ) as running:

        async def body() -> tuple[Any, Any]:
            async with (
                grpc.aio.insecure_channel(running.sglang_scheduler_target) as sglang_channel,
                grpc.aio.insecure_channel(running.target) as vllm_channel,
            ):
                sglang = sglang_scheduler_pb2_grpc.SglangSchedulerStub(sglang_channel)
                vllm = vllm_engine_pb2_grpc.VllmEngineStub(vllm_channel)
                call = sglang.Generate(generate_request("long", [5, 6], max_new_tokens=4000, ignore_eos=True))
                await call.read()  # in flight: the drain waits for it
                running.terminate()
                for _ in range(200):
                    health = await sglang.HealthCheck(pb.HealthCheckRequest())
                    if not health.healthy:
                        break
                    await asyncio.sleep(0.02)
                other = await vllm.HealthCheck(vllm_engine_pb2.HealthCheckRequest())
                await sglang.Abort(pb.AbortRequest(request_id="long"))
                return health, other

        sglang_health, vllm_health = asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
        assert not sglang_health.healthy and sglang_health.message == "draining"
        assert not vllm_health.healthy and vllm_health.message == "draining"
