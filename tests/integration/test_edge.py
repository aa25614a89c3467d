"""The server's edge against malformed bytes and abusive HTTP/2, over real loopback connections.

Each test reproduces a way an outside client broke the server: a malformed message that killed
the scheduler, invalid UTF-8 answered with UNKNOWN, a 4 GiB length prefix that made the frontend
buffer, parsing that froze the event loop, a unary call carrying two messages.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
from grpclib import Status
from grpclib.client import Channel
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from rawwire import GENERATE, H2Call, frame, raw_call
from streams import wait_idle

from conformance.search.malformed import named_faults, unknown_group
from conformance.spec.descriptors import message_descriptor
from conformance.stream.wire import length_field
from lmrpc.client import LmrpcClient
from lmrpc.v1 import GenerateRequest, GenerateResponse, SamplingParams, StoppingCriteria, TokenIds
from reference_server.testing import ServerProcess

# Every RPC of lmrpc.v1 that takes a message with fields, by request message type.
RPCS = {
    "GenerateRequest": GENERATE,
    "EmbedRequest": "/lmrpc.v1.InferenceService/Embed",
    "AbortRequest": "/lmrpc.v1.ControlService/Abort",
    "TokenizeRequest": "/lmrpc.v1.ControlService/Tokenize",
    "DetokenizeRequest": "/lmrpc.v1.ControlService/Detokenize",
    "ScoreRequest": "/lmrpc.v1.InferenceService/Score",
    "RerankRequest": "/lmrpc.v1.InferenceService/Rerank",
    "StartProfileRequest": "/lmrpc.v1.ControlService/StartProfile",
    "UpdateWeightsRequest": "/lmrpc.v1.ControlService/UpdateWeights",
}
HELLO = GenerateRequest(text="hello", stopping=StoppingCriteria(max_tokens=4, ignore_eos=True))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(engine="fake", args=("--max-message-bytes", str(4 * 1024 * 1024))) as server:
        yield server


def run(server: ServerProcess, body: Callable[[Channel], Awaitable[None]]) -> None:
    async def main() -> None:
        channel = Channel("127.0.0.1", server.port)
        try:
            await body(channel)
            await assert_still_serving(channel)
        finally:
            channel.close()

    asyncio.run(main())


async def assert_still_serving(channel: Channel) -> None:
    health = await HealthStub(channel).Check(HealthCheckRequest(), timeout=10)
    assert health.status == HealthCheckResponse.SERVING
    result = await raw_call(channel, GENERATE, bytes(HELLO))
    assert result.status is Status.OK and len(result.replies) >= 3


def test_malformed_generates_that_killed_the_scheduler_are_refused(server: ServerProcess) -> None:
    killers = [  # ignore_eos as bytes, stop_strings as a varint, packed stop ids cut, a penalty as bytes
        length_field(6, b"\x2a\x01A"),
        length_field(6, b"\x18\x07"),
        length_field(6, b"\x22\x01\x80"),
        length_field(5, b"\x3a\x02xx"),
    ]

    async def body(channel: Channel) -> None:
        for killer in killers:
            result = await raw_call(channel, GENERATE, length_field(2, b"hello") + killer)
            assert result.status is Status.INVALID_ARGUMENT, result
            assert result.message.startswith("malformed GenerateRequest: "), result.message
            assert "'stopping." in result.message or "'sampling." in result.message, result.message
            assert result.replies == []

    run(server, body)


@pytest.mark.parametrize("message_type", sorted(RPCS))
def test_every_malformed_field_of_every_rpc_is_invalid_argument_naming_it(
    server: ServerProcess, message_type: str
) -> None:
    faults = named_faults(message_descriptor(f"lmrpc.v1.{message_type}"))

    async def body(channel: Channel) -> None:
        for fault in faults:
            result = await raw_call(channel, RPCS[message_type], fault.body)
            assert result.status is Status.INVALID_ARGUMENT, (fault.name, result)
            assert fault.field is None or fault.field in result.message, (fault.name, result.message)

    run(server, body)


def test_an_unknown_group_is_skipped_not_read_as_fields(server: ServerProcess) -> None:
    request = GenerateRequest(
        token_ids=TokenIds(ids=[28120, 905]), stopping=StoppingCriteria(max_tokens=2),
        sampling=SamplingParams(temperature=0.0),
    )  # fmt: skip
    injected = unknown_group(length_field(2, b"an injected text prompt"))

    async def body(channel: Channel) -> None:
        result = await raw_call(channel, GENERATE, bytes(request) + injected)
        assert result.status is Status.OK
        info = GenerateResponse.parse(result.replies[0]).prompt_info
        assert info is not None and info.prompt_tokens == 2  # the token ids, not the injected text

    run(server, body)


def test_framing_abuse_gets_a_status_not_a_hang(server: ServerProcess) -> None:
    cases: list[tuple[str, bytes, bool, Status]] = [
        ("two messages on a unary call", frame(bytes(HELLO)) * 2, True, Status.INVALID_ARGUMENT),
        ("no message at all", b"", True, Status.INVALID_ARGUMENT),
        ("a body shorter than its prefix", frame(b"\x12\x02hi", length=40), True, Status.INVALID_ARGUMENT),
        ("a cut prefix", b"\x00\x00\x00", True, Status.INVALID_ARGUMENT),
        ("a compressed message", frame(bytes(HELLO), flag=1), True, Status.UNIMPLEMENTED),
        ("a 4 GiB prefix, body never sent", frame(b"", length=0xFFFFFFFF), False, Status.RESOURCE_EXHAUSTED),
        ("just over the limit", frame(b"", length=4 * 1024 * 1024 + 1), False, Status.RESOURCE_EXHAUSTED),
    ]

    async def body(channel: Channel) -> None:
        for name, data, end, expected in cases:
            async with H2Call("127.0.0.1", server.port) as call:
                call.start("/lmrpc.v1.ControlService/Tokenize" if "4 GiB" not in name else GENERATE)
                call.send(data, end=end)
                result = await call.wait(10)
                assert result.status is expected, (name, result)

    run(server, body)


def test_an_oversized_prefix_is_refused_before_the_body_and_the_connection_lives_on(
    server: ServerProcess,
) -> None:
    async def body(channel: Channel) -> None:
        async with H2Call("127.0.0.1", server.port) as call:
            call.start(GENERATE)
            call.send(struct.pack(">BI", 0, 256 * 1024 * 1024) + b"\x00" * 60000)
            result = await call.wait(10)
            assert result.status is Status.RESOURCE_EXHAUSTED
            assert "268435456 bytes is over the server's limit" in result.message
        # the refused stream's unread data was released: the shared channel keeps working
        for _ in range(3):
            refused = await raw_call(channel, GENERATE, b"\x12" + b"\x80" * 5 + b"x" * (4 * 1024 * 1024))
            assert refused.status is Status.RESOURCE_EXHAUSTED

    run(server, body)


def test_large_bodies_do_not_freeze_the_event_loop(server: ServerProcess) -> None:
    one_byte_tags = b"\x78\x00" * (2 * 1024 * 1024 - 16)  # ~4 MiB of unknown field 15
    abort_ids = length_field(1, b"".join(length_field(1, f"id-{i}".encode()) for i in range(380_000)))

    async def body(channel: Channel) -> None:
        for path, poison, expected in (
            (GENERATE, one_byte_tags, Status.INVALID_ARGUMENT),  # valid protobuf, but no input
            ("/lmrpc.v1.ControlService/Abort", abort_ids, Status.INVALID_ARGUMENT),  # over the id limit
        ):
            started = time.monotonic()
            call = asyncio.create_task(raw_call(channel, path, poison))
            probe = Channel("127.0.0.1", server.port)
            try:
                while not call.done():
                    health = await HealthStub(probe).Check(HealthCheckRequest(), timeout=5)
                    assert health.status == HealthCheckResponse.SERVING
                    await asyncio.sleep(0.01)
            finally:
                probe.close()
            result = await call
            assert result.status is expected, result
            assert time.monotonic() - started < 30

    run(server, body)


def test_rapid_reset_leaves_no_request_behind(server: ServerProcess) -> None:
    """HTTP/2 rapid reset: stream after stream opened with a full Generate and cancelled at once,
    on one connection. Every request is released, and other clients are served meanwhile."""
    request = frame(
        bytes(GenerateRequest(text="reset me", stopping=StoppingCriteria(max_tokens=4000, ignore_eos=True)))
    )

    async def body(channel: Channel) -> None:
        async with H2Call("127.0.0.1", server.port) as flood:
            for i in range(2000):
                flood.start(GENERATE)
                flood.send(request, end=True)
                flood.reset()
                flood.next_call()
                if i % 100 == 0:
                    await asyncio.sleep(0)  # let the pump read the server's frames
                    health = await HealthStub(channel).Check(HealthCheckRequest(), timeout=10)
                    assert health.status == HealthCheckResponse.SERVING
        async with LmrpcClient.connect(server.target) as client:
            await wait_idle(client, timeout=60)

    run(server, body)


def test_a_reset_stream_is_a_normal_event_not_an_error(server: ServerProcess) -> None:
    """A client that resets a Generate at once, or as its first reply goes out, is an ordinary
    event: the request is released and the server logs no error and no traceback for it."""
    request = frame(
        bytes(GenerateRequest(text="reset me", stopping=StoppingCriteria(max_tokens=4000, ignore_eos=True)))
    )
    logged_before = len(server.log())

    async def body(channel: Channel) -> None:
        async with H2Call("127.0.0.1", server.port) as flood:
            for i in range(200):
                flood.start(GENERATE)
                flood.send(request, end=True)
                if i % 2:
                    await asyncio.sleep(0.001 * (i % 7))  # some resets land as replies go out
                flood.reset()
                flood.next_call()
        async with LmrpcClient.connect(server.target) as client:
            await wait_idle(client, timeout=60)

    run(server, body)
    logged = server.log()[logged_before:]
    assert "Traceback" not in logged and "Failed to handle" not in logged, logged[-4000:]


@pytest.mark.parametrize("timeout", ["soon", "1x", "123456789S", ""])
def test_a_malformed_grpc_timeout_is_internal(server: ServerProcess, timeout: str) -> None:
    """As grpc-go and gRPC C-core answer it: INTERNAL, naming the header (grpclib says UNKNOWN)."""

    async def body(channel: Channel) -> None:
        async with H2Call("127.0.0.1", server.port) as call:
            call.start("/lmrpc.v1.ControlService/GetLoad", metadata={"grpc-timeout": timeout})
            call.send(frame(b""), end=True)
            result = await call.wait(10)
        assert result.status is Status.INTERNAL and "grpc-timeout" in result.message, result

    run(server, body)
