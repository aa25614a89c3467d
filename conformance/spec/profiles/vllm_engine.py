"""``vllm-engine``: vllm.grpc.engine.VllmEngine, smg's vLLM worker protocol."""

from __future__ import annotations

from conformance.spec.profiles.base import Profile, na, reads
from conformance.spec.profiles.smg import SMG, SMG_CASES

VLLM_ENGINE = Profile(
    "vllm-engine",
    "vllm.grpc.engine (smg)",
    {
        **SMG,
        "REQ-2": na("vLLM's responses carry no request id"),
        "SAMPLE-1": reads(
            "presence kept for temperature, max_tokens and seed; 0 reads as unset for top_p, top_k, min_p, the "
            "penalties, n and min_tokens; defaults are default_sampling_params_json's"
        ),
        "SAMPLE-3": reads(
            "with `--assume seeded_sampling`; the seed is an int32 (the driver sends lmrpc's seed mod 2³¹)"
        ),
        "SAMPLE-5": reads(
            "the ranges vLLM checks that the protocol can express (0 reads as unset for top_p and "
            "repetition_penalty, vLLM puts no upper bound on repetition_penalty, nothing is advertised)"
        ),
        "SAMPLE-6": reads("with `--assume seeded_sampling`"),
        "CONSTRAIN-1": reads(
            "SamplingParams' constraint oneof: json_schema, regex, grammar (EBNF), json_object and choice, "
            "each vLLM's structured output of the same name; no text, so the driver detokenizes the ids"
        ),
        "STREAM-2": reads(
            "chunks carry only new ids (smg's ChunkSemantics::Delta, proto_wrapper.rs): an output's chunks add "
            "up to its tokens, never more than max_tokens (a stream has no total to compare with)"
        ),
        "STREAM-6": reads(
            "responses carry no id: checked by content (concurrent greedy requests give what each gives alone)"
        ),
        "STREAM-8": reads(
            "stream=false: one complete per output with all its output_ids (smg collects only the completes, "
            "response_collection.rs); a greedy or seeded result equals the streamed one"
        ),
        "FINISH-2": reads(
            "every token reaches a chunk before its output's complete (smg streams chunk ids only); a streaming "
            "complete's output_ids (empty, or the last delta as vLLM's servicer sends) carry no id no chunk "
            "carried, and its completion_tokens is at most what the chunks carried (smg-project/smg#282)"
        ),
        "FINISH-4": reads(
            'finish_reason is "stop", "length" or "abort" ("error" is a failure dressed as a finish: ERR-2)'
        ),
        "USAGE-5": reads(
            "a chunk's completion_tokens is its own id count (delta: smg counts the chunks' ids); stream=false, "
            "a complete's is its output_ids' count; ≤ max_tokens, ≥ min_tokens"
        ),
        "ABORT-1": na(
            "Abort answers nothing per id (AbortResponse is empty), and an empty id list is a no-op"
        ),
        "ABORT-2": reads(
            "(Abort reports no outcome) the stream ends promptly: every unfinished output gets a complete "
            '"abort" counting the tokens delivered; status OK. No tail is counted after the Abort: nothing '
            "advertises how many tokens a server keeps for a slow reader, so such a count would measure the "
            "harness's reading, not the server"
        ),
        "ABORT-6": na(
            "lmrpc.v1's promise: vLLM's Abort reaches the requests in flight, and no vLLM document says an "
            "Abort for an id not yet seen is remembered"
        ),
        "CONSTRAIN-4": na(
            "lmrpc.v1's promise: vLLM's grammar backend compiles a schema with a remote $ref, and no vLLM "
            "document says an unenforceable keyword is refused"
        ),
        "SMG-4": reads(
            "on a vLLM port, SGLang's HealthCheck (which smg probes first) answers a non-OK status"
        ),
    },
    {
        **SMG_CASES,
        "ABORT-1[prefix-id]": reads(
            "an Abort names ids exactly: one that only shares a prefix with a request in flight leaves it "
            "streaming (what the Abort did shows on the stream: it reports nothing per id)"
        ),
        "CONSTRAIN-2[constraint.choice=empty-string]": na(
            "vLLM takes any list of strings as a choice, the empty one included: an output of no text"
        ),
        "CONSTRAIN-3[ignore_eos]": na(
            "vLLM documents ignore_eos as generating on past EOS, and its structured outputs stop masking "
            "once the grammar is complete: with both, the text goes on unconstrained (seen on vLLM 0.32), "
            "and no vLLM document says which promise wins"
        ),
        "SAMPLE-5[top_p=0]": na("top_p = 0 reads as unset"),
        "SAMPLE-5[repetition_penalty=11]": na("vLLM puts no upper bound on repetition_penalty"),
        "SAMPLE-5[top_logprobs-without-return_logprobs]": na("one logprobs field: a count means logprobs on"),
    },
)
