"""The vLLM dialect's request and response translation, field by field (docs/protocols/vllm-engine.md)."""

from __future__ import annotations

import pytest
from grpclib import GRPCError, Status

from lmrpc._gen.vllm.grpc import engine as vllm
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
from reference_server.frontend.dialects.vllm_engine.requests import to_lmrpc
from reference_server.frontend.dialects.vllm_engine.responses import GenerateTranslator


def request(stream: bool = True, **sampling: object) -> vllm.GenerateRequest:
    return vllm.GenerateRequest(
        request_id="r",
        tokenized=vllm.TokenizedInput(original_text="", input_ids=[1, 2, 3]),
        sampling_params=vllm.SamplingParams(**sampling),  # type: ignore[arg-type]
        stream=stream,
    )


def test_presence_is_kept_where_the_dialect_has_it() -> None:
    greedy = to_lmrpc(request(temperature=0.0, max_tokens=7, seed=0))
    assert greedy.sampling is not None and greedy.stopping is not None
    assert greedy.sampling.temperature == 0.0 and greedy.sampling.seed == 0  # present zeros stay zeros
    assert greedy.stopping.max_tokens == 7
    unset = to_lmrpc(request())
    assert unset.sampling is not None and unset.stopping is not None
    assert unset.sampling.temperature is None and unset.sampling.seed is None  # absent stays absent
    assert unset.stopping.max_tokens is None


def test_proto3_zeros_are_unset_where_the_dialect_has_no_presence() -> None:
    sampling = to_lmrpc(request()).sampling
    assert sampling is not None
    assert (sampling.top_p, sampling.top_k, sampling.min_p, sampling.n) == (None, None, None, None)
    assert (sampling.frequency_penalty, sampling.presence_penalty, sampling.repetition_penalty) == (
        None,
        None,
        None,
    )
    full = to_lmrpc(
        request(
            top_p=0.5,
            top_k=40,
            min_p=0.1,
            frequency_penalty=0.5,
            presence_penalty=-0.5,
            repetition_penalty=1.2,
            n=3,
        )
    ).sampling
    assert full is not None
    assert (full.top_p, full.top_k, full.n) == (0.5, 40, 3)
    assert full.repetition_penalty == pytest.approx(1.2) and full.presence_penalty == -0.5


def test_a_negative_seed_stays_distinct() -> None:
    sampling = to_lmrpc(request(seed=-1)).sampling
    assert sampling is not None and sampling.seed == 2**64 - 1


def test_stops_response_options_and_input() -> None:
    lmrpc = to_lmrpc(
        request(
            stream=False,
            stop=["END"],
            stop_token_ids=[9],
            min_tokens=2,
            ignore_eos=True,
            include_stop_str_in_output=True,
            skip_special_tokens=True,
            logprobs=3,
        )
    )
    assert lmrpc.token_ids is not None and lmrpc.token_ids.ids == [1, 2, 3] and lmrpc.request_id == "r"
    stopping, response = lmrpc.stopping, lmrpc.response
    assert stopping is not None and response is not None
    assert (stopping.stop_strings, stopping.stop_token_ids, stopping.min_tokens) == (["END"], [9], 2)
    assert stopping.ignore_eos and stopping.include_stop_in_output
    assert response.final_only and not response.return_text and response.return_token_ids
    assert response.return_logprobs and response.top_logprobs == 3 and response.skip_special_tokens
    text = to_lmrpc(vllm.GenerateRequest(text="hello"))
    assert text.text == "hello" and text.response is not None and text.response.return_logprobs is False


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (request(logit_bias={1: 2.0}), "sampling_params.logit_bias"),
        (request(prompt_logprobs=0), "sampling_params.prompt_logprobs"),
        (request(truncate_prompt_tokens=-1), "sampling_params.truncate_prompt_tokens"),
        (vllm.GenerateRequest(text="x", kv_transfer_params=vllm.KvTransferParams()), "kv_transfer_params"),
        (vllm.GenerateRequest(text="x", media_refs=vllm.MediaRefs()), "multimodal"),
        (vllm.GenerateRequest(text="x", extra_mm_inputs=[vllm.MultimodalInputs()]), "multimodal"),
    ],
)
def test_unsupported_fields_are_unimplemented(message: vllm.GenerateRequest, field: str) -> None:
    with pytest.raises(GRPCError) as refused:
        to_lmrpc(message)
    assert refused.value.status is Status.UNIMPLEMENTED and field in str(refused.value.message)


def test_structured_outputs_become_the_constraint() -> None:
    grammar = to_lmrpc(request(grammar='root ::= "x"')).constraint
    assert grammar is not None and grammar.ebnf == 'root ::= "x"'
    choice = to_lmrpc(request(choice=vllm.ChoiceConstraint(choices=["a", "b"]))).constraint
    assert choice is not None and choice.choice is not None and choice.choice.choices == ["a", "b"]
    assert to_lmrpc(request()).constraint is None


