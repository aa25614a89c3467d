"""The fields of each protocol's schema that no case sends or reads, each with the reason
(spec/fields.py). A pattern is a glob over ``GROUP PATH``; the first that matches gives the reason.

``NOT_APPLICABLE``: nothing of the protocol's promises to judge there (another feature set: images,
audio, LoRA adapters, disaggregated serving, a profiler's internals), or a field the harness cannot
make a server send. ``OPEN``: a field a case should send or read and none does yet; each is a known
gap of the library, shown as ``open`` by ``conformance coverage`` so that it is never mistaken for
covered. A field in neither list and covered by no case fails ``conformance coverage``.
"""

from __future__ import annotations

from collections.abc import Mapping

Patterns = tuple[tuple[str, str], ...]

MEDIA = "images, audio and video: the harness judges text models (no multimodal model runs here)"
LORA = "LoRA adapters: no lmrpc clause, and the harness has no adapter to load"
DISAGG = "prefill/decode disaggregation: a pair of servers and a KV transfer, not one server's promise"
SPEC = "speculative decoding statistics: informational, no rule relates them to the output"
TRACE = "trace context for the caller's own tracing: nothing a server answers depends on it"
DP = "data-parallel rank routing: one rank is all a single server has"
PROFILE = "the profiler's own settings and messages: ADMIN-* judges only that a profile starts and stops"
HIDDEN = "hidden states: a research option no lmrpc clause or gateway reads"
FREEFORM = "free-form text for people (a message, a path): no rule constrains its content"
LOADS = "load figures with no rule against the server's observed state (LOAD-* judges the counts)"
SERVER_INFO = "configuration echoed for operators: no rule relates it to what the server does"
INPUT_LOGPROBS = "prompt logprobs: not part of lmrpc.v1, so its dialects never ask for them"
KV_EXTRA = "KV event details beyond blocks, parents and tokens: tiers, media, LoRA and salts (SMG-6)"
CONSTRAINED_ONLY = (
    "open on the fake engine: sent by CONSTRAIN-1[sglang-runtime,legacy-fields|text-generate] and "
    "CONSTRAIN-2[sglang-runtime,legacy-with-guided] where constrained decoding is served, which CI's "
    "fake-engine reference run does not"
)
OPENAI_ONLY = "an OpenAI-hosted feature open servers do not serve (see docs/protocols/openai.md)"

_SMG_COMMON: Patterns = (
    ("*.Generate request *mm_inputs*", MEDIA),
    ("*.Embed request mm_inputs*", MEDIA),
    ("*.Generate response complete.media_identity*", MEDIA),
    ("*.Generate request media_refs*", MEDIA),
    ("*.Generate request lora_id", LORA),
    ("*LoRAAdapter*", LORA),
    ("*.GetLoads response loads.lora*", LORA),
    ("*.Generate request disaggregated_params*", DISAGG),
    ("*.Generate request kv_transfer_params*", DISAGG),
    ("*.Generate response complete.kv_transfer_params*", DISAGG),
    ("*.GetLoads response loads.disaggregation*", DISAGG),
    ("*.SubscribeKvEvents response load.disaggregation*", DISAGG),
    ("*.Generate response complete.spec_*", SPEC),
    ("*.GetLoads response loads.speculative*", SPEC),
    ("*.SubscribeKvEvents response load.speculative*", SPEC),
    ("*.Generate request data_parallel_rank", DP),
    ("*.Embed request data_parallel_rank", DP),
    ("*.GetLoads request dp_rank", DP),
    ("*.GetLoads response *dp_rank*", DP),
    ("*.SubscribeKvEvents response dp_rank", DP),
    ("*.StartProfile *", PROFILE),
    ("*.StopProfile response *", PROFILE),
    ("*.FlushCache request timeout_s", "the flush's own deadline: ADMIN-* judges flushes within the call's"),
    ("*.FlushCache response message", FREEFORM),
    ("*.Abort response message", FREEFORM),
    ("*.Generate response *input_logprobs*", INPUT_LOGPROBS),
    ("*.Generate request sampling_params.prompt_logprobs", INPUT_LOGPROBS),
    ("*.Generate request sampling_params.logit_bias", "no lmrpc.v1 field carries a logit bias"),
    ("*.Generate request sampling_params.structural_tag", "structural tags: no lmrpc.v1 constraint kind"),
    ("*.Generate request sampling_params.custom_params", "engine-specific extras with no schema"),
    ("*.Generate request custom_logit_processor", "serialized Python logit processors: no lmrpc.v1 field"),
    ("*.Generate request tokenized.original_text", "a copy of the text the ids came from, for logging"),
    ("*.Embed request tokenized.original_text", "a copy of the text the ids came from, for logging"),
    ("*.SubscribeKvEvents request load_records_before_first_batch", KV_EXTRA),
    ("*.SubscribeKvEvents response events.removed.*", KV_EXTRA),
    ("*.SubscribeKvEvents response events.cleared.ownership", KV_EXTRA),
    ("*.SubscribeKvEvents response events.stored.blocks.extra_keys*", KV_EXTRA),
    ("*.SubscribeKvEvents response events.stored.blocks.lora_id", KV_EXTRA),
    ("*.SubscribeKvEvents response events.stored.blocks.cache_level", KV_EXTRA),
    ("*.SubscribeKvEvents response events.stored.*", KV_EXTRA),
    ("*.SubscribeKvEvents response load*", LOADS),
    ("*.SubscribeKvEvents response timestamp", LOADS),
    (
        "*.SubscribeKvEvents response snapshot.blocks",
        "snapshot paging: SMG-6 subscribes from batch 0 and reads counts",
    ),
    ("*.SubscribeKvEvents response snapshot.unknown_before", KV_EXTRA),
    ("*.GetLoads request include", "section filters of the load report: the harness asks for all of it"),
    ("*.GetLoads response *", LOADS),
    ("*.GetServerInfo response *", SERVER_INFO),
    ("*.GetModelInfo response *", SERVER_INFO),
)

