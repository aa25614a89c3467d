"""Decoding GenerateResponse bytes without trusting them to be valid UTF-8 (STREAM-5).

A stock protobuf parser rejects a message whose string field holds invalid UTF-8, which would turn a
STREAM-5 violation into an opaque client error. Here the delta's ``text`` bytes are cut out, the rest
is parsed normally, and the text is put back decoded with ``surrogateescape`` so that the checks can
see (and report) the offending bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.stream import wiretap
from lmrpc.v1 import GenerateResponse

_LEN = 2  # wire type of length-delimited fields


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def write_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


@dataclass(frozen=True, slots=True)
class WireField:
    number: int
    wire_type: int
    raw: bytes  # the whole field: tag and payload
    payload: bytes  # for length-delimited fields, the content; otherwise empty


def split_fields(data: bytes) -> list[WireField]:
    fields: list[WireField] = []
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = read_varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        payload = b""
        if wire_type == 0:
            _, pos = read_varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == _LEN:
            length, pos = read_varint(data, pos)
            payload = data[pos : pos + length]
            pos += length
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        if pos > len(data):
            raise ValueError("truncated field")
        fields.append(WireField(number, wire_type, data[start:pos], payload))
    return fields


def length_field(number: int, payload: bytes) -> bytes:
    return write_varint(number << 3 | _LEN) + write_varint(len(payload)) + payload


@dataclass(frozen=True, slots=True)
class Decoded:
    message: GenerateResponse
    text_bytes: bytes | None  # the delta's raw text bytes, when the message is a delta with text
    text_is_utf8: bool


def decode_response(data: bytes) -> Decoded:
    """Parse one GenerateResponse, tolerating invalid UTF-8 in ``delta.text``."""
    text_bytes: bytes | None = None
    stripped = bytearray()
    for top in split_fields(data):
        if top.number == 3 and top.wire_type == _LEN:  # delta
            inner = bytearray()
            for sub in split_fields(top.payload):
                if sub.number == 3 and sub.wire_type == _LEN:  # delta.text (last one wins, as in protobuf)
                    text_bytes = sub.payload
                else:
                    inner += sub.raw
            stripped += length_field(3, bytes(inner))
        else:
            stripped += top.raw
    message = GenerateResponse.parse(bytes(stripped))
    wiretap.track(message, "InferenceService.Generate response")
    if text_bytes is None or message.delta is None:
        return Decoded(message, None, True)
    try:
        message.delta.text = text_bytes.decode("utf-8")
        ok = True
    except UnicodeDecodeError:
        message.delta.text = text_bytes.decode("utf-8", "surrogateescape")
        ok = False
    return Decoded(message, text_bytes, ok)
