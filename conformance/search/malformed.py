"""Request bodies that are not valid protobuf for their message type, made from its descriptor.

Two kinds:

- ``named_faults``: one body per way a field can be malformed (invalid UTF-8 in a string field,
  a known field in the wrong wire type, a length that runs past the end, a truncated varint, wire
  types 6 and 7, an end-group without a start), each a definite protobuf error that a server
  must refuse with INVALID_ARGUMENT naming the field (MALFORMED-1);
- ``mutants``: seeded random damage to valid bodies (bit flips, cuts, insertions, splices of
  the named faults, random bytes), for fuzzing: such a body may still parse, but no outcome may
  be UNKNOWN or INTERNAL (ERR-1) and the server must keep serving (ERR-5).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from conformance.stream.wire import length_field, write_varint

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
INVALID_UTF8 = b"ok\xff\xfe"
MAX_NESTING = 2


@dataclass(frozen=True, slots=True)
class Fault:
    name: str  # what is wrong, e.g. "invalid UTF-8 in stopping.stop_strings"
    body: bytes
    field: str | None  # the field name the refusal should mention, or None


def tag(number: int, wire: int) -> bytes:
    return write_varint(number << 3 | wire)


def named_faults(descriptor: Descriptor) -> list[Fault]:
    """Definitely malformed bodies for ``descriptor``'s message, fields nested up to two levels."""
    faults = [
        Fault("wire type 6", tag(1, 6) + b"\x00", None),
        Fault("wire type 7", tag(1, 7) + b"\x00", None),
        Fault("end-group without a start-group", tag(19, EGROUP), None),
        Fault("truncated field tag", b"\x80", None),
        Fault("length-delimited field running past the end", tag(19, LEN) + b"\x0a" + b"abc", None),
    ]
    for path, chain, fd in _fields(descriptor, (), ()):
        wrap = _wrapper(chain)
        if fd.type == FieldDescriptor.TYPE_STRING:
            faults.append(
                Fault(f"invalid UTF-8 in {path}", wrap(length_field(fd.number, INVALID_UTF8)), fd.name)
            )
        faults.append(Fault(f"wrong wire type for {path}", wrap(_wrong_wire(fd)), fd.name))
        if _wire(fd) == LEN:
            faults.append(Fault(f"truncated {path}", wrap(tag(fd.number, LEN) + b"\x10" + b"short"), fd.name))
        elif _wire(fd) == VARINT:
            faults.append(
                Fault(f"truncated varint in {path}", wrap(tag(fd.number, VARINT) + b"\xff"), fd.name)
            )
    return faults


def unknown_group(inner: bytes, number: int = 1000) -> bytes:
    """``inner`` wrapped in an unknown group: a parser must skip it whole, not read its contents."""
    return tag(number, SGROUP) + inner + tag(number, EGROUP)


def mutants(seeds: list[bytes], faults: list[Fault], rng: random.Random) -> Iterator[bytes]:
    """An endless stream of damaged bodies, reproducible from ``rng``'s seed."""
    while True:
        body = bytearray(rng.choice(seeds))
        kind = rng.randrange(7)
        if kind == 0 and body:
            for _ in range(rng.randint(1, 4)):
                body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
        elif kind == 1 and body:
            del body[rng.randrange(len(body)) :]
        elif kind == 2:
            at = rng.randint(0, len(body))
            body[at:at] = rng.randbytes(rng.randint(1, 8))
        elif kind == 3:
            body += rng.choice(faults).body
        elif kind == 4:
            body = bytearray(rng.randbytes(rng.randint(1, 64)))
        elif kind == 5 and body:
            at = rng.randrange(len(body))
            body[at:at] = body[at : at + rng.randint(1, 16)]
        else:
            body = bytearray(rng.choice(faults).body) + body
        yield bytes(body)


def _fields(
    descriptor: Descriptor, prefix: tuple[str, ...], chain: tuple[FieldDescriptor, ...]
) -> Iterator[tuple[str, tuple[FieldDescriptor, ...], FieldDescriptor]]:
    for fd in descriptor.fields:
        path = ".".join((*prefix, fd.name))
        yield path, chain, fd
        if (
            fd.type == FieldDescriptor.TYPE_MESSAGE
            and fd.message_type is not None
            and len(chain) < MAX_NESTING
        ):
            yield from _fields(fd.message_type, (*prefix, fd.name), (*chain, fd))


def _wrapper(chain: tuple[FieldDescriptor, ...]) -> Callable[[bytes], bytes]:
    def wrap(inner: bytes) -> bytes:
        for fd in reversed(chain):
            inner = length_field(fd.number, inner)
        return inner

    return wrap


def _wire(fd: FieldDescriptor) -> int:
    if fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE):
        return LEN
    if fd.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64):
        return I64
    if fd.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32):
        return I32
    return VARINT


def _wrong_wire(fd: FieldDescriptor) -> bytes:
    """``fd`` encoded with a wire type its type never uses (packed LEN is right for repeated
    numbers, so those get I32 instead)."""
    if _wire(fd) == LEN:
        return tag(fd.number, VARINT) + b"\x01"
    if fd.is_repeated:
        return tag(fd.number, I64 if _wire(fd) == I32 else I32) + b"\x00" * (8 if _wire(fd) == I32 else 4)
    return tag(fd.number, LEN) + b"\x01A"
