"""``sglang-scheduler``: sglang.grpc.scheduler.SglangScheduler, smg's SGLang worker protocol."""

from __future__ import annotations

from conformance.spec.profiles.base import Profile, na, reads
from conformance.spec.profiles.smg import SMG, SMG_CASES

SGLANG_SCHEDULER = Profile(
    "sglang-scheduler",
    "sglang.grpc.scheduler (smg)",
    {
        **SMG,
        "CONSTRAIN-1": reads(
            "SamplingParams' constraint oneof: json_schema, regex and ebnf_grammar; a JSON object is sent as "
            'the schema {"type": "object"} and a choice as a regex of its strings; no text, so the driver '
            "detokenizes the ids"
        ),
        "REQ-2": reads("every response echoes the request_id"),
        "SAMPLE-1": reads(
            "no presence: every value is sent, absent ones as default_sampling_params_json says (as smg does), "
            'so temperature 0 is greedy and never "unset"'
        ),
        "SAMPLE-3": na("no seed field"),
        "SAMPLE-5": reads(
            "the ranges SGLang checks that the protocol can express (max_new_tokens = 0 is a prefill-only "
            "request; top_logprobs_num counts only with return_logprob; nothing is advertised)"
        ),
        "SAMPLE-6": na("no seed field"),
        "STREAM-2": reads(
            'chunk ids are new ids ("incremental chunk") while counts are cumulative: the ids of an output\'s '
            "chunks add up to its complete's completion_tokens"
        ),
        "STREAM-6": reads("every response carries its own request_id"),
        "STREAM-8": reads(
            "stream=false: one complete per output with all its output_ids (smg collects only the completes, "
            "response_collection.rs); a greedy result equals the streamed one"
        ),
        "FINISH-2": reads(
            "every token reaches a chunk before its output's complete (sgl-project/sglang#19895): the complete's "
            "completion_tokens equals the ids its chunks carried, and its output_ids (all of them, or the last "
            "delta) carry no id no chunk carried"
        ),
        "FINISH-4": reads('finish_reason is "stop", "length" or "abort"'),
        "USAGE-5": reads(
            "a chunk's completion_tokens is the output's id count so far (cumulative), the complete's the whole "
            "output's (smg takes it from there); ≤ max_tokens, ≥ min_tokens"
        ),
        "ABORT-1": reads(
            "one id per call: success is true only for a request in flight that no earlier Abort covered, false "
            "for unknown, finished or covered ids, and the call never fails"
        ),
        "ABORT-2": reads(
            'success = true; the stream ends promptly: every unfinished output gets a complete "abort" counting '
            "the tokens delivered; status OK. No tail is counted after the Abort: nothing advertises how many "
            "tokens a server keeps for a slow reader, so such a count would measure the harness's reading"
        ),
        "ABORT-6": na(
            "lmrpc.v1's promise: SGLang's scheduler aborts the requests it holds, and an Abort for an id "
            "not yet seen answers success = false and is not remembered"
        ),
        "SMG-4": reads(
            "SGLang is the first protocol smg probes: its HealthCheck answering OK is what finds it"
        ),
    },
    {
        **SMG_CASES,
        "ABORT-1[duplicate-ids]": na("one id per call"),
        "SAMPLE-5[max_tokens=0]": na("max_new_tokens = 0 is a prefill-only request in SGLang"),
        "SAMPLE-5[top_logprobs-without-return_logprobs]": na(
            "top_logprobs_num counts only with return_logprob"
        ),
        "SAMPLE-1[defaults]": na(
            "no seed field: absent and explicit defaults cannot be compared token by token"
        ),
        "STREAM-8[seeded]": na("no seed field"),
        "CONSTRAIN-2[constraint.choice=none]": na("no choice kind: the driver sends the choice as a regex"),
        "CONSTRAIN-2[constraint.choice=empty-string]": na(
            "no choice kind: the driver sends the choice as a regex"
        ),
    },
)
