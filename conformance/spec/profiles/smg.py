"""What smg's two engine protocols (``vllm-engine``, ``sglang-scheduler``) share: no text, no
PromptInfo, one ``matched_token_id`` for EOS and stop token, no capabilities. Each reading says what
the gateway relies on instead, with the smg source it comes from; each protocol's profile
overrides some of it."""

from __future__ import annotations

from conformance.spec.profiles.base import NO_TEXT, NOT_DRIVEN_CAP_1, NOT_RUNTIME, Reading, na, reads

# What both engine protocols share; each protocol's profile overrides some of it.
SMG: dict[str, Reading] = {
    "ERR-3": reads(
        "as written, each field under the protocol's name for it; but a refused constraint's message is the "
        "engine's grammar compiler's own (vLLM: 'Invalid JSON grammar specification'), which no engine protocol "
        "promises names the field: not judged"
    ),
    "SVC-1": reads(
        "the protocol's service is served: Generate, Abort, GetModelInfo and GetLoads answer (GetServerInfo "
        "is optional: smg only warns when it fails)"
    ),
    "SVC-2": na(
        "smg calls neither grpc.health.v1 nor reflection (its health is the engine HealthCheck: SMG-4); "
        "`--protocol auto` reads reflection where it is served"
    ),
    "SVC-3": na("the protocols report no contract revision"),
    "REQ-1": reads(
        "an empty prompt (no token ids) or no input at all is INVALID_ARGUMENT; there is no chat input"
    ),
    "REQ-3": na(
        "request ids are the gateway's, one per request; the protocols say nothing about a duplicate"
    ),
    "REQ-4": na("the protocols put no rule on request ids"),
    "REQ-5": reads("a prompt or stop token id ≥ GetModelInfo.vocab_size is INVALID_ARGUMENT (smg: HTTP 400)"),
    "REQ-6": reads(
        "prompt + max_tokens must fit GetModelInfo.max_context_length, smg's context length "
        "(create_worker.rs); the engine's default max_tokens is not reported"
    ),
    "REQ-7": reads("the KV capacity is GetLoads' max_total_num_tokens"),
    "REQ-8": na("chat templates and special-token parsing are the gateway's: the server gets token ids"),
    "SAMPLE-2": reads("with `--assume deterministic_greedy`: the protocols advertise nothing"),
    "SAMPLE-4": na("the seed in effect is not reported (there is no PromptInfo)"),
    "SAMPLE-7": reads("with `--assume deterministic_greedy`"),
    "SAMPLE-8": na("options with no presence are always sent; the text options have nothing to act on"),
    "STREAM-1": na(
        "no PromptInfo: nothing comes before the first chunk, and the prompt length rides on every chunk "
        "and complete (USAGE-2)"
    ),
    "STREAM-3": reads("`index` in [0, n) on every chunk and complete (proto3: an absent index reads 0)"),
    "STREAM-4": na(NO_TEXT),
    "STREAM-5": na(NO_TEXT),
    "STREAM-11": na(NO_TEXT),
    "STREAM-7": reads(
        "output_logprobs: one entry per token with its id and a logprob ≤ 0, top_logprobs with the entries "
        "asked for, sorted; the protocols carry no rank (the driver derives it from the token's place in top)"
    ),
    "STREAM-10": na(
        "no return_text, return_token_ids or return_prompt_token_ids: ids are always returned, text never"
    ),
    "FINISH-1": reads(
        "exactly one complete per index and nothing for that index after it; status OK only once every index "
        "has its complete"
    ),
    "FINISH-3": reads("the complete of the last unfinished index is the last message, then status OK"),
    "FINISH-5": reads(
        'matched_token_id / matched_stop_str only with "stop": a matched token id is the output\'s last '
        "token and one of the request's stop_token_ids or GetModelInfo.eos_token_ids, a matched string one "
        'of the request\'s stop strings; a "stop" with no match must end with an EOS id (vLLM reports no '
        "match for EOS)"
    ),
    "FINISH-7": reads('"abort" only when an Abort, a cancel or a deadline ended the request'),
    "USAGE-1": na(
        "no usage message: smg builds usage from the completes (the largest prompt_tokens and cached_tokens, "
        "the completion tokens summed; common/response_formatting.rs)"
    ),
    "USAGE-2": reads("prompt_tokens on every chunk and complete is the number of prompt ids sent"),
    "USAGE-3": na("the sum is the gateway's (USAGE-1); each output's own count is USAGE-5's"),
    "USAGE-4": reads("cached_tokens ≤ prompt_tokens on every chunk and complete"),
    "USAGE-6": reads(
        "with `--assume prefix_cache`: a repeated prompt reports cached_tokens > 0. vLLM keeps whole blocks "
        "of `GetServerInfo.block_size` tokens, so its prompts are sized past one block; where the protocol "
        "does not say, a prompt not found again is repeated until one is (a short prompt is then n/a)"
    ),
    "USAGE-7": na(
        "FlushCache is an operator RPC whose timeout_s semantics are the engine's, and the case needs a quiet "
        "server after it; not driven"
    ),
    "STOP-1": na(NO_TEXT),
    "STOP-2": na(
        "which token completes a stop string depends on text the protocols do not carry (smg matches stop "
        "strings again itself: StopSequenceDecoder)"
    ),
    "STOP-4": reads("an EOS end reports matched_token_id = the EOS id, or no match (vLLM)"),
    "STOP-6": na(NO_TEXT),
    "STOP-7": na(NO_TEXT),
    "N-1": reads("a complete for every index 0…n-1 and none for any other"),
    "N-2": na(
        "the gateway charges the prompt once (the largest prompt_tokens) and sums the completions; each "
        "complete's counts are USAGE-2's and USAGE-5's"
    ),
    "ABORT-3": reads(
        "GetLoads returns to its values before the request: num_running_reqs, num_waiting_reqs, "
        "num_used_tokens, num_total_reqs (SMG-3)"
    ),
    "ABORT-4": reads(
        "aborting the request ends every one of its n outputs (sgl-project/sglang#32588, smg-project/smg#1351)"
    ),
    "ABORT-5": na("there is no abort of all requests"),
    "ABORT-7": na("an empty id list (vLLM) or an empty id (SGLang) is a no-op, not an error"),
    "CANCEL-1": reads(
        "a reset alone releases the request: smg also sends Abort when it drops a stream (abort_on_drop.rs), "
        "vLLM's own protocol relies on the reset (smg-project/smg#2113)"
    ),
    "CANCEL-2": reads(
        'a deadline ends the call with DEADLINE_EXCEEDED or CANCELLED, or with an "abort" finish and status '
        "OK (FINISH-7's reading: smg reads either as the request's end); the server releases it"
    ),
    "ERR-1": reads("an invalid request the protocol can express fails with a status and no messages"),
    "ERR-2": reads(
        "a failure after the first message ends the call with a non-OK status (smg needs the code for retries "
        "and circuit breakers, sgl-project/sglang#19972): never an in-band error, never a complete with "
        '"error" and status OK'
    ),
    "ERR-4": na(
        "the cases call lmrpc.v1 paths; on an engine port, the other engines' HealthCheck is SMG-4's"
    ),
    "MALFORMED-1": na(
        "the cases send raw lmrpc.v1 messages; the reference server's tests cover its engine ports"
    ),
    "MALFORMED-2": na("the cases send raw lmrpc.v1 messages"),
    "MALFORMED-3": na("the cases send raw lmrpc.v1 messages"),
    "MALFORMED-4": na("the cases send raw lmrpc.v1 messages"),
    "CAP-1": na(
        "no capability flags; an option a server cannot honour must still fail, never be ignored (the "
        "reference server: UNIMPLEMENTED naming the field, which smg answers with HTTP 501)"
    ),
    "CAP-2": na("nothing is advertised; `--assume` states what the server promises"),
    "CAP-3": reads(
        "GetModelInfo: vocab_size > 0, max_context_length > 0, every eos id < vocab_size, "
        "default_sampling_params_json within the SAMPLE-5 ranges"
    ),
    "CAP-5": na("the protocols report no limits"),
    "HEALTH-1": na("smg reads the engine HealthCheck, never grpc.health.v1 (SMG-4)"),
    "HEALTH-2": na("smg reads the engine HealthCheck (SMG-5)"),
    "SVC-4": reads(
        "GetServerInfo: uptime_seconds grows while the server runs and falls across a restart; where the "
        "protocol names the instance (sglang-scheduler's start_time) it is the same on every call and new "
        "after a restart"
    ),
    "LIFE-1": na("a drain shows on the engine HealthCheck (SMG-5[drain])"),
    "TRACE-1": reads("the caller's traceparent on the protocol's Generate call"),
    "SMG-5": reads(
        "a drain (--drain-hook): HealthCheck answers healthy=false, a new Generate is UNAVAILABLE and the "
        "streams in flight end with their finish and usage; the protocols report no drain time, so an "
        "ABORTED output is accepted at any time. Start-up and a worker's death are not driven"
    ),
    "LOAD-1": reads(
        "GetLoads: with nothing in flight num_running_reqs, num_waiting_reqs, num_used_tokens and "
        "num_total_reqs are 0 on every rank; an open stream is counted"
    ),
    "TOK-1": na("no Tokenize: the gateway tokenizes with the GetTokenizer bundle (SMG-1)"),
    "TOK-2": na("no Tokenize or Detokenize"),
    "EMBED-1": na("Embed (one tokenized input per call) is not driven"),
    "EMBED-2": na("Embed is not driven"),
    "EMBED-3": na("Embed is not driven"),
    "LIFE-3": na("no PauseGeneration; FlushCache is not driven (USAGE-7)"),
    "FLOW-1": na("the cases speak lmrpc.v1 over raw HTTP/2; the edge guard covers the engine ports too"),
    "FLOW-2": na("the cases speak lmrpc.v1 over raw HTTP/2"),
    "AUTH-1": na("the protocols define no credentials or roles"),
    "AUTH-2": na("the protocols define no credentials or roles"),
    "AUTH-3": na("the protocols define no credentials or roles"),
    "MODELS-1": na(
        "no ListModels: smg takes the model from GetModelInfo (vllm-engine) or lists adapters alone"
    ),
    "SCORE-1": na("no Score or Rerank"),
    "SCORE-2": na("no Score or Rerank"),
    "ADMIN-1": na("StartProfile and StopProfile (smg.grpc.common) are not driven yet"),
    "ADMIN-2": na("no weight update RPC"),
    **NOT_RUNTIME,
}

