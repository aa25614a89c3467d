"""Every field of every protocol, from the protocol's own schema, and whether the case library covers
it (``conformance coverage``).

The fields are not listed by hand: a gRPC protocol's are read from the .proto descriptors the wheel
ships (each RPC of its services, its request and its response, every field at every depth), the
openai protocol's from the official client's types (spec/openai_fields.json, written by
tools/openai_fields.py). A field is named ``GROUP PATH``: the group is ``Service.Method request`` or
``Service.Method response`` on gRPC, ``ROUTE request`` or the response's ``object`` name
(``chat.completion.chunk``) on HTTP; the path is dotted, a repeated field naming its elements.

A request field is covered when a case sent it on the wire (set, not defaulted); a response field
when a case or a driver read it from a message the server sent. Both are recorded by
``conformance run --fields FILE`` (drivers/wiretap.py). A field no case reaches is listed in
``NOT_APPLICABLE`` with the reason, or in ``OPEN`` (a known gap, printed as ``open``); a field
neither covered nor listed is a gap, and ``conformance coverage`` exits 1.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from conformance.spec.descriptors import _pool
from conformance.spec.not_applicable import NOT_APPLICABLE, OPEN, Patterns

# The services each gRPC protocol speaks (the row's API in spec/protocols.py); the HTTP protocol's
# schema is the JSON file.
SERVICES: Mapping[str, tuple[str, ...]] = {
    "lmrpc": ("lmrpc.v1.InferenceService", "lmrpc.v1.ControlService"),
    "vllm-engine": ("vllm.grpc.engine.VllmEngine",),
    "sglang-scheduler": ("sglang.grpc.scheduler.SglangScheduler",),
    "sglang-runtime": ("sglang.runtime.v1.SglangService",),
}
SCHEMA_FILES: Mapping[str, str] = {"openai": "openai_fields.json"}
# Messages whose inside is free-form data, not fields of the protocol: a leaf.
OPAQUE = frozenset({"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"})


def _paths(message: Descriptor, prefix: str, seen: tuple[str, ...]) -> Iterable[str]:
    for field in message.fields:
        path = f"{prefix}{field.name}"
        yield path
        inner = field.message_type
        if (
            field.type == FieldDescriptor.TYPE_MESSAGE
            and inner is not None
            and not inner.GetOptions().map_entry
            and inner.full_name not in OPAQUE
            and inner.full_name not in seen
        ):
            yield from _paths(inner, f"{path}.", (*seen, inner.full_name))


@cache
def universe(protocol: str) -> dict[str, tuple[str, ...]]:
    """Each group of ``protocol`` and its field paths."""
    if protocol in SCHEMA_FILES:
        text = (
            resources.files("conformance.spec").joinpath(SCHEMA_FILES[protocol]).read_text(encoding="utf-8")
        )
        document = json.loads(text)
        return {group: tuple(paths) for group, paths in document.items() if group != "source"}
    groups: dict[str, tuple[str, ...]] = {}
    for service_name in SERVICES[protocol]:
        service = _pool().FindServiceByName(service_name)
        for method in service.methods:
            for side, message in (("request", method.input_type), ("response", method.output_type)):
                group = f"{service.name}.{method.name} {side}"
                groups[group] = tuple(_paths(message, "", (message.full_name,)))
    return groups


def protocols() -> tuple[str, ...]:
    return (*SERVICES, *SCHEMA_FILES)


@dataclass(frozen=True, slots=True)
class Row:
    field: str  # "GROUP PATH"
    side: str  # "request" (sent by) or "response" (read by)
    cases: tuple[str, ...]  # the cases (or "(discovery)") that sent or read it
    reason: str = ""  # why no case covers it (NOT_APPLICABLE, or OPEN: a known gap)
    open: bool = False  # the reason is OPEN's

    @property
    def status(self) -> str:
        if self.cases:
            return "covered"
        if not self.reason:
            return "GAP"
        return "open" if self.open else "n/a"


def side_of(group: str) -> str:
    return "request" if group.endswith(" request") else "response"


def _listed(table: Mapping[str, Patterns], protocol: str, field: str) -> str:
    for pattern, reason in table.get(protocol, ()):
        if fnmatch.fnmatchcase(field, pattern):
            return reason
    return ""


def uncovered_row(protocol: str, field: str, side: str) -> Row:
    """A field no case covers: n/a with its reason, a listed open gap, or a gap."""
    if reason := _listed(NOT_APPLICABLE, protocol, field):
        return Row(field, side, (), reason)
    if reason := _listed(OPEN, protocol, field):
        return Row(field, side, (), reason, open=True)
    return Row(field, side, ())


def matrix(protocol: str, seen: Mapping[str, Mapping[str, Iterable[str]]]) -> list[Row]:
    """Every field of ``protocol``, with what covers it. ``seen``: {"sent"|"read": {field: cases}},
    merged from the runs' field files."""
    rows: list[Row] = []
    for group, paths in universe(protocol).items():
        side = side_of(group)
        observed = seen.get("sent" if side == "request" else "read", {})
        for path in paths:
            field = f"{group} {path}"
            cases = tuple(sorted(set(observed.get(field, ()))))
            rows.append(Row(field, side, cases) if cases else uncovered_row(protocol, field, side))
    return rows


def stale_reasons(protocol: str) -> list[str]:
    """The listed patterns of ``protocol`` that name no field of any protocol's schema (a field renamed
    or removed; a pattern may be shared by the protocols of one family)."""
    every = [f"{group} {path}" for p in protocols() for group, paths in universe(p).items() for path in paths]
    return [
        pattern
        for table in (NOT_APPLICABLE, OPEN)
        for pattern, _ in table.get(protocol, ())
        if not any(fnmatch.fnmatchcase(f, pattern) for f in every)
    ]
