"""The vLLM dialect (vllm.grpc.engine.VllmEngine) next to lmrpc.v1 on the same port, driven by
the official stubs of the pinned smg-grpc-proto package over grpcio (an independent client)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import signal
import zipfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import grpc
import pytest
from smg_grpc_proto import (
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)
from smg_grpc_proto.generated import common_pb2
from tokenizers import Tokenizer

from lmrpc.client import LmrpcClient
from lmrpc.v1 import GenerateRequest, GetLoadRequest, SamplingParams, StoppingCriteria, TokenIds
from reference_server.models.tokenizer import TokenizerBundle
from reference_server.testing import ServerProcess

T = TypeVar("T")
pb = vllm_engine_pb2
TIMEOUT_S = 30.0


def run(target: str, body: Callable[[vllm_engine_pb2_grpc.VllmEngineStub], Awaitable[T]]) -> T:
    async def main() -> T:
        async with grpc.aio.insecure_channel(target) as channel:
            return await asyncio.wait_for(body(vllm_engine_pb2_grpc.VllmEngineStub(channel)), TIMEOUT_S)

    return asyncio.run(main())


def generate_request(request_id: str, ids: list[int], *, stream: bool = True, **sampling: Any) -> Any:
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )


async def responses(stub: Any, request: Any) -> list[Any]:
    return [r async for r in stub.Generate(request)]


async def read_rest(call: Any) -> list[Any]:
    """What is left of a call that was read with ``read()`` (grpcio does not mix that with iteration)."""
    rest = []
    while (message := await call.read()) is not grpc.aio.EOF:
        rest.append(message)
    return rest


@pytest.fixture(scope="module")
def kv_server() -> Iterator[ServerProcess]:
    """A server of its own: these tests read its KV event sequence from the start."""
    with ServerProcess(engine="fake") as server:
        yield server


def test_health_and_detection(fake_server: ServerProcess) -> None:
    async def body(stub: Any) -> None:
        health = await stub.HealthCheck(pb.HealthCheckRequest())
        assert health.healthy and health.message == "serving"
        # smg probes SGLang's HealthCheck first and must not take this server for SGLang
        async with grpc.aio.insecure_channel(fake_server.target) as channel:
            sglang = sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await sglang.HealthCheck(sglang_scheduler_pb2.HealthCheckRequest())
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED

    run(fake_server.target, body)


def test_model_server_and_load_info(fake_server: ServerProcess, tokenizer: TokenizerBundle) -> None:
    async def body(stub: Any) -> tuple[Any, Any, Any]:
        return (
            await stub.GetModelInfo(pb.GetModelInfoRequest()),
            await stub.GetServerInfo(pb.GetServerInfoRequest()),
            await stub.GetLoads(pb.GetLoadsRequest(include=["core", "disagg", "queues", "memory"])),
        )

    model, server, loads = run(fake_server.target, body)
    assert model.served_model_name == model.model_path == "fake-SmolLM2-135M-Instruct"
    assert model.is_generation and model.vocab_size == tokenizer.vocab_size
    assert list(model.eos_token_ids) == list(tokenizer.eos_token_ids)
    assert model.bos_token_id == tokenizer.bos_token_id and model.pad_token_id == -1
    assert model.max_req_input_len == model.max_context_length - 1
    defaults = json.loads(model.default_sampling_params_json)
    assert defaults == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    assert server.data_parallel_size == 1 and server.block_size == 16 and server.max_num_seqs > 0
    assert loads.dp_rank_count == 1 and len(loads.loads) == 1
    assert loads.loads[0].max_total_num_tokens > 0 and loads.loads[0].max_running_requests > 0


def test_tokenizer_bundle_tokenizes_like_the_server(
    fake_server: ServerProcess, tokenizer: TokenizerBundle
) -> None:
    async def body(stub: Any) -> list[Any]:
        return [chunk async for chunk in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]

    chunks = run(fake_server.target, body)
    data = b"".join(c.data for c in chunks)
    assert all(not c.sha256 for c in chunks[:-1]) and chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    archive = zipfile.ZipFile(io.BytesIO(data))
    assert sorted(archive.namelist()) == [
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    config = json.loads(archive.read("tokenizer_config.json"))
    assert config["chat_template"] == tokenizer.chat_template
    assert (config["bos_token"], config["eos_token"]) == (tokenizer.bos_token, tokenizer.eos_token)
    assert json.loads(archive.read("generation_config.json"))["eos_token_id"] == tokenizer.eos_token_ids[0]
    shipped = Tokenizer.from_str(archive.read("tokenizer.json").decode())
    text = "Prices rose 12.5% in 2024 — naïve café 東京 <|im_end|>"
    assert shipped.encode(text, add_special_tokens=False).ids == tokenizer.encode(text)
    assert run(fake_server.target, body)[-1].sha256 == chunks[-1].sha256  # built once, same bytes


def test_stream_and_final_only_agree_with_lmrpc(fake_server: ServerProcess) -> None:
    ids = list(range(300, 340))
    lmrpc_request = GenerateRequest(
        token_ids=TokenIds(ids=ids),
        sampling=SamplingParams(temperature=0.9, seed=5, n=2),
        stopping=StoppingCriteria(max_tokens=12),
    )

    async def direct() -> list[list[int]]:
        async with LmrpcClient.connect(fake_server.target) as client:
            result = await client.generate(lmrpc_request)
            return [list(output.token_ids) for output in result.outputs]

    async def body(stub: Any) -> tuple[list[Any], list[Any]]:
        streamed = await responses(
            stub, generate_request("s", ids, temperature=0.9, seed=5, n=2, max_tokens=12)
        )
        final = await responses(
            stub, generate_request("f", ids, stream=False, temperature=0.9, seed=5, n=2, max_tokens=12)
        )
        return streamed, final

    expected = asyncio.run(direct())
    streamed, final = run(fake_server.target, body)
    chunks = [r.chunk for r in streamed if r.HasField("chunk")]
    completes = {r.complete.index: r.complete for r in streamed if r.HasField("complete")}
    for index in (0, 1):
        tokens = [t for c in chunks if c.index == index for t in c.token_ids]
        assert tokens == expected[index]
        assert all(c.completion_tokens == len(c.token_ids) and c.prompt_tokens == len(ids) for c in chunks)
        assert completes[index].finish_reason == "length" and completes[index].completion_tokens == 12
        assert not completes[index].output_ids  # streaming: the chunks carried them
    assert all(r.HasField("complete") for r in final) and len(final) == 2
    assert {r.complete.index: list(r.complete.output_ids) for r in final} == dict(enumerate(expected))
    assert max(r.complete.cached_tokens for r in final) == len(ids) - 1  # the same prompt, again


def test_stops_map_to_matched_stop(fake_server: ServerProcess, tokenizer: TokenizerBundle) -> None:
    # the fake engine echoes the prompt greedily
    ids = tokenizer.encode("alpha beta gamma delta epsilon")
    stop_word = tokenizer.decode(ids[2:3]).strip()

    async def body(stub: Any) -> tuple[Any, Any, Any]:
        by_string = await responses(
            stub, generate_request("a", ids, stream=False, temperature=0.0, stop=[stop_word])
        )
        by_token = await responses(
            stub, generate_request("b", ids, stream=False, temperature=0.0, stop_token_ids=[ids[3]])
        )
        eos = await responses(
            stub, generate_request("c", [*ids[:3], tokenizer.eos_token_ids[0]], stream=False, temperature=0.0)
        )
        return by_string[-1].complete, by_token[-1].complete, eos[-1].complete

    by_string, by_token, eos = run(fake_server.target, body)
    assert by_string.finish_reason == "stop" and by_string.matched_stop_str == stop_word
    assert by_token.finish_reason == "stop" and by_token.matched_token_id == ids[3]
    assert list(by_token.output_ids) == ids[:4]
    assert eos.finish_reason == "stop" and eos.matched_token_id == tokenizer.eos_token_ids[0]


def test_logprobs_map_to_output_logprobs(fake_server: ServerProcess) -> None:
    async def body(stub: Any) -> list[Any]:
        return await responses(
            stub, generate_request("lp", [5, 6, 7], stream=False, max_tokens=3, logprobs=2, ignore_eos=True)
        )

    complete = run(fake_server.target, body)[-1].complete
    lp = complete.output_logprobs
    assert list(lp.token_ids) == list(complete.output_ids) and len(lp.token_logprobs) == 3
    assert all(len(top.values) == len(top.token_ids) == 2 for top in lp.top_logprobs)


@pytest.mark.parametrize(
    ("sampling", "extra", "field"),
    [
        ({"logit_bias": {5: 1.0}}, {}, "sampling_params.logit_bias"),
        ({"structural_tag": "{}"}, {}, "sampling_params.structural_tag"),
        ({"prompt_logprobs": 1}, {}, "sampling_params.prompt_logprobs"),
        ({"logprobs": -1}, {}, "sampling_params.logprobs=-1"),
        ({"truncate_prompt_tokens": 4}, {}, "sampling_params.truncate_prompt_tokens"),
        ({}, {"kv_transfer_params_json": "{}"}, "kv_transfer_params"),
        ({}, {"mm_inputs": pb.MultimodalInputs()}, "multimodal input"),
    ],
)
def test_unsupported_options_are_unimplemented(
    fake_server: ServerProcess, sampling: dict[str, Any], extra: dict[str, Any], field: str
) -> None:
    request = pb.GenerateRequest(
        request_id="u", tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]), sampling_params=pb.SamplingParams(**sampling),
        **extra,
    )  # fmt: skip

    async def body(stub: Any) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await responses(stub, request)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert field in (refused.value.details() or "")

    run(fake_server.target, body)


def test_structured_outputs_constrain_every_output(
    fake_server: ServerProcess, tokenizer: TokenizerBundle
) -> None:
    async def body(stub: Any) -> tuple[list[Any], list[Any], Any]:
        chosen = await responses(
            stub,
            generate_request(
                "c", [5, 6, 7], stream=False, max_tokens=8, n=3, temperature=1.0, seed=3,
                choice=pb.ChoiceConstraint(choices=["yes", "no"]),
            ),
        )  # fmt: skip
        obj = await responses(
            stub,
            generate_request("j", [5, 6, 7], stream=False, max_tokens=64, temperature=0.0, json_object=True),
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await responses(stub, generate_request("g", [5, 6, 7], grammar='start ::= "a"'))
        return chosen, obj, refused.value

    chosen, obj, refused = run(fake_server.target, body)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and "ebnf" in (refused.details() or "")
    assert sorted(r.complete.index for r in chosen) == [0, 1, 2]
    assert all(tokenizer.decode(list(r.complete.output_ids)) in ("yes", "no") for r in chosen)
    (whole,) = obj
    if whole.complete.finish_reason == "stop":  # a JSON object the fake engine closed in time
        assert isinstance(json.loads(tokenizer.decode(list(whole.complete.output_ids))), dict)
    else:
        assert tokenizer.decode(list(whole.complete.output_ids)).lstrip().startswith("{")


def test_invalid_requests_carry_lmrpc_checks(fake_server: ServerProcess) -> None:
    async def refused(stub: Any, request: Any) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await responses(stub, request)
        return error.value

    async def body(stub: Any) -> None:
        no_input = await refused(stub, pb.GenerateRequest(request_id="x"))
        assert no_input.code() == grpc.StatusCode.INVALID_ARGUMENT and "input" in (no_input.details() or "")
        too_long = await refused(stub, generate_request("y", [1, 2], max_tokens=10**6))
        assert too_long.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in (
            too_long.details() or ""
        )
        bad_id = await refused(stub, generate_request("bad id!", [1, 2]))
        assert bad_id.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in (bad_id.details() or "")
        bad_token = await refused(stub, generate_request("z", [10**7]))
        assert bad_token.code() == grpc.StatusCode.INVALID_ARGUMENT and "vocab_size" in (
            bad_token.details() or ""
        )

    run(fake_server.target, body)


def test_abort_by_id_finishes_with_abort_and_frees_the_engine(slow_fake_server: ServerProcess) -> None:
    async def body(stub: Any) -> list[Any]:
        call = stub.Generate(generate_request("to-abort", [7, 8, 9], max_tokens=2000, ignore_eos=True))
        received = [await call.read()]  # generation is under way
        await stub.Abort(pb.AbortRequest(request_ids=["to-abort", "never-seen"]))
        received += await read_rest(call)
        await stub.Abort(pb.AbortRequest())  # an empty list is a no-op
        return received

    received = run(slow_fake_server.target, body)
    assert received[-1].HasField("complete") and received[-1].complete.finish_reason == "abort"
    assert received[-1].complete.completion_tokens < 2000

    async def load() -> Any:
        async with LmrpcClient.connect(slow_fake_server.target) as client:
            return (await client.control.get_load(GetLoadRequest())).current

    current = asyncio.run(load())
    assert current.active_requests == current.running_sequences == 0


def test_a_failure_after_acceptance_ends_the_call_with_its_status() -> None:
    """lmrpc reports a post-acceptance failure in-stream (ERR-2); the dialect turns it into the
    call's status, as smg expects. A worker dying mid-stream is such a failure."""
    with ServerProcess(engine="fake", args=("--fake-token-delay", "0.05")) as server:

        async def body(stub: Any) -> grpc.aio.AioRpcError:
            call = stub.Generate(generate_request("dies", [4, 5, 6], max_tokens=2000, ignore_eos=True))
            await call.read()
            os.kill(server.worker_pids()["scheduler"], signal.SIGKILL)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await read_rest(call)
            return failed.value

        error = run(server.target, body)
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "scheduler" in (error.details() or "")


