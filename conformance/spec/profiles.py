"""Per-protocol clause profiles: for each protocol the harness drives, whether each clause of
docs/contract.md applies there, how it reads there, or why it cannot be checked there.

lmrpc.v1 is the contract itself: every clause applies as written (the engine clauses of §14 do
not). The engine protocols of smg (``vllm-engine``, ``sglang-scheduler``) carry less: no text, no
PromptInfo, one ``matched_token_id`` for EOS and stop token, no capabilities; each reading says
what the gateway relies on instead, with the smg source it comes from. ``conformance list
--protocol X`` prints a profile; the table in docs/conformance.md is ``markdown_table()``.

A case of a clause that does not apply is SKIP, with the reason; a case override narrows a
clause that applies to some of its cases only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conformance.spec.clauses import CLAUSES

if TYPE_CHECKING:
    from conformance.spec.registry import Case


@dataclass(frozen=True, slots=True)
class Reading:
    applies: bool
    text: str = ""  # how the clause reads there (applies), or why it cannot be checked there


AS_WRITTEN = Reading(True)


def reads(text: str) -> Reading:
    return Reading(True, text)


def na(text: str) -> Reading:
    return Reading(False, text)


@dataclass(frozen=True, slots=True)
class Profile:
    protocol: str
    title: str
    clauses: Mapping[str, Reading]  # clause ID -> reading; a clause not listed applies as written
    cases: Mapping[str, Reading] = field(default_factory=dict)  # case ID -> reading, overriding its clause's
    otherwise: Reading = AS_WRITTEN  # the reading of a clause not listed

    def clause(self, clause_id: str) -> Reading:
        clause = CLAUSES[clause_id]
        if clause.unchecked is not None:
            return na(f"unchecked: {clause.unchecked}")
        return self.clauses.get(clause_id, self.otherwise)

    def case(self, case: Case) -> Reading:
        return self.cases.get(case.id) or self.clause(case.clause.id)


NO_TEXT = "no text: the gateway detokenizes (and matches stop strings again itself)"
ENGINE_ONLY = (
    "engine protocols only: lmrpc.v1 has LOAD-1, ABORT-3 and HEALTH-1/2 instead, and no GetTokenizer"
)

RUNTIME_ONLY = "sglang.runtime.v1 only (contract §15): lmrpc.v1 states these rules in its own clauses"
NOT_RUNTIME = {f"SRT-{i}": na(RUNTIME_ONLY) for i in range(1, 5)}
# Contract revision 3's RPCs: each capability-gated; other protocols' drivers do not drive them.
REVISION_3_FLAGS = ("list_models", "score", "profiler", "weight_updates")
NOT_DRIVEN_CAP_1 = {f"CAP-1[{flag}]": na("lmrpc.v1's capability flag") for flag in REVISION_3_FLAGS}

LMRPC = Profile(
    "lmrpc",
    "lmrpc.v1",
    {**{f"SMG-{i}": na(ENGINE_ONLY) for i in range(1, 7)}, **NOT_RUNTIME},
)

# What both engine protocols share; each protocol's profile overrides some of it.
_ENGINE: dict[str, Reading] = {
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
    "USAGE-6": reads("with `--assume prefix_cache`: a repeated prompt reports cached_tokens > 0"),
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

_ENGINE_CASES: dict[str, Reading] = {
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
}

VLLM = Profile(
    "vllm-engine",
    "vllm.grpc.engine (smg)",
    {
        **_ENGINE,
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
        "ABORT-6": reads("an Abort that overtakes its Generate still wins (Abort reports no outcome)"),
        "SMG-4": reads(
            "on a vLLM port, SGLang's HealthCheck (which smg probes first) answers a non-OK status"
        ),
    },
    {
        **_ENGINE_CASES,
        "SAMPLE-5[top_p=0]": na("top_p = 0 reads as unset"),
        "SAMPLE-5[repetition_penalty=11]": na("vLLM puts no upper bound on repetition_penalty"),
        "SAMPLE-5[top_logprobs-without-return_logprobs]": na("one logprobs field: a count means logprobs on"),
    },
)

SGLANG = Profile(
    "sglang-scheduler",
    "sglang.grpc.scheduler (smg)",
    {
        **_ENGINE,
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
        "ABORT-6": reads("an Abort that overtakes its Generate (success = false) still wins"),
        "SMG-4": reads(
            "SGLang is the first protocol smg probes: its HealthCheck answering OK is what finds it"
        ),
    },
    {
        **_ENGINE_CASES,
        "ABORT-1[duplicate-ids]": na("one id per call"),
        "SAMPLE-5[max_tokens=0]": na("max_new_tokens = 0 is a prefill-only request in SGLang"),
        "SAMPLE-5[top_logprobs-without-return_logprobs]": na(
            "top_logprobs_num counts only with return_logprob"
        ),
        "SAMPLE-1[defaults]": na(
            "no seed field: absent and explicit defaults cannot be compared token by token"
        ),
        "STREAM-8[seeded]": na("no seed field"),
    },
)

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
            "`temperature: 0` is greedy: with `logprobs`, every chosen token is the first of its `top_logprobs`"
        ),
        "SAMPLE-2": reads(
            "SHOULD here (OpenAI's API promises no determinism): the same greedy request gives the same text, "
            "and the `n` choices of a greedy request are equal. The cases that compare two calls run only where "
            "the harness saw greedy decoding repeat (or `--assume deterministic_greedy`)"
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
        "STREAM-1": reads(
            "chat: each choice's first chunk carries `delta.role` `assistant`, and no later chunk another role; "
            "a body's `message.role` is `assistant`"
        ),
        "STREAM-2": reads(
            "under greedy decoding the deltas of a choice concatenate to exactly the non-streamed text: "
            "never a repeat or a cumulative text"
        ),
        "STREAM-3": reads("every `choices[].index` is an integer in [0, n)"),
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
            "string the stop's tokens may be left out), each `logprob` ≤ 0, `top_logprobs` of the asked length "
            "sorted by logprob (legacy completions: a dict of at most the asked length)"
        ),
        "STREAM-8": na("no final_only: stream=false is compared by STREAM-2"),
        "STREAM-10": na(NO_HTTP),
        "STREAM-11": na("without token ids a held-back character cannot be told from a slow one"),
        "FINISH-1": reads(
            "exactly one non-null `finish_reason` per choice, and no content for a choice after it"
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
            "counts one choice: n = 1)"
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
        "USAGE-6": reads("with `--assume prefix_cache`: the same prompt again reports `cached_tokens` > 0"),
        "USAGE-7": na("no cache flush in the API"),
        "STOP-1": reads("a stop string never appears in a choice's content, also across chunk boundaries"),
        "STOP-2": reads(
            "a choice ends at the first occurrence of a stop string: its text is the greedy text without "
            "stop, cut where the stop string starts"
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
            "an optional parameter (`n`, `logprobs`, `stream_options.include_usage`, `echo`, `stream`) is "
            "honoured or refused with a 4xx, never accepted and ignored"
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
            "stop_token_ids or the model's eos_token_ids, or one of the request's stop strings"
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
        "USAGE-6": reads("with `--assume prefix_cache`: a repeated prompt reports cached_tokens > 0"),
        "STOP-1": na("Generate's responses carry no text (SRT-1[text] reads TextGenerate's)"),
        "STOP-4": reads("an EOS end reports `matched` = the EOS id"),
        "STOP-7": na("no no_stop_trim field: the stop text is always trimmed"),
        "N-2": na("no request total: each output's counts are USAGE-2's and USAGE-5's"),
        "ABORT-1": na("`success` says nothing per id (SRT-4)"),
        "ABORT-2": reads(
            'the stream ends promptly: every unfinished output gets a last response with finish_reason "abort", '
            "then status OK"
        ),
        "ABORT-5": reads("`abort_all` ends every request in flight (it reports no outcomes)"),
        "ABORT-6": reads("an Abort that overtakes its Generate still wins (`success` says nothing per id)"),
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
        "EMBED-1": na("Embed is not driven"),
        "EMBED-2": na("Embed is not driven"),
        "EMBED-3": na("Embed is not driven"),
        "LIFE-1": na("its drain is not driven yet (its health is the service's HealthCheck)"),
        "TRACE-1": reads("the caller's traceparent on SglangService.Generate"),
        "SVC-4": reads(
            "GetServerInfo's uptime_seconds grows while the server runs and falls across a restart; the "
            "protocol names no instance"
        ),
        "LIFE-3": reads(
            "PauseGeneration `in_place` holds requests with their KV cache (GetServerInfo `is_paused`); "
            "ContinueGeneration resumes them"
        ),
        "FLOW-1": na("the cases speak lmrpc.v1 over raw HTTP/2; the edge guard covers this port too"),
        "FLOW-2": na("the cases speak lmrpc.v1 over raw HTTP/2"),
        "AUTH-1": na("the protocol defines no credentials or roles"),
        "AUTH-2": na("the protocol defines no credentials or roles"),
        "AUTH-3": na("the protocol defines no credentials or roles"),
        "MODELS-1": na("ListModels answers ModelCards (id, root, parent, max_model_len); not driven yet"),
        "SCORE-1": na("Score is OpenAI JSON (`/v1/score`); not driven yet"),
        "SCORE-2": na("Rerank is OpenAI JSON (`/v1/rerank`); not driven yet"),
        "ADMIN-1": na("StartProfile and StopProfile answer a message only, no trace files; not driven yet"),
        "ADMIN-2": na("UpdateWeightsFromDisk reports no weights version; not driven yet"),
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
        "ERR-1[embed]": na("Embed is not driven"),
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
        **NOT_DRIVEN_CAP_1,
    },
)

PROFILES: dict[str, Profile] = {p.protocol: p for p in (LMRPC, VLLM, SGLANG, SGLANG_RUNTIME, OPENAI)}
GRPC_PROFILES: tuple[Profile, ...] = (LMRPC, VLLM, SGLANG, SGLANG_RUNTIME)


def _cell(profile: Profile, clause_id: str, case_ids: list[str]) -> str:
    reading = profile.clause(clause_id)
    if reading.text.startswith("unchecked: "):
        return reading.text
    text = ("✓" if reading.applies else "—") + (f" {reading.text}" if reading.text else "")
    if reading.applies:
        narrowed = [f"`{i}`: {profile.cases[i].text}" for i in case_ids if i in profile.cases]
        if narrowed:
            text += " — not " + "; not ".join(narrowed)
    return text.replace("|", "\\|")


def markdown_table(case_ids: Mapping[str, list[str]], profiles: tuple[Profile, ...] = GRPC_PROFILES) -> str:
    """Every clause of docs/contract.md, one row each, read for every protocol of ``profiles``
    (``case_ids``: each clause's case IDs, for the cases a profile leaves out)."""
    header = "| clause | level | " + " | ".join(f"{p.title} (`{p.protocol}`)" for p in profiles) + " |"
    lines = [header, "|---|---|" + "---|" * len(profiles)]
    for clause in CLAUSES.values():
        cells = [_cell(p, clause.id, case_ids.get(clause.id, [])) for p in profiles]
        lines.append(f"| {clause.id} | {clause.level.value} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def clause_text(protocol: str, clause_id: str) -> str:
    """What a failure of ``clause_id`` is shown with: the clause as written, or, in the OpenAI
    profile (whose cases check its reading, not lmrpc.v1's wire), the reading."""
    reading = PROFILES[protocol].clause(clause_id) if protocol in PROFILES else AS_WRITTEN
    if protocol == OPENAI.protocol and reading.applies and reading.text:
        return f"{reading.text} (the OpenAI reading)"
    return CLAUSES[clause_id].text
