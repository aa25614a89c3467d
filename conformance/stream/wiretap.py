"""What a run puts on the wire and what it reads back, field by field and case by case
(``conformance run --fields FILE``), for the coverage matrix (spec/fields.py).

Sent: every field set in a request message (gRPC) or present in a JSON body (HTTP), when it is
encoded. Read: every field of a server's message that a case or a driver reads, caught by the
message itself: on gRPC a decoded message's class is swapped for a subclass that notes each field
read; on HTTP a parsed JSON object is a dict that notes each key looked up. A field shown only
(``repr``) or tested only for being non-empty (``bool``) is not counted as read.

Off unless a run asks (``start()``): nothing is swapped or wrapped then.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import betterproto2
from grpclib.client import Channel
from grpclib.encoding.base import CodecBase

DISCOVERY = "(discovery)"  # what the run reads before its first case, and between cases
CASE: ContextVar[str] = ContextVar("wiretap_case", default=DISCOVERY)
_QUIET: ContextVar[bool] = ContextVar("wiretap_quiet", default=False)
_WHERE = "_wiretap_where"  # a tracked message's "GROUP path." prefix, in its __dict__


class Wiretap:
    def __init__(self) -> None:
        self.seen: dict[str, dict[str, set[str]]] = {"sent": {}, "read": {}}

    def note(self, kind: str, field: str) -> None:
        self.seen[kind].setdefault(field, set()).add(CASE.get())

    def to_json(self, protocol: str) -> dict[str, object]:
        return {
            "protocol": protocol,
            **{
                kind: {f: sorted(cases) for f, cases in sorted(fields.items())}
                for kind, fields in self.seen.items()
            },
        }

    def write(self, path: str, protocol: str) -> None:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(self.to_json(protocol), out, indent=1)
            out.write("\n")


ACTIVE: Wiretap | None = None


def start() -> Wiretap:
    global ACTIVE
    ACTIVE = Wiretap()
    return ACTIVE


@contextlib.contextmanager
def in_case(case_id: str) -> Iterator[None]:
    token = CASE.set(case_id)
    try:
        yield
    finally:
        CASE.reset(token)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


# ── gRPC ─────────────────────────────────────────────────────
def _names(cls: Any) -> tuple[str, ...]:
    return tuple(cls._betterproto.meta_by_field_name)


def _sent(message: betterproto2.Message, prefix: str) -> Iterator[str]:
    for name in _names(type(message)):
        value = object.__getattribute__(message, name)
        if value is None or value == message._get_field_default(name):
            continue  # unset, or a proto3 default: not on the wire
        yield f"{prefix}{name}"
        for item in value if isinstance(value, list) else (value,):
            if isinstance(item, betterproto2.Message):
                yield from _sent(item, f"{prefix}{name}.")


_TRACKED: dict[type, type] = {}


def _tracked_class(cls: type[betterproto2.Message]) -> type:
    tracked = _TRACKED.get(cls)
    if tracked is not None:
        return tracked
    names = frozenset(_names(cls))

    def __getattribute__(self: Any, name: str) -> Any:
        if name in names and ACTIVE is not None and not _QUIET.get():
            where = object.__getattribute__(self, "__dict__").get(_WHERE)
            if where is not None:
                ACTIVE.note("read", f"{where}{name}")
        return object.__getattribute__(self, name)

    def __eq__(self: Any, other: object) -> bool:
        if not isinstance(other, cls):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in names)

    def __repr__(self: Any) -> str:
        with _quiet():
            return cls.__repr__(self)

    def __bool__(self: Any) -> bool:
        with _quiet():
            return cls.__bool__(self)

    namespace = {
        "__getattribute__": __getattribute__,
        "__eq__": __eq__,
        "__hash__": None,
        "__repr__": __repr__,
        "__bool__": __bool__,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
    }
    metaclass: Any = type(cls)  # betterproto2's messages are ABCs
    made: type = metaclass(cls.__name__, (cls,), namespace)
    _TRACKED[cls] = made
    return made


def track(message: betterproto2.Message, group: str) -> None:
    """Note each field of ``message`` (a server's, of ``group``: ``Service.Method response``) read
    from now on, when a wiretap runs."""
    if ACTIVE is not None:
        with contextlib.suppress(RecursionError):  # a hostile nesting is recorded no deeper
            _track(message, f"{group} ")


def _track(message: betterproto2.Message, prefix: str) -> None:
    for name in _names(type(message)):
        value = object.__getattribute__(message, name)
        values = value.values() if isinstance(value, dict) else value if isinstance(value, list) else (value,)
        for item in values:
            if isinstance(item, betterproto2.Message):
                _track(item, f"{prefix}{name}.")
    message.__dict__[_WHERE] = prefix
    message.__class__ = _tracked_class(type(message))


class _RouteCodec(CodecBase):
    """The channel's codec, noting what one RPC sends and tracking what it receives."""

    def __init__(self, inner: CodecBase, rpc: str) -> None:
        self.inner = inner
        self.rpc = rpc

    @property
    def __content_subtype__(self) -> str:
        return self.inner.__content_subtype__

    def encode(self, message: Any, message_type: Any) -> bytes:
        if isinstance(message, betterproto2.Message):
            note_sent(message, f"{self.rpc} request")
        return self.inner.encode(message, message_type)

    def decode(self, data: bytes, message_type: Any) -> Any:
        message = self.inner.decode(data, message_type)
        if ACTIVE is not None and isinstance(message, betterproto2.Message):
            with contextlib.suppress(RecursionError):  # a hostile nesting is recorded no deeper
                _track(message, f"{self.rpc} response ")
        return message


def tap(channel: Channel) -> Channel:
    """``channel``, its calls recorded when a wiretap runs (``/pkg.Service/Method`` as ``Service.Method``)."""
    if ACTIVE is None:
        return channel
    request = channel.request

    def recorded(name: str, *args: Any, **kwargs: Any) -> Any:
        stream = request(name, *args, **kwargs)
        service, _, method = name.strip("/").partition("/")
        stream._codec = _RouteCodec(stream._codec, f"{service.rpartition('.')[2]}.{method}")
        return stream

    channel.request = recorded  # type: ignore[method-assign]
    return channel


# ── HTTP (JSON) ──────────────────────────────────────────────
def note_body(route: str, body: Any) -> None:
    """A JSON request body sent to ``route`` (``chat/completions``)."""
    if ACTIVE is not None:
        for field in _json_paths(body, ""):
            ACTIVE.note("sent", f"{route} request {field}")


def _json_paths(value: Any, prefix: str) -> Iterator[str]:
    if isinstance(value, list):
        for item in value:
            yield from _json_paths(item, prefix)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield f"{prefix}{key}"
            yield from _json_paths(item, f"{prefix}{key}.")


class _Object(dict[str, Any]):
    """A JSON object of a response that notes each key looked up in it."""

    where: str

    def _note(self, key: object) -> None:
        if ACTIVE is not None and isinstance(key, str):
            ACTIVE.note("read", f"{self.where}{key}")

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)

    def items(self) -> Any:
        for key in self:
            self._note(key)
        return super().items()

    def values(self) -> Any:
        for key in self:
            self._note(key)
        return super().values()