SMG_CASES: dict[str, Reading] = {
    **NOT_DRIVEN_CAP_1,
    "REQ-1[empty-chat]": na("there is no chat input"),
    "REQ-2[server-assigned]": na("smg always sends a request id"),
    "REQ-6[default-lowered]": na("the engine's default max_tokens is not reported"),
    "SAMPLE-1[max_tokens-default]": na("the engine's default max_tokens is not reported"),
    "SAMPLE-5[n=max+1]": na("no max_outputs is advertised"),
    "SAMPLE-5[top_logprobs=max+1]": na("no max_top_logprobs is advertised"),
    "SAMPLE-5[stop_strings=max+1]": na("no max_stop_strings is advertised"),
    "SAMPLE-5[stop_string=empty]": na("neither engine documents a rule for an empty stop string"),
    "SAMPLE-5[return_text=return_token_ids=false]": na("no return_text / return_token_ids options"),
    "SAMPLE-5[repetition_penalty=0]": na(
        "the engines' own ranges for repetition_penalty differ from lmrpc's at 0"
    ),
    "SAMPLE-5[n=0]": na("n = 0 reads as unset (1)"),
    "ERR-1[generated]": na(
        "its generated values include ones the protocols read as unset (n = 0) or do not limit"
    ),
    "ERR-1[control]": na("no Tokenize or Detokenize"),
    "ERR-1[embed]": na("Embed is not driven"),
    "USAGE-2[tokenize]": na("no Tokenize: USAGE-2 is checked against the prompt ids sent"),
    "FINISH-5[stop-token-is-eos]": na("one matched_token_id for an EOS token and a stop token alike"),
    "LOAD-1[waiting]": na("no PauseGeneration to hold a request waiting"),
    "CONSTRAIN-2[constraint.none-set]": na(
        "the constraint is a oneof of SamplingParams fields: the wire cannot carry one with no kind"
    ),
}
