"""sglang-runtime beyond Generate: how the driver reads OpenAIEmbed (lmrpc.v1's Embed, and the
embedding model discovery learns), how the text path's stop cases pick their stop strings, and which
cases the profile runs in place of lmrpc.v1's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from grpclib import GRPCError, Status
from grpclib.testing import ChannelFor

from conformance.cases import all_cases
from conformance.cases.sglang_runtime import one_stop, stop_candidates, two_stops
from conformance.drivers.sglang_runtime import JsonAnswer, SglangRuntimeDriver, error_message
from conformance.spec.profiles import PROFILES
from conformance.spec.registry import REGISTRY
from conformance.vocabulary import CaseSkipped
from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import EmbedRequest

VECTORS = {"a": [1.0, 0.0, 0.0], "b": [0.0, 1.0, 0.0], "c": [0.0, 0.0, 1.0], "Hello": [0.6, 0.8, 0.0]}


class EmbeddingServer(rt.SglangServiceBase):
    """OpenAIEmbed and ListModels as an SGLang embedding server answers them, or a fixed answer."""

    def __init__(self, status_code: int = 200, body: Any = None) -> None:
        self.status_code, self.body = status_code, body

    async def open_ai_embed(self, message: rt.OpenAiRequest) -> rt.OpenAiResponse:
        texts = json.loads(message.json_body)["input"]
        body = self.body
        if body is None:
            if not texts:
                self.status_code = 400
                body = {"error": {"message": "input must not be empty", "param": "input"}}
            else:
                data = [
                    {"object": "embedding", "embedding": VECTORS[t], "index": i} for i, t in enumerate(texts)
                ]
                body = {"data": data, "model": "emb", "usage": {"prompt_tokens": 2 * len(texts)}}
        return rt.OpenAiResponse(json_body=json.dumps(body).encode(), status_code=self.status_code)

    async def list_models(self, message: rt.ListModelsRequest) -> rt.ListModelsResponse:
        return rt.ListModelsResponse(models=[rt.ModelCard(id="emb", root="emb", max_model_len=512)])


def against(server: EmbeddingServer, body: Callable[[SglangRuntimeDriver, Any], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with ChannelFor([server]) as channel:
            return await body(SglangRuntimeDriver(), channel)

    return asyncio.run(main())


def test_discovery_learns_the_embedding_model_from_openai_embed() -> None:
    async def body(driver: SglangRuntimeDriver, channel: Any) -> Any:
        info = await driver.embedding_model(driver.stub(channel), 5.0)
        driver.embedding = info
        return info, driver.capabilities().embed

    info, embeds = against(EmbeddingServer(), body)
    assert (info.model_id, info.dimensions, info.max_input_tokens, embeds) == ("emb", 3, 512, True)


@pytest.mark.parametrize("server", [EmbeddingServer(400, {"error": {"message": "not an embedding model"}}),
                                    EmbeddingServer(200, {"data": []}), EmbeddingServer(200, "not json")])  # fmt: skip
def test_no_embedding_model_where_openai_embed_refuses_or_answers_none(server: EmbeddingServer) -> None:
    async def body(driver: SglangRuntimeDriver, channel: Any) -> Any:
        driver.embedding = await driver.embedding_model(driver.stub(channel), 5.0)
        return driver.embedding, driver.capabilities().embed

    assert against(server, body) == (None, False)


def test_lmrpc_embed_is_one_openai_embed_batch_in_the_order_listed() -> None:
    async def body(driver: SglangRuntimeDriver, channel: Any) -> Any:
        return await driver.inference(channel).embed(EmbedRequest(request_id="r", texts=["c", "a", "b"]))

    reply = against(EmbeddingServer(), body)
    assert [list(e.values) for e in reply.embeddings] == [VECTORS["c"], VECTORS["a"], VECTORS["b"]]
    assert reply.usage is not None and reply.usage.prompt_tokens == 6
    assert reply.request_id == ""  # OpenAIEmbed carries no request id: the driver invents none


def test_an_openai_embed_status_code_is_the_grpc_status_https_maps_to() -> None:
    async def body(driver: SglangRuntimeDriver, channel: Any) -> Any:
        return await driver.inference(channel).embed(EmbedRequest(texts=[]))

    with pytest.raises(GRPCError) as refused:
        against(EmbeddingServer(), body)
    assert refused.value.status is Status.INVALID_ARGUMENT and "input must not be empty" in str(
        refused.value.message
    )
    assert JsonAnswer(503, "busy").refusal("Score").status is Status.UNAVAILABLE
    assert JsonAnswer(500, {"error": {"message": "boom"}}).refusal("Rerank").status is Status.INTERNAL
    assert error_message({"error": {"message": "boom"}}) == "boom" and error_message([1]) == "[1]"


def test_stop_strings_are_taken_where_the_output_must_end() -> None:
    text = "Once upon a timeOnce upon a timeOnce upon a time"
    for stop, at in stop_candidates(text):
        assert at == text.find(stop) >= 1 and stop.strip() and len(stop) in (3, 4, 5, 6)
    stop, at = one_stop(text)
    assert text[:at] + stop == text[: at + len(stop)]
    pair = two_stops(text)
    assert pair is not None
    (late, late_at), (early, early_at) = pair
    assert late_at >= early_at + len(early) and early not in late
    assert two_stops("aaaaaaaaaaaa") is None
    assert stop_candidates("ab \ufffd\ufffd\ufffd\ufffd") == []
    with pytest.raises(CaseSkipped):
        one_stop("    ")


def test_the_native_cases_run_in_sglang_runtime_in_place_of_lmrpc_v1s() -> None:
    all_cases()
    profile = PROFILES["sglang-runtime"]
    native = [
        c for c in REGISTRY.values() if c.module.startswith("sglang_runtime_") or "text-generate" in c.id
    ]
    assert len(native) >= 13
    for case in native:
        assert case.protocols == ("sglang-runtime",) and profile.case(case).applies, case.id
    for replaced in ("STOP-1[stop-string]", "SCORE-1", "SCORE-2", "EMBED-3", "ADMIN-1", "ADMIN-2[refused]",
                     "LIFE-3[flush]", "EMBED-1[batches]"):  # fmt: skip
        assert not profile.case(REGISTRY[replaced]).applies, replaced
    for driven in ("EMBED-1", "EMBED-2", "ERR-1[embed]", "LIFE-3[pause]"):
        assert profile.case(REGISTRY[driven]).applies, driven
