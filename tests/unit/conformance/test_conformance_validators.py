"""Each stream validator flags its own clause, and only its own, on hand-built streams."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conformance.stream.record import End, Event, StreamRecord, event_kind
from conformance.validators import STREAM_CLAUSES
from conformance.validators.base import VALIDATORS, Facts
from conformance.validators.options import _rank_problems
from conformance.vocabulary import TargetInfo
from lmrpc.v1 import (
    Capabilities,
    EffectiveDefaults,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    ModelInfo,
    OutputFinished,
    PromptInfo,
    ResponseOptions,
    SamplingParams,
    ServerInfo,
    StoppingCriteria,
    TokenCandidate,
    TokenDelta,
    TokenLogprob,
    Usage,
)

INFO = TargetInfo(
    ServerInfo(contract_revision=2, capabilities=Capabilities(max_outputs=4, tokenize=True)),
    ModelInfo(
        vocab_size=100, max_context_tokens=64, eos_token_ids=[2], defaults=EffectiveDefaults(max_tokens=16)
    ),
    None,
)
REQUEST = GenerateRequest(
    request_id="r1",
    text="hi",
    sampling=SamplingParams(n=2),
    stopping=StoppingCriteria(max_tokens=3, ignore_eos=True),
)


def good() -> list[GenerateResponse]:
    def msg(**kw: object) -> GenerateResponse:
        return GenerateResponse(request_id="r1", **kw)  # type: ignore[arg-type]

    return [
        msg(prompt_info=PromptInfo(prompt_tokens=2, num_outputs=2, seed=9)),
        msg(delta=TokenDelta(output_index=0, token_ids=[11, 12], text="ab")),
        msg(delta=TokenDelta(output_index=1, token_ids=[13], text="c")),
        msg(delta=TokenDelta(output_index=0, token_ids=[14], text="d")),
        msg(finished=OutputFinished(output_index=0, reason=FinishReason.LENGTH, completion_tokens=3)),
        msg(delta=TokenDelta(output_index=1, token_ids=[15, 16], text="ef")),
        msg(
            finished=OutputFinished(output_index=1, reason=FinishReason.LENGTH, completion_tokens=3),
            usage=Usage(prompt_tokens=2, completion_tokens=6),
        ),
    ]


def record(messages: list[GenerateResponse], end: End = End.OK) -> StreamRecord:
    rec = StreamRecord(REQUEST, end=end)
    rec.events = [Event(i, 0.01 * i, event_kind(m), m) for i, m in enumerate(messages)]
    return rec


FACTS = Facts(INFO, prompt_ids=[40, 41], detok={0: "abd", 1: "cef"}, detok_but_last={0: "ab", 1: "ce"})


def violated(rec: StreamRecord) -> set[str]:
    return {clause for clause in STREAM_CLAUSES if VALIDATORS[clause](rec, FACTS)}


def test_a_conformant_stream_passes_every_validator() -> None:
    assert violated(record(good())) == set()


def _double_finish(m: list[GenerateResponse]) -> None:
    m.insert(5, GenerateResponse.parse(bytes(m[4])))


def _cumulative(m: list[GenerateResponse]) -> None:
    assert m[3].delta is not None
    m[3].delta.token_ids = [11, 12, 14]


def _lost_index(m: list[GenerateResponse]) -> None:
    assert m[1].delta is not None
    m[1].delta.output_index = None


def _usage_plus_one(m: list[GenerateResponse]) -> None:
    assert m[-1].usage is not None
    m[-1].usage.completion_tokens += 1


def _usage_early(m: list[GenerateResponse]) -> None:
    m[2].usage = Usage(prompt_tokens=2, completion_tokens=1)


def _unspecified(m: list[GenerateResponse]) -> None:
    assert m[4].finished is not None
    m[4].finished.reason = FinishReason.UNSPECIFIED


def _id_dropped(m: list[GenerateResponse]) -> None:
    m[3].request_id = ""


def _prompt_twice(m: list[GenerateResponse]) -> None:
    m.insert(2, GenerateResponse.parse(bytes(m[0])))


def _last_delta_lost(m: list[GenerateResponse]) -> None:
    del m[5]


def _delta_after_finish(m: list[GenerateResponse]) -> None:
    m.insert(5, GenerateResponse(request_id="r1", delta=TokenDelta(output_index=0, token_ids=[], text="")))


def _aborted_without_cause(m: list[GenerateResponse]) -> None:
    assert m[4].finished is not None
    m[4].finished.reason = FinishReason.ABORTED


def _partial_text_leaked(m: list[GenerateResponse]) -> None:
    assert m[3].delta is not None
    m[3].delta.text = "dx"  # one character more than Detokenize gives: not a prefix any more, but longer


def _fffd_for_a_character(m: list[GenerateResponse]) -> None:
    assert m[1].delta is not None
    m[1].delta.text = "a\ufffd"


@pytest.mark.parametrize(
    ("mutate", "clauses"),
    [
        (_double_finish, {"FINISH-1"}),
        (_cumulative, {"STREAM-2", "USAGE-5"}),  # facts fixed: Detokenize of the real ids
        (_lost_index, {"STREAM-3"}),
        (_usage_plus_one, {"USAGE-3", "N-2"}),
        (_usage_early, {"USAGE-1"}),
        (_unspecified, {"FINISH-4", "FINISH-6"}),
        (_id_dropped, {"REQ-2"}),
        (_prompt_twice, {"STREAM-1"}),
        (_last_delta_lost, {"FINISH-2", "USAGE-5", "STREAM-4"}),
        (_delta_after_finish, {"FINISH-1"}),
        (_aborted_without_cause, {"FINISH-7", "FINISH-6"}),  # ignore_eos: it should have reached LENGTH
        (_partial_text_leaked, {"STREAM-4"}),
        (_fffd_for_a_character, {"STREAM-4", "STREAM-5"}),
    ],
)
def test_one_fault_one_clause(mutate: Callable[[list[GenerateResponse]], None], clauses: set[str]) -> None:
    messages = good()
    mutate(messages)
    assert violated(record(messages)) == clauses


def test_how_a_stream_ends() -> None:
    assert violated(record(good()[:3], End.HUNG)) == {"FINISH-3"}
    assert violated(record(good()[:3], End.STATUS)) == {"ERR-2"}
    assert violated(record(good()[:5])) >= {"FINISH-1", "FINISH-3", "USAGE-1"}


def test_foreign_ids_are_cross_talk() -> None:
    messages = good()
    messages[2].request_id = "r2"
    rec = record(messages)
    assert VALIDATORS["STREAM-6"](rec, Facts(INFO, others=frozenset({"r2"})))
    assert violated(rec) == {"REQ-2", "STREAM-6"}


def test_an_aborted_finish_is_fine_when_the_harness_aborted() -> None:
    messages = good()
    _aborted_without_cause(messages)
    rec = record(messages)
    aborted = Facts(
        INFO, prompt_ids=[40, 41], detok=FACTS.detok, detok_but_last=FACTS.detok_but_last, aborted=True
    )
    assert {clause for clause in STREAM_CLAUSES if VALIDATORS[clause](rec, aborted)} == set()


def _logprob(token: int, value: float, rank: int, top: list[tuple[int, float]]) -> TokenLogprob:
    return TokenLogprob(token_id=token, logprob=value, rank=rank, top=[TokenCandidate(t, v) for t, v in top])


@pytest.mark.parametrize(
    ("logprob", "ok"),
    [
        (_logprob(7, -0.5, 1, [(7, -0.5), (8, -1.0)]), True),
        (_logprob(8, -1.0, 2, [(7, -0.5), (8, -1.0)]), True),
        (_logprob(9, -1.0, 2, [(7, -0.5), (8, -1.0)]), True),  # tied with 8: the tie filled top
        (_logprob(9, -1.0, 3, [(7, -0.5), (8, -1.0)]), True),  # the second of two tied candidates
        (_logprob(9, -2.0, 3, [(7, -0.5), (8, -1.0)]), True),  # beyond top
        (_logprob(9, -0.5, 1, [(7, -0.5), (8, -1.0)]), False),  # claims the top logprob, not listed
        (_logprob(8, -1.0, 1, [(7, -0.5), (8, -1.0)]), False),  # rank 1, but 7 is greater
        (_logprob(7, -0.5, 2, [(7, -0.5), (8, -1.0)]), False),  # rank 2, but nothing is greater
        (_logprob(9, -2.0, 2, [(7, -0.5), (8, -1.0)]), False),  # rank inside top, 8 is greater
    ],
)
def test_stream_7_rank_is_exact_up_to_ties(logprob: TokenLogprob, ok: bool) -> None:
    assert (not _rank_problems("x", logprob)) == ok


def test_one_logprob_per_token_also_without_token_ids() -> None:
    request = GenerateRequest(
        request_id="r1",
        text="hi",
        stopping=StoppingCriteria(max_tokens=2),
        response=ResponseOptions(return_logprobs=True, return_token_ids=False),
    )
    lp = _logprob(5, -0.1, 1, [])
    messages = [
        GenerateResponse(request_id="r1", prompt_info=PromptInfo(prompt_tokens=2, num_outputs=1)),
        GenerateResponse(request_id="r1", delta=TokenDelta(output_index=0, text="ab", logprobs=[lp])),
        GenerateResponse(
            request_id="r1",
            finished=OutputFinished(output_index=0, reason=FinishReason.LENGTH, completion_tokens=2),
            usage=Usage(prompt_tokens=2, completion_tokens=2),
        ),
    ]
    rec = StreamRecord(request, end=End.OK)
    rec.events = [Event(i, 0.0, event_kind(m), m) for i, m in enumerate(messages)]
    assert VALIDATORS["STREAM-7"](rec, Facts(INFO))
