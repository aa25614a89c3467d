"""Every allowance a clause's reading gives a server (conformance/spec/profiles/*.py: "may", "or",
"at most", "where present", "no later chunk another role", ...) is one a conforming transcript may
use and still pass its clause's validator; where it is cheap, a transcript that breaks the rule
still fails, so the test has power. A FAIL is a claim about someone else's server: it must show a
break of what that protocol promises, never of a stricter rule the harness made up."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from test_conformance_drivers import EOS, expressed, facts, record_of, run
from test_openai_profile import CHAT, USAGE, body, chunk, delta, stream

from conformance.cases.openai._common import names_field, refused
from conformance.cases.openai.compare import Pair, difference, greedy_is_argmax, judge_pair, no_cross_talk
from conformance.cases.openai.usage import N2_MAX_TOKENS, n_charges_every_choice
from conformance.drivers.normalize import Normalizer
from conformance.drivers.openai.exchange import Exchange, OpenAIRequest, SseEvent
from conformance.drivers.openai.support import Feature, State, Support
from conformance.drivers.sglang_runtime import RuntimeReader
from conformance.harness.context import Checker
from conformance.spec.profiles import PROFILES
from conformance.stream.record import Finding
from conformance.validators import STREAM_CLAUSES, validate
from conformance.validators.openai import CHECKS, Answer, judge
from conformance.vocabulary import Mismatch
from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import GenerateRequest, ResponseOptions, SamplingParams, StoppingCriteria, TokenIds

# ── OpenAI-compatible HTTP ────────────────────────────────────────────────────────────────────


def chat(**fields: Any) -> OpenAIRequest:
    return OpenAIRequest("chat", {"messages": [], "max_tokens": 4, **fields})


def completions(**fields: Any) -> OpenAIRequest:
    return OpenAIRequest("completions", {"prompt": "x", "max_tokens": 4, **fields})


def events(*chunks: Any, done: bool = True) -> list[SseEvent]:
    return [SseEvent(0.0, "", json.dumps(c)) for c in chunks] + (
        [SseEvent(0.0, "", "[DONE]")] if done else []
    )


def sse(request: OpenAIRequest, items: list[SseEvent]) -> Exchange:
    return Exchange(request, "POST", "http://x/v1" + request.path, 200, {"content-type": "text/event-stream"},
                    events=items)  # fmt: skip


def text_chunk(index: int, text: str, finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
    choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
    return {"id": "c1", "object": "text_completion", "choices": [choice]}


def fingerprints(found: list[Mismatch]) -> set[str]:
    return {m.fingerprint for m in found}


# STREAM-1 (openai): "chat: each choice's first chunk carries `delta.role` `assistant`, and no later
# chunk another role"


def test_a_chat_stream_may_repeat_the_assistant_role_on_every_chunk() -> None:
    """TGI sends ``role: assistant`` on every chunk: a repeat is not another role."""
    request = chat(stream=True)
    answer = Answer.of(
        stream(
            request,
            [
                chunk(delta(0, "", role="assistant")),
                chunk(delta(0, "Hel", role="assistant")),
                chunk(delta(0, "lo", "length", role="assistant")),
            ],
        )
    )
    assert judge(answer, list(CHECKS)) == []


def test_a_later_chunk_with_another_role_still_fails_stream_1() -> None:
    request = chat(stream=True)
    answer = Answer.of(
        stream(request, [chunk(delta(0, "", role="assistant")), chunk(delta(0, "Hi", "length", role="user"))])
    )
    found = judge(answer, ["STREAM-1"])
    assert found and "(1, 'user')" in found[0].got


def test_a_chat_stream_may_carry_content_in_its_role_chunk_and_null_roles_later() -> None:
    request = chat(stream=True)
    later = {"index": 0, "delta": {"role": None, "content": " there"}, "finish_reason": "length"}
    answer = Answer.of(stream(request, [chunk(delta(0, "Hello", role="assistant")), chunk(later)]))
    assert answer.view.texts() == {0: "Hello there"}
    assert judge(answer, list(CHECKS)) == []


def test_each_choice_gets_its_role_on_its_own_first_chunk_however_choices_interleave() -> None:
    request = chat(stream=True, n=2)
    answer = Answer.of(
        stream(
            request,
            [
                chunk(delta(0, "", role="assistant")),
                chunk(delta(0, "Hello")),
                chunk(delta(1, "Hi", role="assistant")),
                chunk(delta(1, " you", "length"), delta(0, " there", "length")),
            ],
        )
    )
    assert judge(answer, list(CHECKS)) == []


def test_a_completions_stream_carries_no_role() -> None:
    answer = Answer.of(
        sse(completions(stream=True), events(text_chunk(0, "ab"), text_chunk(0, "c", "length")))
    )
    assert judge(answer, list(CHECKS)) == []


# STREAM-7 (openai): "`top_logprobs` of the asked length sorted by logprob (legacy completions: a
# dict of at most the asked length)"; OpenAI: "up to logprobs+1 elements" (the sampled token's)


def legacy(tokens: list[tuple[str, float, dict[str, float]]], k: int, finish: str = "length") -> Answer:
    logprobs = {
        "tokens": [t for t, _, _ in tokens],
        "token_logprobs": [v for _, v, _ in tokens],
        "top_logprobs": [top for _, _, top in tokens],
        "text_offset": list(range(len(tokens))),
    }
    text = "".join(t for t, _, _ in tokens)
    value = {
        "id": "b", "object": "text_completion",
        "usage": {"prompt_tokens": 2, "completion_tokens": len(tokens), "total_tokens": 2 + len(tokens)},
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}],
    }  # fmt: skip
    request = completions(max_tokens=len(tokens), logprobs=k)
    return Answer.of(Exchange(request, "POST", "http://x/v1/completions", 200,
                              {"content-type": "application/json"}, json.dumps(value)))  # fmt: skip


def test_legacy_completions_may_add_the_sampled_token_beside_the_k_most_likely() -> None:
    """vLLM (and OpenAI: "up to logprobs+1 elements"): k = 2, the sampled token third."""
    answer = legacy(
        [
            ("a", -0.1, {"a": -0.1, "b": -2.5}),  # the sampled token among the two
            ("c", -3.0, {"c": -3.0, "d": -0.2, "e": -1.0}),  # sampled at rank 3: two plus it
        ],
        k=2,
    )
    assert judge(answer, list(CHECKS)) == []


def test_legacy_completions_with_logprobs_0_may_answer_the_sampled_token_alone() -> None:
    answer = legacy([("a", -0.1, {"a": -0.1}), ("b", -0.7, {"b": -0.7})], k=0)
    assert judge(answer, ["STREAM-7"]) == []


def test_legacy_completions_may_answer_fewer_entries_where_equal_strings_collapse() -> None:
    """Two tokens that decode to the same string are one dict key: fewer than k entries."""
    answer = legacy([("\ufffd", -0.4, {"\ufffd": -0.4, "x": -1.5})], k=3)
    assert judge(answer, ["STREAM-7"]) == []


@pytest.mark.parametrize(
    "top",
    [
        {"d": -0.2, "e": -1.0, "f": -1.2},  # k + 1 entries, the sampled token not among them
        {"c": -3.0, "d": -0.2, "e": -1.0, "f": -1.2},  # k + 2
        {},  # none at all although k >= 1
    ],
)
def test_a_legacy_dict_beyond_the_allowance_still_fails_stream_7(top: dict[str, float]) -> None:
    found = judge(legacy([("c", -3.0, top)], k=2), ["STREAM-7"])
    assert [m.want for m in found] == ["at most 2 alternatives, or 3 with the sampled token among them"]


def chat_logprobs(
    entries: list[tuple[str, float, list[tuple[str, float]]]], k: int | None, **fields: Any
) -> Answer:
    content = [
        {"token": t, "logprob": v, "top_logprobs": [{"token": a, "logprob": b} for a, b in top]}
        for t, v, top in entries
    ]
    text = "".join(t for t, _, _ in entries)
    finish = fields.pop("finish", "length")
    completion = fields.pop("completion_tokens", len(entries))
    value = {
        "id": "b", "object": "chat.completion",
        "usage": {"prompt_tokens": 2, "completion_tokens": completion, "total_tokens": 2 + completion},
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                     "logprobs": {"content": content}}],
    }  # fmt: skip
    asked = {"logprobs": True} | ({"top_logprobs": k} if k is not None else {})
    request = chat(**{"max_tokens": completion, **asked, **fields})
    return Answer.of(body(request, value))


def test_a_chat_sampled_token_need_not_be_among_top_logprobs_when_k_likelier_tokens_fill_them() -> None:
    """Sampled at temperature 1 with rank 3: top_logprobs are the two most likely, not it."""
    answer = chat_logprobs([("c", -3.0, [("a", -0.2), ("b", -1.0)])], k=2)
    assert judge(answer, list(CHECKS)) == []


def test_chat_top_logprobs_tied_in_logprob_may_come_in_any_order() -> None:
    answer = chat_logprobs([("b", -0.7, [("a", -0.7), ("b", -0.7), ("c", -0.9)])], k=3)
    assert judge(answer, ["STREAM-7"]) == []


@pytest.mark.parametrize("k", [None, 0])
def test_chat_logprobs_without_alternatives_have_an_empty_top_logprobs(k: int | None) -> None:
    answer = chat_logprobs([("a", -0.1, []), ("b", -0.2, [])], k=k)
    assert judge(answer, ["STREAM-7"]) == []


VLLM_CHAT_TOP = [
    # vLLM puts the sampled token first and cuts the list at k: sampled at rank 3 of k = 2
    [("c", -3.0, [("c", -3.0), ("a", -0.2)])],
    # sampled at rank 2: listed first, ahead of the most likely
    [("b", -1.0, [("b", -1.0), ("a", -0.2)])],
    # a list that passes over the sampled token although it is likelier than one listed
    [("b", -1.0, [("a", -0.2), ("c", -3.0)])],
]


@pytest.mark.parametrize("entries", VLLM_CHAT_TOP)
def test_chat_top_logprobs_that_are_not_the_k_most_likely_sorted_still_fail_stream_7(
    entries: list[tuple[str, float, list[tuple[str, float]]]],
) -> None:
    found = judge(chat_logprobs(entries, k=2), ["STREAM-7"])
    assert [m.want for m in found] == ["the 2 most likely tokens, sorted by logprob, highest first"]


def test_top_logprobs_not_the_k_most_likely_have_one_fingerprint_of_their_own() -> None:
    """vLLM's chat top_logprobs (led by the sampled token, the k-th most likely dropped) are one
    finding, whatever k and the tokens, apart from every other STREAM-7 finding."""
    found = [m for entries in VLLM_CHAT_TOP for m in judge(chat_logprobs(entries, k=2), ["STREAM-7"])]
    found += judge(chat_logprobs([("c", -3.0, [("c", -3.0), ("a", -0.2), ("b", -1.0)])], k=3), ["STREAM-7"])
    assert len(found) == 4 and len(fingerprints(found)) == 1
    # one entry of a two-token choice, a logprob > 0, one alternative of two, an alternative > 0
    others = judge(chat_logprobs([("a", 0.5, [("a", 0.5)])], k=2, completion_tokens=2), ["STREAM-7"])
    assert len(fingerprints(others)) == 4
    assert fingerprints(found).isdisjoint(fingerprints(others))


def test_one_stream_7_fault_never_hides_another_of_the_same_choice() -> None:
    answer = chat_logprobs([("a", -0.2, [("a", -0.2)]), ("c", -3.0, [("c", -3.0), ("a", -0.2)])], k=2)
    found = judge(answer, ["STREAM-7"])
    assert [m.want for m in found] == [
        "2 alternatives",
        "the 2 most likely tokens, sorted by logprob, highest first",
    ]


def test_with_a_stop_string_the_stop_tokens_logprobs_may_be_left_out() -> None:
    """The reading: "with a stop string the stop's tokens may be left out": 3 entries of 4 tokens."""
    entries = [(t, -0.1, [(t, -0.1)]) for t in "abc"]
    answer = chat_logprobs(entries, k=1, finish="stop", completion_tokens=4, max_tokens=8, stop=["d"])
    assert judge(answer, ["STREAM-7"]) == []
    without_stop = chat_logprobs(entries, k=1, finish="stop", completion_tokens=5, max_tokens=8)
    assert judge(without_stop, ["STREAM-7"])  # no stop string: one entry per token (and maybe an EOS)


def test_a_choice_that_ended_on_its_own_may_count_its_eos_without_an_entry() -> None:
    """The reading: usage may count an end-of-sequence token that no logprobs entry shows (vLLM, smg)."""
    entries = [(t, -0.1, [(t, -0.1)]) for t in "abc"]
    for tokens, fits in ((3, True), (4, True), (5, False), (2, False)):
        answer = chat_logprobs(entries, k=1, finish="stop", completion_tokens=tokens, max_tokens=8)
        assert (judge(answer, ["STREAM-7"]) == []) is fits, tokens
    cut = chat_logprobs(entries, k=1, finish="length", completion_tokens=4, max_tokens=4)
    assert judge(cut, ["STREAM-7"])  # cut at max_tokens: one entry per token, no EOS to leave out


# FINISH-1 (openai): "exactly one non-null `finish_reason` per choice, and no content for a choice after it"


def test_a_choice_may_go_on_with_empty_chunks_after_its_finish_while_another_choice_runs() -> None:
    request = chat(stream=True, n=2)
    empty_after = {"index": 0, "delta": {}, "finish_reason": None, "logprobs": None}
    answer = Answer.of(
        stream(
            request,
            [
                chunk(delta(0, "", role="assistant"), delta(1, "", role="assistant")),
                chunk(delta(0, "Hello", "length"), delta(1, "Hi")),
                chunk(empty_after, delta(1, " you")),
                chunk(delta(1, "", "length")),
            ],
        )
    )
    assert judge(answer, list(CHECKS)) == []
    twice = [chunk(delta(0, "x", "length", role="assistant")), chunk(delta(0, None, "length"))]
    assert judge(Answer.of(stream(chat(stream=True), twice)), ["FINISH-1"])  # a second finish_reason


# FINISH-4 (openai): "`finish_reason` is one of stop, length, tool_calls, content_filter, function_call"


@pytest.mark.parametrize("reason", ["stop", "length", "tool_calls", "content_filter", "function_call"])
def test_every_finish_reason_openai_names_is_known(reason: str) -> None:
    answer = Answer.of(stream(chat(stream=True), [chunk(delta(0, "x", reason, role="assistant"))]))
    assert judge(answer, ["FINISH-4"]) == []


def test_a_finish_reason_openai_does_not_name_still_fails_finish_4() -> None:
    answer = Answer.of(stream(chat(stream=True), [chunk(delta(0, "x", "eos", role="assistant"))]))
    assert judge(answer, ["FINISH-4"])


# FINISH-6 (openai): "`length` only when the choice's tokens reached `max_tokens`, and never beyond
# (judged where usage counts one choice: n = 1)"


def answer_with(request: OpenAIRequest, finishes: list[str], completion: int, **usage: Any) -> Answer:
    usage = {"prompt_tokens": 3, "completion_tokens": completion, "total_tokens": 3 + completion, **usage}
    choices = [
        {"index": i, "message": {"role": "assistant", "content": "x"}, "finish_reason": f}
        for i, f in enumerate(finishes)
    ]
    return Answer.of(
        body(request, {"id": "b", "object": "chat.completion", "choices": choices, "usage": usage})
    )


@pytest.mark.parametrize("completion", [2, 4])
def test_a_choice_may_end_stop_below_or_exactly_at_max_tokens(completion: int) -> None:
    """A token that reaches max_tokens and also meets a stop condition ends the choice ``stop``."""
    assert judge(answer_with(chat(max_tokens=4), ["stop"], completion), list(CHECKS)) == []
    assert judge(answer_with(chat(max_tokens=4), ["length"], 3), ["FINISH-6"])  # length short of it


def test_finish_6_and_usage_3_judge_only_counts_the_answer_shows() -> None:
    """n = 2: usage counts both choices (FINISH-6 unjudged); a choice that ended stop has no known
    count, so the sum is not judged either."""
    request = chat(max_tokens=4, n=2)
    assert judge(answer_with(request, ["length", "stop"], 5), list(CHECKS)) == []
    assert judge(answer_with(request, ["length", "length"], 4), ["USAGE-3"])  # 2 · 4 known, 4 reported


# USAGE-1 (openai): "with `stream_options.include_usage` exactly one chunk carries `usage` ... (every
# other chunk's usage null); without it OpenAI says nothing"


def test_without_include_usage_a_stream_may_carry_usage_on_every_chunk() -> None:
    """vLLM's continuous usage stats: OpenAI says nothing of usage without include_usage."""
    running = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    answer = Answer.of(
        stream(
            chat(stream=True),
            [
                chunk(delta(0, "", role="assistant"), usage=running),
                chunk(delta(0, "x", "length"), usage=USAGE),
            ],
        )
    )
    assert judge(answer, ["USAGE-1"]) == []


