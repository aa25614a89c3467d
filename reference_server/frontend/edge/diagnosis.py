"""Explain, in terms of the message's own fields, why protobuf bytes are not a valid message.

The C parser (upb) decides whether bytes are valid; it does not say which field is wrong. This
scanner walks the wire format against the message descriptor and names the first problem
(``invalid UTF-8 in field 'chat.messages[1].content'``), so a client gets an INVALID_ARGUMENT it
can act on. It also finds what upb accepts but the contract refuses: a known field sent with the
wrong wire type (upb keeps it as an unknown field, and a lax parser would misread it).

It only runs on bytes already judged bad or carrying unknown fields, and stops after a budget of
fields so its cost stays bounded whatever the input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.descriptor import Descriptor, FieldDescriptor

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
WIRE_TYPE_NAMES = {VARINT: "VARINT", I64: "I64", LEN: "LEN", SGROUP: "SGROUP", EGROUP: "EGROUP", I32: "I32"}
MAX_DEPTH = 64
MAX_FIELD_NUMBER = (1 << 29) - 1

_I64_TYPES = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}
_I32_TYPES = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32}
_LEN_TYPES = {FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE}


class BudgetExceeded(Exception):
    """The message has more fields than the scanner will look at."""


def expected_wire_type(fd: FieldDescriptor) -> int:
    if fd.type in _I64_TYPES:
        return I64
    if fd.type in _I32_TYPES:
        return I32
    if fd.type in _LEN_TYPES:
        return LEN
    if fd.type == FieldDescriptor.TYPE_GROUP:
        return SGROUP
    return VARINT


def _is_repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


def _packable(fd: FieldDescriptor) -> bool:
    return _is_repeated(fd) and expected_wire_type(fd) in (VARINT, I32, I64)


@dataclass
class _Scan:
    data: bytes
    budget: int
    fields: int = 0
    occurrences: dict[tuple[int, int], int] = field(default_factory=dict)

    def count_field(self) -> None:
        self.fields += 1
        if self.fields > self.budget:
            raise BudgetExceeded

    def varint(self, pos: int, end: int) -> tuple[int, int] | None:
        """(value, next position), or None if the varint is truncated or longer than 10 bytes."""
        value = shift = 0
        for i in range(10):
            if pos + i >= end:
                return None
            byte = self.data[pos + i]
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value, pos + i + 1
        return None


def explain(data: bytes, descriptor: Descriptor, *, budget: int = 200_000) -> str | None:
    """The first problem in ``data`` as ``descriptor``'s message, or None if none was found.

    Raises BudgetExceeded when the bytes hold more than ``budget`` fields before a verdict."""
    return _message(_Scan(data, budget), 0, len(data), descriptor, "", 0)


def _message(scan: _Scan, pos: int, end: int, desc: Descriptor, prefix: str, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"messages nested more than {MAX_DEPTH} levels deep at '{prefix.rstrip('.') or '(top)'}'"
    while pos < end:
        scan.count_field()
        tag = scan.varint(pos, end)
        where = f"'{prefix.rstrip('.')}'" if prefix else "the top level"
        if tag is None:
            return f"truncated field tag in {where}"
        key, pos = tag
        number, wire = key >> 3, key & 7
        if number == 0 or number > MAX_FIELD_NUMBER:
            return f"field number {number} in {where} is out of range"
        if wire not in WIRE_TYPE_NAMES:
            return f"wire type {wire} (field number {number} in {where}) does not exist"
        if wire == EGROUP:
            return f"end-group tag without a start-group (field number {number} in {where})"
        fd = desc.fields_by_number.get(number)
        name = prefix + (fd.name if fd is not None else f"#{number}")
        if fd is not None and _is_repeated(fd):
            slot = (id(desc), number)
            index = scan.occurrences.get(slot, 0)
            scan.occurrences[slot] = index + 1
            if not (wire == LEN and _packable(fd)):
                name = f"{name}[{index}]"
        if fd is not None:
            problem = _wire_type_problem(fd, wire, name)
            if problem is not None:
                return problem
        step = _value(scan, pos, end, wire, number, name, fd, depth)
        if isinstance(step, str):
            return step
        pos = step
    return None


def _wire_type_problem(fd: FieldDescriptor, wire: int, name: str) -> str | None:
    expected = expected_wire_type(fd)
    if wire == expected or (wire == LEN and _packable(fd)):
        return None
    type_name = _type_name(fd)
    return (
        f"field '{name}' has wire type {WIRE_TYPE_NAMES[wire]}; "
        f"a {type_name} field is encoded as {WIRE_TYPE_NAMES[expected]}"
    )


def _value(
    scan: _Scan, pos: int, end: int, wire: int, number: int, name: str, fd: FieldDescriptor | None, depth: int
) -> int | str:
    """The position after the field's value, or a problem."""
    if wire == VARINT:
        value = scan.varint(pos, end)
        return f"truncated varint in field '{name}'" if value is None else value[1]
    if wire in (I64, I32):
        width = 8 if wire == I64 else 4
        if pos + width > end:
            return f"field '{name}' needs {width} bytes but {end - pos} remain (truncated)"
        return pos + width
    if wire == SGROUP:
        return _group(scan, pos, end, number, name, depth)
    length = scan.varint(pos, end)
    if length is None:
        return f"truncated length of field '{name}'"
    size, pos = length
    if size > end - pos:
        return f"field '{name}' declares {size} bytes but {end - pos} remain (truncated)"
    if fd is not None:
        problem = _payload(scan, pos, pos + size, fd, name, depth)
        if problem is not None:
            return problem
    return pos + size


