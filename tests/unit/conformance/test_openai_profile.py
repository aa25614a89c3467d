"""The OpenAI profile's parts that need no server: the base URL, the answer view, the answer checks
(each fails on the answer of a broken server), the stream-vs-body comparison, what the support
probes conclude, the repro scripts and the implementations matrix."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from conformance.cases import all_cases
from conformance.cases.openai.compare import difference
from conformance.drivers.openai.client import OpenAIEndpoint
from conformance.drivers.openai.exchange import End, Exchange, OpenAIRequest, SseEvent
from conformance.drivers.openai.runtime_transport import RuntimeOpenAIClient, client_for
from conformance.drivers.openai.support import State, learn
from conformance.drivers.openai.view import view_of
from conformance.harness.connect import protocol_of
from conformance.report.http_repro import http_script
from conformance.report.implementations import Naming, load_reports, matrix, report_of
from conformance.report.model import RunReport
from conformance.spec.profiles import PROFILES
from conformance.spec.protocols import is_url
from conformance.spec.registry import select
from conformance.validators.openai import CHECKS, Answer, judge
from conformance.vocabulary import CaseResult, Mismatch, Verdict

CHAT = "chat.completion.chunk"


def stream(request: OpenAIRequest, chunks: list[Any], *, done: bool = True) -> Exchange:
    events = [SseEvent(0.0, "", json.dumps(c)) for c in chunks] + (
        [SseEvent(0.0, "", "[DONE]")] if done else []
    )
    return Exchange(
        request,
        "POST",
        "http://x/v1/chat/completions",
        200,
        {"content-type": "text/event-stream"},
        events=events,
    )


def body(request: OpenAIRequest, value: Any, status: int = 200) -> Exchange:
    return Exchange(
        request,
        "POST",
        "http://x/v1/chat/completions",
        status,
        {"content-type": "application/json"},
        json.dumps(value),
    )


def delta(
    index: int, content: str | None = None, finish: str | None = None, role: str | None = None
) -> dict[str, Any]:
    piece: dict[str, Any] = {}
    if role:
        piece["role"] = role
    if content is not None:
        piece["content"] = content
    return {"index": index, "delta": piece, "finish_reason": finish}


def chunk(*choices: dict[str, Any], usage: Any = None) -> dict[str, Any]:
    return {"id": "c1", "object": CHAT, "choices": list(choices), "usage": usage}


USAGE = {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}
STREAMED = OpenAIRequest(
    "chat",
    {"messages": [], "max_tokens": 4, "n": 2, "stream": True, "stream_options": {"include_usage": True}},
)


def good_stream() -> list[Any]:
    return [
        chunk(delta(0, "", role="assistant"), delta(1, "", role="assistant")),
        chunk(delta(0, "Hello"), delta(1, "Hi")),
        chunk(delta(0, " there", "length"), delta(1, " you", "length")),
        {"id": "c1", "object": CHAT, "choices": [], "usage": USAGE},
    ]


@pytest.mark.parametrize(
    ("target", "base", "root"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
        ("https://h.example/openai/v1", "https://h.example/openai/v1", "https://h.example"),
        (
            "sglang-runtime://127.0.0.1:50052",
            "sglang-runtime://127.0.0.1:50052/v1",
            "sglang-runtime://127.0.0.1:50052",
        ),
    ],
)
def test_the_base_url_and_the_server_root(target: str, base: str, root: str) -> None:
    endpoint = OpenAIEndpoint.parse(target)
    assert (endpoint.base_url, endpoint.root_url) == (base, root)


@pytest.mark.parametrize("target", ["127.0.0.1:8080", "ftp://h/v1", "http://h:99999", "http://h/v1?x=1"])
def test_a_target_that_is_not_a_url_is_refused(target: str) -> None:
    with pytest.raises(ValueError, match="target="):
        OpenAIEndpoint.parse(target)


def test_an_sglang_runtime_target_gets_the_grpc_pass_through_client() -> None:
    assert (
        is_url("sglang-runtime://127.0.0.1:50052") and protocol_of("sglang-runtime://h:1", "auto") == "openai"
    )
    assert isinstance(client_for(OpenAIEndpoint.parse("sglang-runtime://h:1")), RuntimeOpenAIClient)
    assert not isinstance(client_for(OpenAIEndpoint.parse("http://h:1")), RuntimeOpenAIClient)


def test_a_correct_stream_passes_every_answer_check() -> None:
    answer = Answer.of(stream(STREAMED, good_stream()))
    assert answer.view.texts() == {0: "Hello there", 1: "Hi you"}
    assert judge(answer, list(CHECKS)) == []


BROKEN: list[tuple[str, Any]] = [
    ("USAGE-1", lambda c: [*c[:2], c[3], c[2]]),  # the usage chunk before the last choice chunk
    ("USAGE-1", lambda c: [*c[:3], {**c[3], "choices": [delta(0, "")]}]),  # usage beside a choice
    ("USAGE-1", lambda c: [*c, c[3]]),  # usage twice
    ("USAGE-3", lambda c: [*c[:3], {**c[3], "usage": {**USAGE, "completion_tokens": 4, "total_tokens": 9}}]),
    ("FINISH-1", lambda c: [*c[:3], chunk(delta(0, None, "length")), c[3]]),  # a second finish
    ("FINISH-1", lambda c: [*c[:3], chunk(delta(1, "late")), c[3]]),  # content after the finish
    ("STREAM-1", lambda c: c[1:]),  # no role
    (
        "N-1",
        lambda c: [chunk(delta(0, "", role="assistant")), chunk(delta(0, "Hello", "length")), c[3]],
    ),  # no choice 1
    (
        "FINISH-1",
        lambda c: [c[0], c[1], chunk(delta(0, " there", "length")), c[3]],
    ),  # choice 1 never finishes
    ("REQ-2", lambda c: [c[0], {**c[1], "id": "other"}, *c[2:]]),
]


@pytest.mark.parametrize(("clause", "breaking"), BROKEN)
def test_each_broken_stream_fails_its_clause(clause: str, breaking: Any) -> None:
    assert judge(Answer.of(stream(STREAMED, breaking(good_stream()))), [clause])


def test_a_stream_without_done_fails_finish_3_and_err_2_unless_an_error_event_came() -> None:
    cut = Answer.of(stream(STREAMED, good_stream(), done=False))
    assert judge(cut, ["FINISH-3"]) and judge(cut, ["ERR-2"])
    errored = Answer.of(stream(STREAMED, [*good_stream(), {"error": {"message": "engine died"}}], done=False))
    assert not judge(errored, ["FINISH-3"]) and not judge(errored, ["ERR-2"])


def test_stop_strings_and_logprobs_in_a_body() -> None:
    request = OpenAIRequest(
        "chat", {"messages": [], "max_tokens": 3, "stop": ["ab"], "logprobs": True, "top_logprobs": 2}
    )
    entries = [
        {
            "token": t,
            "logprob": -0.5,
            "top_logprobs": [{"token": t, "logprob": -0.5}, {"token": "z", "logprob": -0.9}],
        }
        for t in ("x", "y", "z")
    ]
    good = {
        "id": "b", "object": "chat.completion", "usage": {**USAGE, "completion_tokens": 3, "total_tokens": 8},
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "xyz"}, "finish_reason": "length", "logprobs": {"content": entries}}],
    }  # fmt: skip
    assert judge(Answer.of(body(request, good)), ["STOP-1", "STREAM-7", "FINISH-6"]) == []
    leaked = json.loads(json.dumps(good))
    leaked["choices"][0]["message"]["content"] = "xyab"
    assert judge(Answer.of(body(request, leaked)), ["STOP-1"])
    unsorted = json.loads(json.dumps(good))
    unsorted["choices"][0]["logprobs"]["content"][1]["top_logprobs"].reverse()
    assert judge(Answer.of(body(request, unsorted)), ["STREAM-7"])
    short = json.loads(json.dumps(good))
    short["choices"][0]["logprobs"]["content"].pop()
    assert judge(Answer.of(body(request, short)), ["STREAM-7"])  # a choice of max_tokens with 2 entries


@pytest.mark.parametrize(
    ("streamed", "whole", "kind"),
    [
        ("ab", "ab", "equal"),
        ("a", "ab", "lost-tail"),
        ("a\ufffd", "aé", "split-character"),
        ("aab", "ab", "differs"),
    ],
)
def test_stream_and_body_differences_are_told_apart(streamed: str, whole: str, kind: str) -> None:
    assert difference(streamed, whole) == kind


def test_support_is_learned_honoured_refused_or_ignored() -> None:
    async def send(request: OpenAIRequest) -> Exchange:
        n = request.body.get("n", 1)
        if request.api == "completions" and request.body.get("echo"):
            return body(request, {"error": {"message": "echo is not supported"}}, status=400)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": "x"},
                "text": "x",
                "finish_reason": "length",
            }
            for i in range(1)
        ]
        del n  # this server ignores n: one choice, always
        return body(request, {"id": "a", "object": "chat.completion", "choices": choices, "usage": USAGE})

    found = asyncio.run(learn(send, token_prompt=None))
    assert found.feature("chat", "n").state is State.IGNORED
    assert found.feature("completions", "echo").state is State.REFUSED
    assert found.feature("chat", "logprobs").state is State.IGNORED
    assert found.deterministic


def test_a_repro_script_is_standalone_python_naming_the_calls() -> None:
    from conformance.drivers.openai.calls import HttpCall

    calls = [
        HttpCall(
            0.0, "POST", "http://h:1/v1/chat/completions", {"messages": [], "temperature": float("nan")}
        ),
        HttpCall(0.5, "POST", "http://h:1/tokenize", {"content": "x"}, disconnect_after=3),
    ]
    script = http_script("N-2[openai]", "http://h:1/v1", "http://h:1", calls, [Mismatch("usage", "16", "8")])
    compile(script, "repro.py", "exec")
    assert "BASE + '/chat/completions'" in script and "ROOT + '/tokenize'" in script
    assert "- usage: want 16, got 8" in script


def test_the_openai_profile_reads_every_clause_and_selects_only_its_cases() -> None:
    assert PROFILES["openai"].protocol == "openai" and PROFILES["openai"].shows_reading
    chosen = select(all_cases(), level="all", protocol="openai")
    assert chosen and all(c.protocols == ("openai",) and "[openai" in c.id for c in chosen)
    assert not [c for c in select(all_cases(), level="all", protocol="lmrpc") if "openai" in c.protocols]
    assert all(PROFILES["openai"].case(c).applies for c in chosen), [
        c.id for c in chosen if not PROFILES["openai"].case(c).applies
    ]


def test_the_implementations_matrix_shows_each_report_per_clause() -> None:
    def run(name: str, verdict: Verdict) -> dict[str, Any]:
        report = RunReport(
            "http://x/v1", [CaseResult("N-2[openai]", "N-2", "MUST", verdict, reason="usage of one choice")]
        )
        report.protocol, report.server = "openai", {"name": name, "version": "1"}
        made = report_of(report, Naming(), None, {})
        made["_file"] = f"{name}.json"
        return made

    text = matrix([run("good", Verdict.PASS), run("bad", Verdict.FAIL), run("known", Verdict.XFAIL)])
    row = next(line for line in text.splitlines() if line.startswith("| N-2 |"))
    assert row.split("|")[3:6] == [" ✅ ", " ❌ ", " ⚠️ "]
    assert "usage of one choice" in text


def test_an_exchange_summary_names_status_type_and_end() -> None:
    exchange = Exchange(None, "GET", "http://x", 503, {"content-type": "application/json"}, "{}", end=End.OK)
    assert exchange.summary() == "HTTP 503, application/json, 2 bytes, ended ok"
    assert view_of(exchange).choices == {}


def test_the_implementations_document_is_rendered_from_the_committed_reports() -> None:
    root = Path(__file__).resolve().parents[3]
    reports = load_reports(str(root / "docs" / "reports"))
    assert len(reports) >= 4, "docs/reports holds too few implementation reports"
    document = (root / "docs" / "implementations.md").read_text(encoding="utf-8")
    assert matrix(reports) == document, "run: conformance report docs/reports --out docs/implementations.md"


def test_a_supported_request_answered_with_a_5xx_fails_err_1_and_a_clean_refusal_does_not() -> None:
    request = OpenAIRequest("chat", {"messages": [], "max_tokens": 2})
    crashed = body(request, {"detail": "Internal Server Error"}, status=500)
    refused_cleanly = body(request, {"error": {"message": "n is not supported"}}, status=400)
    assert judge(Answer.of(crashed), ["ERR-1"])
    assert not judge(Answer.of(refused_cleanly), ["ERR-1"])
