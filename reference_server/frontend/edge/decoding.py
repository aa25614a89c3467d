"""Strict protobuf decoding of request messages, before anything acts on them.

betterproto2, which the services are written against, is a lax pure-Python parser: it accepts
truncated fields, skips wire types 6 and 7, reads an unknown group's contents as top-level fields,
stores a string with invalid UTF-8 and a bool sent as bytes. So every request is first parsed by
the official C runtime (upb, through ``protobuf``) against the same descriptors, which enforces
protobuf's rules (valid UTF-8 in strings, complete fields, real wire types, groups skipped whole).
A known field sent with the wrong wire type, which protobuf keeps as an unknown field, is refused
too. Then the services get a message rebuilt from upb's canonical re-encoding, with unknown
fields dropped, so betterproto2 only ever sees bytes it reads exactly as upb did.

Failures are INVALID_ARGUMENT naming the message and, where the scanner finds it, the field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import betterproto2
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtobufMessage
from grpclib import GRPCError, Status

from lmrpc._gen.message_pool import default_message_pool
from reference_server.frontend.edge.diagnosis import BudgetExceeded, explain

TYPE_URL_PREFIX = "type.googleapis.com/"


@dataclass(frozen=True, slots=True)
class MessageSpec:
    """How to check and build one request message type."""

    name: str  # full protobuf name, e.g. "lmrpc.v1.GenerateRequest"
    descriptor: Descriptor
    parser: type[ProtobufMessage]  # the upb class for the same descriptor
    build: Callable[[ProtobufMessage, bytes], Any]  # (checked upb message, its canonical bytes) -> value

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1]


class StrictDecoder:
    """Decodes request bytes into the message types the services declare, strictly."""

    def __init__(self, descriptor_sets: Iterable[bytes]) -> None:
        self._pool = descriptor_pool.DescriptorPool()
        seen: set[str] = set()  # a well-known file (google/protobuf/*.proto) is in every set using it
        for serialized in descriptor_sets:
            for file in descriptor_pb2.FileDescriptorSet.FromString(serialized).file:
                if file.name not in seen:
                    seen.add(file.name)
                    self._pool.Add(file)
        self._specs: dict[type, MessageSpec] = {}

    def spec(self, message_type: type) -> MessageSpec:
        spec = self._specs.get(message_type)
        if spec is None:
            spec = self._specs[message_type] = self._make_spec(message_type)
        return spec

    def decode(self, data: bytes, message_type: type) -> Any:
        spec = self.spec(message_type)
        try:
            parsed = spec.parser.FromString(data)
        except DecodeError:
            raise _malformed(spec, _first_problem(data, spec) or "not a valid protobuf encoding") from None
        size_with_unknown = parsed.ByteSize()
        parsed.DiscardUnknownFields()
        if parsed.ByteSize() != size_with_unknown:
            # Unknown fields are fine (a newer client); a known field in the wrong wire type is not.
            problem = _first_problem(data, spec)
            if problem is not None:
                raise _malformed(spec, problem)
        return spec.build(parsed, parsed.SerializeToString())

    def _make_spec(self, message_type: type) -> MessageSpec:
        if issubclass(message_type, ProtobufMessage):  # grpclib's own services (health, reflection)
            descriptor = cast(Descriptor, message_type.DESCRIPTOR)
            return MessageSpec(descriptor.full_name, descriptor, message_type, lambda parsed, _: parsed)
        if not issubclass(message_type, betterproto2.Message):
            raise TypeError(f"{message_type!r} is not a protobuf message type")
        url = default_message_pool.type_to_url.get(message_type)
        if url is None:
            raise TypeError(f"{message_type!r} is not a registered protobuf message type")
        name = url.removeprefix(TYPE_URL_PREFIX)
        descriptor = self._pool.FindMessageTypeByName(name)
        parser = message_factory.GetMessageClass(descriptor)
        bp2_type: type[betterproto2.Message] = message_type
        return MessageSpec(name, descriptor, parser, lambda _, data: bp2_type.parse(data))


def _first_problem(data: bytes, spec: MessageSpec) -> str | None:
    try:
        return explain(data, spec.descriptor)
    except BudgetExceeded:
        return "too many fields to check (unknown or malformed fields among them)"


def _malformed(spec: MessageSpec, problem: str) -> GRPCError:
    return GRPCError(Status.INVALID_ARGUMENT, f"malformed {spec.short_name}: {problem}")
