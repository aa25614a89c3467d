"""The client helper against a tiny in-test grpclib server (real grpclib, in-memory channel)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from grpclib.testing import ChannelFor

from lmrpc.client import LmrpcClient, StreamProtocolError
from lmrpc.v1 import (
    AbortOutcome,
    AbortRequest,
    AbortResponse,
    AbortStatus,
    ControlServiceBase,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    InferenceServiceBase,
    OutputFinished,
    PromptInfo,
    StopMatch,
    TokenDelta,
    Usage,
)


def scripted(request_id: str, *, broken: str | None = None) -> list[GenerateResponse]:
    """A two-output stream, optionally with one contract violation."""

    def delta(index: int, ids: list[int], text: str) -> GenerateResponse:
        return GenerateResponse(
            request_id=request_id, delta=TokenDelta(output_index=index, token_ids=ids, text=text)
        )

    def finished(index: int, tokens: int, *, usage: Usage | None = None) -> GenerateResponse:
        return GenerateResponse(
            request_id=request_id,
            finished=OutputFinished(
                output_index=index,
                reason=FinishReason.STOP,
                stop=StopMatch(eos_token_id=2),
                completion_tokens=tokens,
            ),
            usage=usage,
        )

    stream = [
        GenerateResponse(
            request_id=request_id, prompt_info=PromptInfo(prompt_tokens=3, seed=7, num_outputs=2)
        ),
        delta(0, [10, 11], "ab"),
        delta(1, [20], "x"),
        delta(0, [2], ""),
        finished(0, 3),
        delta(1, [2], ""),
        finished(1, 2, usage=Usage(prompt_tokens=3, completion_tokens=5)),
    ]
    if broken == "double_finish":
        stream.insert(5, finished(0, 3))
    elif broken == "delta_after_finish":
        stream.insert(5, delta(0, [12], "c"))
    elif broken == "missing_index":
        stream[1] = GenerateResponse(request_id=request_id, delta=TokenDelta(token_ids=[10, 11], text="ab"))
    elif broken == "foreign_id":
        stream[2] = GenerateResponse(
            request_id="someone-else", delta=TokenDelta(output_index=1, token_ids=[20])
        )
    return stream


class ScriptedInference(InferenceServiceBase):
    async def generate(self, message: GenerateRequest) -> AsyncIterator[GenerateResponse]:
        for response in scripted(message.request_id, broken=message.text or None):
            yield response


class RecordingControl(ControlServiceBase):
    def __init__(self) -> None:
        self.aborts: list[AbortRequest] = []

    async def abort(self, message: AbortRequest) -> AbortResponse:
        self.aborts.append(message)
        ids = message.request_ids.ids if message.request_ids else ["all"]
        return AbortResponse(outcomes=[AbortOutcome(request_id=i, status=AbortStatus.ABORTED) for i in ids])


def run_with_client(body, control: RecordingControl | None = None):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        async with ChannelFor([ScriptedInference(), control or RecordingControl()]) as channel:
            return await body(LmrpcClient(channel))

    return asyncio.run(main())


def test_generate_aggregates_outputs_and_usage() -> None:
    result = run_with_client(lambda c: c.generate(GenerateRequest(request_id="r1")))
    assert result.request_id == "r1"
    assert result.prompt is not None and result.prompt.seed == 7
    assert [o.index for o in result.outputs] == [0, 1]
    first, second = result.outputs
    assert (first.token_ids, first.text, first.completion_tokens) == ([10, 11, 2], "ab", 3)
    assert (second.token_ids, second.text) == ([20, 2], "x")
    assert first.finish_reason == FinishReason.STOP and first.stop == StopMatch(eos_token_id=2)
    assert result.usage == Usage(prompt_tokens=3, completion_tokens=5)
    assert result.text == "ab" and result.error is None


@pytest.mark.parametrize("broken", ["double_finish", "delta_after_finish", "missing_index", "foreign_id"])
def test_generate_rejects_streams_that_break_the_contract(broken: str) -> None:
    with pytest.raises(StreamProtocolError):
        run_with_client(lambda c: c.generate(GenerateRequest(request_id="r1", text=broken)))


def test_stream_yields_raw_events_and_can_stop_early() -> None:
    async def body(client: LmrpcClient) -> list[str]:
        kinds = []
        async for response in client.stream(GenerateRequest(request_id="r2")):
            kinds.append("prompt" if response.prompt_info else "delta" if response.delta else "finished")
            if len(kinds) == 3:
                break
        return kinds

    assert run_with_client(body) == ["prompt", "delta", "delta"]


def test_abort_by_ids_and_all() -> None:
    control = RecordingControl()

    async def body(client: LmrpcClient) -> tuple[AbortResponse, AbortResponse]:
        return await client.abort("a", "b"), await client.abort(everything=True)

    by_ids, everything = run_with_client(body, control)
    assert [o.request_id for o in by_ids.outcomes] == ["a", "b"]
    assert control.aborts[0].request_ids is not None and control.aborts[0].request_ids.ids == ["a", "b"]
    assert control.aborts[1].all is not None and everything.outcomes[0].status == AbortStatus.ABORTED
    with pytest.raises(ValueError):
        run_with_client(lambda c: c.abort())


def test_connect_parses_targets() -> None:
    async def body() -> None:
        client = LmrpcClient.connect("localhost:123")
        assert (client.channel._host, client.channel._port) == ("localhost", 123)
        client.close()
        with pytest.raises(ValueError):
            LmrpcClient.connect("localhost")

    asyncio.run(body())


def test_server_listener_says_tcp_so_asyncio_sets_nodelay() -> None:
    # Without IPPROTO_TCP on the listening socket, accepted connections miss TCP_NODELAY and
    # every small response waits for a delayed ACK (~40 ms per unary call).
    import socket

    from reference_server.frontend.app import _bind

    listener = _bind("127.0.0.1", 0)
    try:
        assert listener.proto == socket.IPPROTO_TCP
    finally:
        listener.close()
