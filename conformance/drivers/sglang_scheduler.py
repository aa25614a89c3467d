"""``sglang.grpc.scheduler.SglangScheduler``, smg's SGLang worker protocol (smg-grpc-proto), as the
harness drives it.

Its semantics, as smg reads them: chunk ids are new ids, but chunk counts are the output's totals
so far (``ChunkSemantics::Cumulative``: the ``complete``'s ``completion_tokens`` is the output's
count); every response echoes the request id; errors are the call's status (the in-band
``GenerateError`` was removed). The sampling scalars have no presence and the proto says to send
them all, so the driver sends what lmrpc would use: the request's value, else the model's
``default_sampling_params_json`` (smg does the same). There is no seed. ``Abort`` takes one id
and answers whether it covered a request in flight.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import betterproto2
from grpclib.client import Channel

from conformance.drivers.base import JSON_OBJECT_SCHEMA, choice_regex, constraint_of
from conformance.drivers.smg import SmgDriver
from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc.v1 import (
    AbortOutcome,
    AbortStatus,
    EffectiveDefaults,
    GenerateRequest,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
)

TOP_K_DISABLED = -1


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


class SglangSchedulerDriver(SmgDriver):
    protocol = "sglang-scheduler"
    instance_field = "GetServerInfoResponse.start_time"
    service = "sglang.grpc.scheduler.SglangScheduler"
    abort_outcomes = True
    cumulative = True
    echoes_request_id = True
    seeds = False
    response_type = sglang.GenerateResponse
    field_names = MappingProxyType({"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"})

    def stub(self, channel: Channel) -> Any:
        return sglang.SglangSchedulerStub(channel)

    def express_options(self, request: GenerateRequest) -> GenerateRequest:
        d = self.model.defaults or EffectiveDefaults()
        s = request.sampling or SamplingParams()
        request.sampling = SamplingParams(  # every value is sent: absent ones as the defaults say
            temperature=_given(s.temperature, d.temperature),
            top_p=_given(s.top_p, d.top_p),
            top_k=int(_given(s.top_k, d.top_k)),
            min_p=_given(s.min_p, d.min_p),
            frequency_penalty=_given(s.frequency_penalty, d.frequency_penalty),
            presence_penalty=_given(s.presence_penalty, d.presence_penalty),
            repetition_penalty=_given(s.repetition_penalty, d.repetition_penalty),
            n=s.n or None,  # 0 reads as unset
            seed=None,  # no seed field
        )
        if request.stopping is not None:
            request.stopping.min_tokens = request.stopping.min_tokens or None
        return request

    def native_request(self, request: GenerateRequest) -> betterproto2.Message:
        s = request.sampling or SamplingParams()
        st = request.stopping or StoppingCriteria()
        r = request.response or ResponseOptions()
        params = sglang.SamplingParams(
            temperature=s.temperature or 0.0,
            top_p=s.top_p or 0.0,
            top_k=s.top_k or TOP_K_DISABLED,
            min_p=s.min_p or 0.0,
            frequency_penalty=s.frequency_penalty or 0.0,
            presence_penalty=s.presence_penalty or 0.0,
            repetition_penalty=s.repetition_penalty or 0.0,
            max_new_tokens=st.max_tokens,
            min_new_tokens=st.min_tokens or 0,
            stop=list(st.stop_strings),
            stop_token_ids=list(st.stop_token_ids),
            skip_special_tokens=r.skip_special_tokens is not False,
            spaces_between_special_tokens=True,
            ignore_eos=st.ignore_eos,
            no_stop_trim=st.include_stop_in_output,
            n=s.n or 1,
        )
        if (constraint := constraint_of(request)) is not None:
            kind, value = constraint  # no json_object or choice kind: the same languages as a schema, a regex
            if kind == "json_object":
                params.json_schema = JSON_OBJECT_SCHEMA
            elif kind == "choice":
                params.regex = choice_regex(value)
            else:
                setattr(params, {"ebnf": "ebnf_grammar"}.get(kind, kind), value)
        tokenized = None
        if request.token_ids is not None:
            tokenized = sglang.TokenizedInput(original_text="", input_ids=list(request.token_ids.ids))
        return sglang.GenerateRequest(
            request_id=request.request_id,
            tokenized=tokenized,
            sampling_params=params,
            return_logprob=r.return_logprobs,
            logprob_start_len=-1,  # no prompt logprobs (what smg sends)
            top_logprobs_num=r.top_logprobs if r.return_logprobs else 0,
            stream=not r.final_only,
        )

    async def native_abort(self, stub: Any, ids: list[str], timeout: float | None) -> list[AbortOutcome]:
        outcomes = []
        for rid in ids:  # one id per call
            reply = await stub.abort(
                sglang.AbortRequest(request_id=rid, reason="conformance"), timeout=timeout
            )
            status = AbortStatus.ABORTED if reply.success else AbortStatus.NOT_IN_FLIGHT
            outcomes.append(AbortOutcome(request_id=rid, status=status))
        return outcomes

    def health_request(self) -> betterproto2.Message:
        return sglang.HealthCheckRequest()

    def model_request(self) -> betterproto2.Message:
        return sglang.GetModelInfoRequest()

    def server_request(self) -> betterproto2.Message:
        return sglang.GetServerInfoRequest()

    def loads_request(self) -> betterproto2.Message:
        return sglang.GetLoadsRequest()
