"""The OpenAI JSON RPCs of the service (OpenAIEmbed, Score, Rerank): an answer's in-band HTTP status
and body, and the gRPC status a refusal reads as."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpclib import GRPCError, Status

if TYPE_CHECKING:
    pass


HTTP_OK = 200
# The gRPC status of an HTTP status an OpenAI JSON RPC answers in band (the reverse of gRPC's
# HTTP mapping); anything else unsuccessful is INTERNAL.
STATUS_OF_HTTP = {
    400: Status.INVALID_ARGUMENT,
    401: Status.UNAUTHENTICATED,
    403: Status.PERMISSION_DENIED,
    404: Status.NOT_FOUND,
    409: Status.ALREADY_EXISTS,
    429: Status.RESOURCE_EXHAUSTED,
    499: Status.CANCELLED,
    501: Status.UNIMPLEMENTED,
    503: Status.UNAVAILABLE,
    504: Status.DEADLINE_EXCEEDED,
}


def error_message(body: object) -> str:
    """The message of an OpenAI error object (``{"error": {"message": ...}}``), else the body."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))
    return str(body)[:200]


@dataclass(frozen=True, slots=True)
class JsonAnswer:
    """What an OpenAI JSON RPC (OpenAIEmbed, Score, Rerank) answered: its in-band HTTP status and its
    body, parsed (the raw text where it is not JSON)."""

    status_code: int
    body: Any

    @property
    def ok(self) -> bool:
        return self.status_code == HTTP_OK

    def refusal(self, rpc: str) -> GRPCError:
        status = STATUS_OF_HTTP.get(self.status_code, Status.INTERNAL)
        return GRPCError(status, f"{rpc} answered status_code {self.status_code}: {error_message(self.body)}")