def test_chunks_before_the_usage_chunk_may_leave_usage_out_or_null() -> None:
    request = chat(stream=True, stream_options={"include_usage": True})
    no_usage_key = {"id": "c1", "object": CHAT, "choices": [delta(0, "x", "stop")]}
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    answer = Answer.of(
        stream(request, [chunk(delta(0, "", role="assistant")), no_usage_key, {**chunk(), "usage": usage}])
    )
    assert judge(answer, list(CHECKS)) == []


def test_a_body_usage_may_carry_details_beside_its_three_counts() -> None:
    usage = {**USAGE, "prompt_tokens_details": {"cached_tokens": 2}, "completion_tokens_details": None}
    value = {"id": "b", "object": "chat.completion", "usage": usage,
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}  # fmt: skip
    assert judge(Answer.of(body(chat(max_tokens=8), value)), list(CHECKS)) == []


# USAGE-4 (openai): "`prompt_tokens_details.cached_tokens`, where present, ≤ `prompt_tokens`"


@pytest.mark.parametrize(
    "details", [None, {}, {"cached_tokens": None}, {"cached_tokens": 0}, {"cached_tokens": 3}]
)
def test_cached_tokens_may_be_absent_null_or_up_to_the_prompt(details: Any) -> None:
    answer = answer_with(chat(max_tokens=8), ["stop"], 2, prompt_tokens_details=details)
    assert judge(answer, list(CHECKS)) == []
    too_many = answer_with(chat(max_tokens=8), ["stop"], 2, prompt_tokens_details={"cached_tokens": 4})
    assert judge(too_many, ["USAGE-4"])  # more cached than the 3 prompt tokens


