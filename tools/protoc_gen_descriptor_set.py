"""protoc/buf plugin: writes every input file, dependencies first, as one FileDescriptorSet.

The reference server loads the set into protobuf's default pool for gRPC server reflection.
Reads and writes the plugin protocol's wire format directly so that it needs no packages.
"""

from __future__ import annotations

import sys

OUTPUT_NAME = "descriptor_set.binpb"
PROTO_FILE_FIELD = 15  # CodeGeneratorRequest.proto_file
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


def proto_files(request: bytes) -> list[bytes]:
    files, pos = [], 0
    while pos < len(request):
        key, pos = read_varint(request, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = read_varint(request, pos)
        elif wire_type == 2:
            size, pos = read_varint(request, pos)
            if field == PROTO_FILE_FIELD:
                files.append(request[pos : pos + size])
            pos += size
        else:
            raise ValueError(f"unexpected wire type {wire_type} in CodeGeneratorRequest")
    return files


def main() -> None:
    request = sys.stdin.buffer.read()
    descriptor_set = b"".join(length_delimited(1, f) for f in proto_files(request))
    generated_file = length_delimited(1, OUTPUT_NAME.encode()) + length_delimited(15, descriptor_set)
    response = varint(2 << 3) + varint(FEATURE_PROTO3_OPTIONAL) + length_delimited(15, generated_file)
    sys.stdout.buffer.write(response)


if __name__ == "__main__":
    main()
