"""SGLang-scheduler requests as lmrpc.v1 requests.

The scheduler protocol's sampling scalars are plain proto3 fields: a caller sends every value
(the proto says so: "Do not use SamplingParams::default() directly"), so each value is taken as
sent, zero included: ``temperature = 0`` is greedy, ``top_p = 0`` is out of range. Two
sentinels are SGLang's own: ``top_k = -1`` disables top-k (0 does too, as in lmrpc), and
``n = 0`` / ``min_new_tokens = 0`` mean unset. A request without ``sampling_params`` at all
runs with the server's defaults. There is no seed: every request samples with a seed the server
picks, and no response reports it.

The constraints ``json_schema``, ``regex`` and ``ebnf_grammar`` become lmrpc's constraint. Options
the server cannot honour answer UNIMPLEMENTED naming the field, never silently ignored:
``structural_tag``, logit bias, custom parameters and logit processors, prompt
logprobs (``logprob_start_len >= 0`` with ``return_logprob``), ``token_ids_logprob``, hidden
states, input embeddings, LoRA, prefill/decode disaggregation, multimodal inputs, and
``max_new_tokens = 0`` (a prefill-only request). Accepted with no effect, each for a reason:
``original_text`` (for reference, the proto says), ``spaces_between_special_tokens`` (no text
is returned), ``stream_interval`` (the server merges deltas as it sees fit), ``timestamp``,
``log_metrics``, ``require_reasoning`` (no reasoning parser: ``reasoning_tokens`` is 0), and
``top_logprobs_num`` without ``return_logprob`` (SGLang reads it only with logprobs on).
"""

from __future__ import annotations

from grpclib import GRPCError, Status

from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc.v1 import GenerateRequest, SamplingParams, StoppingCriteria, TokenIds
from reference_server.frontend.dialects.base.requests import (
    check_one_data_parallel_rank,
    constraint_of,
    refuse_logit_bias,
    stopping,
    token_ids_request,
    unimplemented,
)

TOP_K_DISABLED = -1
# SGLang's constraints as lmrpc's kinds (structural_tag has none: UNIMPLEMENTED)
CONSTRAINT_KINDS = {"json_schema": "json_schema", "regex": "regex", "ebnf_grammar": "ebnf"}


def to_lmrpc(request: sglang.GenerateRequest) -> GenerateRequest:
    _refuse_unsupported_request_fields(request)
    if request.tokenized is None:
        raise GRPCError(
            Status.INVALID_ARGUMENT, "tokenized: the prompt must be sent as token ids (input_ids)"
        )
    params = request.sampling_params
    if params is not None:
        _refuse_unsupported_sampling(params)
    top_logprobs = request.top_logprobs_num if request.return_logprob else 0
    if top_logprobs < 0:
        raise GRPCError(Status.INVALID_ARGUMENT, f"top_logprobs_num={top_logprobs} must be >= 0")
    lmrpc = token_ids_request(
        request.request_id,
        None if params is None else _sampling(params),
        None if params is None else _stopping(params),
        return_logprobs=request.return_logprob,
        top_logprobs=top_logprobs,
        skip_special_tokens=None if params is None else params.skip_special_tokens,
        stream=request.stream,
    )
    lmrpc.token_ids = TokenIds(ids=list(request.tokenized.input_ids))
    lmrpc.constraint = None if params is None else constraint_of(params, CONSTRAINT_KINDS)
    return lmrpc


def _sampling(p: sglang.SamplingParams) -> SamplingParams:
    if p.top_k < TOP_K_DISABLED:
        raise GRPCError(
            Status.INVALID_ARGUMENT, f"sampling_params.top_k={p.top_k} must be -1 (disabled) or >= 0"
        )
    return SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=max(p.top_k, 0),  # -1 and 0 both disable top-k
        min_p=p.min_p,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        repetition_penalty=p.repetition_penalty,
        n=p.n or None,
    )


def _stopping(p: sglang.SamplingParams) -> StoppingCriteria:
    if p.max_new_tokens == 0:
        raise unimplemented("sampling_params.max_new_tokens=0", "no prefill-only requests")
    return stopping(
        p.max_new_tokens, p.min_new_tokens, p.stop, p.stop_token_ids,
        ignore_eos=p.ignore_eos, include_stop_in_output=p.no_stop_trim,
    )  # fmt: skip


def _refuse_unsupported_sampling(p: sglang.SamplingParams) -> None:
    refuse_logit_bias(p)
    if p.custom_params is not None and p.custom_params.fields:
        raise unimplemented("sampling_params.custom_params", "no custom sampling parameters")


def _refuse_unsupported_request_fields(request: sglang.GenerateRequest) -> None:
    if request.mm_inputs is not None:
        raise unimplemented("mm_inputs", "a text-only model")
    if request.input_embeds:
        raise unimplemented("input_embeds", "prompts are token ids")
    if request.return_logprob and request.logprob_start_len >= 0:
        raise unimplemented(
            f"logprob_start_len={request.logprob_start_len}",
            "no prompt logprobs; send -1 for output logprobs",
        )
    if request.token_ids_logprob:
        raise unimplemented("token_ids_logprob", "no logprobs of chosen token ids")
    if request.return_hidden_states:
        raise unimplemented("return_hidden_states", "no hidden states")
    if request.disaggregated_params is not None:
        raise unimplemented("disaggregated_params", "no prefill/decode disaggregation")
    if request.custom_logit_processor:
        raise unimplemented("custom_logit_processor", "no custom logit processors")
    if request.lora_id:
        raise unimplemented(f"lora_id={request.lora_id!r}", "no LoRA adapters")
    check_one_data_parallel_rank("data_parallel_rank", request.data_parallel_rank)
