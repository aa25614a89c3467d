"""lmrpc: a gRPC contract for LLM inference servers.

``lmrpc.v1`` holds the generated messages and grpclib stubs of the contract;
``lmrpc.client`` is a small async helper on top of them.
"""

from __future__ import annotations

from pathlib import Path

#: The release of the SDK, the reference server and the harness (CHANGELOG.md says what changes it).
__version__ = "0.2.0"

#: Revision of docs/contract.md that this package implements and checks.
CONTRACT_REVISION = 5


def proto_dir() -> Path:
    """Directory holding ``lmrpc/v1/*.proto``, for generating code in other languages."""
    return Path(__file__).resolve().parent / "proto"


def descriptor_set_path() -> Path:
    """The contract as a serialized FileDescriptorSet (used for server reflection)."""
    return Path(__file__).resolve().parent / "_gen" / "descriptor_set.binpb"
