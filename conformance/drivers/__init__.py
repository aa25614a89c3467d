"""Protocol drivers: the wire protocol a target speaks, behind the seams cases use (``Ctx``'s typed
calls and ``ctx.open`` / ``ctx.generate``). ``lmrpc`` is lmrpc.v1 itself; ``vllm-engine`` and
``sglang-scheduler`` are the engine protocols of smg (the Shepherd Model Gateway), with their
semantics normalised into lmrpc.v1 events; ``sglang-runtime`` is SGLang's native service
(``sglang.runtime.v1.SglangService``), read the same way. ``detect`` is ``--protocol auto``."""

from __future__ import annotations

from conformance.drivers.base import PROTOCOLS, Discovered, Driver, Promises
from conformance.drivers.lmrpc import LmrpcDriver
from conformance.drivers.sglang_runtime import SglangRuntimeDriver
from conformance.drivers.sglang_scheduler import SglangSchedulerDriver
from conformance.drivers.smg import SmgDriver
from conformance.drivers.vllm_engine import VllmEngineDriver

__all__ = [
    "PROTOCOLS",
    "Discovered",
    "Driver",
    "LmrpcDriver",
    "Promises",
    "SglangRuntimeDriver",
    "SglangSchedulerDriver",
    "SmgDriver",
    "VllmEngineDriver",
    "make_driver",
]


def make_driver(protocol: str, promises: Promises | None = None) -> Driver:
    """The driver of ``protocol`` (one of PROTOCOLS). ``promises`` (``--assume``) are for the
    protocols that advertise no capabilities: an lmrpc.v1 server advertises its capabilities itself."""
    if protocol == "lmrpc":
        if promises is not None and promises != Promises():
            raise ValueError(
                "--assume is for engine protocols: an lmrpc.v1 server advertises its capabilities"
            )
        return LmrpcDriver()
    if protocol == "vllm-engine":
        return VllmEngineDriver(promises or Promises())
    if protocol == "sglang-scheduler":
        return SglangSchedulerDriver(promises or Promises())
    if protocol == "sglang-runtime":
        return SglangRuntimeDriver(promises or Promises())
    raise ValueError(f"protocol={protocol!r} must be one of {', '.join(PROTOCOLS)} (or auto)")
