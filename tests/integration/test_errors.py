"""Every bad input of docs/contract.md §10 gets its exact status code, before any message."""

from __future__ import annotations

import asyncio

import pytest
from grpclib import GRPCError, Status
from streams import collect, first_delta, run

from lmrpc.client import LmrpcClient
from lmrpc.v1 import (
    AbortRequest,
    ChatInput,
    DetokenizeRequest,
    EmbedRequest,
    GenerateRequest,
    RequestIds,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
    TokenIds,
    TokenizeRequest,
)
from reference_server.testing import ServerProcess

VOCAB = 49152
CONTEXT = 8192

BAD_GENERATE = {
    "no input": GenerateRequest(),
    "empty text": GenerateRequest(text=""),
    "empty token ids": GenerateRequest(token_ids=TokenIds(ids=[])),
    "empty chat": GenerateRequest(chat=ChatInput(messages=[])),
    "token id >= vocab": GenerateRequest(token_ids=TokenIds(ids=[1, VOCAB])),
    "bad request id": GenerateRequest(request_id="has spaces", text="x"),
    "long request id": GenerateRequest(request_id="x" * 129, text="x"),
    "negative temperature": GenerateRequest(text="x", sampling=SamplingParams(temperature=-0.5)),
    "nan temperature": GenerateRequest(text="x", sampling=SamplingParams(temperature=float("nan"))),
    "top_p zero": GenerateRequest(text="x", sampling=SamplingParams(top_p=0.0)),
    "top_p above one": GenerateRequest(text="x", sampling=SamplingParams(top_p=1.5)),
    "min_p above one": GenerateRequest(text="x", sampling=SamplingParams(min_p=2.0)),
    "frequency penalty": GenerateRequest(text="x", sampling=SamplingParams(frequency_penalty=3.0)),
    "presence penalty": GenerateRequest(text="x", sampling=SamplingParams(presence_penalty=-3.0)),
    "repetition penalty zero": GenerateRequest(text="x", sampling=SamplingParams(repetition_penalty=0.0)),
    "n zero": GenerateRequest(text="x", sampling=SamplingParams(n=0)),
    "n too large": GenerateRequest(text="x", sampling=SamplingParams(n=17)),
    "max_tokens zero": GenerateRequest(text="x", stopping=StoppingCriteria(max_tokens=0)),
    "min above max": GenerateRequest(text="x", stopping=StoppingCriteria(max_tokens=2, min_tokens=3)),
    "beyond context": GenerateRequest(text="x", stopping=StoppingCriteria(max_tokens=CONTEXT)),
    "prompt fills context": GenerateRequest(token_ids=TokenIds(ids=[5] * CONTEXT)),
    "empty stop string": GenerateRequest(text="x", stopping=StoppingCriteria(stop_strings=["a", ""])),
    "too many stop strings": GenerateRequest(text="x", stopping=StoppingCriteria(stop_strings=["s"] * 17)),
    "stop token >= vocab": GenerateRequest(text="x", stopping=StoppingCriteria(stop_token_ids=[VOCAB])),
    "top_logprobs too large": GenerateRequest(
        text="x", response=ResponseOptions(return_logprobs=True, top_logprobs=21)
    ),
    "top_logprobs without logprobs": GenerateRequest(text="x", response=ResponseOptions(top_logprobs=2)),
    "nothing to return": GenerateRequest(
        text="x", response=ResponseOptions(return_text=False, return_token_ids=False)
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_GENERATE))
def test_invalid_generate_requests(fake_server: ServerProcess, case: str) -> None:
    with pytest.raises(GRPCError) as error:
        run(fake_server.target, lambda c: collect(c, BAD_GENERATE[case]))
    assert error.value.status == Status.INVALID_ARGUMENT, error.value.message
    assert error.value.message