def test_data_parallel_rank_zero_is_this_server() -> None:
    to_lmrpc(vllm.GenerateRequest(text="x", data_parallel_rank=0))
    with pytest.raises(GRPCError) as refused:
        to_lmrpc(vllm.GenerateRequest(text="x", data_parallel_rank=1))
    assert refused.value.status is Status.INVALID_ARGUMENT


def events() -> list[GenerateResponse]:
    logprob = TokenLogprob(token_id=11, logprob=-0.5, rank=1, top=[TokenCandidate(token_id=11, logprob=-0.5)])
    return [
        GenerateResponse(request_id="r", prompt_info=PromptInfo(prompt_tokens=3, seed=1, num_outputs=2)),
        GenerateResponse(
            request_id="r", delta=TokenDelta(output_index=0, token_ids=[11], logprobs=[logprob])
        ),
        GenerateResponse(request_id="r", delta=TokenDelta(output_index=1, token_ids=[21, 22])),
        GenerateResponse(
            request_id="r",
            finished=OutputFinished(
                output_index=1,
                reason=FinishReason.STOP,
                stop=StopMatch(stop_string="##"),
                completion_tokens=2,
            ),
        ),
        GenerateResponse(request_id="r", delta=TokenDelta(output_index=0, token_ids=[12])),
        GenerateResponse(
            request_id="r",
            finished=OutputFinished(
                output_index=0, reason=FinishReason.STOP, stop=StopMatch(eos_token_id=2), completion_tokens=2
            ),
            usage=Usage(prompt_tokens=3, completion_tokens=4, cached_prompt_tokens=2),
        ),
    ]


def test_streaming_deltas_become_chunks_and_finishes_completes() -> None:
    translator = GenerateTranslator(stream=True)
    out = [r for event in events() for r in translator.translate(event)]
    kinds = [(("chunk", r.chunk.index) if r.chunk else ("complete", r.complete.index)) for r in out]  # type: ignore[union-attr]
    assert kinds == [("chunk", 0), ("chunk", 1), ("complete", 1), ("chunk", 0), ("complete", 0)]
    first = out[0].chunk
    assert (
        first is not None
        and first.token_ids == [11]
        and first.completion_tokens == 1
        and first.prompt_tokens == 3
    )
    assert first.output_logprobs is not None and first.output_logprobs.token_logprobs == [-0.5]
    assert out[1].chunk is not None and out[1].chunk.completion_tokens == 2  # per chunk, not cumulative
    by_string, by_eos = out[2].complete, out[4].complete
    assert by_string is not None and by_eos is not None
    assert (by_string.finish_reason, by_string.matched_stop_str, by_string.output_ids) == ("stop", "##", [])
    assert (by_eos.matched_token_id, by_eos.completion_tokens, by_eos.cached_tokens) == (2, 2, 2)


def test_final_only_completes_carry_the_whole_output() -> None:
    translator = GenerateTranslator(stream=False)
    out = [r for event in events() for r in translator.translate(event)]
    completes = [r.complete for r in out]
    assert all(c is not None for c in completes) and len(completes) == 2
    assert completes[0] is not None and completes[1] is not None
    assert (completes[0].index, completes[0].output_ids) == (1, [21, 22])
    assert (completes[1].index, completes[1].output_ids) == (0, [11, 12])
    assert completes[1].output_logprobs is not None and completes[1].output_logprobs.token_ids == [11]


@pytest.mark.parametrize(
    ("reason", "name"), [(FinishReason.LENGTH, "length"), (FinishReason.ABORTED, "abort")]
)
def test_finish_reasons(reason: FinishReason, name: str) -> None:
    translator = GenerateTranslator(stream=True)
    (response,) = translator.translate(
        GenerateResponse(finished=OutputFinished(output_index=0, reason=reason, completion_tokens=0))
    )
    assert response.complete is not None and response.complete.finish_reason == name
    assert response.complete.matched_token_id is None and response.complete.matched_stop_str is None


def test_an_in_stream_error_ends_the_call_with_its_status() -> None:
    translator = GenerateTranslator(stream=True)
    with pytest.raises(GRPCError) as failed:
        translator.translate(GenerateResponse(error=RequestError(code=14, message="the scheduler died")))
    assert failed.value.status is Status.UNAVAILABLE and failed.value.message == "the scheduler died"
    with pytest.raises(GRPCError) as odd:
        translator.translate(GenerateResponse(error=RequestError(code=0, message="?")))
    assert odd.value.status is Status.INTERNAL