def test_flush_and_embed(fake_server: ServerProcess, tokenizer: TokenizerBundle) -> None:
    async def body(stub: Any) -> tuple[Any, Any, grpc.aio.AioRpcError]:
        flushed = await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=0))
        ids = tokenizer.encode("an embedding of this sentence")
        embedded = await stub.Embed(
            pb.EmbedRequest(request_id="e1", tokenized=pb.TokenizedInput(input_ids=ids))
        )
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            await stub.Embed(pb.EmbedRequest(request_id="e2"))
        return flushed, embedded, empty.value

    flushed, embedded, empty = run(fake_server.target, body)
    assert flushed.success and "released" in flushed.message
    assert embedded.embedding_dim == len(embedded.embedding) > 0 and embedded.prompt_tokens > 0
    assert abs(sum(x * x for x in embedded.embedding) - 1.0) < 1e-3
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT


async def _batches(stub: Any, start: int) -> AsyncIterator[Any]:
    call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=start))
    try:
        async for batch in call:
            yield batch
    finally:
        call.cancel()


def _stored(batch: Any) -> list[tuple[int, list[int]]]:
    return [
        (b.block_hash, list(b.token_ids))
        for e in batch.events
        if e.HasField("stored")
        for b in e.stored.blocks
    ]


def test_kv_events_live_snapshot_and_replay(kv_server: ServerProcess) -> None:
    prompt = list(range(1000, 1040))  # two full blocks of 16 and 8 tokens that are not a block

    async def body(stub: Any) -> None:
        live = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=0))
        await live.initial_metadata()  # sent once the subscription is registered
        await responses(stub, generate_request("k1", prompt, max_tokens=2))
        batch = await live.read()
        assert batch.sequence_number == 1 and not batch.HasField("snapshot")
        assert [tokens for _, tokens in _stored(batch)] == [prompt[:16], prompt[16:32]]
        assert all(b.block_size == 16 for e in batch.events for b in e.stored.blocks)
        # a new subscriber from 0 gets the state as a snapshot that ends at sequence 1
        snapshot = await anext(_batches(stub, 0))
        assert (
            snapshot.sequence_number == 1 and snapshot.snapshot.count == 1 and snapshot.snapshot.blocks == 2
        )
        assert snapshot.events[0].HasField("cleared") and _stored(snapshot) == _stored(batch)
        # a flush removes them
        await stub.FlushCache(common_pb2.FlushCacheRequest())
        removal = await live.read()
        assert removal.sequence_number == 2
        assert [e.WhichOneof("data") for e in removal.events] == ["cleared"]  # the fake engine clears all
        # a subscriber resuming from 1 is replayed batch 2 only
        replayed = await anext(_batches(stub, 1))
        assert replayed.sequence_number == 2 and replayed.events == removal.events
        # a cursor ahead of the server (it restarted) is refused before any batch
        with pytest.raises(grpc.aio.AioRpcError) as ahead:
            await anext(_batches(stub, 99))
        assert ahead.value.code() == grpc.StatusCode.OUT_OF_RANGE
        live.cancel()

    run(kv_server.target, body)


def test_lmrpc_is_still_served_on_the_same_port(fake_server: ServerProcess) -> None:
    """Greedy, so the fake engine's answer is known (sampled, its first token is EOS one time in 50)."""

    async def body() -> str:
        request = GenerateRequest(
            text="hello", sampling=SamplingParams(temperature=0.0), stopping=StoppingCriteria(max_tokens=3)
        )
        async with LmrpcClient.connect(fake_server.target) as client:
            return (await client.generate(request)).text

    assert asyncio.run(body()) == "hello" * 3


def test_no_vllm_dialect_serves_lmrpc_alone() -> None:
    with ServerProcess(engine="fake", args=("--no-vllm-engine",)) as server:

        async def body(stub: Any) -> None:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.HealthCheck(pb.HealthCheckRequest())
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED

        run(server.target, body)
        test_lmrpc_is_still_served_on_the_same_port(server)


def test_an_open_kv_event_subscription_does_not_hold_up_shutdown() -> None:
    with ServerProcess(engine="fake") as server:

        async def body(stub: Any) -> int:
            subscription = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
            await subscription.initial_metadata()
            server.terminate()  # SIGTERM while smg would still be subscribed
            return await asyncio.to_thread(server.wait, 20.0)

        assert run(server.target, body) == 0