_OPEN_SMG: Patterns = (
    (
        "*.SubscribeKvEvents request start_sequence_number",
        "open: every replay starts from a number SMG-6 saw",
    ),
    ("*.SubscribeKvEvents response events.removed*", "open: no case evicts blocks, so no removal is judged"),
    ("*.SubscribeKvEvents response events.event_id", "open: event ids are not checked for uniqueness"),
    ("*.Embed request *", "open: EMBED-* sends text or ids only; the other fields are not sent yet"),
    ("*.Embed response *", "open: EMBED-* reads the vector through the lmrpc view only"),
    ("*.Generate request timestamp*", "open: a request's arrival time for queue metrics, not judged"),
    ("*.Generate request log_metrics", "open: metrics logging switch, not judged"),
    ("*.Generate request input_embeds", "open: embeddings as input: no case sends them"),
    ("*.Generate request return_hidden_states", HIDDEN),
    ("*.Generate response *hidden_states*", HIDDEN),
    ("*.Generate request require_reasoning", "open: reasoning (issue 47)"),
    ("*.Generate response *reasoning_tokens", "open: reasoning (issue 47)"),
    ("*.Generate request token_ids_logprob", "open: logprobs of chosen ids: no lmrpc.v1 field yet"),
    ("*.Generate response *token_ids_logprobs*", "open: logprobs of chosen ids: no lmrpc.v1 field yet"),
    ("*.Generate request sampling_params.stream_interval", "open: chunking interval, checked only as deltas"),
    ("*.Generate request sampling_params.grammar_from_first_token", "open: constraint timing, not sent"),
    ("*.Generate request sampling_params.truncate_prompt_tokens", "open: prompt truncation, not sent"),
    (
        "*.Generate request text",
        "open: vLLM's text input; lmrpc.v1 cases send token ids through this dialect",
    ),
)