# N-1 (openai): "`n` choices with indices exactly 0 … n−1"


def test_a_body_may_list_its_choices_in_any_order() -> None:
    answer = answer_with(chat(max_tokens=4, n=2), ["length", "length"], 8)
    raw = json.loads(answer.exchange.text)
    raw["choices"].reverse()
    assert judge(Answer.of(body(answer.request, raw)), list(CHECKS)) == []


# ERR-1 (openai) and the prose of docs/protocols/openai.md: "A combination of options a server refuses
# ... skips the comparison that needed it, never fails it"


def test_a_combination_refused_as_openai_refuses_fails_no_answer_clause() -> None:
    refusal = body(
        chat(stream=True, logprobs=True), {"error": {"message": "logprobs with stream"}}, status=400
    )
    assert judge(Answer.of(refusal), list(CHECKS)) == []


# ERR-2 / FINISH-3 (openai): "a stream that ends without `[DONE]` sent an `error` event first"


@pytest.mark.parametrize(
    "error",
    [
        SseEvent(0.0, "error", json.dumps({"message": "engine died"})),  # a named SSE event
        SseEvent(0.0, "error", "engine died"),  # ... whose data is plain text
        SseEvent(0.0, "", json.dumps({"error": {"message": "engine died", "type": "server_error"}})),
    ],
)
def test_an_error_event_in_any_of_its_forms_may_end_a_stream_without_done(error: SseEvent) -> None:
    request = chat(stream=True)
    answer = Answer.of(sse(request, [*events(chunk(delta(0, "Hi", role="assistant")), done=False), error]))
    assert judge(answer, ["ERR-2", "FINISH-3"]) == []
    assert judge(Answer.of(sse(request, events(chunk(delta(0, "Hi", role="assistant")), done=False))),
                 ["ERR-2"])  # fmt: skip


