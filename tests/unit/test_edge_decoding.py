"""Strict decoding at the edge: every malformed body is INVALID_ARGUMENT naming its field, valid
bodies decode exactly as protobuf reads them, unknown fields are dropped without being read."""

from __future__ import annotations

import random

import pytest
from grpclib import GRPCError, Status
from grpclib.health.v1.health_pb2 import HealthCheckRequest

from conformance.search.malformed import Fault, mutants, named_faults, unknown_group
from conformance.spec.descriptors import message_descriptor
from conformance.stream.wire import length_field, write_varint
from lmrpc import descriptor_set_path
from lmrpc.v1 import (
    AbortRequest,
    ChatInput,
    ChatMessage,
    DetokenizeRequest,
    EmbedRequest,
    GenerateRequest,
    RequestIds,
    SamplingParams,
    StoppingCriteria,
    TokenIds,
    TokenizeRequest,
)
from reference_server.frontend.edge.decoding import StrictDecoder
from reference_server.frontend.edge.diagnosis import BudgetExceeded, explain

REQUEST_TYPES = [GenerateRequest, EmbedRequest, AbortRequest, TokenizeRequest, DetokenizeRequest]


@pytest.fixture(scope="module")
def decoder() -> StrictDecoder:
    return StrictDecoder([descriptor_set_path().read_bytes()])


def faults_of(message_type: type) -> list[Fault]:
    return named_faults(message_descriptor(f"lmrpc.v1.{message_type.__name__}"))


@pytest.mark.parametrize("message_type", REQUEST_TYPES, ids=lambda t: t.__name__)
def test_every_named_fault_is_invalid_argument_naming_its_field(
    decoder: StrictDecoder, message_type: type
) -> None:
    faults = faults_of(message_type)
    assert len(faults) >= 8
    for fault in faults:
        with pytest.raises(GRPCError) as caught:
            decoder.decode(fault.body, message_type)
        assert caught.value.status is Status.INVALID_ARGUMENT, fault.name
        message = caught.value.message or ""
        assert message.startswith(f"malformed {message_type.__name__}: "), (fault.name, message)
        if fault.field is not None:
            assert f"{fault.field}" in message, (fault.name, message)


def test_the_inputs_that_killed_the_scheduler_are_refused(decoder: StrictDecoder) -> None:
    # ignore_eos (bool, field 5 of StoppingCriteria) as bytes; stop_strings (field 3) as a varint
    for inner, field in ((b"\x2a\x01A", "stopping.ignore_eos"), (b"\x18\x07", "stopping.stop_strings")):
        body = length_field(2, b"hi") + length_field(6, inner)
        with pytest.raises(GRPCError) as caught:
            decoder.decode(body, GenerateRequest)
        assert caught.value.status is Status.INVALID_ARGUMENT
        assert field in (caught.value.message or "")


def test_invalid_utf8_names_the_nested_field(decoder: StrictDecoder) -> None:
    content = length_field(1, b"user") + length_field(2, b"\xc3(")
    body = length_field(
        4, length_field(1, length_field(1, b"user") + length_field(2, b"fine")) + length_field(1, content)
    )
    with pytest.raises(GRPCError) as caught:
        decoder.decode(body, GenerateRequest)
    assert "invalid UTF-8 in field 'chat.messages[1].content'" in (caught.value.message or "")


@pytest.mark.parametrize(
    "message",
    [
        GenerateRequest(
            request_id="r-1", chat=ChatInput(messages=[ChatMessage(role="user", content="héllo ✓")]),
            sampling=SamplingParams(temperature=0.0, top_k=0, n=2, seed=0),
            stopping=StoppingCriteria(max_tokens=3, stop_strings=["\n"], stop_token_ids=[1, 2], ignore_eos=True),
        ),
        GenerateRequest(token_ids=TokenIds(ids=[1, 2, 300000])),
        AbortRequest(request_ids=RequestIds(ids=["a", "b"])),
        EmbedRequest(texts=["x", ""]),
        DetokenizeRequest(token_ids=[0, 1, 2], skip_special_tokens=False),
    ],
)  # fmt: skip
def test_valid_messages_decode_exactly(decoder: StrictDecoder, message: object) -> None:
    decoded = decoder.decode(bytes(message), type(message))  # type: ignore[call-overload]
    assert decoded == message


def test_present_zero_values_keep_their_presence(decoder: StrictDecoder) -> None:
    decoded = decoder.decode(
        bytes(GenerateRequest(text="x", sampling=SamplingParams(temperature=0.0))), GenerateRequest
    )
    assert decoded.sampling is not None and decoded.sampling.temperature == 0.0


def test_unknown_fields_are_dropped_and_an_unknown_group_is_skipped_whole(decoder: StrictDecoder) -> None:
    valid = bytes(GenerateRequest(token_ids=TokenIds(ids=[5, 6])))
    injected = unknown_group(length_field(2, b"INJECTED"))  # field 2 would be `text`
    unknown_varint = write_varint(999 << 3) + b"\x01"
    decoded = decoder.decode(valid + injected + unknown_varint, GenerateRequest)
    assert decoded == GenerateRequest(token_ids=TokenIds(ids=[5, 6]))
    assert bytes(decoded) == valid


def test_grpclib_message_types_are_checked_too(decoder: StrictDecoder) -> None:
    assert (
        decoder.decode(HealthCheckRequest(service="x").SerializeToString(), HealthCheckRequest).service == "x"
    )
    with pytest.raises(GRPCError) as caught:
        decoder.decode(length_field(1, b"\xff"), HealthCheckRequest)
    assert caught.value.status is Status.INVALID_ARGUMENT
    assert "service" in (caught.value.message or "")


def test_random_damage_is_refused_or_decoded_never_anything_else(decoder: StrictDecoder) -> None:
    seeds = [
        bytes(GenerateRequest(text="hello", stopping=StoppingCriteria(max_tokens=4, stop_strings=["a"])))
    ]
    damaged = mutants(seeds, faults_of(GenerateRequest), random.Random(7))
    for _ in range(2000):
        try:
            decoder.decode(next(damaged), GenerateRequest)
        except GRPCError as exc:
            assert exc.status is Status.INVALID_ARGUMENT


def test_the_diagnosis_budget_bounds_its_work() -> None:
    descriptor = message_descriptor("lmrpc.v1.GenerateRequest")
    with pytest.raises(BudgetExceeded):
        explain(b"\x78\x00" * 1000, descriptor, budget=100)
    assert explain(b"\x78\x00" * 1000 + b"\x0f", descriptor) is not None