def _payload(scan: _Scan, pos: int, end: int, fd: FieldDescriptor, name: str, depth: int) -> str | None:
    if fd.type == FieldDescriptor.TYPE_STRING:
        try:
            scan.data[pos:end].decode("utf-8")
        except UnicodeDecodeError:
            return f"invalid UTF-8 in field '{name}'"
        return None
    if fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type is not None:
        return _message(scan, pos, end, fd.message_type, f"{name}.", depth + 1)
    if _packable(fd):
        return _packed(scan, pos, end, fd, name)
    return None


def _packed(scan: _Scan, pos: int, end: int, fd: FieldDescriptor, name: str) -> str | None:
    expected = expected_wire_type(fd)
    if expected != VARINT:
        width = 8 if expected == I64 else 4
        if (end - pos) % width:
            return f"packed field '{name}' holds {end - pos} bytes, not a multiple of {width}"
        return None
    while pos < end:
        scan.count_field()
        value = scan.varint(pos, end)
        if value is None:
            return f"truncated varint in packed field '{name}'"
        pos = value[1]
    return None


def _group(scan: _Scan, pos: int, end: int, number: int, name: str, depth: int) -> int | str:
    """Skip an (unknown) group up to its matching end-group tag."""
    if depth > MAX_DEPTH:
        return f"groups nested more than {MAX_DEPTH} levels deep at '{name}'"
    while pos < end:
        scan.count_field()
        tag = scan.varint(pos, end)
        if tag is None:
            return f"truncated field tag inside group '{name}'"
        key, pos = tag
        inner_number, wire = key >> 3, key & 7
        if wire == EGROUP:
            if inner_number != number:
                return f"group '{name}' ends with the end-group tag of field {inner_number}"
            return pos
        if wire not in WIRE_TYPE_NAMES or inner_number == 0:
            return f"corrupt field (number {inner_number}, wire type {wire}) inside group '{name}'"
        step = _value(scan, pos, end, wire, inner_number, f"{name}.#{inner_number}", None, depth + 1)
        if isinstance(step, str):
            return step
        pos = step
    return f"group '{name}' is never closed"


def _type_name(fd: FieldDescriptor) -> str:
    names = {
        FieldDescriptor.TYPE_BOOL: "bool",
        FieldDescriptor.TYPE_STRING: "string",
        FieldDescriptor.TYPE_BYTES: "bytes",
        FieldDescriptor.TYPE_MESSAGE: "message",
        FieldDescriptor.TYPE_ENUM: "enum",
        FieldDescriptor.TYPE_FLOAT: "float",
        FieldDescriptor.TYPE_DOUBLE: "double",
    }
    return names.get(fd.type, "integer")