NOT_APPLICABLE: Mapping[str, Patterns] = {
    "lmrpc": (
        (
            "InferenceService.* response usage.completion_tokens",
            "a usage field that is 0 by definition for this RPC",
        ),
        (
            "InferenceService.* response usage.cached_prompt_tokens",
            "cache reuse counts for scoring RPCs: no rule",
        ),
        ("ControlService.GetModelInfo response model.architecture", SERVER_INFO),
        ("ControlService.GetServerInfo response server.limits.drain_timeout_seconds", SERVER_INFO),
    ),
    "vllm-engine": (*_SMG_COMMON,),
    "sglang-scheduler": (*_SMG_COMMON,),
    "sglang-runtime": (
        ("SglangService.* request trace_headers", TRACE),
        ("SglangService.* request routing_key", "a key for a router in front: one server routes nothing"),
        ("SglangService.* request routed_dp_rank", DP),
        ("SglangService.GetLoad request dp_rank", DP),
        ("SglangService.* request *disaggregated_params*", DISAGG),
        ("SglangService.* request image_data", MEDIA),
        ("SglangService.* request audio_data", MEDIA),
        ("SglangService.* request video_data", MEDIA),
        ("SglangService.* request lora_path", LORA),
        (
            "SglangService.* request kv_hints*",
            "KV placement hints for a cache tier: not one server's promise",
        ),
        ("SglangService.* request *structural_tag", "structural tags: no lmrpc.v1 constraint kind"),
        ("SglangService.StartProfile *", PROFILE),
        ("SglangService.StopProfile response *", PROFILE),
        ("SglangService.ContinueGeneration response message", FREEFORM),
        (
            "SglangService.UpdateWeightsFromDisk request load_format",
            "the checkpoint's format: the harness reloads the one served",
        ),
        ("SglangService.WatchEngineState response *info*", SERVER_INFO),
        ("SglangService.ListModels response models.*", SERVER_INFO),
        ("SglangService.Tokenize response max_model_len", SERVER_INFO),
        ("SglangService.Tokenize response input_text", "an echo of the request's text"),
        (
            "SglangService.* request session_id",
            "stateful sessions: an SGLang extension no lmrpc.v1 clause has",
        ),
        ("SglangService.* request priority", "priority scheduling: no lmrpc.v1 field"),
        ("SglangService.* request logprob_start_len", INPUT_LOGPROBS),
    ),
    "openai": (
        ("chat/completions request audio*", OPENAI_ONLY),
        ("chat/completions request modalities", OPENAI_ONLY),
        ("chat/completions request moderation*", OPENAI_ONLY),
        ("chat/completions request prediction*", OPENAI_ONLY),
        ("chat/completions request prompt_cache*", OPENAI_ONLY),
        ("chat/completions request safety_identifier", OPENAI_ONLY),
        ("chat/completions request service_tier", OPENAI_ONLY),
        ("chat/completions request store", OPENAI_ONLY),
        ("chat/completions request metadata", OPENAI_ONLY),
        ("chat/completions request verbosity", OPENAI_ONLY),
        ("chat/completions request web_search_options*", OPENAI_ONLY),
        ("chat/completions request messages.audio*", MEDIA),
        ("chat/completions request messages.content.file*", MEDIA),
        ("chat/completions request messages.content.image_url*", MEDIA),
        ("chat/completions request messages.content.input_audio*", MEDIA),
        ("chat/completions request messages.content.prompt_cache_breakpoint*", OPENAI_ONLY),
        ("chat/completions request *stream_options.include_obfuscation", OPENAI_ONLY),
        ("completions request stream_options.include_obfuscation", OPENAI_ONLY),
        (
            "chat/completions request *custom*",
            "custom (free-text) tools: OpenAI's, no open server serves them",
        ),
        ("chat/completions request tool_choice.allowed_tools*", OPENAI_ONLY),
        ("chat/completions request function_call*", "the functions API that tools replaced (deprecated)"),
        ("chat/completions request functions*", "the functions API that tools replaced (deprecated)"),
        (
            "chat/completions request messages.function_call*",
            "the functions API that tools replaced (deprecated)",
        ),
        (
            "chat/completions request user",
            "an end-user id for abuse monitoring: nothing a server answers depends on it",
        ),
        (
            "completions request user",
            "an end-user id for abuse monitoring: nothing a server answers depends on it",
        ),
        ("* moderation*", OPENAI_ONLY),
        ("* service_tier", OPENAI_ONLY),
        ("* system_fingerprint", "a backend configuration id; open servers send a constant or nothing"),
        ("* metadata", OPENAI_ONLY),
        ("chat.completion.chunk obfuscation", OPENAI_ONLY),
        ("* choices.message.audio*", MEDIA),
        ("* choices.delta.audio*", MEDIA),
        ("* choices.message.annotations*", "web search citations: OpenAI-hosted search only"),
        ("* *function_call*", "the functions API that tools replaced (deprecated)"),
        ("* *tool_calls.custom*", "custom (free-text) tools: OpenAI's, no open server serves them"),
        ("* usage.*_tokens_details.audio_tokens", MEDIA),
        ("* usage.*_tokens_details.image_tokens", MEDIA),
        ("* usage.completion_tokens_details.*prediction_tokens", OPENAI_ONLY),
        ("* usage.prompt_tokens_details.cache_write_tokens", OPENAI_ONLY),
        ("list data.shutdown_date", OPENAI_ONLY),
        ("error error.misalignment*", OPENAI_ONLY),
    ),
}

