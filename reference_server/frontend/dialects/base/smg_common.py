"""What smg's engine dialects add to the base: the ``smg.grpc.common`` RPCs their protocols share.

smg's engine protocols run the tokenizer in the gateway (``GetTokenizer`` hands it the bundle),
route by the prefix cache (``SubscribeKvEvents``) and administer the engine (``FlushCache``, the
profiler). A dialect that is not smg's derives from ``DialectBase`` alone.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import ClassVar

from grpclib import GRPCError, Status

from lmrpc._gen.smg.grpc.common import (
    FlushCacheRequest,
    FlushCacheResponse,
    GetTokenizerChunk,
    GetTokenizerRequest,
    ProfileResponse,
    StartProfileRequest,
    StopProfileRequest,
)
from lmrpc.v1 import FlushCacheRequest as LmrpcFlushCacheRequest
from reference_server.frontend.dialects.base.kv_stream import kv_events_handler
from reference_server.frontend.dialects.base.service import DialectBase, DialectRequest, DialectResponse
from reference_server.frontend.grpc_hooks import RawHandler


class SmgEngineDialect(DialectBase[DialectRequest, DialectResponse]):
    #: the protocol's SubscribeKvEvents path, served from the radix cache's event hub
    kv_events_path: ClassVar[str]

    def raw_handlers(self) -> dict[str, RawHandler]:
        """SubscribeKvEvents is served raw (``kv_stream.py`` says why); ``grpc_hooks`` installs it."""
        return {self.kv_events_path: kv_events_handler(self.kv_events)}

    async def get_tokenizer(self, message: GetTokenizerRequest) -> AsyncIterator[GetTokenizerChunk]:
        bundle = await self.tokenizer_zip.get()
        for data, sha256 in bundle.chunks():
            yield GetTokenizerChunk(data=data, sha256=sha256)

    async def flush_cache(self, message: FlushCacheRequest) -> FlushCacheResponse:
        """Never waits and never fails for requests in flight: prefixes they use stay cached."""
        if not math.isfinite(message.timeout_s) or message.timeout_s < 0:
            raise GRPCError(Status.INVALID_ARGUMENT, f"timeout_s={message.timeout_s} must be >= 0 and finite")
        response = await self.control.flush_cache(LmrpcFlushCacheRequest())
        return FlushCacheResponse(
            success=True,
            message=f"released {response.released_tokens} cached KV tokens (prefixes in use stay cached)",
        )

    async def start_profile(self, message: StartProfileRequest) -> ProfileResponse:
        raise GRPCError(
            Status.UNIMPLEMENTED, "StartProfile is not supported by this server: it has no profiler"
        )

    async def stop_profile(self, message: StopProfileRequest) -> ProfileResponse:
        raise GRPCError(
            Status.UNIMPLEMENTED, "StopProfile is not supported by this server: it has no profiler"
        )
