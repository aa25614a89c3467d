"""SGLang's native gRPC service (sglang.runtime.v1.SglangService) on its own port
(``--sglang-runtime-port``), driven by the generated grpclib stubs.

Streams are held open by construction, never by sleeping: PauseGeneration keeps requests in the
engine until ContinueGeneration, and ``in_engine`` waits (on the server's own load report) until
they are there before anything races with them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from grpclib import GRPCError, Status
from grpclib.client import Channel

from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.client import LmrpcClient
from lmrpc.v1 import GenerateRequest, GetLoadRequest, SamplingParams, StoppingCriteria, TokenIds
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import TokenizerBundle
from reference_server.testing import ServerProcess

T = TypeVar("T")
TIMEOUT_S = 60.0
PROMPT_IDS = [300, 301, 302, 303, 304, 305]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(engine="fake", args=("--sglang-runtime-port", "0")) as running:
        yield running


def run(server: ServerProcess, body: Callable[[rt.SglangServiceStub], Awaitable[T]], token: str = "") -> T:
    async def main() -> T:
        channel = Channel("127.0.0.1", server.sglang_runtime_port)
        metadata = {"authorization": f"Bearer {token}"} if token else None
        try:
            return await asyncio.wait_for(body(rt.SglangServiceStub(channel, metadata=metadata)), TIMEOUT_S)
        finally:
            channel.close()

    return asyncio.run(main())


def meta(response: Any) -> dict[str, Any]:
    """meta_info decoded: every value is JSON text, as SGLang's server writes it."""
    return {key: json.loads(value) for key, value in response.meta_info.items()}


def sampling(**values: Any) -> rt.SamplingParams:
    return rt.SamplingParams(**{"temperature": 0.0, "ignore_eos": True, **values})


async def collect(stream: AsyncIterator[T]) -> list[T]:
    return [item async for item in stream]


async def status_of(call: Awaitable[Any]) -> GRPCError:
    with pytest.raises(GRPCError) as refused:
        await call
    return refused.value


async def load(stub: rt.SglangServiceStub) -> dict[str, Any]:
    (entry,) = json.loads((await stub.get_load(rt.GetLoadRequest())).json_info)
    return dict(entry)


async def in_engine(stub: rt.SglangServiceStub, sequences: int) -> None:
    """Until the engine holds ``sequences`` sequences (running or waiting)."""
    while True:
        entry = await load(stub)
        if entry["num_running_reqs"] + entry["num_waiting_reqs"] >= sequences:
            return
        await asyncio.sleep(0.02)


async def idle(stub: rt.SglangServiceStub) -> dict[str, Any]:
    while True:
        entry = await load(stub)
        if entry["num_running_reqs"] + entry["num_waiting_reqs"] == 0:
            return entry
        await asyncio.sleep(0.02)


def by_index(responses: list[Any]) -> dict[int, list[Any]]:
    outputs: dict[int, list[Any]] = {}
    for response in responses:
        outputs.setdefault(meta(response)["index"], []).append(response)
    return outputs


def test_discovery_health_and_load(server: ServerProcess, tokenizer: TokenizerBundle) -> None:
    async def body(stub: rt.SglangServiceStub) -> tuple[Any, ...]:
        return (
            await stub.health_check(rt.HealthCheckRequest()),
            await stub.get_model_info(rt.GetModelInfoRequest()),
            json.loads((await stub.get_server_info(rt.GetServerInfoRequest())).json_info),
            await stub.list_models(rt.ListModelsRequest()),
            await load(stub),
        )

    health, model, server_info, models, entry = run(server, body)
    assert health.healthy
    model_info = json.loads(model.json_info)
    assert model.model_path == model_info["model_path"] == "fake-SmolLM2-135M-Instruct"
    assert model_info["is_generation"] and model_info["vocab_size"] == tokenizer.vocab_size
    assert model_info["weight_version"] == "default"
    assert server_info["incremental_streaming_output"] is False  # streams are cumulative
    assert server_info["served_model_name"] == models.models[0].id == model.model_path
    assert models.models[0].max_model_len == server_info["context_length"]
    assert [m.id for m in models.models[1:]] == ["fake-embedding"]
    assert entry["dp_rank"] == 0 and entry["max_total_num_tokens"] == server_info["max_total_num_tokens"]

    async def lmrpc_here() -> GRPCError:
        async with LmrpcClient.connect(server.sglang_runtime_target) as client:
            return await status_of(client.control.get_load(GetLoadRequest()))

    assert asyncio.run(lmrpc_here()).status is Status.UNIMPLEMENTED  # only SGLang's service here


