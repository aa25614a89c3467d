"""Clients that do not read (FLOW-1, FLOW-2): the server stops working for them, keeps a bounded
amount for them, and gives up on them after the stall timeout; nobody else waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from grpclib import Status
from rawwire import GENERATE, H2Call, frame
from streams import collect, run, wait_idle

from lmrpc.client import LmrpcClient
from lmrpc.v1 import FinishReason, GenerateRequest, GenerateResponse, Load, StoppingCriteria
from reference_server.testing import ServerProcess

PARKED = 32
WINDOW = 2048  # bytes the stalled client lets the server send before it stops reading


def endless(request_id: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id, text="never read", stopping=StoppingCriteria(max_tokens=8000, ignore_eos=True)
    )


@pytest.fixture(scope="module")
def holding_server() -> Iterator[ServerProcess]:
    args = ("--fake-token-delay", "0.002", "--max-parked-tokens", str(PARKED), "--stall-timeout", "0")
    with ServerProcess(engine="fake", args=args) as server:
        yield server


@pytest.fixture(scope="module")
def stall_server() -> Iterator[ServerProcess]:
    args = ("--fake-token-delay", "0.002", "--max-parked-tokens", str(PARKED), "--stall-timeout", "1")
    with ServerProcess(engine="fake", args=args) as server:
        yield server


async def stalled_call(server: ServerProcess, request: GenerateRequest) -> H2Call:
    call = H2Call("127.0.0.1", server.port, window=WINDOW)
    await call.__aenter__()
    call.read_data = False
    call.start(GENERATE)
    call.send(frame(bytes(request)), end=True)
    return call


async def load_until(client: LmrpcClient, ready: object, timeout: float = 30.0) -> Load:
    deadline = time.monotonic() + timeout
    while True:
        load = await client.load()
        if ready(load):  # type: ignore[operator]
            return load
        assert time.monotonic() < deadline, f"load never got there: {load}"
        await asyncio.sleep(0.05)


def responses(call: H2Call) -> list[GenerateResponse]:
    return [GenerateResponse.parse(m) for m in call.result.messages()]


def test_a_client_that_does_not_read_stops_the_work_done_for_it(holding_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> None:
        call = await stalled_call(holding_server, endless("stalled"))
        try:
            await load_until(client, lambda load: load.running_sequences == 1)
            await asyncio.sleep(2.0)  # ~1000 tokens of engine time at 2 ms a step
            bystander = await collect(
                client, GenerateRequest(text="hi", stopping=StoppingCriteria(max_tokens=12, ignore_eos=True))
            )
            assert bystander[-1].finished is not None and bystander[-1].finished.completion_tokens == 12
            aborted = await client.abort("stalled")
            assert aborted.outcomes[0].request_id == "stalled"
            call.acknowledge()  # start reading: everything kept for the client arrives, then the end
            await call.wait(10)
        finally:
            await call.__aexit__()
        finished = [r.finished for r in responses(call) if r.finished is not None]
        assert len(finished) == 1 and finished[0].reason == FinishReason.ABORTED
        # bounded by what the window let through, the parked tokens and one merged delta
        assert finished[0].completion_tokens < 300, finished[0].completion_tokens
        await wait_idle(client)

    run(holding_server.target, body)


def test_a_stalled_request_is_aborted_and_ends_with_a_request_error(stall_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> None:
        call = await stalled_call(stall_server, endless("stall-then-read"))
        try:
            await load_until(client, lambda load: load.running_sequences == 1)
            # the engine lets go of it after the stall timeout; its stream is still open
            await load_until(client, lambda load: load.active_requests == 1 and load.running_sequences == 0)
            call.acknowledge()
            result = await call.wait(10)
        finally:
            await call.__aexit__()
        assert result.status is Status.OK
        last = responses(call)[-1]
        assert last.error is not None and last.error.code == Status.RESOURCE_EXHAUSTED.value
        assert "FLOW-2" in last.error.message and last.usage is not None
        await wait_idle(client)

    run(stall_server.target, body)


def test_a_client_that_never_reads_again_is_reset(stall_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> None:
        call = await stalled_call(stall_server, endless("never-reads"))
        try:
            result = await call.wait(30)  # two stall periods, then RST_STREAM
        finally:
            await call.__aexit__()
        assert result.reset is not None
        await wait_idle(client)

    run(stall_server.target, body)


@pytest.mark.parametrize(
    "sent",
    [b"", frame(bytes(endless("slow")))[:3], frame(bytes(endless("slow")))[:-2]],
    ids=["headers-only", "half-a-prefix", "all-but-two-bytes"],
)
def test_a_request_that_never_finishes_arriving_is_refused(stall_server: ServerProcess, sent: bytes) -> None:
    """The other half of a stalled client: one that opens a call and never finishes sending its
    request. After the stall timeout the call ends with a status; no handler waits forever."""

    async def body(client: LmrpcClient) -> None:
        async with H2Call("127.0.0.1", stall_server.port) as call:
            call.start(GENERATE)
            call.send(sent)
            result = await call.wait(30)
        assert result.status is Status.DEADLINE_EXCEEDED, result
        assert "stall_timeout_seconds" in result.message
        await wait_idle(client)

    run(stall_server.target, body)
