"""``openai``: the OpenAI-compatible HTTP API."""

from __future__ import annotations

from conformance.spec.profiles.base import ENGINE_ONLY, NOT_RUNTIME, Profile, na, reads

NO_HTTP = "the OpenAI API has no such thing"
NOT_HTTP_WIRE = "a gRPC wire rule: HTTP/1.1 and JSON carry nothing like it"

# The OpenAI-compatible HTTP API (chat and legacy completions, streamed as server-sent events and
# not). Its cases are its own (conformance/cases/openai/); what a server supports is learned by
# asking it (drivers/openai/support.py). Where OpenAI's API reference leaves a rule open the reading
# says so and its case is SHOULD or absent.
OPENAI = Profile(
    "openai",
    "OpenAI-compatible HTTP",
    {
        "SVC-1": reads(
            "`/v1/models` lists the model (`object` list, entries `object` model); chat and completions answer"
        ),
        "SVC-2": na("no standard health or reflection: `/health` is each server's own"),
        "SVC-3": na("no contract revision"),
        "VER-1": na("a rule for lmrpc.v1's proto files"),
        "REQ-1": reads(
            "`messages: []`, or a body without `messages` or `prompt`, is a 4xx with an error object"
        ),
        "REQ-2": reads(
            "every chunk of a stream carries the same non-empty `id`, and `object` is `chat.completion.chunk` "
            "(`text_completion` for completions); a body's `object` is `chat.completion` / `text_completion`"
        ),
        "REQ-3": na("no request ids"),
        "REQ-4": na("no request ids"),
        "REQ-5": reads("a token-id prompt (completions) with an id no vocabulary has (2³¹−1) is a 4xx"),
        "REQ-6": reads("a `max_tokens` no context window holds (10⁹) is a 4xx, as OpenAI answers it"),
        "REQ-7": na("capacity is not advertised"),
        "REQ-8": na("the server's chat template and tokenization are not observable through the API"),
        "SAMPLE-1": reads(
            "`temperature: 0` is greedy: with `logprobs`, every chosen token has the highest logprob of its "
            "`top_logprobs` (ties in any order)"
        ),
        "SAMPLE-2": reads(
            "SHOULD here (OpenAI's API promises no determinism): the same greedy request gives the same text, "
            "and the `n` choices of a greedy request are equal (where the server takes several greedy choices: "
            "vLLM refuses them by design, which the harness learns). The cases that compare two calls run only "
            "where the harness saw greedy decoding repeat (or `--assume deterministic_greedy`)"
        ),
        "SAMPLE-3": reads(
            "SHOULD here (`seed` is best effort in OpenAI's API): the same `seed` gives the same text"
        ),
        "SAMPLE-4": na("the seed in effect is not reported"),
        "SAMPLE-6": reads("with `temperature` 1 the `n` choices of a request differ"),
        "SAMPLE-5": reads(
            "a value outside OpenAI's documented range (`temperature` < 0, `top_p` outside [0, 1], `n` < 1, "
            "`max_tokens` < 1, penalties outside [−2, 2], `top_logprobs` outside [0, 20], a wrong JSON type) "
            "is a 4xx with an error object, never a 2xx or 5xx"
        ),
        "SAMPLE-7": na("`top_k` is not part of OpenAI's API"),
        "SAMPLE-8": na("OpenAI's API has none of these options"),
        "CONSTRAIN-1": reads(
            "`response_format` (chat, and legacy completions where the server visibly honours it there: OpenAI has "
            "none): a choice that ended `stop` has content that `json_schema` with `strict: true` accepts (valid "
            "against the schema), that is JSON (`strict: false`: OpenAI makes the schema best effort, so a "
            "departure is noted) or JSON (`json_object`: OpenAI promises 'valid JSON'; a value that is no object is "
            "noted); one cut at `max_tokens` a prefix of such a document, a trailing U+FFFD aside (OpenAI: the "
            "content 'may be partially cut off'); for n = 1 and 2, greedy and sampled, "
            "streamed and not. Tool calls (lmrpc.v1 has none: a forced call is a constraint on its arguments; "
            "every function offered is `strict` and the judged requests send `parallel_tool_calls: false`, as "
            "OpenAI's guarantee asks): `tool_choice: required` ('must call one or more tools') or a named "
            "function ('forces the model to call that tool') gives one call or more (that function's), unless "
            "cut at `max_tokens`; `auto` calls or not; every call has a non-empty `id`, `type: function`, an "
            "offered function's name and `arguments` a string of JSON valid against its `parameters` (a prefix "
            "when cut short), streamed (fragments joined per `index`) and not; `finish_reason` after calls is "
            "`tool_calls` (a named call may read `stop`, as OpenAI itself answers it), never `tool_calls` "
            "without one; usage adds up. Content beside forced calls is left open by OpenAI: noted. A server that declines the option "
            "(a 4xx with an error object, or a 501 with one) skips"
        ),
        "CONSTRAIN-2": reads(
            "a `json_schema` whose schema is no JSON Schema (a type none has, a string), or a strict function "
            "whose `parameters` are none, is a 4xx with an error object, as OpenAI answers it: never a 5xx, nor "
            "an answer that ignores it"
        ),
        "CONSTRAIN-3": na(
            "read through STREAM-2[openai,response_format] and STREAM-2[openai,tool-arguments] (a greedy "
            "constrained stream is its body) and CONSTRAIN-1's n = 2 and sampled requests"
        ),
        "CONSTRAIN-4": na(
            "OpenAI's strict mode documents its own subset of JSON Schema; what other servers enforce differs "
            "and nothing in the API says which keywords a server drops"
        ),
        "STREAM-1": reads(
            "chat: each choice's first chunk carries `delta.role` `assistant`, and no later chunk another role "
            "(repeating `assistant` is allowed); a body's `message.role` is `assistant`"
        ),
        "STREAM-2": reads(
            "under greedy decoding the deltas of a choice concatenate to exactly the non-streamed text: "
            "never a repeat or a cumulative text; so do a strict `json_schema` choice's, and a forced tool call's "
            "argument fragments join into the body's arguments (the same JSON value: a server may write the "
            "body's anew, as vLLM drops the whitespace its stream carries) under the same names. A streamed call "
            "sends its `id`, `type` and `function.name` in its first delta and never again (OpenAI: 'many of "
            "these fields are only set for the first delta of each tool call'; the SDK's stream helper joins "
            "repeated strings; a repeated `type: function` is harmless), then `arguments` fragments (strings), "
            "and a `finish_reason` after them"
        ),
        "STREAM-3": reads(
            "every `choices[].index` is an integer in [0, n); every `delta.tool_calls` entry carries an integer "
            "`index`, and a choice's calls are numbered 0, 1, … in the order they start, without gaps"
        ),
        "STREAM-4": na("token ids are not carried: STREAM-2 compares with the non-streamed text instead"),
        "STREAM-5": reads(
            "no delta carries U+FFFD where the non-streamed text has none (a character split across chunks)"
        ),
        "STREAM-6": reads(
            "no cross-talk: concurrent greedy streams each give their own text (the one their request gives "
            "alone, or at least closer to it than to any other's), under ids of their own"
        ),
        "STREAM-7": reads(
            "`logprobs`: one entry per token (a choice that ended `length` has `max_tokens` of them; with a stop "
            "string the stop's tokens may be left out), each `logprob` ≤ 0; chat: `top_logprobs` the asked number "
            "of most likely tokens, sorted by logprob (ties in any order; the sampled token among them unless as "
            "many tokens at least as likely fill them); legacy completions: a dict of at most the asked length, or "
            "one more when the sampled token is among them (OpenAI: up to `logprobs` + 1)"
        ),
        "STREAM-8": na("no final_only: stream=false is compared by STREAM-2"),
        "STREAM-10": na(NO_HTTP),
        "STREAM-11": na("without token ids a held-back character cannot be told from a slow one"),
        "FINISH-1": reads(
            "exactly one non-null `finish_reason` per choice (a stream that an `error` event ended excepted: ERR-2), "
            "and no content for a choice after it"
        ),
        "FINISH-2": reads(
            "the last tokens are never lost: under greedy decoding a stream's text is never a proper prefix "
            "of the non-streamed text (the tokens of the finishing chunk kept)"
        ),
        "FINISH-3": reads(
            "`data: [DONE]` ends every stream and nothing follows it; a body is one complete JSON object"
        ),
        "FINISH-4": reads(
            "`finish_reason` is one of stop, length, tool_calls, content_filter, function_call"
        ),
        "FINISH-5": reads("a choice that ended at a stop string reads `stop`"),
        "FINISH-6": reads(
            "`length` only when the choice's tokens reached `max_tokens`, and never beyond (judged where usage "
            "counts one choice: n = 1); a greedy choice that the same request with a larger `max_tokens` "
            "carries on past ended `length`"
        ),
        "FINISH-7": na("no abort"),
        "USAGE-1": reads(
            "a body carries `usage` with total = prompt + completion; with `stream_options.include_usage` exactly "
            "one chunk carries `usage`, the last before `[DONE]`, with empty `choices` (every other chunk's "
            "usage null); without it OpenAI says nothing"
        ),
        "USAGE-2": reads(
            "`prompt_tokens` counts the prompt once: the same for n = 1 and n = 2, streamed and not"
        ),
        "USAGE-3": reads(
            "`completion_tokens` is the sum over choices (judged where every choice's count is known: "
            "`max_tokens` for a choice that ended `length`)"
        ),
        "USAGE-4": reads("`prompt_tokens_details.cached_tokens`, where present, ≤ `prompt_tokens`"),
        "USAGE-5": reads(
            "no choice has more than `max_tokens` tokens; `completion_tokens` ≤ n · `max_tokens`"
        ),
        "USAGE-6": reads(
            "with `--assume prefix_cache`: the same prompt again reports `cached_tokens` > 0. The API does not "
            "say how the cache keeps prompts (vLLM keeps whole blocks), so a prompt not found again is repeated "
            "until one is, up to 1,024 tokens"
        ),
        "USAGE-7": na("no cache flush in the API"),
        "STOP-1": reads("a stop string never appears in a choice's content, also across chunk boundaries"),
        "STOP-2": reads(
            "a choice ends at the first occurrence of a stop string: its text is the greedy text without "
            "stop, cut where the stop string starts, also when its last character shares a token with the "
            "first bytes of a multi-byte character"
        ),
        "STOP-3": na("no stop token ids in OpenAI's API"),
        "STOP-4": na("no `ignore_eos` in OpenAI's API; a natural end reads `stop` (FINISH-5)"),
        "STOP-5": na("no `min_tokens` in OpenAI's API"),
        "STOP-6": reads("a stop string that starts inside a token cuts the text exactly where it starts"),
        "STOP-7": na("the stop string is never part of the content in OpenAI's API"),
        "N-1": reads("`n` choices with indices exactly 0 … n−1 (each finished once: FINISH-1)"),
        "N-2": reads(
            "n = 2 charges the prompt once and both choices' tokens: two `length` choices of `max_tokens` "
            "each report 2 · `max_tokens`"
        ),
        "ABORT-1": na("no abort: a client closes its connection (CANCEL-1)"),
        "ABORT-2": na("no abort"),
        "ABORT-3": na("no load report: CANCEL-1 judges by what a burst after the disconnect meets"),
        "ABORT-4": na("no abort"),
        "ABORT-5": na("no abort"),
        "ABORT-6": na("no abort"),
        "ABORT-7": na("no abort"),
        "CANCEL-1": reads(
            "a client that closes its connection mid-stream frees the server: a burst at the server's "
            "parallelism right after is served as fast as one before (not after the abandoned streams' length)"
        ),
        "CANCEL-2": na("no deadlines on the wire"),
        "CANCEL-3": reads("a stream closed by its client never changes a concurrent greedy stream's text"),
        "ERR-1": reads(
            "an invalid request is a 4xx with an OpenAI error object (`error.message`), also when it asked to "
            "stream: never a 2xx, a 5xx or an event stream"
        ),
        "ERR-2": reads(
            "a stream that ends without `[DONE]` sent an `error` event first (never a silent truncation)"
        ),
        "ERR-3": reads("the error's `param` or `message` names the offending field"),
        "ERR-4": reads("an unknown path, or a model the server does not list, is a 404 with an error object"),
        "ERR-5": reads(
            "after bad requests of every kind (a body that is not JSON included) the next valid request is answered"
        ),
        "MALFORMED-1": reads(
            "a body that is not JSON, or a field of the wrong JSON type, is a 4xx with an error object"
        ),
        "MALFORMED-2": na(
            "OpenAI itself refuses unknown parameters (400) while most servers ignore them: the API leaves it open"
        ),
        "MALFORMED-3": na(NOT_HTTP_WIRE),
        "MALFORMED-4": na(NOT_HTTP_WIRE),
        "CAP-1": reads(
            "an optional parameter (`n`, `logprobs`, `stream_options.include_usage`, `echo`, `stream`, "
            "`max_completion_tokens`, content as a list of text parts) is honoured or refused with a 4xx, "
            "never accepted and ignored (content parts, greedy: the answer to the same text as a string); so "
            "is `tool_choice: none` with tools offered ('the model will not call any tool'): no `tool_calls`, "
            "no `tool_calls` finish"
        ),
        "CAP-2": na("nothing is advertised: CAP-1 learns it"),
        "CAP-3": na("nothing is advertised"),
        "CAP-5": na("no limits are advertised"),
        "HEALTH-1": na("no standard health check"),
        "HEALTH-2": na("no standard health check"),
        "LOAD-1": na("no load report"),
        "TOK-1": reads(
            "where the server has a tokenizer endpoint (`/tokenize`: llama.cpp, vLLM, SGLang; smg's "
            "`/v1/tokenize`), a completion's `prompt_tokens` is its count of the prompt (with or without the "
            "special tokens it adds)"
        ),
        "TOK-2": na("no standard detokenize endpoint"),
        "EMBED-1": na("the profile covers chat and completions"),
        "EMBED-2": na("the profile covers chat and completions"),
        "EMBED-3": na("the profile covers chat and completions"),
        "LIFE-3": na("no pause"),
        "FLOW-1": reads(
            "a client that stops reading a stream never delays other requests (they are served as fast as "
            "before it)"
        ),
        "FLOW-2": na("no stall timeout is advertised"),
        "AUTH-1": reads(
            "with `--api-key`: a call without it, or with another key, is a 401 with an error object"
        ),
        "AUTH-2": na("no admin calls"),
        "AUTH-3": na("no request ids"),
        **{f"SMG-{i}": na(ENGINE_ONLY) for i in range(1, 7)},
        **NOT_RUNTIME,
    },
    otherwise=na("not part of the OpenAI profile"),
    shows_reading=True,
    revision=2,  # CAP-1 reads max_completion_tokens and content parts
)