def test_text_generate_streams_cumulative_text_for_every_output(server: ServerProcess) -> None:
    async def body(stub: rt.SglangServiceStub) -> tuple[list[Any], list[Any]]:
        params = sampling(max_new_tokens=5, n=2)
        streamed = await collect(
            stub.text_generate(
                rt.TextGenerateRequest(text="Tell me", sampling_params=params, stream=True, rid="t-1")
            )
        )
        final = await collect(
            stub.text_generate(rt.TextGenerateRequest(text="Tell me", sampling_params=params))
        )
        return streamed, final

    streamed, final = run(server, body)
    outputs = by_index(streamed)
    assert sorted(outputs) == [0, 1]
    for responses in outputs.values():
        texts = [r.text for r in responses]
        assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
        assert [r.finished for r in responses] == [False] * (len(responses) - 1) + [True]
        infos = [meta(r) for r in responses]
        assert {i["id"] for i in infos} == {"t-1"}
        assert all(i["finish_reason"] is None for i in infos[:-1])
        assert infos[-1]["finish_reason"] == {"type": "length", "length": 5}
        assert infos[-1]["completion_tokens"] == 5 and isinstance(infos[-1]["e2e_latency"], float)
        counts = [i["completion_tokens"] for i in infos]
        assert counts == sorted(counts) and infos[-1]["prompt_tokens"] > 0
    assert [r.finished for r in final] == [True, True]  # final-only: one response per output
    assert {meta(r)["index"]: r.text for r in final} == {i: rs[-1].text for i, rs in outputs.items()}


def test_generate_output_ids_are_cumulative_and_match_lmrpc(server: ServerProcess) -> None:
    async def lmrpc_ids() -> list[list[int]]:
        async with LmrpcClient.connect(server.target) as client:
            result = await client.generate(
                GenerateRequest(
                    token_ids=TokenIds(ids=PROMPT_IDS),
                    sampling=SamplingParams(temperature=0.0, n=2),
                    stopping=StoppingCriteria(max_tokens=6, ignore_eos=True),
                )
            )
            return [list(output.token_ids) for output in result.outputs]

    expected = asyncio.run(lmrpc_ids())

    async def body(stub: rt.SglangServiceStub) -> list[Any]:
        request = rt.GenerateRequest(
            input_ids=PROMPT_IDS, sampling_params=sampling(max_new_tokens=6, n=2), stream=True
        )
        return await collect(stub.generate(request))

    outputs = by_index(run(server, body))
    for index, responses in outputs.items():
        ids = [list(r.output_ids) for r in responses]
        assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(ids))
        assert ids[-1] == expected[index] and responses[-1].finished
    # the same prompt again; lmrpc.v1 reports cached tokens with the request's last finish
    assert max(meta(rs[-1])["cached_tokens"] for rs in outputs.values()) == len(PROMPT_IDS) - 1


def test_stop_token_logprobs_and_token_texts(server: ServerProcess) -> None:
    async def body(stub: rt.SglangServiceStub) -> tuple[Any, Any, Any]:
        (free,) = await collect(
            stub.generate(
                rt.GenerateRequest(input_ids=PROMPT_IDS, sampling_params=sampling(max_new_tokens=6))
            )
        )
        stop_id = free.output_ids[2]
        (stopped,) = await collect(
            stub.generate(
                rt.GenerateRequest(
                    input_ids=PROMPT_IDS,
                    sampling_params=sampling(max_new_tokens=6, stop_token_ids=[stop_id]),
                    return_logprob=True,
                    top_logprobs_num=2,
                )
            )
        )
        (texted,) = await collect(
            stub.text_generate(
                rt.TextGenerateRequest(
                    text="Tell me",
                    sampling_params=sampling(max_new_tokens=3),
                    return_logprob=True,
                    return_text_in_logprobs=True,
                )
            )
        )
        return free, stopped, texted

    free, stopped, texted = run(server, body)
    info = meta(stopped)
    assert list(stopped.output_ids) == list(free.output_ids[:3])
    assert info["finish_reason"] == {"type": "stop", "matched": free.output_ids[2]}
    logprobs = info["output_token_logprobs"]
    assert [entry[1] for entry in logprobs] == list(stopped.output_ids) and info[
        "output_token_logprobs_length"
    ] == 3
    assert all(isinstance(lp, float) and lp <= 0 and text is None for lp, _, text in logprobs)
    assert all(len(top) == 2 for top in info["output_top_logprobs"]) and info["input_token_logprobs"] == []
    assert all(isinstance(text, str) for _, _, text in meta(texted)["output_token_logprobs"])


def test_abort_by_rid_and_abort_all_end_streams_in_band(server: ServerProcess) -> None:
    async def body(stub: rt.SglangServiceStub) -> tuple[list[Any], list[Any], dict[str, Any]]:
        await stub.pause_generation(rt.PauseGenerationRequest(mode="in_place"))
        try:
            params = sampling(max_new_tokens=50, n=2)
            first = asyncio.create_task(
                collect(
                    stub.generate(
                        rt.GenerateRequest(
                            input_ids=PROMPT_IDS, sampling_params=params, stream=True, rid="a-1"
                        )
                    )
                )
            )
            second = asyncio.create_task(
                collect(
                    stub.text_generate(
                        rt.TextGenerateRequest(
                            text="hold", sampling_params=sampling(), stream=True, rid="b-1"
                        )
                    )
                )
            )
            await in_engine(stub, 3)
            assert (await stub.abort(rt.AbortRequest(rid="a-1"))).success
            aborted = await first
            assert not second.done()
            assert (await stub.abort(rt.AbortRequest(abort_all=True))).success
            return aborted, await second, await idle(stub)
        finally:
            await stub.continue_generation(rt.ContinueGenerationRequest())

    aborted, all_aborted, after = run(server, body)
    for responses in (aborted, all_aborted):
        finishes = [meta(r) for r in responses if r.finished]
        assert sorted(f["index"] for f in finishes) == ([0, 1] if responses is aborted else [0])
        assert all(f["finish_reason"]["type"] == "abort" and f["completion_tokens"] == 0 for f in finishes)
    assert after["num_used_tokens"] == 0


