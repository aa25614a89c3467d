"""Prometheus metrics (--metrics-port), scraped over HTTP after lmrpc and vLLM-dialect traffic."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request

import grpc
from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc

from lmrpc.client import LmrpcClient
from lmrpc.v1 import GenerateRequest, SamplingParams, StoppingCriteria, TokenIds
from reference_server.smg_gateway import sum_samples
from reference_server.testing import ServerProcess, free_port

PROMPT = list(range(500, 540))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return str(response.read().decode())


async def traffic(target: str) -> None:
    request = GenerateRequest(
        token_ids=TokenIds(ids=PROMPT),
        sampling=SamplingParams(temperature=0.0),
        stopping=StoppingCriteria(max_tokens=8),
    )
    async with LmrpcClient.connect(target) as client:
        await client.generate(request)  # lmrpc, then the same prompt again over the vLLM dialect
        async with grpc.aio.insecure_channel(target) as channel:
            stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
            vllm_request = vllm_engine_pb2.GenerateRequest(
                request_id="m1",
                tokenized=vllm_engine_pb2.TokenizedInput(input_ids=PROMPT),
                sampling_params=vllm_engine_pb2.SamplingParams(temperature=0.0, max_tokens=8),
                stream=True,
            )
            async for _ in stub.Generate(vllm_request):
                pass
            with contextlib.suppress(grpc.aio.AioRpcError):
                bad = vllm_engine_pb2.GenerateRequest(
                    request_id="m2", text="x", sampling_params={"logit_bias": {1: 1}}
                )
                async for _ in stub.Generate(bad):
                    pass
            long = vllm_engine_pb2.GenerateRequest(
                request_id="m3",
                tokenized=vllm_engine_pb2.TokenizedInput(input_ids=[9, 9, 9]),
                sampling_params=vllm_engine_pb2.SamplingParams(max_tokens=4000, ignore_eos=True),
                stream=True,
            )
            call = stub.Generate(long)
            await call.read()
            call.cancel()  # the client goes away mid-stream
        for _ in range(200):  # the cancel reaches the engine
            load = (await client.control.get_load()).current
            if load is not None and load.active_requests == load.running_sequences == 0:
                return
            await asyncio.sleep(0.05)


def test_metrics_count_requests_latencies_cache_and_cancels() -> None:
    port = free_port()
    with ServerProcess(
        engine="fake", args=("--metrics-port", str(port), "--fake-token-delay", "0.002")
    ) as server:
        asyncio.run(traffic(server.target))
        text = scrape(port)

    def value(name: str, **labels: str) -> float:
        return sum_samples(text, name, **labels)

    assert value("lmrpc:grpc_requests_total", protocol="lmrpc", rpc="Generate", code="OK") == 1
    assert value("lmrpc:grpc_requests_total", protocol="vllm-engine", rpc="Generate", code="OK") == 1
    assert (
        value("lmrpc:grpc_requests_total", protocol="vllm-engine", rpc="Generate", code="UNIMPLEMENTED") == 1
    )
    assert value("lmrpc:grpc_requests_total", protocol="vllm-engine", rpc="Generate", code="CANCELLED") == 1
    assert value("lmrpc:grpc_requests_total", protocol="lmrpc", rpc="GetLoad", code="OK") >= 1
    assert value("lmrpc:time_to_first_token_seconds_count") == 3  # the refused one never started
    assert value("lmrpc:time_to_first_token_seconds_bucket", le="+Inf") == 3
    assert value("lmrpc:inter_token_latency_seconds_count") >= 14  # 7 gaps in each finished output
    assert value("lmrpc:e2e_request_latency_seconds_count") == 2
    assert value("lmrpc:prompt_tokens_total") == 2 * len(PROMPT) + 3
    assert value("lmrpc:generation_tokens_total") >= 17
    assert value("lmrpc:prefix_cache_hits_total") == len(PROMPT) - 1  # the second run of the prompt
    assert 0 < value("lmrpc:cache_hit_rate") < 1
    assert value("lmrpc:request_success_total", finished_reason="length") == 2
    assert value("lmrpc:request_cancelled_total") == 1
    assert value("lmrpc:num_requests_running") == value("lmrpc:num_requests_waiting") == 0
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):  # LOAD-2
        assert f"# TYPE vllm:{gauge} gauge" in text and value(f"vllm:{gauge}") == value(f"lmrpc:{gauge}")
    assert value("lmrpc:kv_cache_tokens", state="total") > 0
    assert value("lmrpc:kv_event_batches_total") >= 1 and value("lmrpc:kv_event_blocks") >= 2
    assert "# TYPE lmrpc:time_to_first_token_seconds histogram" in text
