"""The engine-protocol drivers without a server: how native messages become lmrpc.v1 events and
findings, how lmrpc.v1 requests become native ones (checked against the reference server's own
translation back), the tokenizer bundle checks, and the clause profiles."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from conformance.cases import all_cases
from conformance.drivers import Promises, SglangSchedulerDriver, VllmEngineDriver, make_driver
from conformance.drivers.bundle import Bundle
from conformance.drivers.normalize import Normalizer
from conformance.spec.clauses import CLAUSES
from conformance.spec.profiles import PROFILES
from conformance.spec.registry import REGISTRY
from conformance.stream.record import Event, Finding, StreamRecord, event_kind
from conformance.validators import validate
from conformance.validators.base import Facts
from conformance.vocabulary import TargetInfo
from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import (
    EffectiveDefaults,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    ModelInfo,
    ResponseOptions,
    SamplingParams,
    ServerInfo,
    StoppingCriteria,
    TokenIds,
)
from reference_server.frontend.dialects.sglang_scheduler.requests import to_lmrpc as sglang_to_lmrpc
from reference_server.frontend.dialects.vllm_engine.requests import to_lmrpc as vllm_to_lmrpc

ROOT = Path(__file__).resolve().parents[3]
EOS = 2


def expressed(
    n: int = 1, *, max_tokens: int = 8, final_only: bool = False, stop_token_ids: tuple[int, ...] = ()
) -> GenerateRequest:
    return GenerateRequest(
        request_id="r",
        token_ids=TokenIds(ids=[5, 6, 7]),
        sampling=SamplingParams(n=n),
        stopping=StoppingCriteria(max_tokens=max_tokens, stop_token_ids=list(stop_token_ids)),
        response=ResponseOptions(return_text=False, final_only=final_only),
    )


def record_of(
    request: GenerateRequest, events: list[GenerateResponse], findings: list[Finding]
) -> StreamRecord:
    record = StreamRecord(request, findings=findings)
    for seq, message in enumerate(events):
        record.events.append(Event(seq, 0.0, event_kind(message), message))
    record.end = record.end.OK
    return record


def facts(request: GenerateRequest) -> Facts:
    info = TargetInfo(
        ServerInfo(), ModelInfo(vocab_size=100, max_context_tokens=64, eos_token_ids=[EOS]), None
    )
    facts = Facts(info)
    facts.prompt_ids = list(request.token_ids.ids) if request.token_ids else None
    return facts


def run(normalizer: Normalizer, messages: list[object]) -> list[GenerateResponse]:
    out: list[GenerateResponse] = []
    for message in messages:
        if isinstance(message, (vllm.GenerateStreamChunk, sglang.GenerateStreamChunk)):
            out += normalizer.chunk("r", message)
        else:
            out += normalizer.complete("r", message)  # type: ignore[arg-type]
    return out


def test_a_vllm_stream_counts_from_its_chunks() -> None:
    request, findings = expressed(2, max_tokens=2), []
    normalizer = Normalizer(request, cumulative=False, eos_ids=(EOS,), findings=findings)
    events = run(
        normalizer,
        [
            vllm.GenerateStreamChunk(token_ids=[10, 11], prompt_tokens=3, completion_tokens=2, index=0),
            vllm.GenerateStreamChunk(token_ids=[20], prompt_tokens=3, completion_tokens=1, index=1),
            vllm.GenerateComplete(finish_reason="length", prompt_tokens=3, completion_tokens=2, index=0),
            vllm.GenerateStreamChunk(token_ids=[EOS], prompt_tokens=3, completion_tokens=1, index=1),
            # vLLM's servicer repeats the last delta in a streaming complete: not read as the count
            vllm.GenerateComplete(
                output_ids=[EOS],
                finish_reason="stop",
                prompt_tokens=3,
                completion_tokens=1,
                cached_tokens=2,
                index=1,
            ),
        ],
    )
    kinds = [event_kind(e) for e in events]
    assert kinds == ["prompt_info", "delta", "delta", "finished", "delta", "finished"]
    finished = [e.finished for e in events if e.finished is not None]
    assert [(f.output_index, f.completion_tokens) for f in finished] == [(0, 2), (1, 2)]
    assert finished[1].reason == FinishReason.STOP and finished[1].stop is not None
    assert finished[1].stop.eos_token_id == EOS  # no match reported, the last token is an EOS id
    assert events[-1].usage is not None and (
        events[-1].usage.completion_tokens,
        events[-1].usage.cached_prompt_tokens,
    ) == (4, 2)
    assert events[0].usage is None and not findings
    record = record_of(request, events, findings)
    assert validate(record, facts(request)) == []


def test_a_sglang_stream_takes_counts_from_the_complete() -> None:
    request, findings = expressed(max_tokens=3), []
    normalizer = Normalizer(request, cumulative=True, eos_ids=(EOS,), findings=findings)
    events = run(
        normalizer,
        [
            sglang.GenerateStreamChunk(token_ids=[10, 11], prompt_tokens=3, completion_tokens=2),
            sglang.GenerateStreamChunk(token_ids=[12], prompt_tokens=3, completion_tokens=3),
            sglang.GenerateComplete(
                output_ids=[10, 11, 12], finish_reason="length", prompt_tokens=3, completion_tokens=3
            ),
        ],
    )
    assert not findings
    assert validate(record_of(request, events, findings), facts(request)) == []


@pytest.mark.parametrize(
    ("cumulative", "messages", "clause"),
    [
        # SGLang counts are cumulative: a per-chunk count is a break
        (True, [sglang.GenerateStreamChunk(token_ids=[1], prompt_tokens=3, completion_tokens=1),
                sglang.GenerateStreamChunk(token_ids=[2], prompt_tokens=3, completion_tokens=1)], "USAGE-5"),
        # vLLM counts are per chunk: a cumulative count is a break
        (False, [vllm.GenerateStreamChunk(token_ids=[1], prompt_tokens=3, completion_tokens=1),
                 vllm.GenerateStreamChunk(token_ids=[2], prompt_tokens=3, completion_tokens=2)], "USAGE-5"),
        # the prompt counted as completion, or the other way round
        (False, [vllm.GenerateStreamChunk(token_ids=[1], prompt_tokens=4, completion_tokens=1)], "USAGE-2"),
        (False, [vllm.GenerateStreamChunk(token_ids=[1], prompt_tokens=3, cached_tokens=5, completion_tokens=1)], "USAGE-4"),
        # a streaming complete that carries ids no chunk carried: the last tokens were lost
        (False, [vllm.GenerateStreamChunk(token_ids=[1], prompt_tokens=3, completion_tokens=1),
                 vllm.GenerateComplete(output_ids=[9], finish_reason="length", prompt_tokens=3)], "FINISH-2"),
        (False, [vllm.GenerateStreamChunk(token_ids=[1], prompt_tokens=3, completion_tokens=1),
                 vllm.GenerateComplete(finish_reason="length", prompt_tokens=3, completion_tokens=2)], "FINISH-2"),
        # an engine failure dressed as a finish
        (False, [vllm.GenerateStreamChunk(token_ids=[1], prompt_tokens=3, completion_tokens=1),
                 vllm.GenerateComplete(finish_reason="error", prompt_tokens=3)], "ERR-2"),
    ],
)  # fmt: skip
def test_breaks_of_the_protocols_semantics_are_findings(
    cumulative: bool, messages: list[object], clause: str
) -> None:
    request, findings = expressed(), []
    events = run(Normalizer(request, cumulative, (EOS,), findings), messages)
    assert [f.clause for f in findings] == [clause]
    record = record_of(request, events, findings)
    assert validate(record, facts(request), [clause]), "the clause's validation reports the finding"


def test_matched_token_ids_and_stops_without_a_match() -> None:
    request, findings = expressed(stop_token_ids=(7,)), []
    normalizer = Normalizer(request, cumulative=True, eos_ids=(EOS,), findings=findings)
    as_stop = normalizer.complete(
        "r",
        sglang.GenerateComplete(output_ids=[7], finish_reason="stop", matched_token_id=7, prompt_tokens=3),
    )
    assert as_stop[-1].finished is not None and as_stop[-1].finished.stop is not None
    assert as_stop[-1].finished.stop.stop_token_id == 7
    other = Normalizer(expressed(), cumulative=True, eos_ids=(EOS,), findings=[])
    unexplained = other.complete(
        "r", sglang.GenerateComplete(output_ids=[5], finish_reason="stop", prompt_tokens=3)
    )
    record = record_of(expressed(), unexplained, [])
    assert any("one member" in m.want for m in validate(record, facts(expressed()), ["FINISH-5"]))


def test_final_only_the_complete_is_the_one_delta() -> None:
    request, findings = expressed(max_tokens=3, final_only=True), []
    events = run(
        Normalizer(request, cumulative=False, eos_ids=(EOS,), findings=findings),
        [
            vllm.GenerateComplete(
                output_ids=[4, 5, 6], finish_reason="length", prompt_tokens=3, completion_tokens=3
            )
        ],
    )
    assert [event_kind(e) for e in events] == ["prompt_info", "delta", "finished"]
    assert events[1].delta is not None and events[1].delta.token_ids == [4, 5, 6]
    assert validate(record_of(request, events, findings), facts(request)) == []


def test_a_response_with_neither_member_is_the_removed_in_band_error() -> None:
    findings: list[Finding] = []
    Normalizer(expressed(), True, (EOS,), findings).nothing("r")
    assert [f.clause for f in findings] == ["ERR-2"]


class _Tokenizerless(VllmEngineDriver):
    def tokenize(self, text: str) -> list[int]:
        return [ord(c) % 50 for c in text]


def test_vllm_requests_carry_what_the_dialect_reads_back() -> None:
    driver = _Tokenizerless(Promises(seeded_sampling=True))
    request = GenerateRequest(
        request_id="q",
        text="hey",
        sampling=SamplingParams(temperature=0.0, top_p=0.0, top_k=5, n=2, seed=(1 << 40) + 3),
        stopping=StoppingCriteria(max_tokens=9, min_tokens=0, stop_strings=["x"], ignore_eos=True),
        response=ResponseOptions(return_logprobs=True, top_logprobs=2, return_prompt_token_ids=True),
    )
    sent = driver.express(request)
    assert sent.text is None and sent.token_ids is not None and sent.token_ids.ids == driver.tokenize("hey")
    assert sent.sampling is not None and sent.sampling.top_p is None  # no presence: 0 is unset
    assert sent.sampling.seed == 3 and sent.response is not None and not sent.response.return_prompt_token_ids
    read_back = vllm_to_lmrpc(driver.native_request(sent))  # type: ignore[arg-type]
    assert read_back.token_ids == sent.token_ids and read_back.request_id == "q"
    assert (
        read_back.sampling is not None and read_back.stopping is not None and read_back.response is not None
    )
    assert (read_back.sampling.temperature, read_back.sampling.top_p, read_back.sampling.top_k) == (
        0.0,
        None,
        5,
    )
    assert (read_back.sampling.n, read_back.sampling.seed) == (2, 3)
    assert (read_back.stopping.max_tokens, read_back.stopping.stop_strings) == (9, ["x"])
    assert read_back.response.return_logprobs and read_back.response.top_logprobs == 2


class _SglangSchedulerTokenizerless(SglangSchedulerDriver):
    def tokenize(self, text: str) -> list[int]:
        return [ord(c) % 50 for c in text]


def test_sglang_requests_send_every_value_and_no_seed() -> None:
    driver = _SglangSchedulerTokenizerless()
    driver.model = ModelInfo(
        defaults=EffectiveDefaults(temperature=0.7, top_p=0.9, top_k=0, repetition_penalty=1.0)
    )
    sent = driver.express(
        GenerateRequest(
            request_id="q", text="hey", sampling=SamplingParams(seed=4, top_k=3), stopping=StoppingCriteria()
        )
    )
    assert sent.sampling is not None and sent.sampling.seed is None and sent.sampling.temperature == 0.7
    native = driver.native_request(sent)
    assert isinstance(native, sglang.GenerateRequest) and native.logprob_start_len == -1
    assert native.sampling_params is not None and native.sampling_params.top_k == 3
    read_back = sglang_to_lmrpc(native)
    assert read_back.sampling is not None
    assert (read_back.sampling.temperature, read_back.sampling.top_p, read_back.sampling.top_k) == (
        pytest.approx(0.7),
        pytest.approx(0.9),
        3,
    )
    disabled = driver.native_request(driver.express(GenerateRequest(request_id="d", text="a")))
    assert isinstance(disabled, sglang.GenerateRequest) and disabled.sampling_params is not None
    assert disabled.sampling_params.top_k == -1  # lmrpc's 0 is SGLang's -1: disabled


def test_promises_are_checked() -> None:
    with pytest.raises(ValueError, match="no seed field"):
        SglangSchedulerDriver(Promises(seeded_sampling=True))
    with pytest.raises(ValueError, match="choices"):
        Promises.parse(["deterministic"])
    with pytest.raises(ValueError, match="advertises"):
        make_driver("lmrpc", Promises(prefix_cache=True))


def _zip(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


def test_bundle_checks_are_smgs() -> None:
    tokenizer = Tokenizer.from_str(
        json.dumps(
            {"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0, "</s>": 1}, "unk_token": "a"}}
        )
    )
    files = {
        "tokenizer.json": tokenizer.to_str(),
        "generation_config.json": json.dumps({"eos_token_id": [1]}),
    }
    data = _zip(files)
    digest = hashlib.sha256(data).hexdigest()
    good = Bundle(((data[:10], ""), (data[10:], digest)))
    assert good.problems() == [] and good.eos_ids() == [1]
    assert any("does not match" in p for p in Bundle(((data, "0" * 64),)).problems())
    assert any("no sha256" in p for p in Bundle(((data, ""),)).problems())
    assert any("outside" in p for p in Bundle(((_zip({**files, "../x": ""}), ""),)).problems())
    assert any("tokenizer.json" in p for p in Bundle(((_zip({"a.txt": ""}), ""),)).problems())
    many = {f"f{i}": "" for i in range(51)}
    assert any("entries" in p for p in Bundle(((_zip(many), ""),)).problems())


def test_profiles_name_real_clauses_and_cases() -> None:
    all_cases()
    for profile in PROFILES.values():
        assert set(profile.clauses) <= set(CLAUSES), profile.protocol
        assert set(profile.cases) <= set(REGISTRY), set(profile.cases) - set(REGISTRY)
        assert all(reading.text for reading in profile.clauses.values()), "every reading says how or why"
    assert all(
        PROFILES["lmrpc"].clause(c).applies
        for c in CLAUSES
        if not c.startswith(("SMG", "SRT")) and CLAUSES[c].checkable
    )
    engine_only = [c for c in CLAUSES if c.startswith("SMG") and CLAUSES[c].checkable]
    assert engine_only and all(
        PROFILES[p].clause(c).applies for p in ("vllm-engine", "sglang-scheduler") for c in engine_only
    )
    runtime_only = [c for c in CLAUSES if c.startswith("SRT")]
    assert runtime_only and all(PROFILES["sglang-runtime"].clause(c).applies for c in runtime_only)
    assert not any(
        PROFILES[p].clause(c).applies for p in PROFILES if p != "sglang-runtime" for c in runtime_only
    )


def test_the_docs_tables_are_current() -> None:
    """The profile tables, the protocol index and the package map (every module of the harness)."""
    done = subprocess.run(
        [sys.executable, "tools/docs_tables.py", "--check"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout


def test_an_unmatched_stop_on_a_token_both_eos_and_requested_is_the_stop_token() -> None:
    """vLLM checks EOS before the request's stop tokens and reports no match for an EOS token, so an
    output that ends on a token that is both reads as "stop" with no match: the protocol cannot say
    which of the two ended it, so it is read as lmrpc.v1 reports such a token (FINISH-5)."""
    request, findings = expressed(stop_token_ids=(EOS,)), []
    normalizer = Normalizer(request, cumulative=False, eos_ids=(EOS,), findings=findings)
    events = run(
        normalizer,
        [
            vllm.GenerateStreamChunk(token_ids=[10, EOS], prompt_tokens=3, completion_tokens=2),
            vllm.GenerateComplete(finish_reason="stop", prompt_tokens=3, completion_tokens=2),
        ],
    )
    finished = [e.finished for e in events if e.finished is not None]
    assert finished[-1].stop is not None and finished[-1].stop.stop_token_id == EOS
    assert validate(record_of(request, events, findings), facts(request), ["FINISH-5"]) == []
