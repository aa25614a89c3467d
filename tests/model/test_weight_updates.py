"""Weight updates on the real model, through SGLang's UpdateWeightsFromDisk and lmrpc's
UpdateWeights (ADMIN-2): new weights change what the server generates, the original ones bring
it back, a stream in flight across the swap ends normally, checkpoints that cannot be served are
refused while the model keeps serving, and ModelInfo.weights_version names the weights served.

The perturbed checkpoint is the embedded model's own weights with the final norm negated (so
every logit flips sign and greedy decoding picks other tokens), written as a Hugging Face
directory; the original is reloaded from the embedded GGUF file itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_driver import write_negated_checkpoint, write_tiny_checkpoint
from grpclib import GRPCError, Status
from grpclib.client import Channel

from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.client import LmrpcClient
from lmrpc.v1 import FinishReason, GenerateRequest, SamplingParams, StoppingCriteria
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import TokenizerBundle
from reference_server.testing import ServerProcess

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"
IN_FLIGHT_TOKENS = 24  # long enough to still run when the pause arrives after its first response
TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ("--sglang-runtime-port", "0", "--no-embedding", "--kv-tokens", "2048", "--max-running", "4")
    with ServerProcess(
        engine="model", args=args, startup_timeout_s=300, env={"OMP_NUM_THREADS": "1"}
    ) as running:
        yield running


def greedy(max_new_tokens: int, *, stream: bool = False) -> rt.TextGenerateRequest:
    params = rt.SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True)
    return rt.TextGenerateRequest(text=PROMPT, sampling_params=params, stream=stream)


async def text_of(stub: rt.SglangServiceStub) -> str:
    (response,) = [r async for r in stub.text_generate(greedy(6))]
    return response.text


async def refusal(stub: rt.SglangServiceStub, path: Path) -> rt.UpdateWeightsResponse:
    """As SGLang answers a load that cannot happen: a result with success = false, not a status."""
    return await stub.update_weights_from_disk(rt.UpdateWeightsRequest(model_path=str(path)))


def test_update_weights_changes_generation_and_streams_in_flight_go_on(
    server: ServerProcess, tokenizer: TokenizerBundle, tmp_path: Path
) -> None:
    negated, tiny = tmp_path / "negated", tmp_path / "tiny"
    negated.mkdir()
    tiny.mkdir()
    write_negated_checkpoint(negated, tokenizer)
    write_tiny_checkpoint(tiny, tokenizer)
    original_path = resolve_model(None).path

    async def body(stub: rt.SglangServiceStub) -> dict[str, Any]:
        seen: dict[str, Any] = {"original": await text_of(stub)}
        stream: AsyncIterator[rt.TextGenerateResponse] = stub.text_generate(
            greedy(IN_FLIGHT_TOKENS, stream=True)
        )
        first = await anext(stream)  # the request runs: its prompt and first token used the old weights
        await stub.pause_generation(rt.PauseGenerationRequest(mode="in_place"))
        seen["swapped"] = await stub.update_weights_from_disk(
            rt.UpdateWeightsRequest(model_path=str(negated))
        )
        await stub.continue_generation(rt.ContinueGenerationRequest())
        seen["in_flight"] = [first] + [r async for r in stream]
        seen["negated"] = await text_of(stub)
        seen["missing"] = await refusal(stub, tmp_path / "no-such-model")
        seen["tiny"] = await refusal(stub, tiny)
        seen["still_negated"] = await text_of(stub)
        seen["restored"] = await stub.update_weights_from_disk(
            rt.UpdateWeightsRequest(model_path=str(original_path))
        )
        seen["back"] = await text_of(stub)
        return seen

    async def main() -> dict[str, Any]:
        channel = Channel("127.0.0.1", server.sglang_runtime_port)
        try:
            return await asyncio.wait_for(body(rt.SglangServiceStub(channel)), TIMEOUT_S)
        finally:
            channel.close()

    seen = asyncio.run(main())
    assert seen["swapped"].success and seen["restored"].success
    assert seen["negated"] != seen["original"] and seen["back"] == seen["original"]
    in_flight = seen["in_flight"]
    assert [r.finished for r in in_flight] == [False] * (len(in_flight) - 1) + [True]
    finish = json.loads(in_flight[-1].meta_info["finish_reason"])
    assert finish == {"type": "length", "length": IN_FLIGHT_TOKENS}
    assert in_flight[-1].text.startswith(in_flight[0].text)  # cumulative across the swap
    assert not seen["missing"].success and "no-such-model" in seen["missing"].message
    assert not seen["tiny"].success and "num_layers=2" in seen["tiny"].message
    assert seen["still_negated"] == seen["negated"]  # the refusals left the served weights alone


def lmrpc_greedy(max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        text=PROMPT,
        sampling=SamplingParams(temperature=0.0),
        stopping=StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
    )


def test_lmrpc_update_weights_names_the_weights_it_serves(
    server: ServerProcess, tokenizer: TokenizerBundle, tmp_path: Path
) -> None:
    negated = tmp_path / "negated"
    negated.mkdir()
    write_negated_checkpoint(negated, tokenizer)
    original_path = str(resolve_model(None).path)

    async def body(client: LmrpcClient) -> dict[str, Any]:
        async def version() -> str:
            info = await client.model_info()
            assert info.model is not None
            return info.model.weights_version

        async def tokens() -> list[int]:
            return (await client.generate(lmrpc_greedy(6))).token_ids

        seen: dict[str, Any] = {"original": await tokens()}
        result = client.generate(lmrpc_greedy(IN_FLIGHT_TOKENS))
        in_flight = asyncio.ensure_future(result)
        await asyncio.sleep(0.2)  # the request runs when the update arrives
        seen["named"] = await client.update_weights(str(negated), weights_version="negated")
        seen["in_flight"] = await in_flight
        seen["negated"], seen["negated_version"] = await tokens(), await version()
        with pytest.raises(GRPCError) as missing:
            await client.update_weights(str(tmp_path / "no-such-model"))
        seen["missing"], seen["after_refusal"] = missing.value, await version()
        seen["restored"] = await client.update_weights(original_path)
        seen["back"], seen["restored_version"] = await tokens(), await version()
        return seen

    async def main() -> dict[str, Any]:
        async with LmrpcClient.connect(server.target) as client:
            return await asyncio.wait_for(body(client), TIMEOUT_S)

    seen = asyncio.run(main())
    assert seen["negated"] != seen["original"] and seen["back"] == seen["original"]
    assert seen["named"] == seen["negated_version"] == seen["after_refusal"] == "negated"
    assert seen["restored"] == seen["restored_version"] != "negated"
    ended = seen["in_flight"].output(0)
    assert ended.finish_reason == FinishReason.LENGTH
    assert len(ended.token_ids) == IN_FLIGHT_TOKENS
    assert seen["missing"].status is Status.NOT_FOUND and "no-such-model" in (seen["missing"].message or "")
