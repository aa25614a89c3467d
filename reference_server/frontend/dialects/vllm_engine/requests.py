"""vLLM-dialect requests as lmrpc.v1 requests.

The translation keeps presence where the dialect has it (``optional`` temperature, max_tokens,
seed, logprobs) and reads a proto3 zero as "unset" where the dialect has none (top_p, top_k,
min_p, penalties, n, min_tokens): zero means "off" or "default" for each of those in vLLM too.
Everything else is checked by lmrpc's own validation behind it, with lmrpc's field names.

Structured outputs become lmrpc's constraint (``grammar`` is EBNF); ``structural_tag`` has no lmrpc
kind. Options lmrpc cannot honour answer UNIMPLEMENTED naming the field, never silently ignored:
logit_bias, ``structural_tag``, prompt logprobs, logprobs=-1 (the whole vocabulary),
truncate_prompt_tokens, KV-transfer (PD) parameters and multimodal inputs. Two options are
accepted and have no effect, because the dialect returns token ids and never text:
``spaces_between_special_tokens``, and ``grammar_from_first_token`` (this server has no reasoning
parser: a constraint always starts at the first generated token).
"""

from __future__ import annotations

import betterproto2
from grpclib import GRPCError, Status

from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import GenerateRequest, SamplingParams, StoppingCriteria, TokenIds
from reference_server.frontend.dialects.base.requests import (
    check_one_data_parallel_rank,
    constraint_of,
    refuse_logit_bias,
    stopping,
    token_ids_request,
    unimplemented,
)

UINT64 = 1 << 64
# vLLM's structured outputs as lmrpc's constraint kinds (structural_tag has none: UNIMPLEMENTED)
CONSTRAINT_KINDS = {
    "json_schema": "json_schema",
    "regex": "regex",
    "grammar": "ebnf",
    "json_object": "json_object",
    "choice": "choice",
}


def to_lmrpc(request: vllm.GenerateRequest) -> GenerateRequest:
    _refuse_unsupported_request_fields(request)
    params = request.sampling_params or vllm.SamplingParams()
    _refuse_unsupported_sampling(params)
    lmrpc = token_ids_request(
        request.request_id,
        _sampling(params),
        _stopping(params),
        return_logprobs=params.logprobs is not None,
        top_logprobs=params.logprobs or 0,
        skip_special_tokens=params.skip_special_tokens,
        stream=request.stream,
    )
    lmrpc.constraint = constraint_of(params, CONSTRAINT_KINDS)
    kind, _ = betterproto2.which_one_of(request, "input")
    if kind == "tokenized":
        assert request.tokenized is not None
        lmrpc.token_ids = TokenIds(ids=list(request.tokenized.input_ids))
    elif kind == "text":
        lmrpc.text = request.text
    else:
        raise GRPCError(Status.INVALID_ARGUMENT, "input: exactly one of tokenized or text must be set")
    return lmrpc


def _sampling(p: vllm.SamplingParams) -> SamplingParams:
    return SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p or None,
        top_k=p.top_k or None,
        min_p=p.min_p or None,
        frequency_penalty=p.frequency_penalty or None,
        presence_penalty=p.presence_penalty or None,
        repetition_penalty=p.repetition_penalty or None,
        seed=None if p.seed is None else p.seed % UINT64,  # a negative int32 seed stays distinct
        n=p.n or None,
    )


def _stopping(p: vllm.SamplingParams) -> StoppingCriteria:
    return stopping(
        p.max_tokens, p.min_tokens, p.stop, p.stop_token_ids,
        ignore_eos=p.ignore_eos, include_stop_in_output=p.include_stop_str_in_output,
    )  # fmt: skip


def _refuse_unsupported_sampling(p: vllm.SamplingParams) -> None:
    refuse_logit_bias(p)
    if p.prompt_logprobs is not None:
        raise unimplemented("sampling_params.prompt_logprobs", "no prompt logprobs")
    if p.logprobs is not None and p.logprobs < 0:
        raise unimplemented(
            f"sampling_params.logprobs={p.logprobs}", "logprobs of the whole vocabulary; ask for top-k"
        )
    if p.truncate_prompt_tokens is not None:
        raise unimplemented("sampling_params.truncate_prompt_tokens", "prompts are never truncated")


def _refuse_unsupported_request_fields(request: vllm.GenerateRequest) -> None:
    if request.kv_transfer_params is not None or request.kv_transfer_params_json is not None:
        raise unimplemented("kv_transfer_params", "no prefill/decode disaggregation")
    if request.mm_inputs is not None or request.extra_mm_inputs or request.media_refs is not None:
        raise unimplemented("multimodal input (mm_inputs, extra_mm_inputs, media_refs)", "a text-only model")
    check_one_data_parallel_rank("data_parallel_rank", request.data_parallel_rank)
