"""gRPC server reflection for the lmrpc services.

grpclib's reflection service looks symbols up in protobuf's default descriptor pool, which the
betterproto2-generated code does not fill. ``buf generate`` also writes the contract as a
FileDescriptorSet (``gen/descriptor_set.binpb``), and each vendored contract as another
(``gen/descriptor_set.<package>.binpb``); they are loaded into the default pool here.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool
from grpclib.reflection.service import ServerReflection

from lmrpc import descriptor_set_path


def load_contract_descriptors() -> None:
    pool = descriptor_pool.Default()
    for path in sorted(descriptor_set_path().parent.glob("descriptor_set*.binpb")):
        files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())
        for proto in files.file:
            try:
                pool.FindFileByName(proto.name)
            except KeyError:
                pool.AddSerializedFile(proto.SerializeToString())


def reflection_services(services: Collection[Any]) -> list[Any]:
    load_contract_descriptors()
    return list(ServerReflection.extend(services))
