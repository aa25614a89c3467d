"""The real engine in its default dtype (bf16 on CPU): batch invariance, n>1, prefix cache, stop
rules, abort and finish_output, KV accounting. One engine for the whole module."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from engine_driver import assert_idle, request, run, sampling

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.ipc import Finish, SubmitRequest
from reference_server.models.tokenizer import TokenizerBundle

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine() -> Iterator[ModelEngine]:
    # a small token budget forces chunked prefill when many prompts arrive together
    yield ModelEngine(
        ModelEngineConfig(
            kv_tokens=12288, max_running_sequences=32, max_batch_tokens=96, load_embedding_model=False
        )
    )


def chat(tokenizer: TokenizerBundle, text: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": text}])


FRANCE = "What is the capital of France?"
SEEDED = sampling(0.9, seed=1234, top_p=0.95)


def test_mixed_batch_gives_the_same_tokens_as_alone(engine: ModelEngine, tokenizer: TokenizerBundle) -> None:
    greedy = request("greedy", chat(tokenizer, FRANCE), max_tokens=24)
    seeded = request(
        "seeded", chat(tokenizer, "Write a haiku about the sea."), n=2, sampling_config=SEEDED, max_tokens=24
    )
    alone_greedy = run(engine, {0: [greedy]}).tokens[("greedy", 0)]
    alone_seeded = run(engine, {0: [seeded]}).tokens
    engine.flush_cache()  # the batched run must not lean on the prefix cache of the solo runs

    long_text = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(25))
    others: list[SubmitRequest] = [
        request("long", chat(tokenizer, long_text), max_tokens=12),
        request(
            "n3",
            chat(tokenizer, "Name three primary colors."),
            n=3,
            sampling_config=sampling(1.0, seed=5),
            max_tokens=10,
        ),
        request(
            "topk",
            chat(tokenizer, "Tell me a joke."),
            sampling_config=sampling(0.7, seed=9, top_k=20),
            max_tokens=14,
        ),
        request(
            "minp",
            chat(tokenizer, "What is 12 + 30?"),
            sampling_config=sampling(1.1, seed=3, min_p=0.05),
            max_tokens=9,
        ),
        request(
            "pen",
            chat(tokenizer, "List some fruits."),
            sampling_config=sampling(0.0, repetition_penalty=1.3, frequency_penalty=0.5),
            max_tokens=12,
        ),
        request("short", [1, 2, 3], max_tokens=20),
        request("one", [42], max_tokens=5),
        request("n2greedy", chat(tokenizer, "Hello!"), n=2, max_tokens=8),
        request(
            "lp",
            chat(tokenizer, "Describe a cat."),
            sampling_config=sampling(0.8, seed=11),
            top_logprobs=3,
            max_tokens=10,
        ),
        request("mid", chat(tokenizer, long_text[:400]), max_tokens=6),
        request("eos", chat(tokenizer, "Say hi."), ignore_eos=False, max_tokens=30),
        request("late1", chat(tokenizer, "Why is the sky blue?"), max_tokens=15),
        request(
            "late2",
            chat(tokenizer, FRANCE + " Answer briefly."),
            sampling_config=sampling(0.5, seed=2),
            max_tokens=11,
        ),
        request("late3", list(range(100, 160)), max_tokens=7),
    ]
    arrivals = {0: [others[0], others[1], others[2]], 1: others[3:6], 2: [greedy, others[6]], 4: others[7:10]}
    arrivals[5] = [seeded, others[10]]
    arrivals[9] = others[11:]
    batched = run(engine, arrivals)
    assert len(batched.finishes) == 16 + 1 + 2 + 1  # n=3, n=2 (seeded), n=2 (greedy)
    assert batched.tokens[("greedy", 0)] == alone_greedy
    assert batched.tokens[("seeded", 0)] == alone_seeded[("seeded", 0)]
    assert batched.tokens[("seeded", 1)] == alone_seeded[("seeded", 1)]
    assert alone_seeded[("seeded", 0)] != alone_seeded[("seeded", 1)]  # distinct streams per output
    assert batched.tokens[("n2greedy", 0)] == batched.tokens[("n2greedy", 1)]
    assert "Paris" in tokenizer.decode(alone_greedy)


def test_repeated_prompt_hits_the_prefix_cache(engine: ModelEngine, tokenizer: TokenizerBundle) -> None:
    prompt = chat(tokenizer, "Name three primary colors.")
    engine.flush_cache()
    first = run(engine, {0: [request("first", prompt, max_tokens=12)]})
    second = run(engine, {0: [request("second", prompt, max_tokens=12)]})
    assert first.cached["first"] == 0
    assert second.cached["second"] == len(prompt) - 1  # the last prompt token is always computed
    assert second.tokens[("second", 0)] == first.tokens[("first", 0)]
    assert engine.load(paused=False).kv_tokens_cached > 0
    released = engine.flush_cache()
    assert released > 0
    assert engine.kv.pool.num_free == engine.kv.pool.num_slots


def test_stop_rules(engine: ModelEngine, tokenizer: TokenizerBundle) -> None:
    prompt = chat(tokenizer, FRANCE)
    free = run(engine, {0: [request("free", prompt, max_tokens=12)]}).tokens[("free", 0)]
    eos = engine.info().eos_token_ids[0]
    assert eos in free  # "The capital of France is Paris.<|im_end|>..."
    stop_at = free.index(eos)
    result = run(
        engine,
        {
            0: [
                request("eos", prompt, ignore_eos=False, max_tokens=12),
                request("stoptok", prompt, stop_token_ids=(free[2],), max_tokens=12),
                request("both", prompt, stop_token_ids=(eos,), ignore_eos=False, max_tokens=12),
                request("min", prompt, ignore_eos=False, min_tokens=stop_at + 2, max_tokens=stop_at + 3),
                request("len", prompt, max_tokens=5),
            ]
        },
    )
    assert result.tokens[("eos", 0)] == free[: stop_at + 1]
    assert result.finishes[("eos", 0)] == Finish("stop", eos_token_id=eos)
    assert result.tokens[("stoptok", 0)] == free[:3]
    assert result.finishes[("stoptok", 0)] == Finish("stop", stop_token_id=free[2])
    assert result.finishes[("both", 0)] == Finish("stop", stop_token_id=eos)  # a stop token wins over EOS
    assert eos not in result.tokens[("min", 0)][: stop_at + 2]  # masked below min_tokens
    assert len(result.tokens[("min", 0)]) >= stop_at + 2
    assert result.tokens[("len", 0)] == free[:5]
    assert result.finishes[("len", 0)] == Finish("length")


def test_logprobs_are_raw_model_logprobs(engine: ModelEngine, tokenizer: TokenizerBundle) -> None:
    prompt = chat(tokenizer, FRANCE)
    result = run(engine, {0: [request("lp", prompt, max_tokens=4, top_logprobs=5)]})
    tokens, logprobs = result.tokens[("lp", 0)], result.logprobs[("lp", 0)]
    for token, lp in zip(tokens, logprobs, strict=True):
        assert lp.token_id == token and lp.rank == 1  # greedy picks the top candidate
        assert len(lp.top) == 5 and lp.top[0] == (token, pytest.approx(lp.logprob))
        assert all(a[1] >= b[1] for a, b in itertools.pairwise(lp.top))
        assert lp.logprob <= 0


def test_abort_and_finish_output_release_everything(engine: ModelEngine, tokenizer: TokenizerBundle) -> None:
    prompt = chat(tokenizer, "Tell me a long story about a dragon.")
    engine.add_request(request("waiting", prompt, n=2, max_tokens=50))
    engine.add_request(request("running", prompt, n=3, sampling_config=sampling(1.0, seed=1), max_tokens=50))
    outputs = []
    for _ in range(4):
        outputs += engine.step()
        engine.check_integrity()
    engine.finish_output("running", 1)
    engine.check_integrity()
    aborted = engine.abort_request("running")
    assert sorted(o.output_index for o in aborted) == [0, 2]
    assert all(o.finish == Finish("aborted") and o.token_ids == [] for o in aborted)
    assert engine.abort_request("running") == []  # unknown now
    assert [o.output_index for o in engine.abort_request("waiting")] == [0, 1]
    assert engine.abort_request("never-seen") == []
    assert not engine.has_work()
    assert_idle(engine)
    engine.flush_cache()
    assert engine.kv.pool.num_free == engine.kv.pool.num_slots
