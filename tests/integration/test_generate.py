"""Generate over real loopback gRPC through the whole pipeline (fake engine)."""

from __future__ import annotations

import pytest
from streams import collect, kinds, run, wait_idle

from lmrpc.client import GenerateResult, LmrpcClient, StreamAggregator
from lmrpc.v1 import (
    ChatInput,
    ChatMessage,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    ResponseOptions,
    SamplingParams,
    StopMatch,
    StoppingCriteria,
    TokenIds,
)
from reference_server.models.tokenizer import TokenizerBundle
from reference_server.testing import ServerProcess

GREEDY = SamplingParams(temperature=0.0)


def aggregate(responses: list[GenerateResponse]) -> GenerateResult:
    aggregator = StreamAggregator()
    for response in responses:
        aggregator.feed(response)
    return aggregator.result


def check_stream_shape(responses: list[GenerateResponse], n: int) -> None:
    """One PromptInfo first, deltas only before their finish, one finish per output, usage last."""
    assert kinds(responses)[0] == "prompt_info" and kinds(responses).count("prompt_info") == 1
    finished: set[int] = set()
    for response in responses[1:]:
        index = (response.delta or response.finished).output_index  # type: ignore[union-attr]
        assert index is not None and 0 <= index < n
        assert index not in finished, "event after the output's finish"
        if response.finished is not None:
            finished.add(index)
    assert finished == set(range(n))
    assert all(r.usage is None for r in responses[:-1]) and responses[-1].usage is not None
    assert {r.request_id for r in responses} == {responses[0].request_id}


@pytest.mark.parametrize("n", [1, 4])
def test_stream_and_final_only_agree(fake_server: ServerProcess, n: int) -> None:
    request = GenerateRequest(
        request_id=f"agree-{n}", text="The quick brown fox", sampling=SamplingParams(temperature=0.8, seed=11, n=n),
        stopping=StoppingCriteria(max_tokens=24),
    )  # fmt: skip

    async def body(client: LmrpcClient) -> tuple[list[GenerateResponse], list[GenerateResponse]]:
        streamed = await collect(client, request)
        request.response = ResponseOptions(final_only=True)
        return streamed, await collect(client, request)

    streamed, final = run(fake_server.target, body)
    check_stream_shape(streamed, n)
    check_stream_shape(final, n)
    assert kinds(final)[1:] == ["delta", "finished"] * n
    a, b = aggregate(streamed), aggregate(final)
    assert [(o.token_ids, o.text, o.finish_reason) for o in a.outputs] == [
        (o.token_ids, o.text, o.finish_reason) for o in b.outputs
    ]
    assert a.usage is not None and b.usage is not None
    assert (a.usage.prompt_tokens, a.usage.completion_tokens) == (
        b.usage.prompt_tokens,
        b.usage.completion_tokens,
    )
    assert (
        b.usage.cached_prompt_tokens > 0
    )  # the second run of the same prompt and a.usage.completion_tokens == sum(len(o.token_ids) for o in a.outputs)
    assert all(o.completion_tokens == len(o.token_ids) for o in a.outputs)
    if n > 1:
        assert len({tuple(o.token_ids) for o in a.outputs}) > 1, "seeded outputs should differ"


def test_greedy_outputs_are_identical_and_seed_is_echoed(fake_server: ServerProcess) -> None:
    request = GenerateRequest(
        text="abc", sampling=SamplingParams(temperature=0.0, n=3), stopping=StoppingCriteria(max_tokens=8)
    )
    result = run(fake_server.target, lambda c: c.generate(request))
    assert len({tuple(o.token_ids) for o in result.outputs}) == 1
    seeded = GenerateRequest(
        text="abc", sampling=SamplingParams(temperature=1.0), stopping=StoppingCriteria(max_tokens=8)
    )
    first = run(fake_server.target, lambda c: c.generate(seeded))
    assert first.prompt is not None
    seeded.sampling = SamplingParams(temperature=1.0, seed=first.prompt.seed)
    again = run(fake_server.target, lambda c: c.generate(seeded))
    assert again.token_ids == first.token_ids


def test_utf8_split_across_tokens_streams_cleanly(
    fake_server: ServerProcess, tokenizer: TokenizerBundle
) -> None:
    text = "中文字符和表情😀👍🏽🇫🇷 한국어"
    prompt = tokenizer.encode(text)
    assert any(not tokenizer.decode([t]).isprintable() or "\ufffd" in tokenizer.decode([t]) for t in prompt)
    request = GenerateRequest(
        token_ids=TokenIds(ids=prompt), sampling=GREEDY, stopping=StoppingCriteria(max_tokens=len(prompt))
    )
    responses = run(fake_server.target, lambda c: collect(c, request))
    deltas = [r.delta for r in responses if r.delta is not None]
    assert len(deltas) >= 1
    assert all("\ufffd" not in d.text for d in deltas)
    assert "".join(d.text for d in deltas) == text  # greedy fake engine echoes the prompt


