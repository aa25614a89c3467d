"""The protobuf codec of the gRPC server, with a limit on the size of a request message.

grpclib enforces no receive limit, so an arbitrarily large prompt would be parsed, tokenized and
validated in full. Like other gRPC servers (4 MiB by default), this one answers an oversized
request with RESOURCE_EXHAUSTED before parsing it. grpclib has already buffered the message by
then; the limit bounds the work done on it, not that buffer.
"""

from __future__ import annotations

from typing import Any

from grpclib import GRPCError, Status
from grpclib.encoding.proto import ProtoCodec


class SizeLimitedCodec(ProtoCodec):
    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_message_bytes:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"request message of {len(data)} bytes is over the server's limit of "
                f"{self.max_message_bytes} bytes",
            )
        return super().decode(data, message_type)
