"""Clients that send what well-behaved gRPC libraries never would.

``raw_call`` sends arbitrary bytes as the request message through grpclib (real gRPC framing,
any body). ``H2Call`` (the harness's own, ``conformance.stream.h2call``) speaks HTTP/2 itself, so
a test controls every frame.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.const import Cardinality

from conformance.stream.h2call import H2Call, H2Result, frame
from conformance.stream.live import RawMessage

__all__ = ["GENERATE", "H2Call", "H2Result", "RawResult", "frame", "raw_call"]

GENERATE = "/lmrpc.v1.InferenceService/Generate"


@dataclass
class RawResult:
    status: Status
    message: str
    replies: list[bytes]


async def raw_call(channel: Channel, path: str, body: bytes, *, timeout: float = 30.0) -> RawResult:
    """Send ``body`` as the one request message of ``path`` and collect what comes back."""
    cardinality = Cardinality.UNARY_STREAM if path.endswith("/Generate") else Cardinality.UNARY_UNARY
    replies: list[bytes] = []
    try:
        async with channel.request(path, cardinality, RawMessage, RawMessage, timeout=timeout) as stream:
            await stream.send_message(RawMessage(body), end=True)
            async for reply in stream:
                replies.append(reply.data)
    except GRPCError as exc:
        return RawResult(exc.status, exc.message or "", replies)
    return RawResult(Status.OK, "", replies)