def test_pause_modes(server: ServerProcess) -> None:
    async def body(stub: rt.SglangServiceStub) -> tuple[list[Any], list[Any], str, bool, GRPCError]:
        await stub.pause_generation(rt.PauseGenerationRequest(mode="in_place"))
        try:
            held = asyncio.create_task(
                collect(
                    stub.text_generate(
                        rt.TextGenerateRequest(
                            text="held", sampling_params=sampling(max_new_tokens=4), stream=True
                        )
                    )
                )
            )
            await in_engine(stub, 1)
            paused = json.loads((await stub.get_server_info(rt.GetServerInfoRequest())).json_info)[
                "is_paused"
            ]
            assert (await stub.continue_generation(rt.ContinueGenerationRequest())).message
            completed = await held
            await stub.pause_generation(rt.PauseGenerationRequest(mode="in_place"))
            ended = asyncio.create_task(
                collect(
                    stub.text_generate(
                        rt.TextGenerateRequest(text="ended", sampling_params=sampling(), stream=True)
                    )
                )
            )
            await in_engine(stub, 1)
            await stub.pause_generation(rt.PauseGenerationRequest())  # mode "" is SGLang's default: abort
            retract = (await stub.pause_generation(rt.PauseGenerationRequest(mode="retract"))).message
            bad_mode = await status_of(stub.pause_generation(rt.PauseGenerationRequest(mode="sideways")))
            return completed, await ended, retract, paused, bad_mode
        finally:
            await stub.continue_generation(rt.ContinueGenerationRequest())

    completed, ended, retract, paused, bad_mode = run(server, body)
    assert paused
    assert completed[-1].finished and meta(completed[-1])["finish_reason"] == {"type": "length", "length": 4}
    assert ended[-1].finished and meta(ended[-1])["finish_reason"]["type"] == "abort"
    assert "mode=retract" in retract and "KV cache" in retract
    assert bad_mode.status is Status.INVALID_ARGUMENT and "mode='sideways'" in (bad_mode.message or "")


def test_embeddings_and_classify(server: ServerProcess) -> None:
    async def body(stub: rt.SglangServiceStub) -> tuple[Any, Any, GRPCError, GRPCError]:
        text = await stub.text_embed(rt.TextEmbedRequest(text="hello world", rid="e-1"))
        ids = (await stub.tokenize(rt.TokenizeRequest(text="hello world"))).tokens
        tokenized = await stub.embed(rt.EmbedRequest(input_ids=ids))
        classify = await status_of(stub.classify(rt.ClassifyRequest(text="hello")))
        open_classify = await status_of(stub.open_ai_classify(rt.OpenAiRequest(json_body=b'{"input": "x"}')))
        return text, tokenized, classify, open_classify

    text, tokenized, classify, open_classify = run(server, body)
    assert len(text.embedding) > 0 and text.embedding == pytest.approx(tokenized.embedding)
    info = meta(text)
    assert info["id"] == "e-1" and info["prompt_tokens"] > 0
    for refused in (classify, open_classify):
        assert refused.status is Status.UNIMPLEMENTED and "classification model" in (refused.message or "")


def openai(payload: dict[str, Any]) -> rt.OpenAiRequest:
    return rt.OpenAiRequest(json_body=json.dumps(payload).encode())


def guided(**constraint: Any) -> rt.SamplingParams:
    return rt.SamplingParams(guided_decoding=rt.GuidedDecoding(**constraint))


