"""The generated SDK is wire-compatible with protobuf's own code for the same .proto files.

Every message of lmrpc.v1 is filled (every field, every oneof member in turn) through the protobuf
descriptor, then round-tripped: protobuf bytes -> betterproto2 -> bytes -> protobuf, and
betterproto2 bytes -> betterproto2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import betterproto2
from google.protobuf import descriptor as d
from google.protobuf.message import Message as PbMessage

import lmrpc
import lmrpc.v1 as sdk


def message_classes(
    pb_modules: dict[str, ModuleType],
) -> Iterator[tuple[type[PbMessage], type[betterproto2.Message]]]:
    for module in pb_modules.values():
        for name, _descriptor in module.DESCRIPTOR.message_types_by_name.items():
            yield getattr(module, name), getattr(sdk, name)


def fill(message: PbMessage, oneof_choice: int, depth: int = 0) -> None:
    chosen = {
        o.name: o.fields[oneof_choice % len(o.fields)].name for o in message.DESCRIPTOR.oneofs if o.fields
    }
    for field in message.DESCRIPTOR.fields:
        group = field.containing_oneof
        if group is not None and group.fields and chosen.get(group.name) != field.name:
            continue
        if field.message_type is not None:
            if depth > 3:
                continue
            if field.is_repeated:
                for _ in range(2):
                    fill(getattr(message, field.name).add(), oneof_choice, depth + 1)
            else:
                child = getattr(message, field.name)
                fill(child, oneof_choice, depth + 1)
                child.SetInParent()
            continue
        value = sample_value(field)
        if field.is_repeated:
            getattr(message, field.name).extend([value, value])
        else:
            setattr(message, field.name, value)


def sample_value(field: d.FieldDescriptor) -> Any:
    t = field.type
    if t == d.FieldDescriptor.TYPE_STRING:
        return f"{field.name} ☺ 😈"
    if t == d.FieldDescriptor.TYPE_BOOL:
        return True
    if t in (d.FieldDescriptor.TYPE_FLOAT, d.FieldDescriptor.TYPE_DOUBLE):
        return 0.5
    if t == d.FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values[-1].number
    if t == d.FieldDescriptor.TYPE_BYTES:
        return b"\x00\xff"
    return 2**31 + 7 if t in (d.FieldDescriptor.TYPE_UINT32, d.FieldDescriptor.TYPE_UINT64) else 7


def test_every_message_round_trips_through_protobuf(pb_modules: dict[str, ModuleType]) -> None:
    checked = 0
    for pb_class, bp_class in message_classes(pb_modules):
        max_members = max([len(o.fields) for o in pb_class.DESCRIPTOR.oneofs] + [1])
        for choice in range(max_members):
            original = pb_class()
            fill(original, choice)
            ours = bp_class.parse(original.SerializeToString())
            assert bp_class.parse(bytes(ours)) == ours, bp_class.__name__
            back = pb_class.FromString(bytes(ours))
            assert back == original, f"{bp_class.__name__}: {back} != {original}"
            checked += 1
    assert checked >= 50


def test_presence_of_zero_values_survives_the_wire(pb_modules: dict[str, ModuleType]) -> None:
    pb = pb_modules["lmrpc/v1/inference.proto"]
    ours = sdk.GenerateRequest(
        text="",
        sampling=sdk.SamplingParams(temperature=0.0, seed=0, n=0),
        stopping=sdk.StoppingCriteria(max_tokens=0),
    )
    theirs = pb.GenerateRequest.FromString(bytes(ours))
    assert theirs.WhichOneof("input") == "text"
    assert theirs.sampling.HasField("temperature") and theirs.sampling.temperature == 0.0
    assert theirs.sampling.HasField("seed") and not theirs.sampling.HasField("top_p")
    assert theirs.stopping.HasField("max_tokens")
    back = sdk.GenerateRequest.parse(theirs.SerializeToString())
    assert back.sampling is not None and back.sampling.temperature == 0.0 and back.sampling.top_p is None
    delta = sdk.TokenDelta(output_index=0)
    assert pb.TokenDelta.FromString(bytes(delta)).HasField("output_index")


def test_no_field_shadows_a_generated_message_method() -> None:
    reserved = set(dir(betterproto2.Message))
    for name in sdk.__all__:
        cls = getattr(sdk, name)
        if isinstance(cls, type) and issubclass(cls, betterproto2.Message):
            clashes = {f.name for f in dataclasses.fields(cls)} & reserved
            assert not clashes, f"{name} has fields {clashes} that shadow betterproto2.Message methods"


def test_enum_zero_values_are_unspecified() -> None:
    for name in sdk.__all__:
        cls = getattr(sdk, name)
        if isinstance(cls, type) and issubclass(cls, betterproto2.Enum):
            assert cls(0).name == "UNSPECIFIED", name


def test_protos_and_descriptor_set_ship_with_the_package() -> None:
    assert {p.name for p in (lmrpc.proto_dir() / "lmrpc" / "v1").glob("*.proto")} == {
        "common.proto", "inference.proto", "control.proto",
    }  # fmt: skip
    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet.FromString(lmrpc.descriptor_set_path().read_bytes()).file
    services = {s.name for f in files for s in f.service}
    assert services == {"InferenceService", "ControlService"}
