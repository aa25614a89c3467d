"""``sglang-runtime``: sglang.runtime.v1.SglangService, SGLang's native gRPC service."""

from __future__ import annotations

from conformance.spec.profiles.base import NOT_DRIVEN_CAP_1, Profile, na, reads

NO_TEXT_TO_LEARN = "Generate's responses carry no text to learn a stop string from: STOP-2[text-generate] reads TextGenerate's"
LMRPC_WEIGHTS = (
    "lmrpc.v1's UpdateWeights (weights_version, NOT_FOUND); ADMIN-2[native-*] read UpdateWeightsFromDisk"
)

SGLANG_RUNTIME = Profile(
    "sglang-runtime",
    "sglang.runtime.v1 (SGLang)",
    {
        **{f"SMG-{i}": na("smg's engine protocols only (§14)") for i in range(1, 7)},
        "SVC-1": reads(
            "SglangService is served: Generate, Tokenize, GetModelInfo, GetServerInfo and GetLoad answer"
        ),
        "SVC-2": na(
            "its health is the service's own HealthCheck (`healthy`); `--protocol auto` reads reflection where "
            "it is served"
        ),
        "SVC-3": na("the protocol reports no contract revision"),
        "REQ-2": reads("every response's meta_info `id` is the rid sent (SRT-2)"),
        "REQ-3": reads("a rid in flight is refused with ALREADY_EXISTS; a finished one can be used again"),
        "REQ-8": na("chat is the OpenAI pass-through's (ChatComplete); Generate takes text or ids"),
        "SAMPLE-1": reads(
            "every option keeps its presence: temperature 0 is greedy, an absent one is SGLang's default "
            "(max_new_tokens 128)"
        ),
        "SAMPLE-2": reads("with `--assume deterministic_greedy`: the protocol advertises nothing"),
        "SAMPLE-3": na("no seed field"),
        "SAMPLE-4": na("no seed field"),
        "SAMPLE-5": reads(
            "the ranges SGLang checks that the protocol can express (top_k -1 is disabled; max_new_tokens 0 is "
            "prefill-only; top_logprobs_num counts only with return_logprob; no limit is advertised)"
        ),
        "SAMPLE-6": na("no seed field"),
        "SAMPLE-7": reads("with `--assume deterministic_greedy`"),
        "SAMPLE-8": na("the text options (skip_special_tokens, no_stop_trim) are not fields of this service"),
        "STREAM-1": na(
            "no PromptInfo: nothing comes before the first token; prompt_tokens rides in meta_info"
        ),
        "STREAM-2": reads(
            "responses are cumulative unless the server declares incremental_streaming_output (SRT-1): the ids "
            "new in each response add up to the output, never more than max_tokens"
        ),
        "STREAM-3": reads("meta_info `index` in [0, n) on every response"),
        "STREAM-4": na("Generate carries ids, TextGenerate text: SRT-1[text] compares them"),
        "STREAM-5": na("Generate carries ids, TextGenerate text: SRT-1[text] compares them"),
        "STREAM-6": reads("every response carries its request's id in meta_info"),
        "STREAM-7": reads(
            "meta_info output_token_logprobs `[logprob, id, text]` per token, output_top_logprobs with the "
            "entries asked for; no rank (the driver derives it from the token's place in the top entries)"
        ),
        "STREAM-8": reads(
            "stream unset: one finished response per output with all its ids, equal to the streamed"
        ),
        "STREAM-10": na("Generate returns ids and TextGenerate text, whatever the request says"),
        "STREAM-11": na("Generate carries ids, TextGenerate text: SRT-1[text] compares them"),
        "FINISH-1": reads("exactly one response per output with a finish_reason, its last (SRT-3)"),
        "FINISH-2": reads(
            "the finished response of an output may bring its last ids; no id after it (SRT-3)"
        ),
        "FINISH-4": reads('finish_reason `type` is "stop", "length" or "abort"'),
        "FINISH-5": reads(
            "`matched` only with \"stop\": a token id that is the output's last token and one of the request's "
            "stop_token_ids or the model's eos_token_ids, or one of the request's stop strings, verbatim "
            "(through TextGenerate too: FINISH-5[text-generate])"
        ),
        "USAGE-1": na(
            "no usage message: each output's finished response carries prompt_tokens, completion_tokens and "
            "cached_tokens in meta_info"
        ),
        "USAGE-2": reads("meta_info prompt_tokens is the number of prompt ids on every response"),
        "USAGE-3": na("no request total: each output's own count is USAGE-5's"),
        "USAGE-4": reads("cached_tokens ≤ prompt_tokens on every response"),
        "USAGE-5": reads(
            "meta_info completion_tokens is the output's ids so far on every response; ≤ max_tokens, ≥ min_tokens"
        ),
        "USAGE-6": reads(
            "with `--assume prefix_cache`: a repeated prompt reports cached_tokens > 0; the protocol does not "
            "say how the cache keeps prompts, so a prompt not found again is repeated until one is (a short "
            "prompt is then n/a)"
        ),
        "STOP-1": reads(
            "through TextGenerate (SGLang matches stop strings on the output's text): the matched stop string "
            "is in no response's text, and the text ends where its first occurrence starts: SGLang trims it "
            "unless no_stop_trim, which is not a field of this service; a cumulative stream's last response may "
            "shorten the text (its absence is checked, not a holdback of its prefixes); Generate's responses "
            "carry ids only"
        ),
        "STOP-2": reads(
            "through TextGenerate: the output ends at the stop string whose first occurrence ends first, "
            "whatever its place in the list, also one that ends where a multi-byte character starts; "
            "Generate's responses carry no text to learn one from"
        ),
        "STOP-4": reads("an EOS end reports `matched` = the EOS id"),
        "STOP-7": na("no no_stop_trim field: the stop text is always trimmed"),
        "N-2": na("no request total: each output's counts are USAGE-2's and USAGE-5's"),
        "ABORT-1": na("`success` says nothing per id (SRT-4)"),
        "ABORT-2": reads(
            'the stream ends promptly: every unfinished output gets a last response with finish_reason "abort", '
            "then status OK"
        ),
        "ABORT-5": reads("`abort_all` ends every request in flight (it reports no outcomes)"),
        "ABORT-6": na(
            "lmrpc.v1's promise: SGLang aborts the requests it holds, and no SGLang document says an Abort "
            "for an id not yet seen is remembered"
        ),
        "ABORT-7": reads("an Abort with neither `rid` nor `abort_all` is INVALID_ARGUMENT"),
        "ERR-4": na("the cases call lmrpc.v1 paths"),
        "MALFORMED-1": na(
            "the cases send raw lmrpc.v1 messages; the reference server's tests cover its port"
        ),
        "MALFORMED-2": na("the cases send raw lmrpc.v1 messages"),
        "MALFORMED-3": na("the cases send raw lmrpc.v1 messages"),
        "MALFORMED-4": na("the cases send raw lmrpc.v1 messages"),
        "CAP-1": na(
            "no capability flags; what the protocol cannot express (a seed, chat input, special-token parsing) "
            "is never sent"
        ),
        "CAP-2": na("nothing is advertised; `--assume` states what the server promises"),
        "CAP-3": reads(
            "GetModelInfo's JSON: vocab_size > 0, max_context_length > 0, every eos id < vocab_size"
        ),
        "CAP-5": na("the protocol reports no limits"),
        "HEALTH-1": na("its health is the service's HealthCheck, not grpc.health.v1's lmrpc.v1 services"),
        "HEALTH-2": na("its health is the service's HealthCheck"),
        "LOAD-1": reads(
            "GetLoad's JSON: with nothing in flight num_running_reqs, num_waiting_reqs and num_used_tokens are 0 "
            "on every rank; an open stream is counted"
        ),
        "TOK-1": na("the driver sends Tokenize's ids for a text prompt: Generate returns no prompt ids"),
        "EMBED-1": reads(
            "lmrpc.v1's Embed is OpenAIEmbed (`/v1/embeddings`' JSON): its `data` in input order, each "
            "of the dimensions discovery's first embedding had (no field says them), `usage.prompt_tokens` > 0; "
            "TextEmbed, and Embed of the ids Tokenize gives, return the vector OpenAIEmbed gives the text, "
            "with meta_info prompt_tokens > 0 (EMBED-1[native])"
        ),
        "EMBED-2": reads("OpenAIEmbed's vectors (lmrpc.v1's Embed)"),
        "EMBED-3": reads(
            "TextEmbed's and Embed's meta_info `id` is the rid sent, or a non-empty one the server assigned "
            "(SGLang takes any rid: no format to refuse)"
        ),
        "LIFE-1": na("its drain is not driven yet (its health is the service's HealthCheck)"),
        "TRACE-1": reads("the caller's traceparent on SglangService.Generate"),
        "SVC-4": reads(
            "GetServerInfo's uptime_seconds grows while the server runs and falls across a restart; the "
            "protocol names no instance"
        ),
        "LIFE-3": reads(
            "PauseGeneration's modes: `in_place` holds requests with their KV cache (GetServerInfo `is_paused`), "
            "`retract` holds them too (recomputed on ContinueGeneration, no token lost or repeated), `abort` "
            'ends every request in flight, each output "abort"; requests sent while paused wait for '
            "ContinueGeneration. FlushCache with nothing in flight answers success = true and empties the "
            "cache; with requests running it may refuse (success = false, SGLang's) and never affects them"
        ),
        "FLOW-1": na("the cases speak lmrpc.v1 over raw HTTP/2; the edge guard covers this port too"),
        "FLOW-2": na("the cases speak lmrpc.v1 over raw HTTP/2"),
        "AUTH-1": na("the protocol defines no credentials or roles"),
        "AUTH-2": na("the protocol defines no credentials or roles"),
        "AUTH-3": na("the protocol defines no credentials or roles"),
        "MODELS-1": na("ListModels answers ModelCards (id, root, parent, max_model_len); not driven yet"),
        "SCORE-1": reads(
            "Score is SGLang's `/v1/score` JSON, its HTTP status in band (`status_code`): one entry of scores per "
            "item (SGLang: a probability per label token; `label_token_ids` sent where the server asks for them), "
            "in input order, each the item's scores alone (within 1e-4), the same every time, "
            "`usage.prompt_tokens` > 0; a body without items is a 400; no request id; UNIMPLEMENTED (no model "
            "for it) is SKIP"
        ),
        "SCORE-2": reads(
            "Rerank is SGLang's `/v1/rerank` JSON: each document once by `index`, best first, equal scores by "
            "lower index (duplicate documents tie), its `document` the text sent, its score the one it gets in "
            "a Rerank of its own (SGLang scores Score and Rerank with different models); without top_n every "
            "document, with it the best min(top_n, documents); UNIMPLEMENTED (no model for it) is SKIP"
        ),
        "ADMIN-1": reads(
            "StartProfile and StopProfile answer a `message` (the trace is written on the server's host, named "
            "nowhere); a StartProfile while recording and a StopProfile with none fail with a status (SGLang: "
            "INTERNAL, its profiler's message); greedy tokens are the same while recording"
        ),
        "ADMIN-2": reads(
            "UpdateWeightsFromDisk answers `success` and `message`: a path that does not exist, or holds no "
            "model, is refused (SGLang: success = false, the reason in message; a status also reads as a "
            "refusal) and changes nothing (GetModelInfo's model_path and weight_version, greedy tokens, a "
            "stream in flight); with --weights-path the served checkpoint loads (success = true)"
        ),
    },
    {
        "REQ-1[empty-chat]": na("there is no chat input"),
        "REQ-6[default-lowered]": na(
            "the default max_new_tokens (128) is SGLang's, refused if it does not fit"
        ),
        "SAMPLE-1[max_tokens-default]": na("the default max_new_tokens is not reported"),
        "SAMPLE-1[defaults]": na(
            "no seed field: absent and explicit defaults cannot be compared token by token"
        ),
        "SAMPLE-5[n=max+1]": na("no limit on n is advertised"),
        "SAMPLE-5[top_logprobs=max+1]": na("no limit on top_logprobs_num is advertised"),
        "SAMPLE-5[stop_strings=max+1]": na("no limit on stop strings is advertised"),
        "SAMPLE-5[max_tokens=0]": na("max_new_tokens = 0 is a prefill-only request in SGLang"),
        "SAMPLE-5[top_logprobs-without-return_logprobs]": na(
            "top_logprobs_num counts only with return_logprob"
        ),
        "SAMPLE-5[return_text=return_token_ids=false]": na("no return_text / return_token_ids options"),
        "STREAM-8[seeded]": na("no seed field"),
        "ERR-1[generated]": na("its generated values include max_tokens = 0, a prefill-only request here"),
        "ERR-1[control]": na("Tokenize's text has no presence: a request without input is the empty text"),
        "STOP-1[stop-string]": na(
            "Generate's responses carry no text: STOP-1[text-generate] reads TextGenerate's"
        ),
        "STOP-1[include]": na("no no_stop_trim field: the stop text is always trimmed"),
        "STOP-1[stop-token]": na("Generate's responses carry no text"),
        **{
            case_id: na(NO_TEXT_TO_LEARN)
            for case_id in (
                "STOP-2",
                "STOP-2[later-entry]",
                "STOP-2[before-min-tokens]",
                "STOP-2[before-multibyte]",
            )
        },
        "EMBED-1[batches]": na(
            "it judges each batch's request id: OpenAIEmbed carries none (EMBED-3[native] reads TextEmbed's and "
            "Embed's)"
        ),
        "EMBED-3": na(
            "lmrpc.v1's Embed ids: OpenAIEmbed carries none, and SGLang refuses no rid format (EMBED-3[native])"
        ),
        "EMBED-3[generate-id]": na(
            "lmrpc.v1's promise that an Embed id is not a Generate id: SGLang's rids name any request, and no "
            "SGLang document says an embedding may share a Generate's"
        ),
        "SCORE-1": na(
            "lmrpc.v1's typed Score (request_id, INVALID_ARGUMENT): SCORE-1[native] reads the JSON"
        ),
        "SCORE-1[invalid]": na("lmrpc.v1's INVALID_ARGUMENT naming the field: Score answers a 400 in band"),
        "SCORE-2": na("lmrpc.v1's typed Rerank, scored as Score scores: SCORE-2[native] reads the JSON"),
        "SCORE-2[invalid]": na("lmrpc.v1's INVALID_ARGUMENT naming the field: Rerank answers a 400 in band"),
        "ERR-3[score]": na("lmrpc.v1's typed Score and Rerank"),
        "ADMIN-1": na(
            "lmrpc.v1's StartProfile answers a folder and StopProfile its trace files: ADMIN-1[native]"
        ),
        "ADMIN-1[output_dir]": na(
            "lmrpc.v1's StartProfile answers its folder and StopProfile its trace files"
        ),
        **{
            f"ADMIN-2[{tag}]": na(LMRPC_WEIGHTS)
            for tag in ("refused", "refused-in-flight", "reload", "reload-unnamed")
        },
        "LIFE-3[flush]": na(
            "SGLang refuses FlushCache while requests run (success = false): LIFE-3[native-flush] reads that"
        ),
        "USAGE-2[tokenize]": na("the driver sends Tokenize's ids: USAGE-2 is checked against them"),
        "FINISH-5[stop-token-is-eos]": na("one `matched` token id for an EOS token and a stop token alike"),
        "STOP-2[incomplete-end]": na("Generate's responses carry no text"),
        "STOP-2[incomplete-end-suffix]": na("Generate's responses carry no text"),
        "LOAD-1[waiting]": na(
            "nothing arrives before the first token: a request waiting behind a pause is silent"
        ),
        "ABORT-5[waiting]": na(
            "nothing arrives before the first token: a request waiting behind a pause is silent"
        ),
        "USAGE-7[never-ran]": na(
            "nothing arrives before the first token: a request waiting behind a pause is silent"
        ),
        **NOT_DRIVEN_CAP_1,
        "ABORT-1[prefix-id]": reads(
            "an Abort names its `rid` exactly: one that only shares a prefix with a request in flight leaves "
            "it streaming (what the Abort did shows on the stream: `success` says nothing per id)"
        ),
    },
)
