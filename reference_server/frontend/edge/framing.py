"""Read the one request message of a call from gRPC's length-prefixed framing, within limits.

grpclib reads a message by first trusting its 4-byte length prefix and acknowledging (to HTTP/2
flow control) every byte until that many arrived; a 4 GiB prefix made it buffer whatever the
client sent. Here the prefix is checked against the size limit before a byte of the body is
read, so an oversized message is refused while the client's data is still unacknowledged (HTTP/2
flow control stops the sender, and the stream's buffer is released when the call ends).

A unary-request call is also refused when it carries no message or a second one; any call when a
message is compressed or the stream ends inside a message.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

from grpclib import GRPCError, Status

PREFIX_BYTES = 5


class RawStream(Protocol):
    async def recv_data(self, size: int) -> bytes: ...


async def read_single_message(stream: RawStream, max_message_bytes: int) -> bytes:
    """The call's only message; GRPCError for anything else."""
    data = await read_message(stream, max_message_bytes)
    if data is None:
        raise GRPCError(Status.INVALID_ARGUMENT, "the call carried no request message")
    try:
        extra = await stream.recv_data(PREFIX_BYTES)
    except AssertionError:  # grpclib: the stream ended inside the read
        extra = b"?"
    if extra:
        raise GRPCError(
            Status.INVALID_ARGUMENT, "the call carried more than one request message; this RPC takes one"
        )
    return data


async def read_message(stream: RawStream, max_message_bytes: int) -> bytes | None:
    """The next message of a request stream, or None at its end."""
    try:
        prefix = await stream.recv_data(PREFIX_BYTES)
    except AssertionError:
        raise _truncated("its 5-byte message prefix") from None
    if not prefix:
        return None
    flag, length = struct.unpack(">BI", prefix)
    if flag == 1:
        raise GRPCError(
            Status.UNIMPLEMENTED,
            "compressed request messages are not supported (grpc-encoding: identity only)",
        )
    if flag != 0:
        raise GRPCError(
            Status.INVALID_ARGUMENT, f"message prefix has compressed-flag={flag}; it must be 0 or 1"
        )
    if length > max_message_bytes:
        raise GRPCError(
            Status.RESOURCE_EXHAUSTED,
            f"request message of {length} bytes is over the server's limit of {max_message_bytes} bytes",
        )
    try:
        return await stream.recv_data(length) if length else b""
    except AssertionError:
        raise _truncated(f"a message that declares {length} bytes") from None


def _truncated(what: str) -> GRPCError:
    return GRPCError(Status.INVALID_ARGUMENT, f"the request stream ended inside {what}")


def protocol_stream(stream: Any) -> RawStream:
    """The HTTP/2 stream under a grpclib server stream (grpclib keeps it private; pinned < 0.5,
    and tests/unit/test_edge_framing.py fails loudly if an upgrade moves it)."""
    raw: RawStream = stream._stream
    return raw