def test_a_chunk_with_a_null_error_field_is_an_ordinary_chunk() -> None:
    request = chat(stream=True)
    answer = Answer.of(
        stream(request, [{**chunk(delta(0, "Hi", "length", role="assistant")), "error": None}])
    )
    assert answer.view.texts() == {0: "Hi"} and not answer.view.error_events
    assert judge(answer, list(CHECKS)) == []


# STREAM-5 (openai): "no delta carries U+FFFD where the non-streamed text has none"


def test_a_stream_may_carry_u_fffd_where_the_non_streamed_text_has_it() -> None:
    assert difference("ab\ufffd", "ab\ufffd") == "equal"
    request = chat(temperature=0)
    whole = answer_with(request, ["length"], 4)
    raw = json.loads(whole.exchange.text)
    raw["choices"][0]["message"]["content"] = "a\ufffd"
    whole = Answer.of(body(request, raw))
    streamed = Answer.of(
        stream(request.with_body(stream=True), [chunk(delta(0, "a\ufffd", "length", role="assistant"))])
    )
    assert all(judge_pair(Pair(whole, streamed), c) == [] for c in ("STREAM-2", "FINISH-2", "STREAM-5"))


# ERR-3 (openai): "the error's `param` or `message` names the offending field"


@pytest.mark.parametrize(
    "error",
    [
        {"message": "bad value", "param": "temperature"},
        {"message": "bad value", "param": "body.temperature"},
        {"message": "temperature must be >= 0", "param": None},
    ],
)
def test_an_error_may_name_the_field_in_param_or_in_its_message(error: dict[str, Any]) -> None:
    assert names_field(body(chat(), {"error": error}, status=400), "temperature")
    assert not names_field(body(chat(), {"error": {"message": "bad request"}}, status=400), "temperature")