def test_openai_chat_completions_streamed_and_not(server: ServerProcess) -> None:
    chat = {
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 6,
        "temperature": 0,
        "n": 2,
        "ignore_eos": True,
    }

    async def body(stub: rt.SglangServiceStub) -> tuple[list[Any], list[Any]]:
        streamed = await collect(
            stub.chat_complete(openai({**chat, "stream": True, "stream_options": {"include_usage": True}}))
        )
        whole = await collect(stub.chat_complete(openai(chat)))
        return streamed, whole

    streamed, whole = run(server, body)
    assert [c.finished for c in streamed] == [False] * (len(streamed) - 1) + [True] and streamed[
        -1
    ].json_chunk == b""
    chunks = [json.loads(c.json_chunk) for c in streamed[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    *choice_chunks, usage_chunk = chunks
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 12
    contents: dict[int, str] = {0: "", 1: ""}
    finishes: dict[int, list[str]] = {0: [], 1: []}
    for chunk in choice_chunks:
        (choice,) = chunk["choices"]
        assert chunk["usage"] is None
        contents[choice["index"]] += choice["delta"].get("content", "")
        if choice["finish_reason"] is not None:
            finishes[choice["index"]].append(choice["finish_reason"])
    assert finishes == {0: ["length"], 1: ["length"]}
    openers = [c["choices"][0] for c in choice_chunks if c["choices"][0]["delta"].get("role")]
    assert sorted(o["index"] for o in openers) == [0, 1]
    (message,) = whole
    assert message.finished
    completion = json.loads(message.json_chunk)
    assert (
        completion["object"] == "chat.completion" and completion["model"] == "default"
    )  # none asked: SGLang's
    assert {c["index"]: c["message"]["content"] for c in completion["choices"]} == contents
    usage = completion["usage"]
    assert usage["completion_tokens"] == 12 and usage["total_tokens"] == usage["prompt_tokens"] + 12


def test_guided_decoding_and_response_format_constrain_every_output(server: ServerProcess) -> None:
    choice = guided(choice=rt.ChoiceConstraint(values=["yes", "no"]))
    choice.n, choice.temperature, choice.seed = 3, 1.0, 5
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    chat = {
        "messages": [{"role": "user", "content": "Answer in JSON"}],
        "max_tokens": 40,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    }

    async def body(stub: rt.SglangServiceStub) -> tuple[list[Any], list[Any], list[Any]]:
        chosen = await collect(
            stub.text_generate(rt.TextGenerateRequest(text="Yes or no?", sampling_params=choice))
        )
        legacy = await collect(
            stub.text_generate(
                rt.TextGenerateRequest(
                    text="Digits:", sampling_params=sampling(regex="[0-9]{3}", max_new_tokens=8)
                )
            )
        )
        answered = await collect(stub.chat_complete(openai(chat)))
        return chosen, legacy, answered

    chosen, legacy, answered = run(server, body)
    assert len(chosen) == 3 and all(r.text in ("yes", "no") for r in chosen)
    (digits,) = legacy
    assert len(digits.text) == 3 and digits.text.isdigit()  # ignore_eos: the complete regex ends it
    (message,) = answered
    content = json.loads(message.json_chunk)["choices"][0]["message"]["content"]
    assert isinstance(json.loads(content)["ok"], bool)


def test_openai_completions_streamed_and_not(server: ServerProcess) -> None:
    request = {"prompt": "Once upon", "max_tokens": 5, "temperature": 0, "ignore_eos": True, "logprobs": 1}

    async def body(stub: rt.SglangServiceStub) -> tuple[list[Any], list[Any], list[Any]]:
        streamed = await collect(stub.complete(openai({**request, "stream": True})))
        whole = await collect(stub.complete(openai(request)))
        echoed = await collect(stub.complete(openai({"prompt": PROMPT_IDS, "max_tokens": 2, "echo": True})))
        return streamed, whole, echoed

    streamed, whole, echoed = run(server, body)
    chunks = [json.loads(c.json_chunk) for c in streamed if c.json_chunk]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    (choice,) = json.loads(whole[0].json_chunk)["choices"]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["text_offset"]) == 5
    assert all(len(top) == 1 for top in logprobs["top_logprobs"])
    (echo_choice,) = json.loads(echoed[0].json_chunk)["choices"]
    assert len(echo_choice["text"]) > 0


def test_openai_embeddings_score_and_rerank(server: ServerProcess) -> None:
    async def body(stub: rt.SglangServiceStub) -> list[Any]:
        return [
            await stub.open_ai_embed(openai({"input": ["apple", "pear"]})),
            await stub.open_ai_embed(openai({"input": "apple", "encoding_format": "base64"})),
            await stub.score(openai({"query": "apple", "items": ["apple", "engine oil"]})),
            await stub.rerank(openai({"query": "pear", "documents": ["apple", "pear", "oil"], "top_n": 2})),
            await stub.rerank(
                openai({"query": "pear", "documents": ["apple", "pear"], "return_documents": False})
            ),
        ]

    embedded, encoded, scored, reranked, bare = run(server, body)
    assert all(r.status_code == 200 for r in (embedded, encoded, scored, reranked, bare))
    data = json.loads(embedded.json_body)
    assert data["object"] == "list" and [d["index"] for d in data["data"]] == [0, 1]
    assert data["model"] == "fake-embedding" and data["usage"]["prompt_tokens"] > 0
    raw = base64.b64decode(json.loads(encoded.json_body)["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(
        data["data"][0]["embedding"], abs=1e-6
    )
    scores = json.loads(scored.json_body)
    assert scores["object"] == "scoring" and scores["scores"][0] == [pytest.approx(1.0)]
    assert scores["scores"][1][0] < scores["scores"][0][0]
    ranked = json.loads(reranked.json_body)
    assert [r["index"] for r in ranked][:1] == [1] and len(ranked) == 2 and ranked[0]["document"] == "pear"
    assert ranked[0]["score"] >= ranked[1]["score"]
    assert all("document" not in r for r in json.loads(bare.json_body))


def test_profile_writes_a_chrome_trace_of_the_scheduler(server: ServerProcess, tmp_path: Path) -> None:
    folder = tmp_path / "traces"

    async def body(stub: rt.SglangServiceStub) -> tuple[str, GRPCError, GRPCError]:
        await stub.start_profile(rt.StartProfileRequest(output_dir=str(folder)))
        twice = await status_of(stub.start_profile(rt.StartProfileRequest(output_dir=str(folder))))
        await collect(
            stub.generate(
                rt.GenerateRequest(input_ids=PROMPT_IDS, sampling_params=sampling(max_new_tokens=4))
            )
        )
        stopped = (await stub.stop_profile(rt.StopProfileRequest())).message
        not_started = await status_of(stub.stop_profile(rt.StopProfileRequest()))
        return stopped, twice, not_started

    stopped, twice, not_started = run(server, body)
    (trace,) = folder.glob("*.trace.json")
    assert str(trace) in stopped
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "engine.step" for e in events)
    assert twice.status is not_started.status is Status.FAILED_PRECONDITION


def test_update_weights_from_disk_on_the_fake_engine(server: ServerProcess) -> None:
    """The fake engine has no weights: a loadable path is accepted without effect. A load that
    cannot happen is answered as SGLang 0.5.23 answers it (grpc_bridge.py's
    update_weights_from_disk): status OK, ``success = false`` and the reason in ``message``,
    naming the field and its value, never a status an SGLang client would get as an exception."""
    model = str(resolve_model(None).path)

    async def body(stub: rt.SglangServiceStub) -> list[rt.UpdateWeightsResponse]:
        return [
            await stub.update_weights_from_disk(rt.UpdateWeightsRequest(model_path=model)),
            await stub.update_weights_from_disk(rt.UpdateWeightsRequest(model_path="/nonexistent/model")),
            await stub.update_weights_from_disk(rt.UpdateWeightsRequest(model_path=model, load_format="pt")),
            await stub.update_weights_from_disk(rt.UpdateWeightsRequest(model_path="")),
        ]

    accepted, missing, format_, empty = run(server, body)
    assert accepted.success and "fake engine" in accepted.message
    assert not missing.success and "model_path='/nonexistent/model'" in missing.message
    assert not format_.success and "load_format='pt'" in format_.message
    assert not empty.success and "model_path=''" in empty.message


BAD_INPUTS: list[tuple[str, Callable[[rt.SglangServiceStub], Awaitable[Any]], Status, str]] = [
    (
        "empty text",
        lambda s: collect(s.text_generate(rt.TextGenerateRequest(text=""))),
        Status.INVALID_ARGUMENT,
        "text",
    ),
    ("no ids", lambda s: collect(s.generate(rt.GenerateRequest())), Status.INVALID_ARGUMENT, "input_ids"),
    (
        "negative id",
        lambda s: collect(s.generate(rt.GenerateRequest(input_ids=[5, -1]))),
        Status.INVALID_ARGUMENT,
        "input_ids[1]=-1",
    ),
    (
        "top_k 0",
        lambda s: collect(
            s.generate(rt.GenerateRequest(input_ids=[5], sampling_params=rt.SamplingParams(top_k=0)))
        ),
        Status.INVALID_ARGUMENT,
        "sampling_params.top_k=0",
    ),
    (
        "negative temperature",
        lambda s: collect(
            s.text_generate(
                rt.TextGenerateRequest(text="x", sampling_params=rt.SamplingParams(temperature=-1))
            )
        ),
        Status.INVALID_ARGUMENT,
        "sampling_params.temperature",
    ),
    (
        "n 0",
        lambda s: collect(
            s.text_generate(rt.TextGenerateRequest(text="x", sampling_params=rt.SamplingParams(n=0)))
        ),
        Status.INVALID_ARGUMENT,
        "sampling_params.n",
    ),
    (
        "regex that does not compile",
        lambda s: collect(
            s.text_generate(rt.TextGenerateRequest(text="x", sampling_params=rt.SamplingParams(regex="(a")))
        ),
        Status.INVALID_ARGUMENT,
        "constraint.regex",
    ),
    (
        "prefill only",
        lambda s: collect(
            s.text_generate(
                rt.TextGenerateRequest(text="x", sampling_params=rt.SamplingParams(max_new_tokens=0))
            )
        ),
        Status.UNIMPLEMENTED,
        "sampling_params.max_new_tokens=0",
    ),
    (
        "prompt logprobs",
        lambda s: collect(
            s.text_generate(rt.TextGenerateRequest(text="x", return_logprob=True, logprob_start_len=0))
        ),
        Status.UNIMPLEMENTED,
        "logprob_start_len=0",
    ),
    (
        "lora",
        lambda s: collect(s.text_generate(rt.TextGenerateRequest(text="x", lora_path="a"))),
        Status.UNIMPLEMENTED,
        "lora_path",
    ),
    (
        "second rank",
        lambda s: collect(s.text_generate(rt.TextGenerateRequest(text="x", routed_dp_rank=1))),
        Status.INVALID_ARGUMENT,
        "routed_dp_rank=1",
    ),
    (
        "bad rid",
        lambda s: collect(s.text_generate(rt.TextGenerateRequest(text="x", rid="a b"))),
        Status.INVALID_ARGUMENT,
        "rid=",
    ),
    (
        "abort nothing",
        lambda s: s.abort(rt.AbortRequest()),
        Status.INVALID_ARGUMENT,
        "Abort requires a non-empty rid unless abort_all is true",  # SGLang 0.5.23's words
    ),
    (
        "negative token",
        lambda s: s.detokenize(rt.DetokenizeRequest(tokens=[-3])),
        Status.INVALID_ARGUMENT,
        "Detokenize tokens must be non-negative: tokens[0]=-3",
    ),
    (
        "classify nothing",
        lambda s: s.classify(rt.ClassifyRequest()),
        Status.INVALID_ARGUMENT,
        "Classify requires either text or input_ids",
    ),
    ("load rank", lambda s: s.get_load(rt.GetLoadRequest(dp_rank=2)), Status.INVALID_ARGUMENT, "dp_rank=2"),
    (
        "chat not json",
        lambda s: collect(s.chat_complete(rt.OpenAiRequest(json_body=b"{"))),
        Status.INVALID_ARGUMENT,
        "json_body",
    ),
    (
        "chat unknown parameter",
        lambda s: collect(
            s.chat_complete(openai({"messages": [{"role": "user", "content": "x"}], "temprature": 1}))
        ),
        Status.INVALID_ARGUMENT,
        "temprature",
    ),
    (
        "chat lora adapter",
        lambda s: collect(
            s.chat_complete(
                openai({"messages": [{"role": "user", "content": "x"}], "model": "base:adapter-1"})
            )
        ),
        Status.UNIMPLEMENTED,
        "model='base:adapter-1'",
    ),
    (
        "completion lora adapter",
        lambda s: collect(s.complete(openai({"prompt": "x", "model": "base:adapter-1"}))),
        Status.UNIMPLEMENTED,
        "model='base:adapter-1'",
    ),
    (
        "chat temperature type",
        lambda s: collect(
            s.chat_complete(openai({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}))
        ),
        Status.INVALID_ARGUMENT,
        "temperature",
    ),
    (
        "chat temperature range",
        lambda s: collect(
            s.chat_complete(openai({"messages": [{"role": "user", "content": "x"}], "temperature": -1}))
        ),
        Status.INVALID_ARGUMENT,
        "temperature=-1",
    ),
    (
        "chat tools",
        lambda s: collect(
            s.chat_complete(
                openai({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})
            )
        ),
        Status.UNIMPLEMENTED,
        "tools",
    ),
    (
        "chat image",
        lambda s: collect(
            s.chat_complete(
                openai(
                    {
                        "messages": [
                            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                        ]
                    }
                )
            )
        ),
        Status.UNIMPLEMENTED,
        "messages[0].content[0].type='image_url'",
    ),
    (
        "completion batch",
        lambda s: collect(s.complete(openai({"prompt": ["a", "b"]}))),
        Status.UNIMPLEMENTED,
        "prompt",
    ),
    (
        "embed ids",
        lambda s: s.open_ai_embed(openai({"input": [1, 2]})),
        Status.UNIMPLEMENTED,
        "input as token ids",
    ),
    (
        "score labels",
        lambda s: s.score(openai({"query": "a", "items": ["b"], "label_token_ids": [1]})),
        Status.UNIMPLEMENTED,
        "label_token_ids",
    ),
    (
        "guided without a constraint",
        lambda s: collect(s.generate(rt.GenerateRequest(input_ids=[5], sampling_params=guided()))),
        Status.INVALID_ARGUMENT,
        "guided decoding constraint must be specified",
    ),
    (
        "guided empty regex",
        lambda s: collect(s.generate(rt.GenerateRequest(input_ids=[5], sampling_params=guided(regex="")))),
        Status.INVALID_ARGUMENT,
        "guided decoding constraint must not be empty",
    ),
    (
        "guided empty choice",
        lambda s: collect(
            s.generate(
                rt.GenerateRequest(
                    input_ids=[5], sampling_params=guided(choice=rt.ChoiceConstraint(values=["a", ""]))
                )
            )
        ),
        Status.INVALID_ARGUMENT,
        "guided choice must contain only non-empty values",
    ),
    (
        "legacy empty json_schema",
        lambda s: collect(
            s.text_generate(
                rt.TextGenerateRequest(text="x", sampling_params=rt.SamplingParams(json_schema=""))
            )
        ),
        Status.INVALID_ARGUMENT,
        "legacy json_schema must not be empty",
    ),
    (
        "legacy beside guided",
        lambda s: collect(
            s.text_generate(
                rt.TextGenerateRequest(
                    text="x",
                    sampling_params=rt.SamplingParams(
                        regex="a", guided_decoding=rt.GuidedDecoding(json_schema="{}")
                    ),
                )
            )
        ),
        Status.INVALID_ARGUMENT,
        "legacy json_schema/regex cannot be combined with guided_decoding",
    ),
    (
        "guided structural tag",
        lambda s: collect(
            s.generate(rt.GenerateRequest(input_ids=[5], sampling_params=guided(structural_tag="{}")))
        ),
        Status.UNIMPLEMENTED,
        "sampling_params.guided_decoding.structural_tag",
    ),
    (
        "session",
        lambda s: collect(s.text_generate(rt.TextGenerateRequest(text="x", session_id="s-1"))),
        Status.UNIMPLEMENTED,
        "session_id='s-1'",
    ),
    (
        "disaggregated",
        lambda s: collect(
            s.generate(
                rt.GenerateRequest(
                    input_ids=[5],
                    disaggregated_params=rt.DisaggregatedParams(bootstrap_host="h", bootstrap_room=1),
                )
            )
        ),
        Status.UNIMPLEMENTED,
        "disaggregated_params",
    ),
    (
        "kv hints",
        lambda s: collect(
            s.generate(rt.GenerateRequest(input_ids=[5], kv_hints=rt.KvHintsEnvelope(protocol_version="1.0")))
        ),
        Status.UNIMPLEMENTED,
        "kv_hints",
    ),
    (
        "require reasoning",
        lambda s: collect(s.text_generate(rt.TextGenerateRequest(text="x", require_reasoning=True))),
        Status.UNIMPLEMENTED,
        "require_reasoning",
    ),
    (
        "thinking budget",
        lambda s: collect(s.generate(rt.GenerateRequest(input_ids=[5], max_thinking_tokens=16))),
        Status.UNIMPLEMENTED,
        "max_thinking_tokens=16",
    ),
    (
        "image",
        lambda s: collect(
            s.generate(rt.GenerateRequest(input_ids=[5], image_data=["data:image/png;base64,"]))
        ),
        Status.UNIMPLEMENTED,
        "image_data",
    ),
    (
        "profile folder",
        lambda s: s.start_profile(rt.StartProfileRequest(output_dir="/proc/lmrpc-no-such-folder")),
        Status.INVALID_ARGUMENT,
        "output_dir=",
    ),
]


@pytest.mark.parametrize(
    ("case", "call", "status", "field"), BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS]
)
def test_bad_inputs_name_the_field(
    server: ServerProcess,
    case: str,
    call: Callable[[rt.SglangServiceStub], Awaitable[Any]],
    status: Status,
    field: str,
) -> None:
    refused = run(server, lambda stub: status_of(call(stub)))
    assert refused.status is status, refused.message
    assert field in (refused.message or "")


