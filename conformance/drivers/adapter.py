"""The one base of every adapter that answers lmrpc.v1's stubs through another protocol's RPCs.

A unary method is written as ``async def rpc(self, message, timeout)`` under ``@adapts``, which
gives it grpclib's stub signature (``message=None, *, timeout=None, deadline=None,
metadata=None``); an RPC the protocol lacks is ``rpc = unsupported("Rpc")``, answered without a
call. ``DriverInference`` is InferenceService through any driver: Generate as the driver's
normalised events (what a repro script replays), no Embed.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.metadata import Deadline

from conformance.drivers.base import Driver
from conformance.stream.record import Finding
from lmrpc.v1 import EmbedResponse, GenerateRequest, GenerateResponse, InferenceServiceStub

if TYPE_CHECKING:
    from betterproto2.grpclib.grpclib_client import MetadataLike

Self = TypeVar("Self")
Message = TypeVar("Message")
Answer = TypeVar("Answer")


class HasDriver(Protocol):
    @property
    def driver(self) -> Driver: ...


def adapts(
    handler: Callable[[Self, Message | None, float | None], Awaitable[Answer]],
) -> Callable[..., Coroutine[Any, Any, Answer]]:
    """A stub method with grpclib's signature, answered by ``handler(self, message, timeout)``."""

    @functools.wraps(handler)
    async def method(
        self: Self,
        message: Message | None = None,
        *,
        timeout: float | None = None,
        deadline: Deadline | None = None,
        metadata: MetadataLike | None = None,
    ) -> Answer:
        return await handler(self, message, timeout)

    return method


def unsupported_error(protocol: str, rpc: str) -> GRPCError:
    """What the harness answers, without a call, for an lmrpc.v1 RPC the protocol does not have."""
    return GRPCError(Status.UNIMPLEMENTED, f"{protocol} has no {rpc} (answered by the conformance driver)")


def unsupported(rpc: str) -> Callable[..., Coroutine[Any, Any, Any]]:
    """A stub method for an RPC the protocol lacks: UNIMPLEMENTED, named by the driver's protocol."""

    async def method(self: HasDriver, message: object = None, **options: object) -> NoReturn:
        raise unsupported_error(self.driver.protocol, rpc)

    method.__name__ = rpc
    return method


class DriverInference(InferenceServiceStub):
    """lmrpc.v1's InferenceService through ``driver``."""

    def __init__(self, channel: Channel, driver: Driver) -> None:
        super().__init__(channel)
        self.driver = driver

    async def generate(
        self,
        message: GenerateRequest,
        *,
        timeout: float | None = None,
        deadline: Deadline | None = None,
        metadata: MetadataLike | None = None,
    ) -> AsyncIterator[GenerateResponse]:
        findings: list[Finding] = []
        events = self.driver.events(self.channel, self.driver.express(message), timeout, findings, metadata)
        async for decoded in events:
            yield decoded.message

    embed: Callable[..., Coroutine[Any, Any, EmbedResponse]] = unsupported("Embed through the harness")
