"""Random arrivals, aborts and detokenizer finishes against a tiny KV pool (requests wait,
prefixes are shared and evicted): the engine's bookkeeping must hold after every step.
Runs the tiny random Llama of test_hf_checkpoint, so each step takes milliseconds."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest
from engine_driver import assert_idle, request, sampling, write_tiny_checkpoint

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.ipc import Finish, SubmitRequest
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import TokenizerBundle

pytestmark = pytest.mark.model

KV_TOKENS = 160


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, tokenizer: TokenizerBundle) -> ModelEngine:
    folder: Path = tmp_path_factory.mktemp("tiny")
    write_tiny_checkpoint(folder, tokenizer)
    config = ModelEngineConfig(
        source=resolve_model(folder), dtype="float32", kv_tokens=KV_TOKENS, max_running_sequences=6,
        max_batch_tokens=16, load_embedding_model=False,
    )  # fmt: skip
    return ModelEngine(config)


def random_request(rng: random.Random, rid: str) -> SubmitRequest:
    prefix = [[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 30, 31], [40]][rng.randrange(3)]
    prompt = prefix + [rng.randrange(100, 200) for _ in range(rng.randrange(0, 30))]
    n = rng.choice([1, 1, 2, 3])
    max_tokens = rng.randrange(1, 12)
    while len(prompt) + n * max_tokens > KV_TOKENS:
        max_tokens -= 1
    temperature = rng.choice([0.0, 0.8])
    return request(
        rid, prompt, n=n, max_tokens=max_tokens, sampling_config=sampling(temperature, seed=rng.randrange(99)),
        min_tokens=rng.choice([0, 0, 2]) if max_tokens > 2 else 0, stop_token_ids=tuple(rng.sample(range(100), 30)),
        top_logprobs=rng.choice([None, 2]),
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_random_traffic_keeps_the_books(engine: ModelEngine, seed: int) -> None:
    rng = random.Random(seed)
    requests: dict[str, SubmitRequest] = {}
    tokens: dict[tuple[str, int], list[int]] = {}
    ended: dict[tuple[str, int], Finish | None] = {}  # None: ended by finish_output
    credit: dict[str, int] = {}  # FLOW-1: tokens a request's outputs may have in all (0: no limit)
    for step in range(300):
        if rng.random() < 0.15 and credit:
            rid = rng.choice(sorted(credit))
            credit[rid] += rng.randrange(1, 6)
            engine.grant_tokens(rid, credit[rid])
        if step < 220 and rng.random() < 0.3:
            rid = f"s{seed}-{step}"
            requests[rid] = random_request(rng, rid)
            if rng.random() < 0.4:  # a client that reads slowly: the request runs on credit
                credit[rid] = max(requests[rid].num_outputs, rng.randrange(1, 8))
                requests[rid] = msgspec.structs.replace(requests[rid], token_credit=credit[rid])
            engine.add_request(requests[rid])
        if rng.random() < 0.05 and requests:
            rid = rng.choice(list(requests))
            for out in engine.abort_request(rid):
                assert out.token_ids == [] and out.finish == Finish("aborted")
                assert (rid, out.output_index) not in ended
                ended[(rid, out.output_index)] = out.finish
        live = [k for k in tokens if k not in ended]
        if rng.random() < 0.05 and live:
            key = rng.choice(live)
            engine.finish_output(*key)
            ended[key] = None
        for out in engine.step():
            key = (out.rid, out.output_index)
            assert key not in ended, f"{key} produced output after it ended"
            tokens.setdefault(key, []).extend(out.token_ids)
            if out.rid in credit:
                produced = sum(
                    len(tokens.get((out.rid, i), [])) for i in range(requests[out.rid].num_outputs)
                )
                assert produced <= credit[out.rid], (
                    f"{out.rid} produced {produced} on a credit of {credit[out.rid]}"
                )
            if out.finish is not None:
                ended[key] = out.finish
        engine.check_integrity()
    for rid in credit:
        credit[rid] = 10**6
        engine.grant_tokens(rid, credit[rid])
    while engine.has_work():
        for out in engine.step():
            key = (out.rid, out.output_index)
            assert key not in ended
            tokens.setdefault(key, []).extend(out.token_ids)
            if out.finish is not None:
                ended[key] = out.finish
        engine.check_integrity()
    assert_idle(engine)
    for rid, req in requests.items():
        for i in range(req.num_outputs):
            assert (rid, i) in ended, f"{rid}/{i} never ended"
            got = tokens.get((rid, i), [])
            assert len(got) <= req.stopping.max_tokens
            finish = ended[(rid, i)]
            if finish is not None and finish.reason == "length":
                assert len(got) == req.stopping.max_tokens
            if finish is not None and finish.reason == "stop":
                assert finish.stop_token_id == got[-1] and len(got) > req.stopping.min_tokens
    engine.flush_cache()
    assert engine.kv.pool.num_free == KV_TOKENS