OPEN: Mapping[str, Patterns] = {
    "lmrpc": (
        ("InferenceService.Generate response error.*", "open: no case provokes an in-stream error event"),
        ("InferenceService.Rerank response *", "open: RERANK reads results only, not its id and usage"),
        ("ControlService.GetModelInfo response model.bos_token_id", "open: no case checks the BOS id"),
        ("ControlService.GetLoad response current.kv_tokens_cached", "open: no case relates it to the cache"),
        ("ControlService.FlushCache response released_tokens", "open: no case relates it to the cache"),
        ("ControlService.UpdateWeights *weights_version", "open: ADMIN-2 reloads without naming a version"),
    ),
    "vllm-engine": (*_OPEN_SMG,),
    "sglang-scheduler": (
        *_OPEN_SMG,
        ("SglangScheduler.Embed request *", "open: EMBED-* sends text or ids only"),
        ("SglangScheduler.Embed response *", "open: EMBED-* reads the vector through the lmrpc view only"),
    ),
    "sglang-runtime": (
        (
            "SglangService.Generate request sampling_params.json_schema",
            "open: the older constraint fields are not sent",
        ),
        (
            "SglangService.Generate request sampling_params.regex",
            "open: the older constraint fields are not sent",
        ),
        (
            "SglangService.TextGenerate request sampling_params.*",
            "open: TextGenerate is sent with few options",
        ),
        ("SglangService.TextGenerate request return_logprob", "open: TextGenerate is sent without logprobs"),
        (
            "SglangService.TextGenerate request return_text_in_logprobs",
            "open: TextGenerate is sent without logprobs",
        ),
        (
            "SglangService.TextGenerate request top_logprobs_num",
            "open: TextGenerate is sent without logprobs",
        ),
        ("SglangService.* request sampling_params.seed", "open: seeds are not sent (no seed is advertised)"),
        ("SglangService.* request max_thinking_tokens", "open: reasoning (issue 47)"),
        ("SglangService.* request require_reasoning", "open: reasoning (issue 47)"),
        (
            "SglangService.Generate request return_text",
            "open: the server's detokenized text is not asked for",
        ),
        ("SglangService.*Complete *", "open: the OpenAI routes of the native service are judged as openai"),
        ("SglangService.OpenAI* *", "open: the OpenAI routes of the native service are judged as openai"),
        ("SglangService.Classify *", "open: no case classifies"),
        ("SglangService.Generate response text", "open: the text the server detokenized is not read"),
        ("SglangService.Tokenize request add_special_tokens", "open: not sent"),
        ("SglangService.Tokenize response count", "open: not read"),
        ("SglangService.HealthCheck response healthy", "open: read through the standard health service"),
        ("SglangService.WatchEngineState response *", "open: not read"),
        ("SglangService.ContinueGeneration response *", "open: not read"),
        ("SglangService.GetLoad *", "open: not read"),
    ),
    "openai": (
        (
            "chat/completions request messages.content.refusal",
            "open: an assistant's refusal part is not sent",
        ),
        ("chat/completions request messages.name", "open: not sent"),
        ("chat/completions request messages.refusal", "open: not sent"),
        (
            "chat/completions request messages.tool_call*",
            "open: no tool result round trip is sent (issue 46)",
        ),
        ("chat/completions request logit_bias", "open: not sent"),
        ("completions request logit_bias", "open: not sent"),
        ("chat/completions request reasoning_effort", "open: reasoning (issue 47)"),
        ("chat/completions request response_format.json_schema.description", "open: not sent"),
        ("completions request best_of", "open: not sent"),
        ("completions request suffix", "open: not sent"),
        ("* choices.logprobs.refusal*", "open: no case provokes a refusal"),
        ("* choices.message.refusal", "open: no case provokes a refusal"),
        ("* choices.delta.refusal", "open: no case provokes a refusal"),
        ("* choices.logprobs.content.bytes", "open: token bytes are not checked against the text"),
        (
            "* choices.logprobs.content.top_logprobs.bytes",
            "open: token bytes are not checked against the text",
        ),
        ("text_completion choices.logprobs.*", "open: completions logprobs are not read"),
        ("* created", "open: not checked"),
        ("* model", "open: the answer's model is not compared with the request's"),
        ("* usage.completion_tokens_details*", "open: reasoning tokens (issue 47)"),
        ("* usage.prompt_tokens_details.*", "open: not read"),
        ("list data.created", "open: not read"),
        ("list data.owned_by", "open: not read"),
        ("error error.code", "open: the error object's code is not read"),
        ("error error.type", "open: the error object's type is not read (issue 46: Anthropic error types)"),
    ),
}
