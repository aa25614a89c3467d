"""Decoding GenerateResponse bytes that carry invalid UTF-8 (STREAM-5 evidence, not a crash)."""

from __future__ import annotations

from conformance.stream.wire import decode_response, length_field, read_varint, split_fields, write_varint
from lmrpc.v1 import GenerateResponse, PromptInfo, TokenDelta


def test_varints_round_trip() -> None:
    for value in (0, 1, 127, 128, 300, 2**32, 2**63 - 1):
        assert read_varint(write_varint(value), 0) == (value, len(write_varint(value)))


def test_valid_message_decodes_unchanged() -> None:
    message = GenerateResponse(
        request_id="r", delta=TokenDelta(output_index=0, token_ids=[5, 6], text="héllo")
    )
    decoded = decode_response(bytes(message))
    assert decoded.message == message and decoded.text_is_utf8 and decoded.text_bytes == "héllo".encode()


def test_invalid_utf8_is_kept_as_evidence() -> None:
    head = GenerateResponse(request_id="r", delta=TokenDelta(output_index=1, token_ids=[7]))
    raw = b"".join(
        length_field(3, f.payload + length_field(3, b"a\xc3")) if f.number == 3 else f.raw
        for f in split_fields(bytes(head))
    )
    decoded = decode_response(raw)
    assert not decoded.text_is_utf8
    assert decoded.text_bytes == b"a\xc3"
    assert decoded.message.delta is not None and decoded.message.delta.token_ids == [7]
    assert decoded.message.delta.text.encode("utf-8", "surrogateescape") == b"a\xc3"


def test_non_delta_messages() -> None:
    message = GenerateResponse(request_id="r", prompt_info=PromptInfo(prompt_tokens=3, num_outputs=1))
    assert decode_response(bytes(message)).message == message