def test_openai_model_is_read_as_sglang_reads_it(server: ServerProcess) -> None:
    """SGLang 0.5.23 reads ``model`` only for a LoRA suffix (serving_base.py,
    _parse_model_parameter): ``"default"`` (its examples' name and its default), no model, or
    any other name is served by the one model, and chat, completions and score repeat the name
    asked for; embeddings name the embedding model, as SGLang names its model's path."""
    chat = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0,
    }  # greedy: text

    async def body(stub: rt.SglangServiceStub) -> tuple[list[Any], list[Any], list[Any]]:
        chats = [
            json.loads((await collect(stub.chat_complete(openai({**chat, **named}))))[-1].json_chunk)
            for named in ({"model": "default"}, {}, {"model": "gpt-4o"})
        ]
        completion = (
            await collect(stub.complete(openai({"prompt": "Hi", "max_tokens": 2, "model": "default"})))
        )[-1]
        unary = [
            await stub.open_ai_embed(openai({"input": "a", "model": "no-such-model"})),
            await stub.score(openai({"query": "a", "items": ["b"], "model": "no-such-model"})),
            await stub.rerank(openai({"query": "a", "documents": ["b"], "model": "no-such-model"})),
        ]
        return chats, [completion], unary

    chats, (completion,), unary = run(server, body)
    assert [c["model"] for c in chats] == ["default", "default", "gpt-4o"]
    assert all(c["object"] == "chat.completion" and c["choices"][0]["message"]["content"] for c in chats)
    assert (
        completion.finished and completion.status_code == 200
    )  # the HTTP status, as SGLang's bridge sends it
    assert json.loads(completion.json_chunk)["model"] == "default"
    assert [r.status_code for r in unary] == [200, 200, 200]
    embedded, scored, _ = (json.loads(r.json_body) for r in unary)
    assert embedded["model"] == "fake-embedding" and scored["model"] == "no-such-model"