# REQ-1, REQ-5, REQ-6, SAMPLE-5, ERR-1, MALFORMED-1 (openai): "a 4xx with an error object" (any 4xx)


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_any_4xx_with_an_error_object_is_a_refusal(status: int) -> None:
    assert refused(body(chat(), {"error": {"message": "bad"}}, status=status)) is None
    assert refused(body(chat(), {"detail": "bad"}, status=status)) is not None  # no error object
    assert refused(body(chat(), {"error": {"message": "bad"}}, status=500)) is not None


# Cases that judge an answer themselves, run against a fake server: the allowances of their readings


def fake_ctx(answer: Callable[[OpenAIRequest], Exchange], *features: str) -> Any:
    """What a case body reads of its Ctx: the server (``answer``), what it supports, a checker."""
    support = Support({f"{api}{f}": Feature(State.HONOURED) for api in ("chat", "completions")
                       for f in ("", *(f".{name}" for name in features))}, deterministic=True)  # fmt: skip

    async def send(request: OpenAIRequest, **_: Any) -> Exchange:
        return answer(request)

    http = SimpleNamespace(send=send, support=support, target=SimpleNamespace(parallel=2))
    return SimpleNamespace(
        http=http, tuning=SimpleNamespace(max_tokens=4), check=Checker(), note=lambda _: None
    )


def greedy_server(second: float) -> Callable[[OpenAIRequest], Exchange]:
    """Chooses "a" (logprob -0.5) beside an alternative "b" of logprob ``second``, listed first."""

    def answer(request: OpenAIRequest) -> Exchange:
        if request.api == "chat":
            entry = {"token": "a", "logprob": -0.5, "top_logprobs": [{"token": "b", "logprob": second},
                                                                        {"token": "a", "logprob": -0.5}]}  # fmt: skip
            choice = {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "length",
                      "logprobs": {"content": [entry]}}  # fmt: skip
        else:
            logprobs = {"tokens": ["a"], "token_logprobs": [-0.5], "top_logprobs": [{"b": second, "a": -0.5}]}
            choice = {"index": 0, "text": "a", "finish_reason": "length", "logprobs": logprobs}
        return body(request, {"id": "b", "object": "x", "choices": [choice], "usage": USAGE})

    return answer


def test_a_greedy_token_tied_with_the_first_alternative_is_the_argmax() -> None:
    """SAMPLE-1 (openai): "every chosen token is the first of its top_logprobs", ties in any order."""
    tied = fake_ctx(greedy_server(-0.5), "logprobs")
    asyncio.run(greedy_is_argmax(tied))
    assert tied.check.mismatches == []
    beaten = fake_ctx(greedy_server(-0.1), "logprobs")
    asyncio.run(greedy_is_argmax(beaten))
    assert beaten.check.mismatches


def texts_server(streamed: dict[str, str]) -> Callable[[OpenAIRequest], Exchange]:
    """Each prompt's greedy text alone is ``ALONE[prompt]``; streamed, ``streamed[prompt]``."""

    def answer(request: OpenAIRequest) -> Exchange:
        prompt = str(request.body.get("prompt"))
        if not request.stream:
            choice = {"index": 0, "text": ALONE[prompt], "finish_reason": "length"}
            return body(
                request, {"id": prompt, "object": "text_completion", "choices": [choice], "usage": USAGE}
            )
        first = {"id": prompt, "object": "text_completion",
                 "choices": [{"index": 0, "text": streamed[prompt], "finish_reason": "length"}]}  # fmt: skip
        return sse(request, events(first))

    return answer


