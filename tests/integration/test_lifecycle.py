"""Startup, health, SIGTERM drain and worker death, each against its own server process."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from streams import first_delta, run

from lmrpc.client import LmrpcClient
from lmrpc.v1 import FinishReason, GenerateRequest, StoppingCriteria
from reference_server.frontend.workers import SHUTDOWN_GRACE_S
from reference_server.testing import ServerProcess, free_port

SERVICES = ("", "lmrpc.v1.InferenceService", "lmrpc.v1.ControlService")


async def health(port: int, service: str = "") -> int:
    channel = Channel("127.0.0.1", port)
    try:
        response = await HealthStub(channel).Check(HealthCheckRequest(service=service), timeout=2)
        return int(response.status)
    finally:
        channel.close()


def test_health_is_not_serving_until_the_engine_is_ready() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "reference_server", "--engine", "fake", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and HealthCheckResponse.SERVING not in seen:
            try:
                seen.append(asyncio.run(health(port)))
            except OSError:
                time.sleep(0.01)
        statuses = {service: asyncio.run(health(port, service)) for service in SERVICES}
        with pytest.raises(GRPCError) as unknown:
            asyncio.run(health(port, "no.such.Service"))
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert seen[0] == HealthCheckResponse.NOT_SERVING and seen[-1] == HealthCheckResponse.SERVING
    assert set(statuses.values()) == {HealthCheckResponse.SERVING}
    assert unknown.value.status == Status.NOT_FOUND


def test_sigterm_drains_streams_in_flight_then_exits_zero() -> None:
    server = ServerProcess(engine="fake", args=("--fake-token-delay", "0.02")).start()
    request = GenerateRequest(text="drain me", stopping=StoppingCriteria(max_tokens=40, ignore_eos=True))

    async def body(client: LmrpcClient) -> None:
        task, _ = await first_delta(client, request)
        server.terminate()
        await asyncio.sleep(0.2)
        assert await health(server.port) == HealthCheckResponse.NOT_SERVING
        with pytest.raises(GRPCError) as refused:
            await client.generate(GenerateRequest(text="too late", stopping=StoppingCriteria(max_tokens=2)))
        assert refused.value.status == Status.UNAVAILABLE
        responses = await asyncio.wait_for(task, 10)
        finish = [r.finished for r in responses if r.finished is not None]
        assert (
            len(finish) == 1 and finish[0].reason == FinishReason.LENGTH and finish[0].completion_tokens == 40
        )

    try:
        run(server.target, body)
        assert server.wait(20) == 0, server.log()
    finally:
        server.stop()


def test_dead_scheduler_fails_streams_then_fresh_workers_serve() -> None:
    server = ServerProcess(engine="fake", args=("--fake-token-delay", "0.02")).start()
    request = GenerateRequest(text="doomed", stopping=StoppingCriteria(max_tokens=2000, ignore_eos=True))

    async def body(client: LmrpcClient) -> None:
        old_workers = server.worker_pids()
        before = await client.server_info()
        task, _ = await first_delta(client, request)
        os.kill(old_workers["scheduler"], signal.SIGKILL)
        responses = await asyncio.wait_for(task, 5)  # no hung client
        error = responses[-1].error
        assert error is not None and error.code == Status.UNAVAILABLE.value and error.retryable
        assert responses[-1].usage is not None
        killed_at = time.monotonic()
        while True:
            try:
                await client.generate(GenerateRequest(text="after", stopping=StoppingCriteria(max_tokens=2)))
            except GRPCError as exc:
                assert exc.status == Status.UNAVAILABLE
                break
            assert time.monotonic() - killed_at < 1.0
        assert await health(server.port, "lmrpc.v1.InferenceService") == HealthCheckResponse.NOT_SERVING
        deadline = time.monotonic() + 60
        while await health(server.port) != HealthCheckResponse.SERVING:  # fresh workers start
            assert time.monotonic() < deadline, server.log()
            await asyncio.sleep(0.1)
        result = await client.generate(
            GenerateRequest(text="again", stopping=StoppingCriteria(max_tokens=4, ignore_eos=True))
        )
        assert len(result.outputs[0].token_ids) == 4
        assert set(server.worker_pids().values()).isdisjoint(old_workers.values())
        after = await client.server_info()  # SVC-4: fresh workers, an empty cache, a new instance
        assert before.instance_id and after.instance_id and after.instance_id != before.instance_id
        assert after.uptime_seconds > before.uptime_seconds  # the process did not restart

    try:
        run(server.target, body)
    finally:
        server.stop()


def test_with_no_restart_left_a_worker_death_exits_nonzero() -> None:
    server = ServerProcess(engine="fake", args=("--max-worker-restarts", "0")).start()
    try:
        os.kill(server.worker_pids()["detokenizer"], signal.SIGKILL)
        assert server.wait(10) == 1, server.log()  # at once, for a supervisor to restart it
        assert "no worker restart left" in server.log()
    finally:
        server.stop()


def test_sigterm_right_after_a_worker_death_exits_promptly() -> None:
    """SIGTERM while the workers are being restarted: the fresh workers, still starting (for
    seconds on a loaded machine), are terminated at once rather than sent a Shutdown they cannot
    read yet, so the server exits well inside the grace a ready worker gets."""
    server = ServerProcess(engine="fake").start()
    try:
        os.kill(server.worker_pids()["scheduler"], signal.SIGKILL)
        time.sleep(0.2)
        server.terminate()
        assert server.wait(SHUTDOWN_GRACE_S - 2) == 0, server.log()
    finally:
        server.stop()


def test_startup_failures_are_clear() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "reference_server", "--engine", "fake", "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in result.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "reference_server", "--engine", "fake", "--port", "0", "--model", "/nonexistent.gguf"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2 and "/nonexistent.gguf" in missing.stderr


def test_workers_exit_when_the_frontend_is_killed() -> None:
    server = ServerProcess(engine="fake").start()
    workers = server.worker_pids()
    assert set(workers) == {"scheduler", "detokenizer"}
    assert server.process is not None
    server.process.kill()
    server.process.wait()
    deadline = time.monotonic() + 10
    alive = set(workers.values())
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid)}
        time.sleep(0.05)
    assert not alive, f"orphaned workers: {alive}"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
