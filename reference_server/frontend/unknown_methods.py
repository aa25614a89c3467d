"""Answer calls to unknown methods with a well-formed UNIMPLEMENTED (ERR-4).

grpclib answers an unknown path with a trailers-only response that lacks ``content-type``;
spec-following clients (grpclib's own among them) then report UNKNOWN "Missing content-type
header" instead of UNIMPLEMENTED. Routing unknown paths to a handler that raises the error makes
grpclib send a normal response: headers with content-type, then grpc-status 12.
"""

from __future__ import annotations

from typing import Any

from grpclib import GRPCError, Status
from grpclib.const import Cardinality, Handler
from grpclib.server import Server, Stream

from lmrpc.v1 import GetLoadRequest


async def _unimplemented(stream: Stream[Any, Any]) -> None:
    raise GRPCError(Status.UNIMPLEMENTED, "Method not found")


_HANDLER = Handler(_unimplemented, Cardinality.UNARY_UNARY, GetLoadRequest, GetLoadRequest)


class _Mapping(dict[str, Handler]):
    def get(self, key: str, default: Any = None) -> Handler:
        return super().get(key) or _HANDLER


def answer_unknown_methods(server: Server) -> None:
    """Call once, right after constructing the server (uses grpclib's private ``_mapping``)."""
    server._mapping = _Mapping(server._mapping)
