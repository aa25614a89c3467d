"""An lmrpc.v1-shaped client over any protocol the harness drives, for repro scripts:

async with connect("127.0.0.1:30000", "sglang-scheduler") as client:
    async for event in client.inference.generate(GenerateRequest(...)):  # lmrpc.v1 events
        print(event)
    await client.control.abort(AbortRequest(...))
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from grpclib.client import Channel

from conformance.drivers import make_driver
from lmrpc.client import parse_target
from lmrpc.v1 import ControlServiceStub, InferenceServiceStub


@dataclass(frozen=True, slots=True)
class DriverClient:
    control: ControlServiceStub
    inference: InferenceServiceStub


@asynccontextmanager
async def connect(target: str, protocol: str, timeout_s: float = 30.0) -> AsyncIterator[DriverClient]:
    channel = Channel(*parse_target(target))
    try:
        driver = make_driver(protocol)
        await driver.discover(channel, timeout_s)  # an engine protocol's driver loads the tokenizer here
        yield DriverClient(driver.control(channel), driver.inference(channel))
    finally:
        channel.close()
