"""The SGLang runtime dialect's request and response translation (docs/protocols/sglang-runtime.md)."""

from __future__ import annotations

import json

import pytest
from grpclib import GRPCError, Status

from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import (
    Choices,
    Constraint,
    FinishReason,
    GenerateResponse,
    OutputFinished,
    PromptInfo,
    StopMatch,
    TokenDelta,
    Usage,
)
from reference_server.frontend.dialects.sglang_runtime.meta import finish_reason
from reference_server.frontend.dialects.sglang_runtime.openai_body import Body, requested_model
from reference_server.frontend.dialects.sglang_runtime.requests import (
    NATIVE_FIELD_NAMES,
    generate_options,
    rename_fields,
    text_generate_options,
)
from reference_server.frontend.dialects.sglang_runtime.responses import TextTranslator, TokenTranslator


def test_sampling_values_are_taken_as_sent_and_absent_ones_get_sglangs_defaults() -> None:
    sent = text_generate_options(
        rt.TextGenerateRequest(text="x", sampling_params=rt.SamplingParams(temperature=0.0, top_k=-1, n=2))
    ).request
    assert sent.sampling is not None and sent.stopping is not None and sent.response is not None
    assert (sent.sampling.temperature, sent.sampling.top_k, sent.sampling.n) == (0.0, 0, 2)
    assert sent.sampling.top_p is None and sent.stopping.max_tokens == 128  # SGLang's default
    assert sent.response.final_only and sent.text == "x"
    streamed = generate_options(rt.GenerateRequest(input_ids=[3, 4], stream=True, rid="r-1"), vocab_size=10)
    assert streamed.stream and not streamed.request.response.final_only  # type: ignore[union-attr]
    assert streamed.request.request_id == "r-1" and list(streamed.request.token_ids.ids) == [3, 4]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        (
            rt.SamplingParams(guided_decoding=rt.GuidedDecoding(structural_tag="{}")),
            Status.UNIMPLEMENTED,
            "sampling_params.guided_decoding.structural_tag",
        ),
        (rt.SamplingParams(top_k=-2), Status.INVALID_ARGUMENT, "sampling_params.top_k=-2"),
        (rt.SamplingParams(min_new_tokens=-1), Status.INVALID_ARGUMENT, "sampling_params.min_new_tokens=-1"),
        (
            rt.SamplingParams(stop_token_ids=[-4]),
            Status.INVALID_ARGUMENT,
            "sampling_params.stop_token_ids[0]=-4",
        ),
    ],
)
def test_refusals_name_the_field(params: rt.SamplingParams, status: Status, field: str) -> None:
    with pytest.raises(GRPCError) as refused:
        generate_options(rt.GenerateRequest(input_ids=[1], sampling_params=params), vocab_size=10)
    assert refused.value.status is status and field in (refused.value.message or "")


def test_ids_outside_the_vocabulary_are_refused_naming_input_ids() -> None:
    with pytest.raises(GRPCError) as refused:
        generate_options(rt.GenerateRequest(input_ids=[1, 10]), vocab_size=10)
    assert "input_ids[1]=10" in (refused.value.message or "")


def test_lmrpc_field_names_are_renamed_to_the_protocols() -> None:
    message = "stopping.max_tokens=5000 plus the 3-token prompt exceeds max_context_tokens=4096"
    assert rename_fields(message, NATIVE_FIELD_NAMES).startswith("sampling_params.max_new_tokens=5000")
    assert rename_fields("sampling.top_p=0.0 must be in (0.0, 1.0]", NATIVE_FIELD_NAMES).startswith(
        "sampling_params.top_p"
    )


def finished(
    reason: FinishReason, tokens: int, stop: StopMatch | None = None, index: int = 0
) -> OutputFinished:
    return OutputFinished(output_index=index, reason=reason, stop=stop, completion_tokens=tokens)


def test_finish_reasons_are_sglangs_objects() -> None:
    assert finish_reason(finished(FinishReason.STOP, 2, StopMatch(eos_token_id=2))) == {
        "type": "stop",
        "matched": 2,
    }
    assert finish_reason(finished(FinishReason.STOP, 2, StopMatch(stop_string="\n"))) == {
        "type": "stop",
        "matched": "\n",
    }
    assert finish_reason(finished(FinishReason.LENGTH, 7)) == {"type": "length", "length": 7}
    assert finish_reason(finished(FinishReason.ABORTED, 0))["type"] == "abort"


def events(*deltas: tuple[int, list[int], str]) -> list[GenerateResponse]:
    prompt = GenerateResponse(request_id="r", prompt_info=PromptInfo(prompt_tokens=4, num_outputs=1))
    return [prompt] + [
        GenerateResponse(request_id="r", delta=TokenDelta(output_index=i, token_ids=ids, text=text))
        for i, ids, text in deltas
    ]


