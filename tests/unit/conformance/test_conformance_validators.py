"""Each stream validator flags its own clause, and only its own, on hand-built streams."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conformance.harness.target import TargetInfo
from conformance.stream.record import End, Event, StreamRecord, event_kind
from conformance.validators import STREAM_CLAUSES
from conformance.validators.base import VALIDATORS, Facts
from lmrpc.v1 import (
    Capabilities,
    EffectiveDefaults,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    ModelInfo,
    OutputFinished,
    PromptInfo,
    SamplingParams,
    ServerInfo,
    StoppingCriteria,
    TokenDelta,
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