def test_stop_strings_and_tokens(fake_server: ServerProcess, tokenizer: TokenizerBundle) -> None:
    prompt = "alpha beta gamma delta"

    def generate(stopping: StoppingCriteria) -> GenerateResult:
        return run(
            fake_server.target,
            lambda c: c.generate(GenerateRequest(text=prompt, sampling=GREEDY, stopping=stopping)),
        )

    excluded = generate(StoppingCriteria(max_tokens=20, stop_strings=["gamma"]))
    assert excluded.text == "alpha beta " and excluded.outputs[0].stop == StopMatch(stop_string="gamma")
    included = generate(StoppingCriteria(max_tokens=20, stop_strings=["gamma"], include_stop_in_output=True))
    assert included.text == "alpha beta gamma"
    beta = tokenizer.encode(" beta")[0]
    by_token = generate(StoppingCriteria(max_tokens=20, stop_token_ids=[beta]))
    assert by_token.token_ids[-1] == beta and by_token.outputs[0].stop == StopMatch(stop_token_id=beta)
    assert by_token.text == "alpha"
    delayed = generate(StoppingCriteria(max_tokens=20, stop_token_ids=[beta], min_tokens=3))
    assert delayed.outputs[0].completion_tokens >= 3


def test_eos_vs_ignore_eos_and_chat(fake_server: ServerProcess) -> None:
    chat = GenerateRequest(
        chat=ChatInput(messages=[ChatMessage(role="user", content="Hi")]), sampling=GREEDY,
        stopping=StoppingCriteria(max_tokens=64),
    )  # fmt: skip
    result = run(fake_server.target, lambda c: c.generate(chat))
    out = result.outputs[0]
    assert out.finish_reason == FinishReason.STOP and out.stop == StopMatch(eos_token_id=2)
    assert out.token_ids[-1] == 2 and "<|im_end|>" not in out.text
    chat.stopping = StoppingCriteria(max_tokens=40, ignore_eos=True)
    ignored = run(fake_server.target, lambda c: c.generate(chat))
    assert ignored.outputs[0].finish_reason == FinishReason.LENGTH and len(ignored.token_ids) == 40


def test_logprobs_align_with_tokens(fake_server: ServerProcess) -> None:
    request = GenerateRequest(
        text="one two", sampling=SamplingParams(temperature=1.0, seed=3),
        stopping=StoppingCriteria(max_tokens=10), response=ResponseOptions(return_logprobs=True, top_logprobs=3),
    )  # fmt: skip
    out = run(fake_server.target, lambda c: c.generate(request)).outputs[0]
    assert [lp.token_id for lp in out.logprobs] == out.token_ids
    for lp in out.logprobs:
        assert lp.logprob <= 0 and lp.rank >= 1 and len(lp.top) == 3
        assert [c.logprob for c in lp.top] == sorted((c.logprob for c in lp.top), reverse=True)
        assert (lp.rank == 1) == (lp.top[0].token_id == lp.token_id)


def test_usage_and_prefix_cache(fake_server: ServerProcess) -> None:
    request = GenerateRequest(
        text="a repeated prompt for the cache",
        sampling=SamplingParams(temperature=0.0, n=2),
        stopping=StoppingCriteria(max_tokens=5),
    )

    async def body(client: LmrpcClient) -> tuple[GenerateResult, GenerateResult, list[int]]:
        first = await client.generate(request)
        second = await client.generate(request)
        ids = await client.tokenize("a repeated prompt for the cache")
        await wait_idle(client)
        return first, second, ids

    first, second, ids = run(fake_server.target, body)
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens == second.usage.prompt_tokens == len(ids)
    assert second.usage.completion_tokens == sum(o.completion_tokens or 0 for o in second.outputs) == 10
    assert 0 < second.usage.cached_prompt_tokens <= second.usage.prompt_tokens
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in second.outputs]


def test_embed_tokenize_detokenize(fake_server: ServerProcess) -> None:
    async def body(client: LmrpcClient):  # type: ignore[no-untyped-def]
        embedded = await client.embed(["hello", "world", "hello"])
        ids = await client.tokenize("round trip ✓")
        return embedded, await client.detokenize(ids)

    embedded, text = run(fake_server.target, body)
    vectors = [e.values for e in embedded.embeddings]
    assert len(vectors) == 3 and all(len(v) == 384 for v in vectors)
    assert all(abs(sum(x * x for x in v) - 1) < 1e-3 for v in vectors)
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert text == "round trip ✓"