def test_watch_engine_state_streams_a_snapshot_per_change(server: ServerProcess) -> None:
    """SGLang 0.5.23's WatchEngineState: a snapshot at once (revision 1, healthy, GetModelInfo's
    and GetServerInfo's answers), then one per change of the pause."""

    async def body(stub: rt.SglangServiceStub) -> tuple[list[rt.EngineStateSnapshot], Any]:
        snapshots: list[rt.EngineStateSnapshot] = []
        model = await stub.get_model_info(rt.GetModelInfoRequest())
        async with contextlib.aclosing(stub.watch_engine_state(rt.WatchEngineStateRequest())) as stream:
            async for snapshot in stream:
                snapshots.append(snapshot)
                if len(snapshots) == 1:
                    await stub.pause_generation(rt.PauseGenerationRequest(mode="in_place"))
                elif len(snapshots) == 2:
                    await stub.continue_generation(rt.ContinueGenerationRequest())
                else:
                    break
        return snapshots, model

    (first, paused, resumed), model = run(server, body)
    assert [s.revision for s in (first, paused, resumed)] == [1, 2, 3]
    assert [s.is_pause for s in (first, paused, resumed)] == [False, True, False]
    assert first.healthy and first.instance_id == paused.instance_id > 1_600_000_000 * 10**9
    assert first.model_info == model
    assert first.server_info is not None and json.loads(first.server_info.json_info)["served_model_name"]


