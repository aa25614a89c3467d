"""``vllm.grpc.engine.VllmEngine``, smg's vLLM worker protocol (smg-grpc-proto), as the harness
drives it.

Its semantics, as smg reads them: chunks are *deltas* in everything (ids, counts, logprobs;
``ChunkSemantics::Delta``); a ``complete`` ends each output (in a stream, its ``output_ids`` and
``completion_tokens`` are not read: vLLM's servicer repeats the last delta there); responses
carry no request id; errors are the call's status. Requests keep presence for ``temperature``,
``max_tokens``, ``seed`` and ``logprobs``; for the other scalars 0 reads as unset, as in vLLM.
``Abort`` takes a list of ids and answers nothing per id.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import betterproto2
from grpclib.client import Channel

from conformance.drivers.base import constraint_of
from conformance.drivers.smg import SmgDriver
from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import (
    AbortOutcome,
    AbortStatus,
    GenerateRequest,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
)

INT31 = (1 << 31) - 1  # the seed is an int32: lmrpc's uint64 seeds are folded into its positive half


class VllmEngineDriver(SmgDriver):
    protocol = "vllm-engine"
    service = "vllm.grpc.engine.VllmEngine"
    abort_outcomes = False
    cumulative = False
    echoes_request_id = False
    seeds = True
    response_type = vllm.GenerateResponse
    probed_before = ("sglang.grpc.scheduler.SglangScheduler",)  # smg tries SGLang first
    # vLLM calls a request's input its prompt (its servers answer "The decoder prompt cannot be empty")
    field_names = MappingProxyType({"input": "prompt"})

    def stub(self, channel: Channel) -> Any:
        return vllm.VllmEngineStub(channel)

    def express_options(self, request: GenerateRequest) -> GenerateRequest:
        s = request.sampling or SamplingParams()
        request.sampling = SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p or None,  # no presence: 0 reads as unset
            top_k=s.top_k or None,
            min_p=s.min_p or None,
            frequency_penalty=s.frequency_penalty or None,
            presence_penalty=s.presence_penalty or None,
            repetition_penalty=s.repetition_penalty or None,
            seed=None if s.seed is None else s.seed & INT31,
            n=s.n or None,
        )
        if request.stopping is not None:
            request.stopping.min_tokens = request.stopping.min_tokens or None
        return request

    def native_request(self, request: GenerateRequest) -> betterproto2.Message:
        s = request.sampling or SamplingParams()
        st = request.stopping or StoppingCriteria()
        r = request.response or ResponseOptions()
        params = vllm.SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p or 0.0,
            top_k=s.top_k or 0,
            min_p=s.min_p or 0.0,
            frequency_penalty=s.frequency_penalty or 0.0,
            presence_penalty=s.presence_penalty or 0.0,
            repetition_penalty=s.repetition_penalty or 0.0,
            max_tokens=st.max_tokens,
            min_tokens=st.min_tokens or 0,
            stop=list(st.stop_strings),
            stop_token_ids=list(st.stop_token_ids),
            skip_special_tokens=r.skip_special_tokens is not False,
            spaces_between_special_tokens=True,
            ignore_eos=st.ignore_eos,
            n=s.n or 0,
            logprobs=r.top_logprobs if r.return_logprobs else None,
            seed=s.seed,
            include_stop_str_in_output=st.include_stop_in_output,
        )
        if (constraint := constraint_of(request)) is not None:
            kind, value = constraint
            if kind == "json_object":
                params.json_object = True
            elif kind == "choice":
                params.choice = vllm.ChoiceConstraint(choices=value)
            else:
                setattr(params, {"ebnf": "grammar"}.get(kind, kind), value)
        tokenized = None
        if request.token_ids is not None:
            tokenized = vllm.TokenizedInput(original_text="", input_ids=list(request.token_ids.ids))
        return vllm.GenerateRequest(
            request_id=request.request_id,
            tokenized=tokenized,
            sampling_params=params,
            stream=not r.final_only,
        )

    async def native_abort(self, stub: Any, ids: list[str], timeout: float | None) -> list[AbortOutcome]:
        await stub.abort(vllm.AbortRequest(request_ids=ids), timeout=timeout)
        return [
            AbortOutcome(request_id=rid, status=AbortStatus.UNSPECIFIED) for rid in ids
        ]  # it says nothing

    def health_request(self) -> betterproto2.Message:
        return vllm.HealthCheckRequest()

    def model_request(self) -> betterproto2.Message:
        return vllm.GetModelInfoRequest()

    def server_request(self) -> betterproto2.Message:
        return vllm.GetServerInfoRequest()

    def loads_request(self) -> betterproto2.Message:
        return vllm.GetLoadsRequest()