def _wrap(value: Any, where: str) -> Any:
    if isinstance(value, list):
        return [_wrap(item, where) for item in value]
    if isinstance(value, dict):
        wrapped = _Object({key: _wrap(item, f"{where}{key}.") for key, item in value.items()})
        wrapped.where = where
        return wrapped
    return value


def track_json(value: Any) -> Any:
    """A parsed response body or event, tracked under its ``object`` name (``chat.completion``), or
    ``error`` for an error object; anything else is returned as it is."""
    if ACTIVE is None or not isinstance(value, dict):
        return value
    kind = value.get("object")
    group = kind if isinstance(kind, str) else "error" if "error" in value else None
    if group is None:
        return value
    try:
        return _wrap(value, f"{group} ")
    except RecursionError:  # a hostile nesting: the body as it came, untracked
        return value


# ── messages a case encodes or decodes itself ───────────────
def note_sent(message: betterproto2.Message, group: str) -> None:
    """A request a case serialized itself (``group``: ``Service.Method request``)."""
    if ACTIVE is not None:
        for field in _sent(message, f"{group} "):
            ACTIVE.note("sent", field)


class _Protobuf:
    """A message decoded by protobuf's runtime (which no class swap reaches), noting each field read."""

    __slots__ = ("_message", "_where")

    def __init__(self, message: Any, where: str) -> None:
        object.__setattr__(self, "_message", message)
        object.__setattr__(self, "_where", where)

    def __getattr__(self, name: str) -> Any:
        message = object.__getattribute__(self, "_message")
        value = getattr(message, name)
        if name not in message.DESCRIPTOR.fields_by_name:
            return value
        where = object.__getattribute__(self, "_where")
        if ACTIVE is not None:
            ACTIVE.note("read", f"{where}{name}")
        return _protobuf_value(value, f"{where}{name}.")

    def HasField(self, name: str) -> bool:  # protobuf's name; a presence test is a read
        if ACTIVE is not None:
            ACTIVE.note("read", f"{object.__getattribute__(self, '_where')}{name}")
        return bool(object.__getattribute__(self, "_message").HasField(name))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Protobuf):
            other = object.__getattribute__(other, "_message")
        return bool(object.__getattribute__(self, "_message") == other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(object.__getattribute__(self, "_message"))


def _protobuf_value(value: Any, where: str) -> Any:
    if hasattr(value, "DESCRIPTOR") and hasattr(value, "ListFields"):
        return _Protobuf(value, where)
    if hasattr(value, "add"):  # a repeated message field
        return [_protobuf_value(item, where) for item in value]
    return value


def track_protobuf(message: Any, group: str) -> Any:
    """``message`` (decoded by protobuf's runtime), tracked as ``group``'s when a wiretap runs."""
    return message if ACTIVE is None else _Protobuf(message, f"{group} ")
