"""What the case library covers: every input class the contract speaks of is sent by some case, and
every MUST sentence of a checkable clause is made observable by some case (``conformance list
--coverage``), by two where a second case can see its fault another way (``SEEN_ONCE_BECAUSE`` says
why one case is enough for the others).

Input classes are predicates over the requests a case sends. A case declares the classes it sends
(``@case(..., sends=...)``); the self-test checks each declaration against the case's transcript on
the reference server, so a declaration cannot outlive the request it describes. Scenarios (an abort
racing a waiting request, health while paused, ...) depend on the server's state, not on one request:
they are declared only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import betterproto2

from conformance.spec.clauses import CLAUSES, MUST
from lmrpc.v1 import (
    AbortRequest,
    ChatInput,
    DetokenizeRequest,
    EmbedRequest,
    GenerateRequest,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
    TokenizeRequest,
)

Sent = Callable[[str, betterproto2.Message], bool]  # (the stub method, its request) -> in the class?


@dataclass(frozen=True, slots=True)
class InputClass:
    id: str
    text: str
    sent: Sent | None = None  # None: a scenario, declared by the cases that set it up


def _gen(test: Callable[[GenerateRequest], bool]) -> Sent:
    return lambda method, request: isinstance(request, GenerateRequest) and test(request)


def _s(request: GenerateRequest) -> SamplingParams:
    return request.sampling or SamplingParams()


def _st(request: GenerateRequest) -> StoppingCriteria:
    return request.stopping or StoppingCriteria()


def _r(request: GenerateRequest) -> ResponseOptions:
    return request.response or ResponseOptions()


def _chat(request: GenerateRequest) -> ChatInput:
    return request.chat or ChatInput()


def _constraint_kind(kind: str) -> Sent:
    def test(request: GenerateRequest) -> bool:
        return (
            request.constraint is not None
            and betterproto2.which_one_of(request.constraint, "kind")[0] == kind
        )

    return _gen(test)


def _of(kind: type[betterproto2.Message], test: Callable[[betterproto2.Message], bool]) -> Sent:
    return lambda method, request: isinstance(request, kind) and test(request)


def _method(name: str) -> Sent:
    return lambda method, request: method == name


_ID = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
ROLES = ("system", "user", "assistant")

INPUT_CLASSES: tuple[InputClass, ...] = (
    # Generate: input
    InputClass("generate.text", "text input", _gen(lambda r: r.text is not None)),
    InputClass("generate.token_ids", "token_ids input", _gen(lambda r: r.token_ids is not None)),
    InputClass("generate.chat", "chat input", _gen(lambda r: r.chat is not None)),
    InputClass(
        "generate.chat.no-generation-prompt",
        "ChatInput.add_generation_prompt=false",
        _gen(lambda r: r.chat is not None and _chat(r).add_generation_prompt is False),
    ),
    InputClass(
        "generate.chat.unknown-role",
        "a chat role the usual templates do not name",
        _gen(lambda r: any(m.role not in ROLES for m in _chat(r).messages)),
    ),
    InputClass("generate.parse_special_tokens=true", "", _gen(lambda r: r.parse_special_tokens is True)),
    InputClass("generate.parse_special_tokens=false", "", _gen(lambda r: r.parse_special_tokens is False)),
    InputClass("generate.request_id=empty", "a server-assigned id", _gen(lambda r: r.request_id == "")),
    # Generate: sampling
    InputClass("generate.temperature=0", "greedy", _gen(lambda r: _s(r).temperature == 0)),
    InputClass("generate.temperature>0", "", _gen(lambda r: (_s(r).temperature or 0) > 0)),
    InputClass("generate.temperature=absent", "the default", _gen(lambda r: _s(r).temperature is None)),
    InputClass("generate.top_p", "", _gen(lambda r: _s(r).top_p is not None)),
    InputClass("generate.top_k", "", _gen(lambda r: _s(r).top_k is not None)),
    InputClass("generate.min_p", "", _gen(lambda r: _s(r).min_p is not None)),
    InputClass("generate.frequency_penalty", "", _gen(lambda r: _s(r).frequency_penalty is not None)),
    InputClass("generate.presence_penalty", "", _gen(lambda r: _s(r).presence_penalty is not None)),
    InputClass("generate.repetition_penalty", "", _gen(lambda r: _s(r).repetition_penalty is not None)),
    InputClass("generate.seed", "", _gen(lambda r: _s(r).seed is not None)),
    InputClass("generate.n>1", "", _gen(lambda r: (_s(r).n or 1) > 1)),
    # Generate: stopping
    InputClass("generate.max_tokens=absent", "the default", _gen(lambda r: _st(r).max_tokens is None)),
    InputClass(
        "generate.min_tokens",
        "with max_tokens",
        _gen(lambda r: bool(_st(r).min_tokens) and _st(r).max_tokens is not None),
    ),
    InputClass(
        "generate.min_tokens-without-max_tokens",
        "",
        _gen(lambda r: bool(_st(r).min_tokens) and _st(r).max_tokens is None),
    ),
    InputClass("generate.stop_strings=1", "", _gen(lambda r: len(_st(r).stop_strings) == 1)),
    InputClass("generate.stop_strings>1", "", _gen(lambda r: len(_st(r).stop_strings) > 1)),
    InputClass("generate.stop_token_ids", "", _gen(lambda r: bool(_st(r).stop_token_ids))),
    InputClass("generate.ignore_eos", "", _gen(lambda r: _st(r).ignore_eos)),
    InputClass(
        "generate.include_stop+stop_strings",
        "",
        _gen(lambda r: _st(r).include_stop_in_output and bool(_st(r).stop_strings)),
    ),
    InputClass(
        "generate.include_stop+stop_token_ids",
        "include_stop_in_output with stop tokens and no stop strings",
        _gen(
            lambda r: (
                _st(r).include_stop_in_output and bool(_st(r).stop_token_ids) and not _st(r).stop_strings
            )
        ),
    ),
    InputClass(
        "generate.include_stop+eos",
        "include_stop_in_output with no stop conditions (EOS)",
        _gen(lambda r: _st(r).include_stop_in_output and not (_st(r).stop_token_ids or _st(r).stop_strings)),
    ),
    # Generate: constraint (CONSTRAIN-*)
    *(
        InputClass(f"generate.constraint.{kind}", f"a {kind} constraint", _constraint_kind(kind))
        for kind in ("json_schema", "json_object", "regex", "ebnf", "choice")
    ),
    InputClass("generate.constraint.none-set", "a constraint with no member set", _constraint_kind("")),
    # Generate: response
    InputClass("generate.return_text=false", "", _gen(lambda r: _r(r).return_text is False)),
    InputClass("generate.return_token_ids=false", "", _gen(lambda r: _r(r).return_token_ids is False)),
    InputClass("generate.return_logprobs", "", _gen(lambda r: _r(r).return_logprobs)),
    InputClass(
        "generate.logprobs-without-token_ids",
        "",
        _gen(lambda r: _r(r).return_logprobs and _r(r).return_token_ids is False),
    ),
    InputClass(
        "generate.top_logprobs-without-return_logprobs",
        "",
        _gen(lambda r: _r(r).top_logprobs > 0 and not _r(r).return_logprobs),
    ),
    InputClass("generate.skip_special_tokens=false", "", _gen(lambda r: _r(r).skip_special_tokens is False)),
    InputClass("generate.return_prompt_token_ids", "", _gen(lambda r: _r(r).return_prompt_token_ids)),
    InputClass("generate.final_only", "", _gen(lambda r: _r(r).final_only)),
    # Abort
    InputClass(
        "abort.ids=1",
        "",
        _of(AbortRequest, lambda r: r.request_ids is not None and len(r.request_ids.ids) == 1),  # type: ignore[attr-defined]
    ),
    InputClass(
        "abort.duplicate-ids",
        "",
        _of(
            AbortRequest,
            lambda r: r.request_ids is not None and len(set(r.request_ids.ids)) < len(r.request_ids.ids),  # type: ignore[attr-defined]
        ),
    ),
    InputClass(
        "abort.ids>1",
        "",
        _of(AbortRequest, lambda r: r.request_ids is not None and len(set(r.request_ids.ids)) > 1),  # type: ignore[attr-defined]
    ),
    InputClass("abort.all", "", _of(AbortRequest, lambda r: r.all is not None)),  # type: ignore[attr-defined]
    InputClass(
        "abort.empty-ids",
        "",
        _of(AbortRequest, lambda r: r.request_ids is not None and not r.request_ids.ids),  # type: ignore[attr-defined]
    ),
    InputClass(
        "abort.no-target",
        "",
        _of(AbortRequest, lambda r: r.request_ids is None and r.all is None),  # type: ignore[attr-defined]
    ),
    # Tokenize, Detokenize, Embed, admin
    InputClass("tokenize.text", "", _of(TokenizeRequest, lambda r: r.text is not None)),  # type: ignore[attr-defined]
    InputClass("tokenize.chat", "", _of(TokenizeRequest, lambda r: r.chat is not None)),  # type: ignore[attr-defined]
    InputClass(
        "tokenize.no-input",
        "",
        _of(TokenizeRequest, lambda r: r.text is None and r.chat is None),  # type: ignore[attr-defined]
    ),
    InputClass(
        "tokenize.parse_special_tokens",
        "",
        _of(TokenizeRequest, lambda r: r.parse_special_tokens is not None),  # type: ignore[attr-defined]
    ),
    InputClass(
        "detokenize.skip_special_tokens=false",
        "",
        _of(DetokenizeRequest, lambda r: r.skip_special_tokens is False),  # type: ignore[attr-defined]
    ),
    InputClass("embed.texts>1", "", _of(EmbedRequest, lambda r: len(r.texts) > 1)),  # type: ignore[attr-defined]
    InputClass("embed.no-texts", "", _of(EmbedRequest, lambda r: not r.texts)),  # type: ignore[attr-defined]
    InputClass("embed.request_id=empty", "", _of(EmbedRequest, lambda r: r.request_id == "")),  # type: ignore[attr-defined]
    InputClass(
        "embed.request_id-malformed",
        "",
        _of(EmbedRequest, lambda r: r.request_id != "" and not _ID.fullmatch(r.request_id)),  # type: ignore[attr-defined]
    ),
    InputClass("admin.pause", "PauseGeneration", _method("pause_generation")),
    InputClass("admin.flush", "FlushCache", _method("flush_cache")),
    # Scenarios: the server's state, not one request
    InputClass("scenario.abort-live-and-unknown", "one Abort naming a request in flight and an unknown id"),
    InputClass("scenario.abort-all-while-waiting", "Abort(all) while requests wait (paused, no tokens)"),
    InputClass("scenario.abort-twice-at-once", "two Aborts of one request, concurrently"),
    InputClass("scenario.abort-before-arrival", "an Abort for an id whose Generate comes later"),
    InputClass(
        "scenario.abort-prefix-id",
        "an Abort of an id that is a proper prefix of a request in flight, or that it is a prefix of",
    ),
    InputClass("scenario.abort-then-reuse", "an Abort of a finished id, then a Generate reusing it"),
    InputClass("scenario.health-while-paused", "Health/Check while generation is paused"),
    InputClass("scenario.health-while-streaming", "Health/Check while requests stream"),
    InputClass("scenario.metrics-while-busy", "a metrics scrape with requests running and waiting"),
    InputClass("scenario.load-while-waiting", "GetLoad while a request waits (no tokens yet)"),
    InputClass("scenario.cancel-twin-shares-prompt", "a cancel beside a request with the same prompt"),
    InputClass("scenario.cancel-after-begin", "a client cancel right after the call began"),
    InputClass("scenario.cancel-after-first-token", "a client cancel after the first token"),
    InputClass("scenario.deadline", "a Generate whose deadline expires"),
    InputClass("scenario.wait-for-capacity", "a request that must wait for KV capacity"),
    InputClass("scenario.special-string-in-chat", "a special-token string inside chat content"),
    InputClass("scenario.stop-before-min-tokens", "a stop string that occurs before min_tokens"),
    InputClass("scenario.stop-string-fffd-at-end", "stop string U+FFFD and an output cut inside a character"),
    InputClass("scenario.reuse-after-finish", "a Generate reusing the id of a finished request at once"),
    InputClass("scenario.restart", "the server restarted by the user's --restart-hook"),
    InputClass("scenario.drain", "the server's shutdown begun by the user's --drain-hook, streams in flight"),
    InputClass("scenario.waiting-limit", "one request more than limits.max_waiting_requests"),
)
CLASSES: dict[str, InputClass] = {c.id: c for c in INPUT_CLASSES}


def classes_sent(method: str, request: betterproto2.Message) -> set[str]:
    """The input classes one call belongs to."""
    return {c.id for c in INPUT_CLASSES if c.sent is not None and c.sent(method, request)}


# ── MUST sentences ───────────────────────────────────────────────────────────────────────────

_SENTENCE = re.compile(r"(?<=\.)\s+(?=[A-Z`(*])")


def sentences() -> dict[str, str]:
    """Every sentence of every checkable MUST clause, as ``CLAUSE.k`` (1-based) -> text."""
    out: dict[str, str] = {}
    for clause in CLAUSES.values():
        if clause.level is MUST and clause.checkable:
            for k, text in enumerate(_SENTENCE.split(clause.text), 1):
                out[f"{clause.id}.{k}"] = text
    return out


# The cases (IDs or globs) that make each MUST sentence observable. A sentence not listed is a gap.
OBSERVED_BY: dict[str, tuple[str, ...]] = {
    "SVC-1.1": ("SVC-1",),
    "SVC-1.2": ("ERR-4[*]", "CAP-1[embed]", "CAP-1[tokenize]", "CAP-1[admin]"),
    "SVC-2.1": ("SVC-2[*]",),
    "SVC-3.1": ("SVC-3",),
    "SVC-4.1": ("SVC-4", "SVC-4[restart]"),
    "SVC-4.2": ("SVC-4", "SVC-4[restart]"),
    "SVC-4.3": ("SVC-4[restart]",),
    "REQ-1.1": ("REQ-1[no-input]",),
    "REQ-1.2": ("REQ-1[empty-*]",),
    "REQ-2.1": ("REQ-2", "REQ-2[server-assigned]"),
    "REQ-3.1": ("REQ-3",),
    "REQ-3.2": ("REQ-3", "REQ-3[reuse-after-finish]", "ABORT-1[finished-then-reused]"),
    "REQ-4.1": ("REQ-4[*]", "ERR-1[generated]"),  # [id-128-bytes]: the accepted boundary
    "REQ-5.1": ("REQ-5[*]", "ERR-1[generated]"),
    "REQ-6.1": ("REQ-6[max_tokens=window]", "REQ-6[one-over]"),
    "REQ-6.2": ("REQ-6[max_tokens=window]", "REQ-6[one-over]"),
    "REQ-6.3": ("REQ-6[exact-fit]", "REQ-6[one-over]"),
    "REQ-6.4": ("REQ-6[default-lowered]", "REQ-6[prompt=window]"),
    "REQ-7.1": ("REQ-7",),
    "REQ-7.2": ("REQ-7[waits-for-capacity]",),
    # [parse_special_tokens]: parsing adds one token only where the default left the content text
    "REQ-8.1": ("REQ-8[chat-content]", "REQ-8[parse_special_tokens]"),
    "REQ-8.2": ("REQ-8[text]",),
    "REQ-8.3": ("REQ-8[parse_special_tokens]", "REQ-8[parse-as-default]"),
    "REQ-8.4": ("REQ-8[*]",),
    "SAMPLE-1.1": ("SAMPLE-1[defaults]", "SAMPLE-1[max_tokens-default]"),
    "SAMPLE-1.2": ("SAMPLE-1[temperature=0]", "SAMPLE-2[n]"),
    "SAMPLE-1.3": ("SAMPLE-1[n-absent]", "STREAM-1"),  # STREAM-1: num_outputs 1 for pooled requests without n
    "SAMPLE-2.1": ("SAMPLE-2", "SAMPLE-2[n]"),
    "SAMPLE-3.1": ("SAMPLE-3",),
    "SAMPLE-3.2": ("SAMPLE-3[per-output]", "SAMPLE-3[first-of-n]"),
    "SAMPLE-4.1": ("SAMPLE-4",),
    "SAMPLE-4.2": ("SAMPLE-4[picked]", "SAMPLE-4[picked-n]"),
    "SAMPLE-5.1": ("SAMPLE-5[*]", "ERR-1[generated]", "CAP-5[max_stop_string_bytes]"),
    "SAMPLE-7.1": ("SAMPLE-7",),
    "SAMPLE-8.1": ("SAMPLE-8[*]", "SAMPLE-1[max_tokens-default]", "STREAM-2", "STREAM-4"),
    "STREAM-1.1": ("STREAM-1", "REQ-6[exact-fit]"),  # [exact-fit]: the first message only
    "STREAM-1.2": ("STREAM-1", "SAMPLE-1[n-absent]"),
    "STREAM-2.1": ("STREAM-2", "USAGE-5"),  # USAGE-5: repeated ids outnumber completion_tokens
    "STREAM-2.2": ("STREAM-2", "USAGE-5"),
    "STREAM-3.1": ("STREAM-3", "N-1[*]"),  # N-1: an index outside [0, n)
    "STREAM-4.1": ("STREAM-4", "STOP-1[stop-string]", "STOP-6[inside-token]", "STOP-7[*]"),
    "STREAM-4.2": ("STREAM-4", "STREAM-5[every-byte]"),
    "STREAM-4.3": ("STREAM-4", "STOP-2[incomplete-end]"),
    "STREAM-5.1": ("STREAM-5", "STREAM-5[multibyte]"),
    "STREAM-5.2": ("STREAM-5", "STREAM-5[multibyte]"),
    "STREAM-5.3": ("STREAM-5", "STREAM-5[multibyte]"),
    "STREAM-6.1": ("STREAM-6", "STREAM-6[concurrent]", "STREAM-6[stateful]"),
    "STREAM-7.1": ("STREAM-7", "CAP-2[max_top_logprobs]"),
    "STREAM-7.2": ("STREAM-7", "CAP-2[combined]"),  # [combined]: logprobs with n and stops at their limits
    "STREAM-7.3": ("STREAM-7", "CAP-2[combined]"),
    "STREAM-8.1": ("STREAM-8",),
    "STREAM-8.2": ("STREAM-8[greedy]", "STREAM-8[seeded]"),
    "STREAM-10.1": ("STREAM-10", "STREAM-7"),  # STREAM-7: one logprob per token with return_token_ids=false
    "STREAM-10.2": ("STREAM-10", "TOK-1"),
    "STREAM-11.1": ("STREAM-11", "STREAM-5[multibyte]"),
    "FINISH-1.1": ("FINISH-1", "FINISH-1[stateful]", "N-1[*]"),
    "FINISH-1.2": ("FINISH-1", "FINISH-1[stateful]"),
    "FINISH-2.1": ("FINISH-2", "ABORT-2[*]"),
    "FINISH-3.1": ("FINISH-3", "FINISH-1[stateful]"),  # the machine runs FINISH-3's validator
    "FINISH-3.2": ("FINISH-3", "FINISH-1[stateful]"),
    "FINISH-4.1": ("FINISH-4", "ABORT-2[*]"),
    "FINISH-5.1": ("FINISH-5", "STOP-2*", "STOP-3", "STOP-4[eos]"),
    "FINISH-5.2": ("FINISH-5[stop-token-is-eos]", "FINISH-5"),  # FINISH-5: the pool's stop token eos_ids[:1]
    "FINISH-6.1": ("FINISH-6",),
    "FINISH-6.2": ("FINISH-6", "FINISH-6[ignore_eos]"),
    "FINISH-6.3": ("FINISH-6[stop-at-max-tokens]", "FINISH-6[eos-at-max-tokens]"),
    "FINISH-7.1": ("FINISH-7", "CANCEL-2[deadline]"),
    "FINISH-7.2": ("FINISH-7", "CANCEL-2[deadline]"),
    "USAGE-1.1": ("USAGE-1", "ABORT-2[*]", "FLOW-2"),  # ABORT-2, FLOW-2: Usage on the terminal message
    "USAGE-2.1": ("USAGE-2", "USAGE-2[tokenize]"),
    "USAGE-2.2": ("USAGE-2[tokenize]", "N-2"),
    "USAGE-3.1": ("USAGE-3", "USAGE-3[stateful]"),
    "USAGE-4.1": ("USAGE-4", "CAP-2[combined]"),
    "USAGE-5.1": ("USAGE-5", "STOP-5*"),
    "USAGE-6.1": ("USAGE-6[*]",),
    "USAGE-7.1": ("USAGE-7[after-flush]", "USAGE-7[fresh-prompt]", "USAGE-7[never-ran]"),
    "STOP-1.1": ("STOP-1[stop-string]", "STOP-1[stop-token]", "STOP-4[eos]", "STREAM-4"),
    "STOP-1.2": ("STOP-1[include]", "STOP-6[inside-token]", "STREAM-4"),
    "STOP-1.3": ("STOP-1[stop-token]", "STOP-6[inside-token]"),
    "STOP-2.1": ("STOP-2", "STOP-2[later-entry]", "STOP-2[before-multibyte]"),
    "STOP-2.2": ("STOP-2[before-min-tokens]", "STREAM-4"),  # STREAM-4: the pool's min_tokens
    "STOP-2.3": ("STOP-2[incomplete-end]", "STOP-2[incomplete-end-suffix]"),
    "STOP-3.1": ("STOP-3", "STOP-1[stop-token]"),
    "STOP-4.1": ("STOP-4[eos]", "STOP-7[eos]"),
    "STOP-4.2": ("STOP-4[ignore_eos]", "FINISH-6"),  # FINISH-6: ignore_eos outputs end LENGTH at max_tokens
    "STOP-5.1": ("STOP-5", "STOP-5[no-max-tokens]", "STOP-5[default]", "STOP-5[eos]"),
    "STOP-5.2": ("STOP-5", "STOP-5[eos]", "STOP-2[before-min-tokens]"),
    "STOP-6.1": ("STOP-6[inside-token]", "STOP-6[inside-token-excluded]", "STREAM-4"),
    "STOP-6.2": ("STOP-6[inside-token]", "STOP-6[inside-token-excluded]"),
    "STOP-7.1": ("STOP-7[*]", "STOP-1[stop-token]"),
    "N-1.1": ("N-1", "N-1[*]"),
    "N-2.1": ("N-2", "USAGE-2[tokenize]", "USAGE-3"),
    "ABORT-1.1": ("ABORT-1[unknown]", "ABORT-1[finished]", "ABORT-1[twice]", "ABORT-1[twice-while-ending]"),
    "ABORT-1.2": ("ABORT-1[duplicate-ids]", "ABORT-1[mixed]"),
    "ABORT-1.3": ("ABORT-1[finished]", "ABORT-1[finished-then-reused]"),
    "ABORT-2.1": ("ABORT-2[*]", "ABORT-4[*]"),
    "ABORT-2.2": ("ABORT-2[*]", "ABORT-4[*]"),
    "ABORT-3.1": ("ABORT-3[*]", "CANCEL-1[*]", "CANCEL-2[deadline]"),
    "ABORT-4.1": ("ABORT-4[*]",),
    "ABORT-5.1": ("ABORT-5", "ABORT-5[waiting]"),
    "ABORT-7.1": ("ABORT-7[*]",),
    "CANCEL-1.1": ("CANCEL-1[*]",),
    "CANCEL-2.1": (
        "CANCEL-2[deadline]",
        "CANCEL-2[held]",
        "ABORT-3[stateful]",
    ),  # the machine's deadlines, released
    "CANCEL-2.2": ("CANCEL-2[deadline]", "CANCEL-2[held]"),
    "CANCEL-3.1": ("CANCEL-3", "CANCEL-3[shared-prefix]"),
    "ERR-1.1": ("ERR-1[*]", "SAMPLE-5[*]", "REQ-1[*]"),
    "ERR-2.1": ("ERR-2", "FLOW-2"),
    "ERR-2.2": ("ERR-2", "FINISH-7"),
    "ERR-3.1": ("ERR-3", "MALFORMED-1[*]"),  # MALFORMED-1: the field, not the value
    "ERR-4.1": ("ERR-4[*]",),
    "ERR-5.1": ("ERR-5", "MALFORMED-3"),
    "MALFORMED-1.1": ("MALFORMED-1[*]",),
    "MALFORMED-2.1": ("MALFORMED-2",),
    "MALFORMED-3.1": ("MALFORMED-3",),
    "MALFORMED-4.1": ("MALFORMED-4[*]",),
    "LIFE-1.1": ("LIFE-1[drain]",),
    "FLOW-1.1": ("FLOW-1",),
    "FLOW-2.1": ("FLOW-2",),
    "FLOW-2.2": ("FLOW-2",),
    "AUTH-1.1": ("AUTH-1", "AUTH-1[every-rpc]"),
    "AUTH-1.2": ("AUTH-1", "AUTH-1[every-rpc]"),  # [every-rpc]: no effect on a stream in flight
    "AUTH-2.1": ("AUTH-2", "AUTH-2[in-flight]"),  # [in-flight]: no effect on an admin's stream
    "AUTH-3.1": ("AUTH-3", "AUTH-3[in-flight-id]"),
    "AUTH-3.2": ("AUTH-3", "AUTH-3[in-flight-id]"),
    "AUTH-3.3": ("AUTH-3", "AUTH-3[in-flight-id]"),
    "AUTH-3.4": ("AUTH-3",),
    "AUTH-3.5": ("AUTH-3",),
    "CAP-1.1": ("CAP-1[*]",),
    "CONSTRAIN-1.1": ("CONSTRAIN-1[*]", "CONSTRAIN-3[n=4]"),
    "CONSTRAIN-1.2": ("CONSTRAIN-1[*]", "CONSTRAIN-3[ignore_eos]"),
    "CONSTRAIN-1.3": ("CONSTRAIN-1[*]", "CONSTRAIN-3[stop-string]"),
    "CONSTRAIN-1.4": ("CONSTRAIN-3[stop-string]", "CONSTRAIN-1[*]"),
    "CONSTRAIN-1.5": ("CONSTRAIN-1[*]",),
    "CONSTRAIN-2.1": ("CONSTRAIN-2[*]", "ERR-3"),
    "CONSTRAIN-2.2": ("CAP-1[constrained_decoding]",),
    "CONSTRAIN-3.1": ("CONSTRAIN-3[n=4]", "CONSTRAIN-3[greedy]", "CONSTRAIN-3[seeded]"),
    "CONSTRAIN-3.2": ("CONSTRAIN-3[ignore_eos]",),
    "CAP-1.2": ("SAMPLE-5[n=max+1]", "SAMPLE-5[top_logprobs=max+1]", "SAMPLE-5[stop_strings=max+1]"),
    "CAP-2.1": ("CAP-2[*]",),
    "CAP-3.1": ("CAP-3",),
    "CAP-5.1": ("CAP-5[max_stop_string_bytes]", "CAP-5[max_waiting_requests]"),
    "CAP-5.2": ("CAP-5[no-stop-string-limit]", "CAP-5[no-abort-ids-limit]"),
    "HEALTH-1.1": ("HEALTH-1", "HEALTH-1[in-flight]"),
    "HEALTH-1.2": ("HEALTH-1",),
    "HEALTH-1.3": ("HEALTH-1[paused]", "LIFE-3[pause]"),  # [pause]: with a stream stalled by the pause
    "HEALTH-2.1": ("HEALTH-2[watch]", "LIFE-1[drain]"),
    "LOAD-1.1": ("LOAD-1[idle]", "LOAD-1[ground-truth]"),
    "LOAD-1.2": ("LOAD-1[active]", "LOAD-1[waiting]", "LOAD-1[ground-truth]"),
    "LOAD-1.3": ("LOAD-1[ground-truth]",),
    "TOK-1.1": ("TOK-1", "TOK-1[*]"),
    "EMBED-1.1": ("EMBED-1", "EMBED-1[batches]"),
    "EMBED-2.1": ("EMBED-2", "EMBED-1[batches]"),  # [batches]: norms, and a text repeated in one call
    "EMBED-3.1": ("EMBED-3", "EMBED-1[batches]"),  # [batches]: echoed or assigned, not the malformed id
    "EMBED-3.2": ("EMBED-3",),
    "MODELS-1.1": ("MODELS-1",),
    "MODELS-1.2": ("MODELS-1",),
    "MODELS-1.3": ("MODELS-1",),
    "MODELS-1.4": ("MODELS-1",),
    "SCORE-1.1": ("SCORE-1",),
    "SCORE-1.2": ("SCORE-1",),
    "SCORE-1.3": ("SCORE-1", "SCORE-1[invalid]"),
    "SCORE-1.4": ("SCORE-1[invalid]",),
    "SCORE-2.1": ("SCORE-2",),
    "SCORE-2.2": ("SCORE-2",),
    "SCORE-2.3": ("SCORE-2[invalid]",),
    "ADMIN-1.1": ("ADMIN-1",),
    "ADMIN-1.2": ("ADMIN-1",),
    "ADMIN-1.3": ("ADMIN-1",),
    "ADMIN-2.1": ("ADMIN-2[reload]", "ADMIN-2[reload-unnamed]"),
    "ADMIN-2.2": ("ADMIN-2[refused]", "ADMIN-2[refused-in-flight]"),
    "ADMIN-2.3": ("ADMIN-2[refused]",),
    # engine protocols (smg), through their drivers
    "SMG-1.1": ("SMG-1",),
    "SMG-1.2": ("SMG-1",),
    "SMG-2.1": ("SMG-2[eos]", "FINISH-5"),
    "SMG-2.2": ("SMG-2[eos]",),
    "SMG-2.3": ("REQ-6[exact-fit]", "REQ-6[one-over]", "REQ-5[token-id=vocab_size]"),
    "SMG-3.1": ("SMG-3[*]",),
    "SMG-3.2": ("SMG-3[*]", "LOAD-1[active]"),
    "SMG-4.1": ("SMG-4", "SMG-4[in-flight]"),
    "SMG-4.2": ("SMG-4",),
    "SMG-5.1": ("SMG-5[drain]",),
    "SMG-6.1": ("SMG-6[*]",),
    "SMG-6.2": ("SMG-6[*]",),
    "SMG-6.3": ("SMG-6[stored]", "SMG-6[replay]", "SMG-6[cleared]"),
    "SMG-6.4": ("SMG-6[stored]", "SMG-6[cleared]"),
    "SMG-6.5": ("SMG-6[replay]", "SMG-6[cleared]"),
    # SGLang's native service, through its driver
    "SRT-1.1": ("SRT-1[ids]", "SRT-1[text]"),
    "SRT-1.2": ("SRT-1[ids]", "SRT-1[text]"),
    "SRT-2.1": ("SRT-2", "SRT-1[text]", "SRT-4[rid]"),
    "SRT-2.2": ("SRT-2", "SRT-1[text]"),
    "SRT-3.1": ("SRT-3", "SRT-4[rid]"),
    "SRT-3.2": ("SRT-3", "SRT-4[abort_all]"),
    "SRT-4.1": ("SRT-4[rid]", "SRT-4[one-of-two]", "SRT-4[abort_all]", "ABORT-5"),
    "SRT-4.2": ("SRT-4[rid]", "SRT-4[one-of-two]"),
}

# MUST sentences one case observes on purpose: why a second case would only repeat the first. Every
# other sentence seen by one case still needs a second one that sees its fault another way.
SEEN_ONCE_BECAUSE: dict[str, str] = {
    "CONSTRAIN-2.2": "one refusal for one capability flag; CAP-1[constrained_decoding] sends a constraint "
    "to a server without it, and a second case would send the same request",
    "CONSTRAIN-3.2": "the one case where a constraint meets ignore_eos and min_tokens; "
    "CONSTRAIN-3[ignore_eos] sends a choice that completes before min_tokens with ignore_eos",
    "SVC-1.1": "which services a server serves is one fact; SVC-1 calls every mandatory RPC of both, "
    "and a second case would call the same RPCs again",
    "SVC-3.1": "one deterministic answer, ServerInfo.contract_revision; a second case would read the "
    "same field again",
    "SVC-4.3": "instance_id changes only across a restart, which the harness can cause only through "
    "--restart-hook, run once per run by SVC-4[restart]",
    "REQ-1.1": "a request with no input member is the only way to break it on the wire (protobuf keeps "
    "the last of two oneof members); REQ-1[no-input] sends it, and a second case would send the same "
    "request",
    "REQ-8.2": "one tokenizer rule for text input; REQ-8[text] tokenizes a text holding a special-token "
    "string and finds the token in Tokenize's ids and in Generate's prompt ids, and a second case "
    "would tokenize the same string again",
    "CAP-3.1": "two static answers, GetServerInfo and GetModelInfo, fetched once per run; CAP-3 checks "
    "every relation the sentence lists, and a second case would read the same fields again",
    "LOAD-1.3": "one scene (N requests generating, M held behind a pause, nothing else in flight) that "
    "LOAD-1[ground-truth] builds with N=2 and M=3 (M=0 where the server cannot pause) and reads in all "
    "four fields; a second case would build the same scene",
    "MODELS-1.1": "ListModels answers one static list; MODELS-1 checks its ids and kinds, and a second "
    "case would read the same list again",
    "MODELS-1.2": "ListModels answers one static list; MODELS-1 checks its generation entry against "
    "GetModelInfo, and a second case would read the same list again",
    "MODELS-1.3": "ListModels answers one static list; MODELS-1 checks its embedding entry against "
    "Capabilities.embed and EmbeddingModelInfo, and a second case would read the same list again",
    "MODELS-1.4": "ListModels answers one static list; MODELS-1 checks the base_model_id of every entry, "
    "and a second case would read the same list again",
    "SCORE-1.4": "the sentence names three invalid inputs (an empty query, no items, an empty item); "
    "SCORE-1[invalid] sends each and checks the code and the field named, and a second case would "
    "send the same three",
    "SCORE-2.3": "the sentence names four invalid inputs (top_n = 0, an empty query, no documents, an "
    "empty document); SCORE-2[invalid] sends each and checks the code and the field named, and a "
    "second case would send the same four",
    "ADMIN-2.3": "the refusals a harness can cause on any host are a path that does not exist and one "
    "that holds no model (/dev/null), both sent by ADMIN-2[refused]; a model of another shape needs "
    "a checkpoint the harness does not have",
    "REQ-7.2": "it takes a request that two requests' KV reservations cannot hold at once; "
    "REQ-7[waits-for-capacity] builds that scene once (each needs 60 % of the cache), sees the second "
    "accepted and waiting, and runs it once the first is aborted; a second case would build the same scene",
    "SMG-5.1": "the states it names are reached only through the user's hooks or a crash: start-up is over "
    "before a run begins, a worker's death is not the harness's to cause, and a drain ends the server, so "
    "a run drains it once, in SMG-5[drain]",
    "LIFE-1.1": "only a shutdown begun by --drain-hook shows it, and the server is gone afterwards: a "
    "run drains it once, in LIFE-1[drain] (SMG-5[drain] runs the same body on the engine protocols)",
    "FLOW-2.1": "it takes a client that reads nothing for a whole stall timeout; FLOW-2 stalls one that "
    "reads afterwards beside one that never does (FLOW-2.2), and a second case would stall a client "
    "the same way",
    "FLOW-2.2": "it takes a client that reads nothing for two stall timeouts; FLOW-2 stalls one beside "
    "one that reads after the first (FLOW-2.1), and a second case would stall a client the same way",
    "SMG-1.1": "GetTokenizer streams one static zip; SMG-1 reads it whole and checks its chunks and "
    "digest, and a second case would download the same bytes (SMG-2[eos] reads only its EOS ids)",
    "SMG-1.2": "GetTokenizer streams one static zip; SMG-1 checks its entries and loads its "
    "tokenizer.json, and a second case would open the same archive again",
    "SMG-2.2": "two static lists, GetModelInfo.eos_token_ids and the bundle's end-of-sequence ids; "
    "SMG-2[eos] compares them, and a second case would compare the same lists again",
}
