"""Protocol drivers: the wire protocol a target speaks, behind the seams cases use (``Ctx``'s typed
calls and ``ctx.open`` / ``ctx.generate``). ``lmrpc`` is lmrpc.v1 itself; ``vllm-engine`` and
``sglang-scheduler`` are the engine protocols of smg (the Shepherd Model Gateway; their shared
layer is ``smg``), with their semantics normalised into lmrpc.v1 events; ``sglang-runtime`` is
SGLang's native service (``sglang.runtime.v1.SglangService``), read the same way; ``openai/`` the
OpenAI-compatible HTTP API. Which class drives a protocol is its row's ``driver``
(``conformance.spec.protocols``); ``detect`` is ``--protocol auto``."""

from __future__ import annotations

from conformance.drivers.base import Discovered, Driver, Promises
from conformance.drivers.lmrpc import LmrpcDriver
from conformance.drivers.sglang_runtime import SglangRuntimeDriver
from conformance.drivers.sglang_scheduler import SglangSchedulerDriver
from conformance.drivers.smg import SmgDriver
from conformance.drivers.vllm_engine import VllmEngineDriver
from conformance.spec.protocols import load, protocol

__all__ = [
    "Discovered",
    "Driver",
    "LmrpcDriver",
    "Promises",
    "SglangRuntimeDriver",
    "SglangSchedulerDriver",
    "SmgDriver",
    "VllmEngineDriver",
    "driver_class",
    "make_driver",
]


def driver_class(protocol_id: str) -> type[Driver]:
    """The class its row names, for a gRPC protocol."""
    row = protocol(protocol_id)
    if row.wire != "grpc":
        raise ValueError(f"protocol={protocol_id!r} is not a gRPC protocol: it has a target of its own")
    found = load(row.driver)
    if not (isinstance(found, type) and issubclass(found, Driver)):
        raise TypeError(f"the {protocol_id} row names {row.driver}, which is no Driver")
    return found


def make_driver(protocol_id: str, promises: Promises | None = None) -> Driver:
    """The driver of ``protocol_id``. ``promises`` (``--assume``) are for the protocols that
    advertise no capabilities: one that advertises them refuses promises."""
    cls = driver_class(protocol_id)
    if protocol(protocol_id).advertises:
        if promises is not None and promises != Promises():
            raise ValueError(
                f"--assume is for protocols that advertise nothing: {protocol_id} advertises its capabilities"
            )
        return cls()
    return cls(promises or Promises())  # type: ignore[call-arg]
