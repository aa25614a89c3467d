"""Edge mutants: the reference server with exactly one fault at its wire boundary, for the clauses a
proxy cannot carry through (malformed bytes, framing, flow control, authentication).

A proxy re-frames and re-reads every message, so the zoo's proxy mutants cannot lie about length
prefixes or stop reading. These mutants are the real server instead, started by this module after
one of its parts is replaced; nothing of the fault lives in ``reference_server``.

    python -m tests.selftest.edge_mutants MUTANT [server options...]
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import betterproto2
from grpclib import GRPCError, Status

from reference_server.frontend.edge import auth, decoding, framing, guard
from reference_server.frontend.metrics import exporter
from reference_server.frontend.requests import DuplicateRequestError, FlowHooks, RequestState, RequestTable


@dataclass(frozen=True)
class EdgeMutant:
    name: str
    fault: str
    expected: frozenset[str]  # the cases that must fail (globs allowed), and no others
    apply: Callable[[], None]


def _lax_decoding() -> None:
    """betterproto2 alone, as the server had it: accepts what upb refuses."""

    def decode(self: decoding.StrictDecoder, data: bytes, message_type: type) -> Any:
        if issubclass(message_type, betterproto2.Message):
            return message_type.parse(data)
        return message_type.FromString(data)  # type: ignore[attr-defined]

    decoding.StrictDecoder.decode = decode  # type: ignore[method-assign]


def _first_message_only() -> None:
    async def read_single_message(stream: framing.RawStream, max_message_bytes: int) -> bytes:
        return await framing.read_message(stream, max_message_bytes) or b""

    guard.read_single_message = read_single_message  # type: ignore[assignment]


def _limit_after_body() -> None:
    original = framing.read_message

    async def read_message(stream: framing.RawStream, max_message_bytes: int) -> bytes | None:
        return await original(stream, 2**32)  # reads whatever the prefix claims, checks nothing

    guard.read_message = read_message  # type: ignore[assignment]
    framing.read_message = read_message  # type: ignore[assignment]


def _no_credit() -> None:
    """Requests generate on, whether their client reads or not."""
    FlowHooks.initial_credit = lambda self, num_outputs: 0  # type: ignore[method-assign]
    RequestTable.mark_submitted = _submitted_without_grants  # type: ignore[method-assign]


def _submitted_without_grants(self: RequestTable, state: RequestState, prompt_tokens: int) -> None:
    state.submitted = True
    state.granted = 10**12  # never grant: there is no limit to lift


def _no_room_after_a_burst() -> None:
    """The mutation sample's survivor (requests.py, the grant test negated): credit is granted again at
    every read of less than half the window, and never after a read of more, so a client that reads a
    burst of held tokens at once is never given room again."""

    async def next_events(self: RequestState) -> list[Any]:
        while not self._events and self.failure is None:
            self._wakeup.clear()
            await self._wakeup.wait()
        events, self._events = self._events, []
        self.taken_tokens += sum(len(e.token_ids) for e in events)
        window = self.flow.window
        if not (self.submitted and self.taken_tokens + window - self.granted >= window // 2):
            self.granted = self.taken_tokens + window
            self.flow.grant(self.rid, self.granted)
        return events

    RequestState.next_events = next_events  # type: ignore[method-assign]


def _stall_as_aborted_finish() -> None:
    from reference_server.frontend import inference

    def stall(self: inference.InferenceService, state: RequestState) -> None:
        state.abort_requested = True
        if state.submitted:
            self.ctx.link.abort([state.rid])  # the engine's aborted finishes end the stream

    inference.InferenceService._stall = stall  # type: ignore[method-assign]


def _open_door() -> None:
    def authenticate(self: auth.Credentials, metadata: Any, peer_certificate: Any) -> auth.Principal:
        try:
            return original(self, metadata, peer_certificate)
        except GRPCError:
            return auth.Principal("anyone", "client")

    original = auth.Credentials.authenticate
    auth.Credentials.authenticate = authenticate  # type: ignore[method-assign]


def _no_roles() -> None:
    def authorize(self: guard.EdgeGuard, path: str, stream: Any) -> auth.Principal:
        return original(self, path.replace("/lmrpc.v1.ControlService/", "/unchecked/"), stream)

    original = guard.EdgeGuard._authorize
    guard.EdgeGuard._authorize = authorize  # type: ignore[method-assign]


def _shared_ids() -> None:
    def authorize(self: guard.EdgeGuard, path: str, stream: Any) -> auth.Principal:
        principal = original(self, path, stream)
        return auth.Principal("everyone", principal.role)  # one owner for all: ids and aborts collide

    original = guard.EdgeGuard._authorize
    guard.EdgeGuard._authorize = authorize  # type: ignore[method-assign]


def _global_ids() -> None:
    """Ids are owned for Abort, but ALREADY_EXISTS compares them across principals."""
    original = RequestTable.register

    def register(self: RequestTable, owner: str, request_id: str, num_outputs: int) -> RequestState:
        if any(state.request_id == request_id for state in self.states()):
            raise DuplicateRequestError(request_id)
        return original(self, owner, request_id, num_outputs)

    RequestTable.register = register  # type: ignore[method-assign]


def _gateway_gauges_swapped() -> None:
    """The gauges the inference gateway reads say waiting where they mean running, and back."""
    original = exporter._families
    swap = {
        "vllm:num_requests_waiting": "vllm:num_requests_running",
        "vllm:num_requests_running": "vllm:num_requests_waiting",
    }

    def families(snapshot: Any) -> Any:
        for family in original(snapshot):
            if family.name in swap:
                family.name = swap[family.name]
                family.samples = [sample._replace(name=family.name) for sample in family.samples]
            yield family

    exporter._families = families


def _wrong_refusal_code() -> None:
    original = auth.Credentials.authenticate

    def authenticate(self: auth.Credentials, metadata: Any, peer_certificate: Any) -> auth.Principal:
        try:
            return original(self, metadata, peer_certificate)
        except GRPCError as exc:
            raise GRPCError(Status.PERMISSION_DENIED, exc.message) from None

    auth.Credentials.authenticate = authenticate  # type: ignore[method-assign]


def _trace_not_continued() -> None:
    guard.valid_traceparent = lambda value: ""  # type: ignore[assignment]  # every call starts a new trace


EDGE_MUTANTS = (
    EdgeMutant("lax-decoding", "requests parsed by betterproto2 alone", frozenset({"MALFORMED-1[*]", "MALFORMED-2", "MALFORMED-2[nested]"}), _lax_decoding),
    EdgeMutant("first-message-only", "a unary call's extra or missing message goes unnoticed", frozenset({"MALFORMED-4[two-messages]", "MALFORMED-4[no-message]"}), _first_message_only),
    EdgeMutant("limit-after-body", "the size limit is checked after the body was read", frozenset({"MALFORMED-3", "MALFORMED-3[unary]"}), _limit_after_body),
    EdgeMutant("no-credit", "generation goes on for a client that does not read", frozenset({"FLOW-1"}), _no_credit),
    EdgeMutant("no-room-after-a-burst", "a client that reads a burst of held tokens is never given room again", frozenset({"FLOW-1[pause-then-read]"}), _no_room_after_a_burst),
    EdgeMutant("stall-as-aborted-finish", "a stalled request ends with ABORTED finishes", frozenset({"FLOW-2"}), _stall_as_aborted_finish),
    EdgeMutant("open-door", "calls without credentials are served", frozenset({"AUTH-1", "AUTH-1[every-rpc]"}), _open_door),
    EdgeMutant("wrong-refusal-code", "missing credentials answer PERMISSION_DENIED", frozenset({"AUTH-1", "AUTH-1[every-rpc]"}), _wrong_refusal_code),
    EdgeMutant("no-roles", "every principal may use administrative RPCs", frozenset({"AUTH-2", "AUTH-2[in-flight]"}), _no_roles),
    EdgeMutant("shared-ids", "requests are not owned: one principal aborts another's", frozenset({"AUTH-3", "AUTH-3[in-flight-id]"}), _shared_ids),
    EdgeMutant("gateway-gauges-swapped", "vllm:num_requests_waiting and _running are swapped", frozenset({"LOAD-2"}), _gateway_gauges_swapped),
    EdgeMutant("trace-not-continued", "the caller's traceparent is dropped: every call starts a new trace", frozenset({"TRACE-1"}), _trace_not_continued),
    EdgeMutant("global-ids", "an id in flight for one principal is ALREADY_EXISTS for another", frozenset({"AUTH-3", "AUTH-3[in-flight-id]"}), _global_ids),
)  # fmt: skip


def serve_mutant(apply: Mapping[str, Callable[[], None]], argv: list[str]) -> None:
    """``MUTANT [server options...]``: the reference server (``reference``) or, with its one part
    replaced first, the mutant of ``apply`` so named."""
    name, args = argv[0], argv[1:]
    if name != "reference":
        apply[name]()
    from reference_server.cli import main as serve

    serve(args)


def main() -> None:
    serve_mutant({m.name: m.apply for m in EDGE_MUTANTS}, sys.argv[1:])


if __name__ == "__main__":
    main()
