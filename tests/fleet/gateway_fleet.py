"""Reference servers behind the real smg gateway, reached with the official OpenAI client: the
parts the tests share."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from openai import OpenAI

from lmrpc.client import LmrpcClient
from lmrpc.v1 import GetLoadRequest, Load
from reference_server.models.source import DEFAULT_MODEL_ID
from reference_server.smg_gateway import SmgGateway, sum_samples
from reference_server.testing import ServerProcess, free_port

FAKE_MODEL = f"fake-{DEFAULT_MODEL_ID}"
# Routing decided by cache knowledge only: no warm-up slice sends cache misses or hits elsewhere.
DETERMINISTIC_ROUTING = ("--worker-warmup-secs", "0", "--worker-warmup-divert-every", "0")
CLIENT_TIMEOUT_S = 60.0


@dataclass
class Replica:
    server: ServerProcess
    metrics_port: int

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        return sum_samples(self.metrics(), name, **labels)

    def generate_calls(self) -> float:
        return self.metric("lmrpc:grpc_requests_total", protocol="vllm-engine", rpc="Generate")

    def load(self) -> Load:
        async def query() -> Load:
            async with LmrpcClient.connect(self.server.target) as client:
                current = (await client.control.get_load(GetLoadRequest())).current
                assert current is not None
                return current

        return asyncio.run(query())


@dataclass
class Fleet:
    replicas: list[Replica]
    gateway: SmgGateway

    def client(self) -> OpenAI:
        return OpenAI(base_url=self.gateway.base_url, api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT_S)


def start_replica(
    stack: contextlib.ExitStack, *, engine: str = "fake", args: tuple[str, ...] = ()
) -> Replica:
    port = free_port()
    server = stack.enter_context(ServerProcess(engine=engine, args=(*args, "--metrics-port", str(port))))
    return Replica(server, port)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout_s`` naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
