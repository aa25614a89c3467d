"""Contract revision 3 on the fake engine: ListModels (MODELS-1), Score and Rerank (SCORE-1,
SCORE-2), the profiler (ADMIN-1) and UpdateWeights' refusals and versions (ADMIN-2), through the
SDK's helpers. tests/model/test_weight_updates.py changes real weights."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpclib import GRPCError, Status
from streams import run

from lmrpc import CONTRACT_REVISION
from lmrpc.client import LmrpcClient
from lmrpc.v1 import (
    GenerateRequest,
    ModelKind,
    RerankRequest,
    SamplingParams,
    ScoreRequest,
    StoppingCriteria,
    UpdateWeightsRequest,
)
from reference_server.models.source import resolve_model
from reference_server.testing import ServerProcess

FRUIT = ["a red apple", "the stock market fell", "an apple pie", "green apples"]


@pytest.fixture(scope="module")
def bare_server() -> Iterator[ServerProcess]:
    with ServerProcess(engine="fake", args=("--no-embedding",)) as server:
        yield server


async def refused(call: object) -> GRPCError:
    with pytest.raises(GRPCError) as error:
        await call  # type: ignore[misc]
    return error.value


def test_the_revision_and_its_capabilities(fake_server: ServerProcess, bare_server: ServerProcess) -> None:
    full = run(fake_server.target, LmrpcClient.server_info)
    bare = run(bare_server.target, LmrpcClient.server_info)
    assert full.contract_revision == bare.contract_revision == CONTRACT_REVISION == 5
    assert full.capabilities is not None and bare.capabilities is not None
    flags = ("list_models", "score", "profiler", "weight_updates")
    assert [getattr(full.capabilities, f) for f in flags] == [True] * 4
    assert [getattr(bare.capabilities, f) for f in flags] == [True, False, True, True]


def test_list_models_matches_model_info(fake_server: ServerProcess, bare_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> None:
        info = await client.model_info()
        assert info.model is not None and info.embedding_model is not None
        generation, embedding = await client.models()
        assert (generation.model_id, generation.kind, generation.max_input_tokens) == (
            info.model.model_id,
            ModelKind.GENERATION,
            info.model.max_context_tokens,
        )
        assert (embedding.model_id, embedding.kind, embedding.max_input_tokens) == (
            info.embedding_model.model_id,
            ModelKind.EMBEDDING,
            info.embedding_model.max_input_tokens,
        )
        assert generation.base_model_id == embedding.base_model_id == ""

    run(fake_server.target, body)

    async def bare(client: LmrpcClient) -> None:
        assert [m.kind for m in await client.models()] == [ModelKind.GENERATION]

    run(bare_server.target, bare)


def test_scores_keep_input_order_and_rerank_orders_by_them(fake_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> None:
        scores = await client.score("apple", FRUIT)
        alone = [(await client.score("apple", [item]))[0] for item in FRUIT]
        assert scores == pytest.approx(alone, abs=1e-6) and len(set(scores)) > 1
        ranked = await client.rerank("apple", FRUIT)
        assert [r.index for r in ranked] == sorted(range(len(FRUIT)), key=lambda i: (-scores[i], i))
        assert [r.score for r in ranked] == pytest.approx([scores[r.index] for r in ranked], abs=1e-6)
        best_two = await client.rerank("apple", FRUIT, top_n=2)
        assert [(r.index, r.score) for r in best_two] == [(r.index, r.score) for r in ranked[:2]]
        assert len(await client.rerank("apple", FRUIT, top_n=99)) == len(FRUIT)
        reply = await client.inference.score(ScoreRequest(request_id="score-1", query="apple", items=FRUIT))
        assert reply.request_id == "score-1" and reply.usage is not None and reply.usage.prompt_tokens > 0

    run(fake_server.target, body)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (ScoreRequest(query="", items=["x"]), "query"),
        (ScoreRequest(query="q"), "items"),
        (ScoreRequest(query="q", items=["x", ""]), "items[1]"),
        (ScoreRequest(query="q", items=["x", "word " * 600]), "items[1]"),
        (ScoreRequest(query="q", items=["x"], request_id="bad id!"), "request_id"),
        (RerankRequest(query="q", documents=["x"], top_n=0), "top_n=0"),
        (RerankRequest(query="q"), "documents"),
        (RerankRequest(query="q", documents=[""]), "documents[0]"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_bad_scoring_input_names_the_field(
    fake_server: ServerProcess, request_: ScoreRequest | RerankRequest, field: str
) -> None:
    async def body(client: LmrpcClient) -> GRPCError:
        call = client.inference.score if isinstance(request_, ScoreRequest) else client.inference.rerank
        return await refused(call(request_))  # type: ignore[arg-type]

    error = run(fake_server.target, body)
    assert error.status is Status.INVALID_ARGUMENT and field in (error.message or ""), error.message


def test_scoring_without_an_embedding_model_is_unimplemented(bare_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> list[Status]:
        return [
            (await refused(client.score("q", ["x"]))).status,
            (await refused(client.rerank("q", ["x"]))).status,
        ]

    assert run(bare_server.target, body) == [Status.UNIMPLEMENTED] * 2


def test_profile_writes_a_trace_into_the_folder_it_names(fake_server: ServerProcess, tmp_path: Path) -> None:
    folder = tmp_path / "traces"

    async def body(client: LmrpcClient) -> tuple[str, list[str], GRPCError, GRPCError]:
        started = await client.start_profile(str(folder))
        twice = await refused(client.start_profile(str(folder)))
        greedy = GenerateRequest(
            text="Hello", sampling=SamplingParams(temperature=0.0), stopping=StoppingCriteria(max_tokens=4)
        )
        await client.generate(greedy)
        traces = await client.stop_profile()
        return started, traces, twice, await refused(client.stop_profile())

    started, traces, twice, not_started = run(fake_server.target, body)
    assert Path(started) == folder
    (trace,) = traces
    assert Path(trace).parent == folder and Path(trace).is_file()
    assert any(e.get("name") == "engine.step" for e in json.loads(Path(trace).read_text())["traceEvents"])
    assert twice.status is not_started.status is Status.FAILED_PRECONDITION


def test_update_weights_versions_and_refusals(tmp_path: Path) -> None:
    """The fake engine has no weights: a loadable path is accepted without effect, and the version
    moves; refusals name model_path and leave the version alone. A restart loads the initial
    weights again (another server here: the shared one stays as it was)."""
    model = str(resolve_model(None).path)
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()

    async def body(client: LmrpcClient) -> list[object]:
        async def version() -> str:
            info = await client.model_info()
            assert info.model is not None
            return info.model.weights_version

        seen: list[object] = [await version()]
        for path in (tmp_path / "no-such-model", not_a_model):
            error = await refused(client.update_weights(str(path)))
            seen += [error.status, str(path) in (error.message or ""), await version()]
        empty = await refused(
            client.control.update_weights(UpdateWeightsRequest(model_path=model, weights_version=""))
        )
        seen += [empty.status, await version()]
        seen += [await client.update_weights(model, weights_version="rl-step-7"), await version()]
        seen += [await client.update_weights(model), await version()]
        return seen

    with ServerProcess(engine="fake") as server:
        seen = run(server.target, body)
    assert seen == [
        "initial",
        Status.NOT_FOUND, True, "initial",
        Status.INVALID_ARGUMENT, True, "initial",
        Status.INVALID_ARGUMENT, "initial",
        "rl-step-7", "rl-step-7",
        "update-2", "update-2",
    ]  # fmt: skip