ALONE = {"1, 2, 3, 4,": " 5, 6, 7, 8", "The capital of France is": " Paris, the city of light"}


@pytest.mark.parametrize(
    ("streamed", "ok"),
    [
        (dict(ALONE), True),
        # batch variance: stream 0 drifts after " 5, 6," but stays closer to its own text than to any other
        ({"1, 2, 3, 4,": " 5, 6, 8, 9", "The capital of France is": ALONE["The capital of France is"]}, True),
        # cross-talk: stream 0 carries the other request's text
        (
            {
                "1, 2, 3, 4,": " Paris, the city",
                "The capital of France is": ALONE["The capital of France is"],
            },
            False,
        ),
    ],
)
def test_a_concurrent_stream_may_differ_from_its_text_alone_if_closer_to_it_than_to_any_other(
    streamed: dict[str, str], ok: bool
) -> None:
    """STREAM-6 (openai): "the one their request gives alone, or at least closer to it than to any other's"."""
    ctx = fake_ctx(texts_server(streamed), "stream")
    asyncio.run(no_cross_talk(ctx))
    assert (ctx.check.mismatches == []) == ok


def n2_server(finishes: list[str], completion: int) -> Callable[[OpenAIRequest], Exchange]:
    def answer(request: OpenAIRequest) -> Exchange:
        n = request.n
        choices = [{"index": i, "message": {"role": "assistant", "content": "x"}, "text": "x",
                    "finish_reason": finishes[i] if n > 1 else finishes[0]} for i in range(n)]  # fmt: skip
        count = completion if n > 1 else N2_MAX_TOKENS
        usage = {"prompt_tokens": 3, "completion_tokens": count, "total_tokens": 3 + count}
        return body(request, {"id": "b", "object": "x", "choices": choices, "usage": usage})

    return answer


def test_n_2_is_judged_only_where_both_choices_ran_to_max_tokens() -> None:
    """N-2 (openai): "two `length` choices of `max_tokens` each report 2 · `max_tokens`": an n = 2
    answer with a choice that ended stop is not judged, whatever its count."""
    stopped = fake_ctx(n2_server(["length", "stop"], N2_MAX_TOKENS + 1), "n")
    asyncio.run(n_charges_every_choice(stopped))
    assert stopped.check.mismatches == []
    charged_once = fake_ctx(n2_server(["length", "length"], N2_MAX_TOKENS), "n")
    asyncio.run(n_charges_every_choice(charged_once))
    assert charged_once.check.mismatches


# ── engine protocols (vllm-engine, sglang-scheduler) and sglang-runtime ─────────────────────────


def applying(protocol: str) -> list[str]:
    """The stream clauses that apply in ``protocol``'s profile."""
    return [c for c in STREAM_CLAUSES if PROFILES[protocol].clause(c).applies]


def judged(
    protocol: str, request: GenerateRequest, messages: list[object], cumulative: bool
) -> list[Mismatch]:
    findings: list[Finding] = []
    normalizer = Normalizer(request, cumulative=cumulative, eos_ids=(EOS,), findings=findings)
    out = run(normalizer, messages)
    return validate(record_of(request, out, findings), facts(request), applying(protocol))


def v_chunk(ids: list[int], index: int = 0, **kw: Any) -> vllm.GenerateStreamChunk:
    return vllm.GenerateStreamChunk(
        token_ids=ids, prompt_tokens=3, completion_tokens=len(ids), index=index, **kw
    )


def v_complete(reason: str, index: int = 0, **kw: Any) -> vllm.GenerateComplete:
    return vllm.GenerateComplete(finish_reason=reason, prompt_tokens=3, index=index, **kw)


# STREAM-3 (engine): "`index` in [0, n) on every chunk and complete (proto3: an absent index reads 0)"


def test_an_engine_message_without_an_index_is_output_0() -> None:
    messages: list[object] = [vllm.GenerateStreamChunk(token_ids=[5], prompt_tokens=3, completion_tokens=1),
                              vllm.GenerateComplete(finish_reason="length", prompt_tokens=3)]  # fmt: skip
    assert judged("vllm-engine", expressed(max_tokens=1), messages, cumulative=False) == []
    beyond: list[object] = [v_chunk([5], index=1), v_complete("length", index=1)]
    assert any(
        "output_index" in m.what for m in judged("vllm-engine", expressed(max_tokens=1), beyond, False)
    )


# FINISH-3 (engine): "the complete of the last unfinished index is the last message": outputs may
# finish in any order


@pytest.mark.parametrize("protocol", ["vllm-engine", "sglang-scheduler"])
def test_engine_outputs_may_finish_in_any_order(protocol: str) -> None:
    cumulative = protocol == "sglang-scheduler"
    native = sglang if cumulative else vllm
    messages: list[object] = [
        native.GenerateStreamChunk(token_ids=[5], prompt_tokens=3, completion_tokens=1, index=0),
        native.GenerateStreamChunk(token_ids=[6], prompt_tokens=3, completion_tokens=1, index=1),
        native.GenerateComplete(finish_reason="length", prompt_tokens=3, completion_tokens=1, index=1),
        native.GenerateComplete(finish_reason="length", prompt_tokens=3, completion_tokens=1, index=0),
    ]
    assert judged(protocol, expressed(2, max_tokens=1), messages, cumulative) == []


