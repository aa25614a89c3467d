"""The field matrix (``conformance coverage``): the schema it reads, what the wiretap records on the
wire, and that a field nobody covers fails it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.spec import fields
from conformance.spec.protocols import PROTOCOLS
from conformance.stream import wiretap
from lmrpc.v1 import GenerateRequest, GenerateResponse, SamplingParams, StoppingCriteria, TokenDelta

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tap() -> wiretap.Wiretap:
    recording = wiretap.start()
    yield recording
    wiretap.ACTIVE = None


def test_openai_schema_is_written_from_the_installed_client() -> None:
    done = subprocess.run([sys.executable, "-m", "tools.openai_fields", "--check"], cwd=ROOT, check=False)
    assert done.returncode == 0, "conformance/spec/openai_fields.json is stale: python -m tools.openai_fields"


def test_every_protocol_of_the_table_has_a_schema() -> None:
    assert set(fields.protocols()) == set(PROTOCOLS)
    for protocol in PROTOCOLS:
        groups = fields.universe(protocol)
        assert sum(len(paths) for paths in groups.values()) >= 150, protocol
    lmrpc = fields.universe("lmrpc")
    assert "sampling.temperature" in lmrpc["InferenceService.Generate request"]
    assert "finished.stop.stop_string" in lmrpc["InferenceService.Generate response"]
    runtime = fields.universe("sglang-runtime")
    assert {"sampling_params.regex", "sampling_params.guided_decoding.regex"} <= set(
        runtime["SglangService.Generate request"]
    ), "every way to carry an option is a field of its own"


def test_no_listed_pattern_is_stale() -> None:
    for protocol in PROTOCOLS:
        assert fields.stale_reasons(protocol) == [], protocol


def test_the_wiretap_records_fields_set_on_the_wire(tap: wiretap.Wiretap) -> None:
    request = GenerateRequest(
        request_id="r", text="hi", sampling=SamplingParams(temperature=0.0), stopping=StoppingCriteria()
    )
    with wiretap.in_case("CASE-1"):
        wiretap.note_sent(request, "InferenceService.Generate request")
    sent = tap.seen["sent"]
    assert sent["InferenceService.Generate request sampling.temperature"] == {"CASE-1"}  # 0 with presence
    assert "InferenceService.Generate request stopping" in sent  # an empty message is still sent
    assert "InferenceService.Generate request stopping.max_tokens" not in sent  # unset
    assert "InferenceService.Generate request token_ids" not in sent  # an empty repeated field


def test_the_wiretap_records_what_is_read_not_what_is_shown(tap: wiretap.Wiretap) -> None:
    message = GenerateResponse.parse(
        bytes(GenerateResponse(request_id="r", delta=TokenDelta(token_ids=[1, 2])))
    )
    wiretap.track(message, "InferenceService.Generate response")
    repr(message)
    bool(message.delta)
    assert tap.seen["read"].keys() == {"InferenceService.Generate response delta"}
    with wiretap.in_case("STREAM-2"):
        assert message.delta.token_ids == [1, 2]
    assert tap.seen["read"]["InferenceService.Generate response delta.token_ids"] == {"STREAM-2"}
    assert message == GenerateResponse(request_id="r", delta=TokenDelta(token_ids=[1, 2]))  # still equal


def test_json_bodies_are_tracked_by_their_object_name(tap: wiretap.Wiretap) -> None:
    wiretap.note_body("chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2})
    body = wiretap.track_json(
        {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "y"}}]}
    )
    assert body["choices"][0]["message"].get("content") == "y"
    assert "chat/completions request messages.role" in tap.seen["sent"]
    assert "chat.completion choices.message.content" in tap.seen["read"]
    assert "chat.completion choices.index" not in tap.seen["read"]
    assert json.loads(json.dumps(body)) == body  # still plain JSON


def test_an_uncovered_field_fails_coverage(tmp_path: Path) -> None:
    file = tmp_path / "fields.json"
    file.write_text(json.dumps({"protocol": "lmrpc", "sent": {}, "read": {}}))
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "coverage", str(file)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "GAP      InferenceService.Generate request sampling.temperature" in done.stdout
    rows = {r.field: r for r in fields.matrix("lmrpc", {})}
    assert rows["InferenceService.Rerank response usage"].status == "open"
    assert rows["ControlService.GetModelInfo response model.architecture"].status == "n/a"


def test_a_hostile_nesting_is_returned_untracked(tap: wiretap.Wiretap) -> None:
    deep: dict[str, object] = {"object": "chat.completion"}
    inner = deep
    for _ in range(5000):
        inner["x"] = {}
        inner = inner["x"]  # type: ignore[assignment]
    assert wiretap.track_json(deep) is deep
