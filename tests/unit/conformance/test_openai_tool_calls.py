"""The tool-call and structured-output helpers of the OpenAI profile, without a server: assembling a
body's and a stream's calls, the framing and index rules, each call judged against its function's
parameters, and the response_format shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conformance.cases.openai._output import cut_text
from conformance.cases.openai.structured import FORMATS
from conformance.cases.openai.tools import PARAMETERS
from conformance.drivers.openai.exchange import Exchange, OpenAIRequest, SseEvent
from conformance.validators.shapes import shape_problem
from conformance.validators.tool_calls import call_problems, calls_of, framing_problems, index_problems

REQUEST = OpenAIRequest("chat", {"messages": [], "tools": [], "tool_choice": "required", "stream": True})


def stream(*chunks: dict[str, Any]) -> Exchange:
    events = [SseEvent(0.0, "", json.dumps(c)) for c in chunks] + [SseEvent(0.0, "", "[DONE]")]
    headers = {"content-type": "text/event-stream"}
    return Exchange(REQUEST, "POST", "http://x/v1/chat/completions", 200, headers, events=events)


def body(message: dict[str, Any], finish: str = "tool_calls") -> Exchange:
    value = {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    headers = {"content-type": "application/json"}
    return Exchange(REQUEST, "POST", "http://x/v1/chat/completions", 200, headers, json.dumps(value))


def tool_chunk(*deltas: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"tool_calls": list(deltas)}, "finish_reason": finish}]}


def first(index: int, name: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}


def fragment(index: int | None, text: str) -> dict[str, Any]:
    found: dict[str, Any] = {"function": {"arguments": text}}
    if index is not None:
        found["index"] = index
    return found


def openai_stream() -> Exchange:
    """Two parallel calls streamed as OpenAI streams them, then the finish."""
    return stream(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]},
        tool_chunk(first(0, "get_weather")),
        tool_chunk(fragment(0, '{"city": "Pa')),
        tool_chunk(fragment(0, 'ris", "unit": "celsius"}')),
        tool_chunk(first(1, "get_time", "call_2")),
        tool_chunk(fragment(1, '{"city": "Tokyo", "utc": true}')),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )


def test_a_stream_is_assembled_per_index_and_a_correct_one_breaks_no_rule() -> None:
    choice = calls_of(openai_stream())[0]
    assert [(c.index, c.id, c.name, c.arguments) for c in choice.calls] == [
        (0, "call_1", "get_weather", '{"city": "Paris", "unit": "celsius"}'),
        (1, "call_2", "get_time", '{"city": "Tokyo", "utc": true}'),
    ]
    assert choice.finish == "tool_calls" and choice.content == ""
    assert framing_problems(choice) == [] and index_problems(choice) == []
    assert all(call_problems(c, PARAMETERS) == [] for c in choice.calls)


def test_a_body_is_assembled_from_its_message() -> None:
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"city": "Paris", "utc": false}'},
    }
    choice = calls_of(body({"role": "assistant", "content": None, "tool_calls": [call]}))[0]
    assert [(c.name, c.arguments) for c in choice.calls] == [("get_time", '{"city": "Paris", "utc": false}')]
    assert call_problems(choice.calls[0], PARAMETERS, named="get_time") == []
    assert call_problems(choice.calls[0], PARAMETERS, named="get_weather")[0][0] == "function.name"


def test_a_body_whose_tool_calls_are_no_list_is_malformed() -> None:
    assert calls_of(body({"tool_calls": {"id": "c"}}))[0].malformed


@pytest.mark.parametrize(
    ("arguments", "complete", "broken"),
    [
        ('{"city": "Paris", "unit": "celsius"}', True, False),
        ('{"city": "Paris", "unit": "kelvin"}', True, True),  # off the schema
        ('{"city": "Paris"', True, True),  # cut, but the choice ended as if whole
        ('{"city": "Paris"', False, False),  # cut at max_tokens: a prefix will do
        ('{"city": "Paris"}{"city"', False, True),  # no prefix of one document
        ('{"city": "Paris", "unit": "celsius"}{"city": "Paris", "unit": "celsius"}', True, True),
    ],
)
def test_arguments_are_judged_against_the_parameters(arguments: str, complete: bool, broken: bool) -> None:
    choice = calls_of(stream(tool_chunk(first(0, "get_weather")), tool_chunk(fragment(0, arguments))))[0]
    assert bool(call_problems(choice.calls[0], PARAMETERS, complete=complete)) is broken


def test_a_call_without_an_id_type_or_known_name_breaks_each_rule() -> None:
    bad = {"function": {"name": "launch", "arguments": 3}}
    choice = calls_of(body({"tool_calls": [bad]}))[0]
    fields = [what for what, _, _ in call_problems(choice.calls[0], PARAMETERS)]
    assert fields == ["id", "type", "function.name", "function.arguments"]


def test_an_id_and_a_name_sent_again_break_the_framing_and_not_the_call() -> None:
    repeat = {**fragment(0, '"}'), "id": "call_1", "function": {"name": "get_time", "arguments": '"}'}}
    choice = calls_of(
        stream(
            tool_chunk(first(0, "get_time")),
            tool_chunk(fragment(0, '{"city": "Paris", "utc": false')),
            tool_chunk(repeat),
        )
    )[0]
    assert choice.calls[0].name == "get_time"  # read leniently: the first name counts
    (problem,) = framing_problems(choice)
    assert "id in delta 2" in problem[2] and "function.name in delta 2" in problem[2]


def test_a_repeated_type_function_is_harmless() -> None:
    again = {**fragment(0, "}"), "type": "function"}
    choice = calls_of(stream(tool_chunk(first(0, "get_time")), tool_chunk(again)))[0]
    assert framing_problems(choice) == []


def test_an_id_and_a_name_that_come_late_break_the_framing() -> None:
    late = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_time", "arguments": "{}"},
    }
    choice = calls_of(stream(tool_chunk({"index": 0, "function": {"arguments": ""}}), tool_chunk(late)))[0]
    assert choice.calls[0].id == "call_1"
    missing, late_again = framing_problems(choice)
    assert "no id, function.name, type" in missing[2] and "id in delta 1" in late_again[2]


def test_a_delta_without_an_index_joins_the_call_before_it_and_breaks_the_index_rule() -> None:
    choice = calls_of(
        stream(tool_chunk(first(0, "get_time")), tool_chunk(fragment(None, '{"city": "Paris", "utc": true}')))
    )[0]
    assert [c.arguments for c in choice.calls] == ['{"city": "Paris", "utc": true}']
    assert index_problems(choice) == [("tool_call deltas", "an integer index >= 0 on every one", "1 without")]


def test_calls_numbered_from_one_break_the_index_rule() -> None:
    choice = calls_of(stream(tool_chunk(first(1, "get_time")), tool_chunk(fragment(1, "{}"))))[0]
    assert index_problems(choice) == [("tool call indices, in the order the calls start", "[0]", "[1]")]


def test_content_deltas_are_kept_apart_from_the_calls() -> None:
    text = {"choices": [{"index": 0, "delta": {"content": "Calling."}, "finish_reason": None}]}
    choice = calls_of(stream(text, tool_chunk(first(0, "get_time"))))[0]
    assert (choice.content, choice.content_deltas, len(choice.calls)) == ("Calling.", 1, 1)


@pytest.mark.parametrize(
    ("tag", "text", "complete", "ok", "noted"),
    [
        ("json_schema", '{"name": "Ada", "age": 36, "member": true}', True, True, False),
        ("json_schema", '{"name": "Ada", "age": "36", "member": true}', True, False, False),
        ("json_schema", '{"name": "Ada", "ag', False, True, False),
        ("json_schema", "Sure! Ada is 36.", False, False, False),
        ("json_schema-nonstrict", '{"name": "Ada"}', True, True, True),  # JSON; the schema is best effort
        ("json_schema-nonstrict", "Ada, 36", True, False, False),
        ("json_object", '{"a": 1}', True, True, False),
        ("json_object", '[{"a": 1}]', True, True, True),  # valid JSON, as promised; no object: noted
        ("json_object", '[{"a": 1', False, True, True),
        ("json_object", '```json\n{"a": 1}\n```', True, False, False),
        ("json_object", "```json\n{", False, False, False),
    ],
)
def test_each_response_format_accepts_its_shape(
    tag: str, text: str, complete: bool, ok: bool, noted: bool
) -> None:
    fmt = FORMATS[tag]
    assert (shape_problem(fmt.shape, text, complete=complete) is None) is ok
    if ok:
        off = fmt.noted is not None and shape_problem(fmt.noted, text, complete=complete) is not None
        assert off is noted


def test_a_trailing_replacement_character_of_a_cut_is_tolerated() -> None:
    assert cut_text('{"name": "Ad\ufffd', complete=False) == '{"name": "Ad'
    assert cut_text('{"a": 1}\ufffd', complete=True) == '{"a": 1}\ufffd'
    assert (
        shape_problem(FORMATS["json_schema"].shape, cut_text('{"name": \ufffd', False), complete=False)
        is None
    )
    choice = calls_of(stream(tool_chunk(first(0, "get_time")), tool_chunk(fragment(0, '{"city": \ufffd'))))[0]
    assert call_problems(choice.calls[0], PARAMETERS, complete=False) == []
    assert call_problems(choice.calls[0], PARAMETERS, complete=True) != []