def test_generate_return_text_seed_and_priority(server: ServerProcess) -> None:
    """SGLang 0.5.23's ``return_text`` puts the text so far in GenerateResponse.text (left unset
    without it); ``seed`` is lmrpc's seed (the same seed, the same tokens); ``priority`` is
    accepted, as SGLang accepts it without priority scheduling."""

    async def body(stub: rt.SglangServiceStub) -> tuple[list[Any], list[Any], list[list[int]]]:
        with_text = await collect(
            stub.generate(
                rt.GenerateRequest(
                    input_ids=PROMPT_IDS,
                    sampling_params=sampling(max_new_tokens=4),
                    stream=True,
                    return_text=True,
                )
            )
        )
        without = await collect(
            stub.generate(
                rt.GenerateRequest(input_ids=PROMPT_IDS, sampling_params=sampling(max_new_tokens=2))
            )
        )
        seeded = [
            (
                await collect(
                    stub.generate(
                        rt.GenerateRequest(
                            input_ids=PROMPT_IDS,
                            sampling_params=rt.SamplingParams(
                                temperature=1.0, seed=-7, max_new_tokens=6, ignore_eos=True
                            ),
                            priority=3,
                        )
                    )
                )
            )[-1].output_ids
            for _ in range(2)
        ]
        return with_text, without, seeded

    with_text, without, (first, second) = run(server, body)
    assert all(r.text is not None for r in with_text) and with_text[-1].text
    texts = [r.text or "" for r in with_text]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))  # cumulative
    assert all(r.text is None for r in without)
    assert first == second and len(first) == 6


