"""lmrpc.v1 itself: the generated stubs, and Generate read as raw bytes (so invalid UTF-8 in a
text delta is recorded, not fatal: ``conformance.stream.wire``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.const import Cardinality

from conformance.drivers.base import Discovered, Driver
from conformance.stream.live import GENERATE, RawMessage
from conformance.stream.record import Finding
from conformance.stream.wire import Decoded, decode_response
from lmrpc.v1 import (
    ControlServiceStub,
    GenerateRequest,
    GetLoadRequest,
    GetModelInfoRequest,
    GetServerInfoRequest,
    InferenceServiceStub,
    ModelInfo,
    ServerInfo,
)

if TYPE_CHECKING:
    from betterproto2.grpclib.grpclib_client import MetadataLike


class LmrpcDriver(Driver):
    protocol = "lmrpc"
    announces_acceptance = True  # PromptInfo
    instance_field = "ServerInfo.instance_id"
    service = "lmrpc.v1.ControlService"

    async def events(
        self,
        channel: Channel,
        request: GenerateRequest,
        deadline_s: float | None,
        findings: list[Finding],
        metadata: MetadataLike | None = None,
    ) -> AsyncGenerator[Decoded]:
        async with channel.request(
            GENERATE,
            Cardinality.UNARY_STREAM,
            GenerateRequest,
            RawMessage,
            timeout=deadline_s,
            metadata=metadata,
        ) as stream:
            await stream.send_message(request, end=True)
            while (raw := await stream.recv_message()) is not None:
                yield decode_response(raw.data)
            await stream.recv_trailing_metadata()

    async def answers(self, channel: Channel, timeout_s: float) -> bool:
        """GetServerInfo answers with anything but UNIMPLEMENTED (an UNAUTHENTICATED answer still
        shows the service is there)."""
        try:
            await self.probe(channel, timeout_s)
        except GRPCError as exc:
            return exc.status is not Status.UNIMPLEMENTED
        return True

    async def probe(self, channel: Channel, timeout_s: float) -> None:
        await ControlServiceStub(channel).get_server_info(GetServerInfoRequest(), timeout=timeout_s)

    def control(self, channel: Channel) -> ControlServiceStub:
        return ControlServiceStub(channel)

    def inference(self, channel: Channel) -> InferenceServiceStub:
        return InferenceServiceStub(channel)

    async def discover(self, channel: Channel, timeout_s: float) -> Discovered:
        control = ControlServiceStub(channel)
        server = await asyncio.wait_for(control.get_server_info(GetServerInfoRequest()), timeout_s)
        model = await asyncio.wait_for(control.get_model_info(GetModelInfoRequest()), timeout_s)
        load = await asyncio.wait_for(control.get_load(GetLoadRequest()), timeout_s)
        return Discovered(
            server.server or ServerInfo(),
            model.model or ModelInfo(),
            model.embedding_model,
            int(load.current.kv_tokens_total) if load.current else 0,
        )
