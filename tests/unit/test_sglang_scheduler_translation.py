"""The SGLang dialect's request and response translation, field by field (docs/protocols/sglang-scheduler.md)."""

from __future__ import annotations

import pytest
from grpclib import GRPCError, Status

from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc.v1 import (
    FinishReason,
    GenerateResponse,
    OutputFinished,
    PromptInfo,
    RequestError,
    StopMatch,
    TokenCandidate,
    TokenDelta,
    TokenLogprob,
    Usage,
)
from reference_server.frontend.dialects.sglang_scheduler.requests import to_lmrpc
from reference_server.frontend.dialects.sglang_scheduler.responses import GenerateTranslator


def request(stream: bool = True, **sampling: object) -> sglang.GenerateRequest:
    return sglang.GenerateRequest(
        request_id="r",
        tokenized=sglang.TokenizedInput(input_ids=[1, 2, 3]),
        sampling_params=sglang.SamplingParams(**sampling),  # type: ignore[arg-type]
        stream=stream,
        logprob_start_len=-1,
    )


def test_values_are_taken_as_sent_zero_included() -> None:
    sent = to_lmrpc(request(temperature=0.0, top_p=0.0, min_p=0.0, repetition_penalty=0.0, top_k=-1))
    assert sent.sampling is not None
    assert (sent.sampling.temperature, sent.sampling.top_p, sent.sampling.repetition_penalty) == (
        0.0,
        0.0,
        0.0,
    )
    assert sent.sampling.top_k == 0  # -1 is SGLang's "disabled", lmrpc's is 0
    assert sent.sampling.seed is None  # the protocol has no seed
    assert sent.sampling.n is None and sent.stopping is not None and sent.stopping.min_tokens is None
    assert sent.stopping.max_tokens is None  # optional max_new_tokens: absent stays absent
    no_params = to_lmrpc(
        sglang.GenerateRequest(request_id="d", tokenized=sglang.TokenizedInput(input_ids=[1]))
    )
    assert no_params.sampling is None and no_params.stopping is None  # the server's defaults


def test_stopping_and_response_options() -> None:
    lmrpc = to_lmrpc(
        request(
            stream=False,
            max_new_tokens=9,
            min_new_tokens=2,
            stop=["a", "b"],
            stop_token_ids=[7],
            ignore_eos=True,
            no_stop_trim=True,
            skip_special_tokens=True,
            n=3,
        )
    )
    assert lmrpc.token_ids is not None and lmrpc.token_ids.ids == [1, 2, 3]
    assert lmrpc.stopping is not None and lmrpc.sampling is not None and lmrpc.response is not None
    assert (lmrpc.stopping.max_tokens, lmrpc.stopping.min_tokens) == (9, 2)
    assert lmrpc.stopping.stop_strings == ["a", "b"] and lmrpc.stopping.stop_token_ids == [7]
    assert lmrpc.stopping.ignore_eos and lmrpc.stopping.include_stop_in_output
    assert lmrpc.sampling.n == 3
    assert lmrpc.response.final_only and lmrpc.response.return_text is False
    assert lmrpc.response.skip_special_tokens is True


def test_logprobs_need_return_logprob() -> None:
    with_logprobs = request()
    with_logprobs.return_logprob, with_logprobs.top_logprobs_num = True, 3
    response = to_lmrpc(with_logprobs).response
    assert response is not None and response.return_logprobs and response.top_logprobs == 3
    without = request()
    without.top_logprobs_num = 3  # read only with return_logprob, as SGLang does
    response = to_lmrpc(without).response
    assert response is not None and not response.return_logprobs and response.top_logprobs == 0


@pytest.mark.parametrize(
    ("changes", "status", "field"),
    [
        ({"tokenized": None}, Status.INVALID_ARGUMENT, "tokenized"),
        ({"data_parallel_rank": 2}, Status.INVALID_ARGUMENT, "data_parallel_rank=2"),
        ({"lora_id": "x"}, Status.UNIMPLEMENTED, "lora_id"),
        ({"custom_logit_processor": "x"}, Status.UNIMPLEMENTED, "custom_logit_processor"),
    ],
)
def test_refusals_name_the_field(changes: dict[str, object], status: Status, field: str) -> None:
    message = request()
    for name, value in changes.items():
        setattr(message, name, value)
    with pytest.raises(GRPCError) as refused:
        to_lmrpc(message)
    assert refused.value.status is status and field in (refused.value.message or "")


def events() -> list[GenerateResponse]:
    def lp(token: int) -> TokenLogprob:
        return TokenLogprob(
            token_id=token, logprob=-0.5, rank=1, top=[TokenCandidate(token_id=token, logprob=-0.5)]
        )

    return [
        GenerateResponse(request_id="r", prompt_info=PromptInfo(prompt_tokens=3, num_outputs=1)),
        GenerateResponse(
            request_id="r", delta=TokenDelta(output_index=0, token_ids=[4, 5], logprobs=[lp(4), lp(5)])
        ),
        GenerateResponse(request_id="r", delta=TokenDelta(output_index=0, token_ids=[6], logprobs=[lp(6)])),
        GenerateResponse(
            request_id="r",
            finished=OutputFinished(
                output_index=0, reason=FinishReason.STOP, stop=StopMatch(eos_token_id=6), completion_tokens=3
            ),
            usage=Usage(prompt_tokens=3, completion_tokens=3, cached_prompt_tokens=2),
        ),
    ]


def test_streaming_chunks_are_deltas_with_cumulative_counts() -> None:
    translator = GenerateTranslator(stream=True)
    out = [r for event in events() for r in translator.translate(event)]
    assert [r.request_id for r in out] == ["r", "r", "r"]
    first, second, complete = out[0].chunk, out[1].chunk, out[2].complete
    assert first is not None and second is not None and complete is not None
    assert (first.token_ids, first.completion_tokens, first.prompt_tokens) == ([4, 5], 2, 3)
    assert (second.token_ids, second.completion_tokens) == ([6], 3)
    assert second.output_logprobs is not None and second.output_logprobs.token_ids == [6]  # incremental
    assert complete.output_ids == [4, 5, 6] and complete.completion_tokens == 3  # all of them
    assert complete.finish_reason == "stop" and complete.matched_token_id == 6
    assert complete.cached_tokens == 2 and complete.output_logprobs is not None
    assert complete.output_logprobs.token_ids == [4, 5, 6]  # cumulative


def test_non_streaming_sends_one_complete() -> None:
    translator = GenerateTranslator(stream=False)
    out = [r for event in events() for r in translator.translate(event)]
    assert len(out) == 1 and out[0].complete is not None and out[0].complete.output_ids == [4, 5, 6]


def test_a_failure_after_acceptance_is_the_calls_status() -> None:
    translator = GenerateTranslator(stream=True)
    translator.translate(events()[0])
    with pytest.raises(GRPCError) as failed:
        translator.translate(
            GenerateResponse(
                request_id="r", error=RequestError(code=Status.UNAVAILABLE.value, message="gone")
            )
        )
    assert failed.value.status is Status.UNAVAILABLE and failed.value.message == "gone"