# FINISH-5 / STOP-4 (engine): "a matched token id is the output's last token and one of the request's
# stop_token_ids or GetModelInfo.eos_token_ids, a matched string one of the request's stop strings;
# a "stop" with no match must end with an EOS id (vLLM reports no match for EOS)"; "an EOS end
# reports matched_token_id = the EOS id, or no match (vLLM)"


def stop_request() -> GenerateRequest:
    return GenerateRequest(
        request_id="r",
        token_ids=TokenIds(ids=[5, 6, 7]),
        sampling=SamplingParams(n=1),
        stopping=StoppingCriteria(max_tokens=2, stop_token_ids=[9], stop_strings=["x"]),
        response=ResponseOptions(return_text=False),
    )


@pytest.mark.parametrize(
    ("last", "match"),
    [
        (EOS, {}),  # vLLM: no match reported for EOS
        (EOS, {"matched_token_id": EOS}),  # SGLang: the EOS id
        (9, {"matched_token_id": 9}),  # a requested stop token
        (4, {"matched_stop_str": "x"}),  # a requested stop string (the engine's own match)
    ],
)
def test_an_engine_stop_may_report_eos_with_or_without_a_match(last: int, match: dict[str, Any]) -> None:
    messages: list[object] = [v_chunk([4, last]), v_complete("stop", **match)]
    assert judged("vllm-engine", stop_request(), messages, cumulative=False) == []


def test_an_engine_match_on_a_length_finish_still_fails_finish_5() -> None:
    messages: list[object] = [v_chunk([4, EOS]), v_complete("length", matched_token_id=EOS)]
    found = judged("vllm-engine", stop_request(), messages, cumulative=False)
    assert [m.want for m in found] == ["set if and only if reason is STOP"]


# FINISH-2 / USAGE-5 (vllm-engine): "a streaming complete's output_ids (empty, or the last delta as
# vLLM's servicer sends) carry no id no chunk carried, and its completion_tokens is at most what the
# chunks carried"


@pytest.mark.parametrize(
    ("output_ids", "completion_tokens"),
    [([], 0), ([12], 1), ([11, 12], 2), ([10, 11, 12], 3), ([], 3)],
)
def test_a_vllm_streaming_complete_may_repeat_the_last_delta_or_carry_nothing(
    output_ids: list[int], completion_tokens: int
) -> None:
    messages: list[object] = [
        v_chunk([10]),
        v_chunk([11, 12]),
        v_complete("length", output_ids=output_ids, completion_tokens=completion_tokens),
    ]
    assert judged("vllm-engine", expressed(max_tokens=3), messages, cumulative=False) == []


# FINISH-2 / STREAM-2 / USAGE-5 (sglang-scheduler): "chunk ids are new ids while counts are
# cumulative"; "its output_ids (all of them, or the last delta) carry no id no chunk carried"


@pytest.mark.parametrize("output_ids", [[10, 11, 12], [11, 12]])
def test_a_sglang_complete_may_carry_all_ids_or_the_last_delta(output_ids: list[int]) -> None:
    messages: list[object] = [
        sglang.GenerateStreamChunk(token_ids=[10], prompt_tokens=3, completion_tokens=1),
        sglang.GenerateStreamChunk(token_ids=[11, 12], prompt_tokens=3, completion_tokens=3),
        sglang.GenerateComplete(
            output_ids=output_ids, finish_reason="length", prompt_tokens=3, completion_tokens=3
        ),
    ]
    assert judged("sglang-scheduler", expressed(max_tokens=3), messages, cumulative=True) == []


# ERR-2 (engine): "a failure after the first message ends the call with a non-OK status"


@pytest.mark.parametrize("protocol", ["vllm-engine", "sglang-scheduler"])
def test_an_engine_failure_after_the_first_message_is_a_status_not_a_finish(protocol: str) -> None:
    from grpclib.const import Status

    request, findings = expressed(2, max_tokens=4), []
    normalizer = Normalizer(
        request, cumulative=protocol == "sglang-scheduler", eos_ids=(EOS,), findings=findings
    )
    out = run(normalizer, [v_chunk([5])]) + [normalizer.failure("r", Status.INTERNAL, "worker died")]
    assert validate(record_of(request, out, findings), facts(request), applying(protocol)) == []


# STREAM-7 (engine): "the protocols carry no rank (the driver derives it from the token's place in top)"


def logprobs_of(entries: list[tuple[int, float, list[tuple[int, float]]]]) -> vllm.OutputLogProbs:
    return vllm.OutputLogProbs(
        token_logprobs=[v for _, v, _ in entries],
        token_ids=[t for t, _, _ in entries],
        top_logprobs=[vllm.TopLogProbs(values=[v for _, v in top], token_ids=[t for t, _ in top])
                      for _, _, top in entries],
    )  # fmt: skip


def logprob_request(k: int) -> GenerateRequest:
    request = expressed(max_tokens=2)
    request.response = ResponseOptions(return_text=False, return_logprobs=True, top_logprobs=k)
    return request


