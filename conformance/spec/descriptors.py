"""Every message the SDK ships (lmrpc.v1 and the vendored engine protocols), from the descriptor
sets in the wheel, as protobuf descriptors and, where a case must decode a message with protobuf's
own runtime, as message classes.

protobuf's runtime is needed where betterproto2 cannot decode a message: ``smg.grpc.common.
KvEventBatch`` has a field named ``load``, which shadows ``betterproto2.Message.load``, so
``KvEventBatch.parse`` fails on every input (``'NoneType' object is not callable``)."""

from __future__ import annotations

from functools import cache

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from lmrpc import descriptor_set_path


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    seen: set[str] = set()
    for path in sorted(descriptor_set_path().parent.glob("descriptor_set*.binpb")):
        for file in descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()).file:
            if file.name not in seen:
                seen.add(file.name)
                pool.Add(file)
    return pool


def message_descriptor(full_name: str) -> Descriptor:
    return _pool().FindMessageTypeByName(full_name)


@cache
def message_class(full_name: str) -> type[Message]:
    return message_factory.GetMessageClass(message_descriptor(full_name))
