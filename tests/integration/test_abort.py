"""Abort, client cancel and deadlines over real gRPC; the server must end up holding nothing."""

from __future__ import annotations

import asyncio

from grpclib import GRPCError, Status
from rawwire import GENERATE, H2Call, frame
from streams import collect, first_delta, kinds, run, wait_idle

from lmrpc.client import LmrpcClient
from lmrpc.v1 import (
    AbortStatus,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    SamplingParams,
    StoppingCriteria,
)
from reference_server.testing import ServerProcess


def long_request(request_id: str, n: int = 1) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id, text="a long generation", sampling=SamplingParams(temperature=0.0, n=n),
        stopping=StoppingCriteria(max_tokens=2000, ignore_eos=True),
    )  # fmt: skip


def check_aborted(responses: list[GenerateResponse], n: int) -> None:
    finishes = [r.finished for r in responses if r.finished is not None]
    assert sorted(f.output_index for f in finishes) == list(range(n))  # type: ignore[type-var]
    assert all(f.reason == FinishReason.ABORTED for f in finishes)
    assert responses[-1].usage is not None
    delivered = sum(len(r.delta.token_ids) for r in responses if r.delta is not None)
    assert responses[-1].usage.completion_tokens == delivered == sum(f.completion_tokens for f in finishes)


def test_abort_mid_stream_covers_every_output(slow_fake_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> None:
        for n in (1, 4):
            task, _ = await first_delta(client, long_request(f"abort-mid-{n}", n))
            response = await client.abort(f"abort-mid-{n}")
            assert [(o.request_id, o.status) for o in response.outcomes] == [
                (f"abort-mid-{n}", AbortStatus.ABORTED)
            ]
            check_aborted(await asyncio.wait_for(task, 5), n)
            again = await client.abort(f"abort-mid-{n}")  # idempotent
            assert again.outcomes[0].status == AbortStatus.NOT_IN_FLIGHT
        await wait_idle(client)

    run(slow_fake_server.target, body)


def test_abort_unknown_and_abort_all(slow_fake_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> None:
        unknown = await client.abort("never-seen", "also-never-seen")
        assert {o.status for o in unknown.outcomes} == {AbortStatus.NOT_IN_FLIGHT}
        started = [await first_delta(client, long_request(f"all-{i}", n=2)) for i in range(3)]
        response = await client.abort(everything=True)
        assert {o.request_id for o in response.outcomes} >= {f"all-{i}" for i in range(3)}
        for task, _ in started:
            check_aborted(await asyncio.wait_for(task, 5), 2)
        await wait_idle(client)

    run(slow_fake_server.target, body)


def test_abort_before_the_request_arrives_still_wins(slow_fake_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> list[GenerateResponse]:
        await client.abort("early-bird")
        return await collect(client, long_request("early-bird", n=2), timeout=10)

    responses = run(slow_fake_server.target, body)
    assert kinds(responses) == ["prompt_info", "finished", "finished"]
    check_aborted(responses, 2)


def test_client_cancel_and_deadline_release_the_request(slow_fake_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> None:
        task, _ = await first_delta(client, long_request("cancel-me", n=3))
        assert (await client.load()).running_sequences == 3
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await wait_idle(client)
        try:
            await collect(client, long_request("deadline"), timeout=0.3)
        except TimeoutError:
            pass  # the client's own timer ended the call
        except GRPCError as error:  # or the server's did first (on a busy machine, either may)
            assert error.status is Status.DEADLINE_EXCEEDED, error
        else:
            raise AssertionError("a 2000-token generation finished within a 0.3 s deadline")
        await wait_idle(client)
        # the id is free again at once
        done = await client.generate(
            GenerateRequest(
                request_id="cancel-me", text="x", stopping=StoppingCriteria(max_tokens=2, ignore_eos=True)
            )
        )
        assert done.outputs[0].completion_tokens == 2

    run(slow_fake_server.target, body)


def test_pause_and_resume(slow_fake_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> None:
        from lmrpc.v1 import PauseGenerationRequest, ResumeGenerationRequest

        await client.control.pause_generation(PauseGenerationRequest())
        task = asyncio.create_task(
            client.generate(
                GenerateRequest(text="paused", stopping=StoppingCriteria(max_tokens=3, ignore_eos=True))
            )
        )
        for _ in range(100):  # until the request has reached the engine
            load = await client.load()
            if load.waiting_sequences + load.running_sequences:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # paused: it must still be there, unfinished
        load = await client.load()
        assert load.paused and not task.done() and load.waiting_sequences + load.running_sequences == 1
        await client.control.resume_generation(ResumeGenerationRequest())
        result = await asyncio.wait_for(task, 10)
        assert result.outputs[0].completion_tokens == 3
        await wait_idle(client)

    run(slow_fake_server.target, body)


def test_an_abort_for_a_finished_request_does_not_poison_its_id(slow_fake_server: ServerProcess) -> None:
    # ignore_eos: the fake engine's sampled tokens may include EOS (CI once saw it as the third)
    short = GenerateRequest(
        request_id="reuse-me", text="short", stopping=StoppingCriteria(max_tokens=3, ignore_eos=True)
    )

    async def body(client: LmrpcClient) -> None:
        first = await client.generate(short)
        assert first.outputs[0].finish_reason == FinishReason.LENGTH
        late = await client.abort("reuse-me")  # the request it names has ended (ABORT-1)
        assert late.outcomes[0].status == AbortStatus.NOT_IN_FLIGHT
        again = await client.generate(short)  # well within the abort grace period
        assert again.outputs[0].finish_reason == FinishReason.LENGTH and len(again.outputs[0].token_ids) == 3

    run(slow_fake_server.target, body)


def test_a_second_abort_before_the_stream_ended_is_not_in_flight(slow_fake_server: ServerProcess) -> None:
    async def body(client: LmrpcClient) -> None:
        call = H2Call("127.0.0.1", slow_fake_server.port, window=300)  # stops reading: the stream cannot end
        async with call:
            call.read_data = False
            call.start(GENERATE)
            call.send(frame(bytes(long_request("twice"))), end=True)
            await wait_for_load(client, lambda load: load.active_requests == 1)
            first = await client.abort("twice")
            second = await client.abort("twice")
            assert first.outcomes[0].status == AbortStatus.ABORTED
            assert second.outcomes[0].status == AbortStatus.NOT_IN_FLIGHT
            assert not call.ended.is_set()
            call.acknowledge()
            await call.wait(10)
        await wait_idle(client)

    run(slow_fake_server.target, body)


async def wait_for_load(client: LmrpcClient, ready: object, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not ready(await client.load()):  # type: ignore[operator]
        assert loop.time() < deadline
        await asyncio.sleep(0.02)
