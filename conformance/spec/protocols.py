"""The wire protocols the harness drives. The gRPC ones share one case library (each reads the
clauses through its profile); the OpenAI-compatible HTTP API has cases of its own, registered for
it alone (``@case(..., protocols=HTTP_PROTOCOLS)``)."""

from __future__ import annotations

GRPC_PROTOCOLS = ("lmrpc", "vllm-engine", "sglang-scheduler", "sglang-runtime")
HTTP_PROTOCOLS = ("openai",)
PROTOCOLS = (*GRPC_PROTOCOLS, *HTTP_PROTOCOLS)


def family(protocol: str) -> tuple[str, ...]:
    """The protocols whose cases a run with ``--protocol protocol`` may select (``auto`` on a
    host:port target is gRPC)."""
    return HTTP_PROTOCOLS if protocol in HTTP_PROTOCOLS else GRPC_PROTOCOLS


def is_url(target: str) -> bool:
    """An OpenAI API target: over HTTP, or through SGLang's native gRPC service."""
    return target.startswith(("http://", "https://", "sglang-runtime://"))
