"""The protocols the harness drives, one row each: everything else derives from this table (the
CLI's choices and help, ``--protocol auto``'s probe order, which driver a run constructs, each
protocol's profile, which cases a run may select, the docs index). A protocol is added by adding
its row here, its driver (``driver``) and its profile (``profile``).

The gRPC protocols share one case library, each reading the clauses through its profile; an HTTP
protocol has cases of its own, registered for it alone (``@case(..., protocols=(id,))``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal

Wire = Literal["grpc", "http"]


@dataclass(frozen=True, slots=True)
class Protocol:
    id: str  # the harness id: --protocol ID, its profile's and docs page's name, everywhere
    title: str  # what it is, in a few words
    api: str  # the service (gRPC) or the API (HTTP) it names on the wire
    served_by: str  # who serves it
    wire: Wire
    driver: str  # "module:Class": the driver (gRPC) or target (HTTP) the run constructs
    profile: str  # "module:NAME": how the contract's clauses read there
    detect_rank: int | None = None  # its place in --protocol auto's probes on host:port (None: never probed)
    schemes: tuple[str, ...] = ()  # the URL schemes its targets take (HTTP); gRPC takes host:port
    advertises: bool = False  # it advertises its capabilities itself, so --assume is refused

    @property
    def page(self) -> str:
        """Its guide: docs/protocols/<id>.md."""
        return f"docs/protocols/{self.id}.md"

    @property
    def target_form(self) -> str:
        return (
            "host:port"
            if self.wire == "grpc"
            else "a URL (" + ", ".join(f"{s}://" for s in self.schemes) + ")"
        )


TABLE: tuple[Protocol, ...] = (
    Protocol(
        "lmrpc",
        "lmrpc.v1, this contract",
        "`lmrpc.v1` (`InferenceService`, `ControlService`), the [contract](../contract.md)",
        "the reference server's main port; any server that implements the contract",
        "grpc",
        "conformance.drivers.lmrpc:LmrpcDriver",
        "conformance.spec.profiles.lmrpc:LMRPC",
        detect_rank=1,  # the complete contract first: a port serving it and a dialect is checked as it
        advertises=True,
    ),
    Protocol(
        "vllm-engine",
        "smg's vLLM engine protocol",
        "`vllm.grpc.engine.VllmEngine`, smg's vLLM worker protocol (`smg-grpc-proto`)",
        "vLLM's gRPC server (`vllm.entrypoints.grpc_server`); the reference server's main port",
        "grpc",
        "conformance.drivers.vllm_engine:VllmEngineDriver",
        "conformance.spec.profiles.vllm_engine:VLLM_ENGINE",
        detect_rank=3,  # smg's own order: SGLang before vLLM
    ),
    Protocol(
        "sglang-scheduler",
        "smg's SGLang engine protocol",
        "`sglang.grpc.scheduler.SglangScheduler`, smg's SGLang worker protocol (`smg-grpc-proto`)",
        "SGLang with `--grpc-mode`; the reference server's `--sglang-scheduler-port`",
        "grpc",
        "conformance.drivers.sglang_scheduler:SglangSchedulerDriver",
        "conformance.spec.profiles.sglang_scheduler:SGLANG_SCHEDULER",
        detect_rank=2,
    ),
    Protocol(
        "sglang-runtime",
        "SGLang's native gRPC service",
        "`sglang.runtime.v1.SglangService`, SGLang's own gRPC service",
        "every SGLang process beside its HTTP API; the reference server's `--sglang-runtime-port`",
        "grpc",
        "conformance.drivers.sglang_runtime:SglangRuntimeDriver",
        "conformance.spec.profiles.sglang_runtime:SGLANG_RUNTIME",
        detect_rank=4,  # smg does not drive it: probed last
    ),
    Protocol(
        "openai",
        "the OpenAI-compatible HTTP API",
        "the OpenAI-compatible HTTP API (`/v1/chat/completions`, `/v1/completions`, `/v1/models`)",
        "vLLM, SGLang, llama.cpp, Ollama, TGI, smg (in front of the reference server)",
        "http",
        "conformance.drivers.openai.target:HttpTarget",
        "conformance.spec.profiles.openai:OPENAI",
        # sglang-runtime://: the same API through SGLang's native service (drivers/openai/runtime_transport.py)
        schemes=("http", "https", "sglang-runtime"),
    ),
)

BY_ID: dict[str, Protocol] = {p.id: p for p in TABLE}
PROTOCOLS: tuple[str, ...] = tuple(BY_ID)
GRPC_PROTOCOLS: tuple[str, ...] = tuple(p.id for p in TABLE if p.wire == "grpc")
HTTP_PROTOCOLS: tuple[str, ...] = tuple(p.id for p in TABLE if p.wire == "http")
DETECTION_ORDER: tuple[str, ...] = tuple(
    p.id for p in sorted(TABLE, key=lambda p: p.detect_rank or 0) if p.detect_rank is not None
)
URL_SCHEMES: tuple[str, ...] = tuple(s for p in TABLE for s in p.schemes)


def protocol(protocol_id: str) -> Protocol:
    try:
        return BY_ID[protocol_id]
    except KeyError:
        raise ValueError(
            f"protocol={protocol_id!r} must be one of {', '.join(PROTOCOLS)} (or auto)"
        ) from None


def wire_of(protocol_id: str) -> Wire:
    """The wire a run with ``--protocol protocol_id`` speaks (``auto`` on host:port is gRPC)."""
    return "grpc" if protocol_id == "auto" else protocol(protocol_id).wire


def family(protocol_id: str) -> tuple[str, ...]:
    """The protocols whose cases a run with ``--protocol protocol_id`` may select (``auto`` on a
    host:port target is gRPC)."""
    return HTTP_PROTOCOLS if wire_of(protocol_id) == "http" else GRPC_PROTOCOLS


def is_url(target: str) -> bool:
    """A target an HTTP protocol takes: a URL of one of its schemes."""
    return target.startswith(tuple(f"{scheme}://" for scheme in URL_SCHEMES))


def load(ref: str) -> object:
    """What a row's ``"module:NAME"`` names (its driver, its profile); the caller checks its type."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def cli_help() -> str:
    """``--protocol``'s help, from the rows."""
    rows = "; ".join(f"{p.id} ({p.title}, on {p.target_form})" for p in TABLE)
    order = ", ".join(DETECTION_ORDER)
    return f"the wire protocol: {rows}. auto: {HTTP_PROTOCOLS[0]} for a URL, else probed in the order {order}"