def test_streamed_responses_are_cumulative_and_end_once_with_finished() -> None:
    translator = TextTranslator(stream=True)
    stream = events((0, [5], "He"), (0, [6], "llo"))
    stream.append(
        GenerateResponse(
            request_id="r",
            finished=finished(FinishReason.LENGTH, 2),
            usage=Usage(prompt_tokens=4, completion_tokens=2, cached_prompt_tokens=3),
        )
    )
    responses = [r for event in stream for r in translator.translate(event)]
    assert [(r.text, r.finished) for r in responses] == [("He", False), ("Hello", False), ("Hello", True)]
    infos = [{k: json.loads(v) for k, v in r.meta_info.items()} for r in responses]
    assert [i["completion_tokens"] for i in infos] == [1, 2, 2]
    assert infos[0]["id"] == "r" and infos[0]["finish_reason"] is None and infos[0]["prompt_tokens"] == 4
    assert infos[-1]["finish_reason"] == {"type": "length", "length": 2} and infos[-1]["cached_tokens"] == 3
    assert responses[0].meta_info["id"] == '"r"'  # every value is JSON text, strings quoted


def test_final_only_output_is_one_response_with_every_id() -> None:
    translator = TokenTranslator(stream=False)
    stream = events((0, [5, 6, 7], ""))
    stream.append(
        GenerateResponse(request_id="r", finished=finished(FinishReason.STOP, 3, StopMatch(stop_token_id=7)))
    )
    (response,) = [r for event in stream for r in translator.translate(event)]
    assert list(response.output_ids) == [5, 6, 7] and response.finished
    assert json.loads(response.meta_info["finish_reason"]) == {"type": "stop", "matched": 7}


@pytest.mark.parametrize(
    ("model", "answered"),
    [(None, "default"), ("default", "default"), ("gpt-4o", "gpt-4o"), ("served:name", "served:name")],
)
def test_any_model_is_served_and_named_back_as_sglang_does(model: str | None, answered: str) -> None:
    """SGLang 0.5.23 reads ``model`` only for a LoRA suffix; the served name may itself have a colon."""
    body = Body({} if model is None else {"model": model}, ("model",))
    assert requested_model(body, "served:name") == answered


@pytest.mark.parametrize("model", ["base:adapter", "served:name:adapter"])
def test_a_lora_suffix_is_unimplemented_naming_the_model(model: str) -> None:
    with pytest.raises(GRPCError) as refused:
        requested_model(Body({"model": model}, ("model",)), "served:name")
    assert refused.value.status is Status.UNIMPLEMENTED and f"model={model!r}" in (
        refused.value.message or ""
    )


def test_seed_is_lmrpcs_seed_and_guided_decoding_is_checked_before_anything_else() -> None:
    seeded = generate_options(
        rt.GenerateRequest(input_ids=[1], sampling_params=rt.SamplingParams(seed=-1)), vocab_size=10
    )
    assert seeded.request.sampling is not None and seeded.request.sampling.seed == (1 << 64) - 1
    empty = rt.SamplingParams(guided_decoding=rt.GuidedDecoding(ebnf=""))
    with pytest.raises(GRPCError) as invalid:
        text_generate_options(rt.TextGenerateRequest(text="x", sampling_params=empty, lora_path="a"))
    assert invalid.value.message == "guided decoding constraint must not be empty"  # before lora_path


@pytest.mark.parametrize(
    ("params", "constraint"),
    [
        (
            rt.SamplingParams(guided_decoding=rt.GuidedDecoding(ebnf='root ::= "a"')),
            Constraint(ebnf='root ::= "a"'),
        ),
        (rt.SamplingParams(guided_decoding=rt.GuidedDecoding(regex="a+")), Constraint(regex="a+")),
        (
            rt.SamplingParams(guided_decoding=rt.GuidedDecoding(json_schema="{}")),
            Constraint(json_schema="{}"),
        ),
        (
            rt.SamplingParams(
                guided_decoding=rt.GuidedDecoding(choice=rt.ChoiceConstraint(values=["y", "n"]))
            ),
            Constraint(choice=Choices(["y", "n"])),
        ),
        (rt.SamplingParams(json_schema='{"type": "object"}'), Constraint(json_schema='{"type": "object"}')),
        (rt.SamplingParams(regex="b+"), Constraint(regex="b+")),
        (rt.SamplingParams(), None),
    ],
)
def test_constraints_become_lmrpcs_constraint(
    params: rt.SamplingParams, constraint: Constraint | None
) -> None:
    options = text_generate_options(rt.TextGenerateRequest(text="x", sampling_params=params))
    assert options.request.constraint == constraint


def test_return_text_gives_generate_responses_the_text() -> None:
    options = generate_options(rt.GenerateRequest(input_ids=[1], return_text=True), vocab_size=10)
    assert options.return_text
    assert not generate_options(rt.GenerateRequest(input_ids=[1]), vocab_size=10).return_text