def test_never_fits_is_resource_exhausted() -> None:
    with ServerProcess(engine="fake", args=("--kv-tokens", "9000")) as server:
        request = GenerateRequest(
            text="x", sampling=SamplingParams(n=4), stopping=StoppingCriteria(max_tokens=4000)
        )
        with pytest.raises(GRPCError) as error:
            run(server.target, lambda c: collect(c, request))
        assert error.value.status == Status.RESOURCE_EXHAUSTED
        fits = GenerateRequest(
            text="x", sampling=SamplingParams(n=2), stopping=StoppingCriteria(max_tokens=8)
        )
        assert run(server.target, lambda c: c.generate(fits)).usage is not None


def test_duplicate_in_flight_request_id(slow_fake_server: ServerProcess) -> None:
    request = GenerateRequest(
        request_id="dup", text="x", stopping=StoppingCriteria(max_tokens=500, ignore_eos=True)
    )

    async def body(client: LmrpcClient) -> None:
        task, _ = await first_delta(client, request)
        with pytest.raises(GRPCError) as error:
            await collect(client, request)
        assert error.value.status == Status.ALREADY_EXISTS
        assert not task.done(), "the request in flight was affected"
        await client.abort("dup")
        await asyncio.wait_for(task, 5)

    run(slow_fake_server.target, body)


def test_control_rpc_errors(fake_server: ServerProcess) -> None:
    async def status_of(call) -> Status:  # type: ignore[no-untyped-def]
        try:
            await call
        except GRPCError as exc:
            return exc.status
        return Status.OK

    async def body(client: LmrpcClient) -> dict[str, Status]:
        return {
            "abort no target": await status_of(client.control.abort(AbortRequest())),
            "abort empty ids": await status_of(client.control.abort(AbortRequest(request_ids=RequestIds()))),
            "detokenize bad id": await status_of(
                client.control.detokenize(DetokenizeRequest(token_ids=[VOCAB + 1]))
            ),
            "tokenize no input": await status_of(client.control.tokenize(TokenizeRequest())),
            "embed nothing": await status_of(client.inference.embed(EmbedRequest())),
            "embed too long": await status_of(client.inference.embed(EmbedRequest(texts=["word " * 400]))),
        }

    assert set(run(fake_server.target, body).values()) == {Status.INVALID_ARGUMENT}


def test_unknown_method_is_unimplemented(fake_server: ServerProcess) -> None:
    from grpclib.client import Channel
    from grpclib.const import Cardinality

    from lmrpc.v1 import GetLoadRequest, GetLoadResponse

    async def body() -> Status:
        channel = Channel("127.0.0.1", fake_server.port)
        try:
            async with channel.request(
                "/lmrpc.v1.ControlService/NoSuchMethod",
                Cardinality.UNARY_UNARY,
                GetLoadRequest,
                GetLoadResponse,
            ) as stream:
                await stream.send_message(GetLoadRequest(), end=True)
                await stream.recv_message()
        except GRPCError as exc:
            return exc.status
        finally:
            channel.close()
        return Status.OK

    assert asyncio.run(body()) == Status.UNIMPLEMENTED


def test_oversized_request_messages_are_resource_exhausted(fake_server: ServerProcess) -> None:
    over = "x" * (4 * 1024 * 1024 + 1)  # the default --max-message-bytes is 4 MiB

    async def body(client: LmrpcClient) -> list[tuple[Status, str]]:
        answers = []
        for call in (
            client.generate(GenerateRequest(text=over)),
            client.control.tokenize(TokenizeRequest(text=over)),
            client.inference.embed(EmbedRequest(texts=[over])),
        ):
            with pytest.raises(GRPCError) as caught:
                await call
            answers.append((caught.value.status, caught.value.message or ""))
        return answers

    for status, message in run(fake_server.target, body):
        assert status is Status.RESOURCE_EXHAUSTED and "limit of 4194304 bytes" in message


def test_server_keeps_serving_after_bad_requests(fake_server: ServerProcess) -> None:
    result = run(
        fake_server.target,
        lambda c: c.generate(
            GenerateRequest(text="still alive", stopping=StoppingCriteria(max_tokens=3, ignore_eos=True))
        ),
    )
    assert result.outputs[0].completion_tokens == 3