def test_detokenize_keeps_special_tokens_and_leaves_out_unknown_ids(
    server: ServerProcess, tokenizer: TokenizerBundle
) -> None:
    """As SGLang's (grpc_bridge.py's detokenize: the tokenizer's decode with its defaults): special
    tokens are kept, an id outside the vocabulary decodes to nothing."""
    eos = tokenizer.eos_token_ids[0]
    known = tokenizer.encode("hello")

    async def body(stub: rt.SglangServiceStub) -> tuple[str, str]:
        special = (await stub.detokenize(rt.DetokenizeRequest(tokens=[*known, eos]))).text
        unknown = (
            await stub.detokenize(rt.DetokenizeRequest(tokens=[*known, tokenizer.vocab_size + 5]))
        ).text
        return special, unknown

    special, unknown = run(server, body)
    assert special == tokenizer.decode([*known, eos], skip_special_tokens=False) and special != unknown
    assert unknown == tokenizer.decode(known, skip_special_tokens=False)


def test_openai_unary_refusals_are_http_400_in_band(server: ServerProcess) -> None:
    async def body(stub: rt.SglangServiceStub) -> list[Any]:
        return [
            await stub.open_ai_embed(openai({"input": ""})),
            await stub.rerank(rt.OpenAiRequest(json_body=b"[1]")),
            await stub.score(openai({"query": "a", "items": ["b"], "top": 3})),
        ]

    responses = run(server, body)
    assert [r.status_code for r in responses] == [400, 400, 400]
    errors = [json.loads(r.json_body)["error"] for r in responses]
    assert all(e["code"] == 400 and e["message"] for e in errors)
    assert [errors[0]["param"], errors[2]["param"]] == ["input", "top"]


def test_admin_rpcs_need_the_admin_role_under_auth(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("client-1 client\nadmin-1 admin\n")
    args = ("--sglang-runtime-port", "0", "--auth", str(tokens))
    with ServerProcess(engine="fake", args=args) as guarded:

        async def as_client(stub: rt.SglangServiceStub) -> list[GRPCError]:
            return [
                await status_of(stub.pause_generation(rt.PauseGenerationRequest(mode="in_place"))),
                await status_of(stub.abort(rt.AbortRequest(abort_all=True))),
                await status_of(stub.start_profile(rt.StartProfileRequest(output_dir=str(tmp_path)))),
                await status_of(stub.flush_cache(rt.FlushCacheRequest())),
            ]

        async def as_admin(stub: rt.SglangServiceStub) -> tuple[Any, Any, Any]:
            return (
                await stub.flush_cache(rt.FlushCacheRequest()),
                await stub.abort(rt.AbortRequest(abort_all=True)),
                await collect(
                    stub.text_generate(
                        rt.TextGenerateRequest(text="x", sampling_params=sampling(max_new_tokens=2))
                    )
                ),
            )

        anonymous = run(guarded, lambda stub: status_of(stub.health_check(rt.HealthCheckRequest())))
        refusals = run(guarded, as_client, token="client-1")
        flushed, aborted, generated = run(guarded, as_admin, token="admin-1")
    assert anonymous.status is Status.UNAUTHENTICATED
    assert all(r.status is Status.PERMISSION_DENIED for r in refusals)
    assert flushed.success and aborted.success and generated[-1].finished
