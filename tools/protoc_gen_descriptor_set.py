"""protoc/buf plugin: writes every input file, dependencies first, as one FileDescriptorSet.

The reference server loads the sets into protobuf's default pool for gRPC server reflection.
Reads and writes the plugin protocol's wire format directly so that it needs no packages.

``buf generate`` runs the plugin once per input of buf.gen.yaml. The input holding the package
named by the ``primary=<package>`` option is written to ``descriptor_set.binpb`` (the lmrpc
contract); any other input to ``descriptor_set.<package of its first file>.binpb``.
"""

from __future__ import annotations

import sys

PRIMARY_OUTPUT = "descriptor_set.binpb"
FILE_TO_GENERATE_FIELD = 1  # CodeGeneratorRequest.file_to_generate
PARAMETER_FIELD = 2  # CodeGeneratorRequest.parameter
PROTO_FILE_FIELD = 15  # CodeGeneratorRequest.proto_file
NAME_FIELD, PACKAGE_FIELD = 1, 2  # FileDescriptorProto.name, .package
FEATURE_PROTO3_OPTIONAL = 1


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def length_delimited(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def fields(message: bytes) -> list[tuple[int, bytes]]:
    """The length-delimited fields of a message, in order (other wire types are skipped)."""
    result, pos = [], 0
    while pos < len(message):
        key, pos = read_varint(message, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = read_varint(message, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            size, pos = read_varint(message, pos)
            result.append((field, message[pos : pos + size]))
            pos += size
        else:
            raise ValueError(f"unexpected wire type {wire_type}")
    return result


def string_field(message: bytes, number: int) -> str:
    return next((value.decode() for field, value in fields(message) if field == number), "")


def output_name(request: list[tuple[int, bytes]], files: list[bytes]) -> str:
    options = dict(
        item.split("=", 1)
        for value in (v.decode() for f, v in request if f == PARAMETER_FIELD)
        for item in value.split(",")
        if "=" in item
    )
    packages = {string_field(f, NAME_FIELD): string_field(f, PACKAGE_FIELD) for f in files}
    generated = [packages[v.decode()] for f, v in request if f == FILE_TO_GENERATE_FIELD]
    if not generated or options.get("primary") in generated:
        return PRIMARY_OUTPUT
    return f"descriptor_set.{generated[0]}.binpb"


def main() -> None:
    request = fields(sys.stdin.buffer.read())
    files = [value for field, value in request if field == PROTO_FILE_FIELD]
    descriptor_set = b"".join(length_delimited(1, f) for f in files)
    name = output_name(request, files)
    generated_file = length_delimited(1, name.encode()) + length_delimited(15, descriptor_set)
    response = varint(2 << 3) + varint(FEATURE_PROTO3_OPTIONAL) + length_delimited(15, generated_file)
    sys.stdout.buffer.write(response)


if __name__ == "__main__":
    main()
