"""Authentication and request ownership (AUTH-1..4) against a server started with --auth."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from streams import first_delta

from lmrpc.client import LmrpcClient
from lmrpc.v1 import (
    AbortStatus,
    FinishReason,
    FlushCacheRequest,
    GenerateRequest,
    PauseGenerationRequest,
    ResumeGenerationRequest,
    StoppingCriteria,
)
from reference_server.testing import ServerProcess

CLIENT, OTHER, ADMIN = "client-token-1", "client-token-2", "admin-token-1"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text(
        f"# credential role\n{CLIENT} client\n{OTHER} client  # a second client\n{ADMIN} admin\n"
    )
    args = ("--auth", str(tokens), "--fake-token-delay", "0.01")
    with ServerProcess(engine="fake", args=args) as server:
        yield server


def long_request(request_id: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id, text="owned", stopping=StoppingCriteria(max_tokens=3000, ignore_eos=True)
    )


def clients(server: ServerProcess) -> tuple[LmrpcClient, LmrpcClient, LmrpcClient]:
    return tuple(LmrpcClient.connect(server.target, token=t) for t in (CLIENT, OTHER, ADMIN))  # type: ignore[return-value]


def run(server: ServerProcess, body: object) -> None:
    async def main() -> None:
        client, other, admin = clients(server)
        try:
            await body(client, other, admin)  # type: ignore[operator]
        finally:
            for c in (client, other, admin):
                c.close()

    asyncio.run(main())


async def status_of(call: object) -> Status:
    try:
        await call  # type: ignore[misc]
    except GRPCError as exc:
        return exc.status
    return Status.OK


def test_calls_without_valid_credentials_are_unauthenticated(server: ServerProcess) -> None:
    async def body(client: LmrpcClient, other: LmrpcClient, admin: LmrpcClient) -> None:
        info = await client.server_info()
        assert info.capabilities is not None and info.capabilities.authentication
        for token in (None, "wrong-token"):
            async with LmrpcClient.connect(server.target, token=token) as anonymous:
                assert await status_of(anonymous.load()) is Status.UNAUTHENTICATED
                assert await status_of(anonymous.generate(long_request("x"))) is Status.UNAUTHENTICATED
        channel = Channel("127.0.0.1", server.port)  # probes and discovery need no credentials
        try:
            health = await HealthStub(channel).Check(HealthCheckRequest(service=""))
            assert health.status == HealthCheckResponse.SERVING
        finally:
            channel.close()

    run(server, body)


def test_administrative_rpcs_need_the_admin_role(server: ServerProcess) -> None:
    async def body(client: LmrpcClient, other: LmrpcClient, admin: LmrpcClient) -> None:
        for who, expected in ((client, Status.PERMISSION_DENIED), (admin, Status.OK)):
            assert await status_of(who.control.pause_generation(PauseGenerationRequest())) is expected
            assert await status_of(who.control.resume_generation(ResumeGenerationRequest())) is expected
            assert await status_of(who.control.flush_cache(FlushCacheRequest())) is expected
        assert await status_of(client.abort(everything=True)) is Status.PERMISSION_DENIED
        for who, recording, missing in (
            (client, Status.PERMISSION_DENIED, Status.PERMISSION_DENIED),
            (admin, Status.FAILED_PRECONDITION, Status.NOT_FOUND),  # let through, refused on their merits
        ):
            assert await status_of(who.stop_profile()) is recording
            assert await status_of(who.update_weights("/nonexistent/weights")) is missing
        assert await status_of(client.start_profile()) is Status.PERMISSION_DENIED
        assert await status_of(other.models()) is Status.OK  # not administrative

    run(server, body)


def test_a_client_can_neither_see_nor_abort_another_clients_request(server: ServerProcess) -> None:
    async def body(client: LmrpcClient, other: LmrpcClient, admin: LmrpcClient) -> None:
        mine, _ = await first_delta(client, long_request("same-id"))
        theirs, _ = await first_delta(other, long_request("same-id"))  # ids are per owner: no clash
        refused = await other.abort("same-id", "not-even-mine")
        assert [o.status for o in refused.outcomes] == [AbortStatus.ABORTED, AbortStatus.NOT_IN_FLIGHT]
        theirs_done = await asyncio.wait_for(theirs, 10)
        assert (
            theirs_done[-1].finished is not None and theirs_done[-1].finished.reason == FinishReason.ABORTED
        )
        await asyncio.sleep(0.3)
        assert not mine.done()  # the other client's abort of "same-id" was its own request only
        everything = await admin.abort(everything=True)  # an admin sees and aborts every request
        assert [o.request_id for o in everything.outcomes] == ["same-id"]
        mine_done = await asyncio.wait_for(mine, 10)
        assert mine_done[-1].finished is not None and mine_done[-1].finished.reason == FinishReason.ABORTED

    run(server, body)


def test_an_abort_before_the_request_only_binds_its_own_principal(server: ServerProcess) -> None:
    async def body(client: LmrpcClient, other: LmrpcClient, admin: LmrpcClient) -> None:
        early = await other.abort("pre-aborted")  # remembered for `other` only (ABORT-6)
        assert early.outcomes[0].status == AbortStatus.NOT_IN_FLIGHT
        short = GenerateRequest(request_id="pre-aborted", text="hi", stopping=StoppingCriteria(max_tokens=3))
        result = await client.generate(short)
        assert result.outputs[0].finish_reason != FinishReason.ABORTED
        result = await other.generate(short)
        assert result.outputs[0].finish_reason == FinishReason.ABORTED

    run(server, body)


def test_an_auth_file_that_does_not_parse_stops_startup(tmp_path: Path) -> None:
    bad = tmp_path / "tokens"
    bad.write_text("only-a-token\n")
    with pytest.raises(Exception, match="expected 'CREDENTIAL ROLE'"):
        ServerProcess(engine="fake", args=("--auth", str(bad))).start()