@pytest.mark.parametrize(
    ("k", "entries"),
    [
        (2, [(10, -0.25, [(10, -0.25), (11, -2.0)]), (12, -3.0, [(13, -0.5), (14, -1.0)])]),  # beyond top
        (2, [(10, -0.5, [(11, -0.5), (10, -0.5)]), (12, -1.0, [(13, -0.5), (12, -1.0)])]),  # a tie, rank 2
        (0, [(10, -0.25, []), (12, -3.0, [])]),  # nothing asked beyond the token's own
    ],
)
def test_an_engine_logprob_rank_is_derived_from_its_place_in_top(
    k: int, entries: list[tuple[int, float, list[tuple[int, float]]]]
) -> None:
    messages: list[object] = [
        v_chunk([10], output_logprobs=logprobs_of(entries[:1])),
        v_chunk([12], output_logprobs=logprobs_of(entries[1:])),
        v_complete("length"),
    ]
    assert judged("vllm-engine", logprob_request(k), messages, cumulative=False) == []


def test_an_engine_top_that_passes_over_a_likelier_sampled_token_still_fails_stream_7() -> None:
    entries = [(10, -0.25, [(13, -0.5), (14, -1.0)])]
    messages: list[object] = [v_chunk([10], output_logprobs=logprobs_of(entries)), v_complete("length")]
    request = logprob_request(2)
    request.stopping = StoppingCriteria(max_tokens=1)
    assert judged("vllm-engine", request, messages, cumulative=False)


# sglang-runtime: STREAM-2 "responses are cumulative unless the server declares
# incremental_streaming_output"; FINISH-2 "the finished response of an output may bring its last ids"


def runtime(ids: list[int], completion: int, reason: dict[str, Any] | None = None) -> rt.GenerateResponse:
    meta = {
        "id": "r",
        "prompt_tokens": 3,
        "completion_tokens": completion,
        "cached_tokens": 0,
        "finish_reason": reason,
    }
    return rt.GenerateResponse(output_ids=ids, meta_info={k: json.dumps(v) for k, v in meta.items()},
                               finished=reason is not None)  # fmt: skip


@pytest.mark.parametrize(
    ("incremental", "responses"),
    [
        # cumulative: every response all ids so far; the finished one brings the last id
        (False, [runtime([10], 1), runtime([10, 11], 2), runtime([10, 11, 12], 3, {"type": "length"})]),
        # declared incremental: only new ids; the finished one brings the last id
        (True, [runtime([10], 1), runtime([11], 2), runtime([12], 3, {"type": "length"})]),
        # the finished response brings no id
        (False, [runtime([10], 1), runtime([10, 11, 12], 3), runtime([10, 11, 12], 3, {"type": "length"})]),
        (True, [runtime([10], 1), runtime([11, 12], 3), runtime([], 3, {"type": "length"})]),
    ],
)
def test_sglang_runtime_responses_may_be_cumulative_or_declared_incremental_and_end_with_ids(
    incremental: bool, responses: list[rt.GenerateResponse]
) -> None:
    request, findings = expressed(max_tokens=3), []
    reader = RuntimeReader(Normalizer(request, True, (EOS,), findings), incremental, "r")
    out = [event for response in responses for event in reader.read(response)]
    assert not findings
    assert validate(record_of(request, out, findings), facts(request), applying("sglang-runtime")) == []


def runtime_logprobs(
    ids: list[int], completion: int, rows: list[int], reason: dict[str, Any] | None = None
) -> rt.GenerateResponse:
    """A response whose meta_info carries the logprobs of the output's ids ``rows`` (ids as given)."""
    response = runtime(ids, completion, reason)
    lists = {
        "output_token_logprobs": [[-0.5, t, None] for t in rows],
        "output_top_logprobs": [[[-0.5, t, None]] for t in rows],
    }
    response.meta_info.update({k: json.dumps(v) for k, v in lists.items()})
    return response


@pytest.mark.parametrize(
    ("incremental", "responses"),
    [
        # cumulative: the logprob lists hold the whole output so far, like its ids
        (False, [runtime_logprobs([10], 1, [10]), runtime_logprobs([10, 11], 2, [10, 11]),
                 runtime_logprobs([10, 11], 2, [10, 11], {"type": "length"})]),
        # declared incremental: SGLang slices the logprob lists with the ids
        # (OutputProcessor.handle_batch_output: logprob_ops.slice_streaming_output_meta_info)
        (True, [runtime_logprobs([10], 1, [10]), runtime_logprobs([11], 2, [11]),
             runtime_logprobs([], 2, [], {"type": "length"})]),
    ],
)  # fmt: skip
def test_sglang_runtime_logprobs_come_as_the_ids_do_cumulative_or_declared_incremental(
    incremental: bool, responses: list[rt.GenerateResponse]
) -> None:
    """STREAM-7 (sglang-runtime): "meta_info output_token_logprobs `[logprob, id, text]` per token,
    output_top_logprobs with the entries asked for"."""
    request = expressed(max_tokens=2)
    request.response = ResponseOptions(return_text=False, return_logprobs=True, top_logprobs=1)
    findings: list[Finding] = []
    reader = RuntimeReader(Normalizer(request, True, (EOS,), findings), incremental, "r")
    out = [event for response in responses for event in reader.read(response)]
    assert validate(record_of(request, out, findings), facts(request), applying("sglang-runtime")) == []
