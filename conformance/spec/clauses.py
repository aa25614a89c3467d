"""The numbered clauses of docs/contract.md (revision 1), mirrored so an installed harness needs no docs.

``tests/unit/conformance/test_conformance_clauses.py`` parses docs/contract.md and fails when this table drifts
from it (an ID, level, section or rule text that differs), so the mirror cannot go stale silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

CONTRACT_REVISION = 1


class Level(StrEnum):
    """How binding a clause is: MUST gates conformance, SHOULD is checked by ``--level should``."""

    MUST = "MUST"
    SHOULD = "SHOULD"


MUST = Level.MUST
SHOULD = Level.SHOULD


@dataclass(frozen=True, slots=True)
class Clause:
    id: str
    level: Level
    section: str
    text: str
    unchecked: str | None = None  # why a black-box client cannot check it, when it cannot

    @property
    def checkable(self) -> bool:
        return self.unchecked is None


_TABLE: tuple[Clause, ...] = (
    Clause(
        "SVC-1",
        MUST,
        "Services",
        "A server serves `lmrpc.v1.InferenceService` and `lmrpc.v1.ControlService`. An RPC it does not serve answers `UNIMPLEMENTED` (capabilities say which optional RPCs are served, CAP-1).",
    ),
    Clause(
        "SVC-2",
        MUST,
        "Services",
        "A server serves the standard `grpc.health.v1.Health` service (see §11) and gRPC server reflection (`grpc.reflection.v1` and `v1alpha`) describing both lmrpc services.",
    ),
    Clause(
        "SVC-3",
        MUST,
        "Services",
        "`ServerInfo.contract_revision` is the revision of this document the server implements (this one: 1).",
    ),
    Clause(
        "VER-1",
        MUST,
        "Services",
        "Within `lmrpc.v1` every change is backward compatible on the wire (`buf breaking`, FILE rules): fields and services are added, never renamed, renumbered or removed. New behaviour comes with a new optional field and, where a server may lack it, a capability flag; the meaning of an existing field never changes.",
        unchecked="static wire-compatibility rule, checked by `buf breaking`, not at run time",
    ),
    Clause(
        "REQ-1",
        MUST,
        "Requests",
        "Exactly one member of `GenerateRequest.input` is set; otherwise `INVALID_ARGUMENT`. A prompt that is empty after tokenization or templating is `INVALID_ARGUMENT`.",
    ),
    Clause(
        "REQ-2",
        MUST,
        "Requests",
        "Every `GenerateResponse` carries the request's `request_id`: the client's, or, when the client sent an empty one, a server-assigned id that is unique among requests in flight.",
    ),
    Clause(
        "REQ-3",
        MUST,
        "Requests",
        "A `Generate` whose `request_id` equals that of a request in flight fails with `ALREADY_EXISTS` and no messages; the request in flight is not affected. Once a request's terminal message was sent (or its stream cancelled and its resources released), its id may be used again.",
    ),
    Clause(
        "REQ-4",
        MUST,
        "Requests",
        "`request_id` is at most 128 bytes of `[A-Za-z0-9._:/-]`; anything else is `INVALID_ARGUMENT`.",
    ),
    Clause(
        "REQ-5",
        MUST,
        "Requests",
        "Every token id in `token_ids` input is `< ModelInfo.vocab_size`; otherwise `INVALID_ARGUMENT`.",
    ),
    Clause(
        "REQ-6",
        MUST,
        "Requests",
        "The prompt plus `max_tokens` must fit `ModelInfo.max_context_tokens`. When `max_tokens` is present and does not fit: `INVALID_ARGUMENT`. When it is absent the default is lowered to what the window leaves; a prompt that leaves no room at all is `INVALID_ARGUMENT`.",
    ),
    Clause(
        "REQ-7",
        MUST,
        "Requests",
        "A request that can never be served by this server (for example its `n` outputs need more KV-cache space than the server has in total) fails with `RESOURCE_EXHAUSTED`. A request that merely has to wait for capacity is accepted and waits; it never fails for that reason.",
    ),
    Clause(
        "SAMPLE-1",
        MUST,
        "Sampling options",
        'A sampling or stopping scalar that is absent takes the value in `ModelInfo.defaults`; one that is present takes exactly the value sent, zero included. `temperature = 0` means greedy decoding (and is never confused with "unset"). `n` absent means 1.',
    ),
    Clause(
        "SAMPLE-2",
        MUST,
        "Sampling options",
        "If `Capabilities.deterministic_greedy`: a greedy request gives the same tokens every time for the same prompt and options, whatever else the server is running; the `n` outputs of a greedy request are identical.",
    ),
    Clause(
        "SAMPLE-3",
        MUST,
        "Sampling options",
        "If `Capabilities.seeded_sampling`: the same prompt, options and `seed` give the same tokens every time, whatever else the server is running. Output `i` of an n>1 request samples from a stream derived from `(seed, i)`.",
    ),
    Clause(
        "SAMPLE-4",
        MUST,
        "Sampling options",
        "`PromptInfo.seed` is the seed in effect: the request's, or the one the server picked when it was absent. Sending that seed back reproduces the outputs (with SAMPLE-3).",
    ),
    Clause(
        "SAMPLE-5",
        MUST,
        "Sampling options",
        "Values outside these ranges are `INVALID_ARGUMENT`: `temperature` ≥ 0 and finite; `top_p` in (0, 1]; `min_p` in [0, 1]; `frequency_penalty`, `presence_penalty` in [-2, 2]; `repetition_penalty` in (0, 10]; `n` in [1, `Capabilities.max_outputs`]; `max_tokens` ≥ 1; `min_tokens` ≤ `max_tokens` (effective values); `top_logprobs` ≤ `Capabilities.max_top_logprobs`; each stop string non-empty and at most `Capabilities.max_stop_strings` of them; `return_text` and `return_token_ids` not both false.",
    ),
    Clause(
        "SAMPLE-6",
        SHOULD,
        "Sampling options",
        "With `temperature > 0` and a seed, the `n` outputs of one request differ from each other (they use distinct streams, SAMPLE-3).",
    ),
    Clause(
        "SAMPLE-7",
        MUST,
        "Sampling options",
        "If `Capabilities.truncation_sampling`: `top_k = 1` (at any temperature) gives the greedy tokens.",
    ),
    Clause(
        "STREAM-1",
        MUST,
        "The stream",
        "The first message is a `PromptInfo`, and no other message is a `PromptInfo`. `PromptInfo.num_outputs` is the effective `n`.",
    ),
    Clause(
        "STREAM-2",
        MUST,
        "The stream",
        "**Deltas only.** A `TokenDelta` carries only tokens generated since the previous delta of the same output: never a repeat, never a cumulative list. Concatenating an output's `token_ids` in order gives exactly the output's tokens, every token included (also when one engine step produced several).",
    ),
    Clause(
        "STREAM-3",
        MUST,
        "The stream",
        "`output_index` is present on every `TokenDelta` and `OutputFinished`, also for output 0, and lies in `[0, n)`.",
    ),
    Clause(
        "STREAM-4",
        MUST,
        "The stream",
        "Concatenating an output's text deltas gives `Detokenize(token_ids, skip_special_tokens)` of that output, except that matched stop text is removed as STOP-1 says. No character is lost or duplicated.",
    ),
    Clause(
        "STREAM-5",
        MUST,
        "The stream",
        "Every text delta is well-formed UTF-8 and never ends inside a character. A text delta never contains U+FFFD unless the detokenized token ids themselves contain it (an invalid byte sequence); incomplete characters are held back until they complete.",
    ),
    Clause(
        "STREAM-6",
        MUST,
        "The stream",
        "A stream carries only its own request's events (no cross-talk between concurrent requests).",
    ),
    Clause(
        "STREAM-7",
        MUST,
        "The stream",
        "If `return_logprobs` (and `Capabilities.logprobs`): each delta carries exactly one `TokenLogprob` per token, in the same order, with `token_id` equal to the token; `logprob` ≤ 0; `rank` ≥ 1; `top` has `top_logprobs` entries sorted by decreasing logprob; when the sampled token is among them its logprob matches; `rank = 1` exactly when it is the top candidate. Without `return_logprobs` no logprobs are sent.",
    ),
    Clause(
        "STREAM-8",
        MUST,
        "The stream",
        "With `final_only` (and `Capabilities.final_only`) the same event types are used: `PromptInfo`, then for each output exactly one `TokenDelta` holding all its tokens and text followed by its `OutputFinished`, then `Usage` on the terminal message. For a greedy or seeded request the result equals that of the streamed request.",
    ),
    Clause(
        "STREAM-9",
        MUST,
        "The stream",
        "(client rule) A server may merge consecutive deltas of one output, for example when the client reads slowly; a client must not assume one token per delta.",
        unchecked="a rule for clients",
    ),
    Clause(
        "STREAM-10",
        MUST,
        "The stream",
        "`return_text = false` sends empty `text`; `return_token_ids = false` sends empty `token_ids`; the other fields are unaffected. `return_prompt_token_ids` fills `PromptInfo.prompt_token_ids` with exactly the prompt that `prompt_tokens` counts.",
    ),
    Clause(
        "FINISH-1",
        MUST,
        "Finishing",
        "Each output gets exactly one `OutputFinished`, and no event for that output follows it (other outputs may continue). A stream never ends with status OK while an output is unfinished, unless its terminal message is a `RequestError`.",
    ),
    Clause(
        "FINISH-2",
        MUST,
        "Finishing",
        "**The last tokens are never lost.** Every token of an output is delivered in a `TokenDelta` before that output's `OutputFinished`; `OutputFinished` carries no tokens.",
    ),
    Clause(
        "FINISH-3",
        MUST,
        "Finishing",
        "The terminal message is the `OutputFinished` of the last unfinished output, or a `RequestError`. After it the server sends nothing and ends the call with status OK.",
    ),
    Clause("FINISH-4", MUST, "Finishing", "`OutputFinished.reason` is never `FINISH_REASON_UNSPECIFIED`."),
    Clause(
        "FINISH-5",
        MUST,
        "Finishing",
        "`stop` is set if and only if `reason` is `FINISH_REASON_STOP`, and says what matched: `eos_token_id` is one of `ModelInfo.eos_token_ids` and the output's last token; `stop_token_id` is one of the request's `stop_token_ids` and the output's last token; `stop_string` is one of the request's `stop_strings`, verbatim. A token that is both a requested stop token and an EOS token reports `stop_token_id`.",
    ),
    Clause(
        "FINISH-6",
        MUST,
        "Finishing",
        "`FINISH_REASON_LENGTH` means the output has `max_tokens` tokens or the context window is full. With `ignore_eos` and no stop conditions an output ends with `LENGTH` after exactly `max_tokens` tokens (when the window allows).",
    ),
    Clause(
        "USAGE-1",
        MUST,
        "Usage and token counts",
        "`Usage` is set on the terminal message and on no other message.",
    ),
    Clause(
        "USAGE-2",
        MUST,
        "Usage and token counts",
        "`Usage.prompt_tokens` equals `PromptInfo.prompt_tokens` and the number of ids `Tokenize` returns for the same input (TOK-1). It counts the prompt once, whatever `n` is.",
    ),
    Clause(
        "USAGE-3",
        MUST,
        "Usage and token counts",
        "`Usage.completion_tokens` is the sum of `OutputFinished.completion_tokens` over the outputs that finished.",
    ),
    Clause(
        "USAGE-4", MUST, "Usage and token counts", "`Usage.cached_prompt_tokens` ≤ `Usage.prompt_tokens`."
    ),
    Clause(
        "USAGE-5",
        MUST,
        "Usage and token counts",
        "`OutputFinished.completion_tokens` equals the number of token ids the output's deltas carried (when `return_token_ids`), is ≤ `max_tokens`, and is ≥ `min_tokens` unless the output was aborted or hit the context window.",
    ),
    Clause(
        "USAGE-6",
        MUST,
        "Usage and token counts",
        "If `Capabilities.prefix_cache`: sending the same prompt again, after the first request finished, reports `cached_prompt_tokens > 0` (for prompts of at least 2 tokens) and, for a greedy request, the same output.",
    ),
    Clause(
        "STOP-1",
        MUST,
        "Stop conditions",
        "Unless `include_stop_in_output`, the text of the matched stop string, stop token or EOS token never appears in the output's text, in any delta, even briefly: text that could still become part of a stop string is held back until it cannot. With `include_stop_in_output` the text ends with the matched stop string. Token ids are never removed (STREAM-2).",
    ),
    Clause(
        "STOP-2",
        MUST,
        "Stop conditions",
        "If `Capabilities.stop_strings`: an output ends at the earliest occurrence of any of its stop strings in its text; the text before it contains none of them.",
    ),
    Clause(
        "STOP-3",
        MUST,
        "Stop conditions",
        "If `Capabilities.stop_token_ids`: an output ends at the first generated token that is one of `stop_token_ids`.",
    ),
    Clause(
        "STOP-4",
        MUST,
        "Stop conditions",
        "Unless `ignore_eos`, an output ends at the first EOS token, reported as `eos_token_id` (not as a stop token, FINISH-5). With `ignore_eos` an EOS token never ends an output.",
    ),
    Clause(
        "STOP-5",
        MUST,
        "Stop conditions",
        "No stop condition (EOS, stop token id, stop string) ends an output before it has `min_tokens` tokens.",
    ),
    Clause(
        "N-1",
        MUST,
        "Multiple outputs (n > 1)",
        "A request with `n` outputs produces deltas and exactly one `OutputFinished` for every index `0 … n-1`, and none for any other index.",
    ),
    Clause(
        "N-2",
        MUST,
        "Multiple outputs (n > 1)",
        "Usage of an n>1 request charges the prompt once and sums completion tokens (USAGE-2, USAGE-3).",
    ),
    Clause(
        "N-3",
        SHOULD,
        "Multiple outputs (n > 1)",
        "*(server-internal)* The prompt is prefilled once and its KV state shared by the `n` outputs; the `n` outputs are admitted all-or-nothing, so a request never holds part of its capacity while waiting for the rest.",
        unchecked="server-internal",
    ),
    Clause(
        "ABORT-1",
        MUST,
        "Abort, cancellation and deadlines",
        "`Abort` is idempotent and never fails for unknown ids: an id that is not in flight (unknown, finished, already aborted) gets `ABORT_STATUS_NOT_IN_FLIGHT`; the call returns OK. Aborting a finished request has no effect on anything.",
    ),
    Clause(
        "ABORT-2",
        MUST,
        "Abort, cancellation and deadlines",
        "Aborting a request in flight returns `ABORT_STATUS_ABORTED` and ends its stream promptly: every unfinished output gets `OutputFinished(FINISH_REASON_ABORTED)` with the tokens it already has counted, the terminal message carries `Usage`, and the call ends OK. Tokens generated before the abort are delivered before the finish (FINISH-2).",
    ),
    Clause(
        "ABORT-3",
        MUST,
        "Abort, cancellation and deadlines",
        "After an abort, cancel or deadline, the server keeps no state for the request: `GetLoad` returns to the values it had before the request (LOAD-1), and the request's KV-cache space is free or held only as reusable prefix cache.",
    ),
    Clause(
        "ABORT-4",
        MUST,
        "Abort, cancellation and deadlines",
        "Aborting a request covers all of its `n` outputs.",
    ),
    Clause(
        "ABORT-5",
        MUST,
        "Abort, cancellation and deadlines",
        "`Abort` with `AllRequests` aborts every request in flight and reports each as `ABORT_STATUS_ABORTED`.",
    ),
    Clause(
        "ABORT-6",
        SHOULD,
        "Abort, cancellation and deadlines",
        "An `Abort` for an id that is not yet in flight is remembered for a short grace period (the reference server: 5 s): a `Generate` with that id arriving within it is accepted and immediately ends with `FINISH_REASON_ABORTED` finishes. (An abort that races ahead of its request still wins.)",
    ),
    Clause(
        "ABORT-7",
        MUST,
        "Abort, cancellation and deadlines",
        "An `AbortRequest` with no target, or with an empty id list, is `INVALID_ARGUMENT`.",
    ),
    Clause(
        "CANCEL-1",
        MUST,
        "Abort, cancellation and deadlines",
        "When the client cancels a `Generate` call (HTTP/2 RST_STREAM), at any point after it began, the server stops generating for it and releases its resources promptly (ABORT-3).",
    ),
    Clause(
        "CANCEL-2",
        MUST,
        "Abort, cancellation and deadlines",
        "When a `Generate` call's deadline (`grpc-timeout`) expires, the client sees `DEADLINE_EXCEEDED` (or `CANCELLED`), and the server stops and releases the request as for CANCEL-1.",
    ),
    Clause(
        "CANCEL-3",
        MUST,
        "Abort, cancellation and deadlines",
        "A cancelled or aborted request never affects other requests in flight.",
    ),
    Clause(
        "ERR-1",
        MUST,
        "Errors",
        "A request that is invalid, or that cannot be accepted, fails with a non-OK status and **no messages**, with the code from the table below; bad input never yields `UNKNOWN` or `INTERNAL`.",
    ),
    Clause(
        "ERR-2",
        MUST,
        "Errors",
        "A failure after acceptance (engine error, worker crash, server shutdown past its drain time) is reported as exactly one terminal `RequestError` (`code` ≠ 0, a gRPC status number), after which the call ends with status OK. An engine failure is never disguised as a finish reason.",
    ),
    Clause(
        "ERR-3",
        MUST,
        "Errors",
        "The status message of an invalid request names the offending field and value (`temperature=-1.0 must be >= 0`).",
    ),
    Clause("ERR-4", MUST, "Errors", "A call to an unknown method or service fails with `UNIMPLEMENTED`."),
    Clause(
        "ERR-5",
        MUST,
        "Errors",
        "The server keeps serving after any invalid request (a following valid request succeeds).",
    ),
    Clause(
        "CAP-1",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        'A request that uses an option or RPC whose `Capabilities` flag is false fails with `UNIMPLEMENTED`; the option is never silently ignored. "Uses" means: a non-default value is present (for example any `stop_strings` when `stop_strings` is false, `chat` input when `chat_input` is false, `n > 1` when `max_outputs` is 1, `return_logprobs` when `logprobs` is false). A value beyond a numeric limit of a feature the server does have (`n > max_outputs > 1`, `top_logprobs > max_top_logprobs`, more than `max_stop_strings` stop strings) is `INVALID_ARGUMENT` (SAMPLE-5).',
    ),
    Clause(
        "CAP-2",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        "A capability the server advertises is honoured as the clauses above describe.",
    ),
    Clause(
        "CAP-3",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        "`GetServerInfo` and `GetModelInfo` are consistent: `vocab_size > 0`; `max_context_tokens > 0`; every `eos_token_id < vocab_size`; `defaults` lie within the SAMPLE-5 ranges and `defaults.n ≤ max_outputs`; `embedding_model` is present exactly when `Capabilities.embed`; `has_chat_template` is true when `chat_input` is.",
    ),
    Clause(
        "HEALTH-1",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        '`grpc.health.v1.Health/Check` answers for the services `""`, `lmrpc.v1.InferenceService` and `lmrpc.v1.ControlService`: `SERVING` when the server accepts requests. An unknown service name is `NOT_FOUND`.',
    ),
    Clause(
        "HEALTH-2",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        "The status is `NOT_SERVING` while the server starts (model loading), drains, or after a worker process died; `Watch` streams each transition.",
    ),
    Clause(
        "LOAD-1",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        "When no request is in flight, `Load.active_requests`, `running_sequences`, `waiting_sequences` and `kv_tokens_in_use` are 0. While a stream is open its request is counted in `active_requests`.",
    ),
    Clause(
        "TOK-1",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        "If `Capabilities.tokenize`: `Tokenize` returns exactly the prompt ids `Generate` uses for the same `text` or `chat` input.",
    ),
    Clause(
        "TOK-2",
        SHOULD,
        "Capabilities, health, load, tokenization, embeddings",
        "`Detokenize(Tokenize(text))` returns `text` for text of assigned Unicode characters that contains no special-token strings and that the vocabulary can encode (a byte-level vocabulary may lack some bytes, so characters of unassigned planes may not survive).",
    ),
    Clause(
        "EMBED-1",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        "If `Capabilities.embed`: `Embed` returns one embedding per input text, in order, each with `EmbeddingModelInfo.dimensions` values, and `usage.prompt_tokens > 0`.",
    ),
    Clause(
        "EMBED-2",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        "Every embedding is L2-normalized (norm within 1e-3 of 1) and the same text always gives the same vector (within 1e-5).",
    ),
    Clause(
        "LIFE-1",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        "On shutdown (SIGTERM) the server turns health `NOT_SERVING`, refuses new requests with `UNAVAILABLE`, lets streams in flight finish (up to a drain timeout, after which their outputs end `ABORTED`), and exits 0.",
        unchecked="needs control of the server process (SIGTERM)",
    ),
    Clause(
        "LIFE-2",
        MUST,
        "Capabilities, health, load, tokenization, embeddings",
        "If a worker process dies, streams in flight end with a `RequestError` (`UNAVAILABLE`), health turns `NOT_SERVING`, and new requests fail with `UNAVAILABLE` within 1 s. No client is left hanging.",
        unchecked="needs a worker process to die",
    ),
    Clause(
        "LIFE-3",
        SHOULD,
        "Capabilities, health, load, tokenization, embeddings",
        "`PauseGeneration` stops progress without failing anything: new requests are accepted and wait, open streams stall; `ResumeGeneration` continues them. `FlushCache` releases cached prefixes not used by running requests and never affects a running request.",
    ),
)

CLAUSES: dict[str, Clause] = {c.id: c for c in _TABLE}
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(c.section for c in _TABLE))

_ROW = re.compile(r"^\| ([A-Z]+-\d+) \| (MUST|SHOULD) \| (.*) \|\s*$")
_HEADING = re.compile(r"^## \d+\. (.*)$")


def parse_contract(markdown: str) -> list[Clause]:
    """Read the clause tables of docs/contract.md (ID, level, section, text; no ``unchecked``)."""
    section = ""
    clauses: list[Clause] = []
    for line in markdown.splitlines():
        if heading := _HEADING.match(line):
            section = heading.group(1).strip()
        elif row := _ROW.match(line):
            clauses.append(Clause(row.group(1), Level(row.group(2)), section, row.group(3)))
    return clauses


def clause_of(case_id: str) -> str:
    """``ABORT-4[n=4]`` -> ``ABORT-4``."""
    return case_id.split("[", 1)[0]
