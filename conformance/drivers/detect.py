"""``--protocol auto``: which protocol a port speaks, found the way smg finds it, lmrpc.v1 first.

Order: **lmrpc.v1**, then smg's own probe order **SGLang → vLLM**
(``model_gateway/src/workflow/steps/local/detect_backend.rs`` tries sglang, vllm, trtllm,
tokenspeed, mlx and takes the first whose engine ``HealthCheck`` answers OK), then SGLang's native
service **sglang.runtime.v1** (its ``HealthCheck`` answering OK), which smg does not drive. lmrpc.v1 comes
first because it is the complete contract: a port that serves it (the reference server's main
port also serves the vLLM dialect) is checked as lmrpc.v1; ``--protocol vllm-engine`` checks the
dialect instead. A port serving both SGLang and vLLM is SGLang, as smg sees it.

Server reflection, when the port serves it, narrows the probes to the services it lists;
without reflection every protocol is probed in order. A protocol *answers* when its call ends
with a status other than UNIMPLEMENTED (lmrpc.v1's GetServerInfo: an UNAUTHENTICATED answer
still shows the service is there) or OK (an engine's HealthCheck, exactly smg's test).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.exceptions import ProtocolError, StreamTerminatedError
from grpclib.reflection.v1 import reflection_grpc as refl_v1
from grpclib.reflection.v1 import reflection_pb2 as refl_v1_pb2
from grpclib.reflection.v1alpha import reflection_grpc as refl_v1alpha
from grpclib.reflection.v1alpha import reflection_pb2 as refl_v1alpha_pb2
from h2.exceptions import H2Error

from conformance.drivers import Driver, driver_class
from conformance.spec.protocols import DETECTION_ORDER

# a driver of each protocol to probe with (no promise changes what a probe sends)
PROBES: dict[str, Driver] = {p: driver_class(p)() for p in DETECTION_ORDER}
SERVICES = {p: driver.service for p, driver in PROBES.items()}


class DetectionError(Exception):
    """No protocol the harness drives answers on the port."""


@dataclass(frozen=True, slots=True)
class Detection:
    protocol: str
    how: str  # what decided it, for the report


async def detect(channel: Channel, timeout_s: float) -> Detection:
    listed = await reflected_services(channel, timeout_s)
    known = [p for p in DETECTION_ORDER if listed is not None and SERVICES[p] in listed]
    candidates = known or list(DETECTION_ORDER)
    seen = (
        f"reflection lists {', '.join(sorted(listed)) or 'nothing'}"
        if listed is not None
        else "no reflection"
    )
    tried: list[str] = []
    for candidate in candidates:
        if await answers(channel, candidate, timeout_s):
            return Detection(
                candidate, f"{seen}; {SERVICES[candidate]} answers (probed {', '.join([*tried, candidate])})"
            )
        tried.append(candidate)
    raise DetectionError(f"no protocol the harness drives answers ({seen}; probed {', '.join(tried)})")


async def answers(channel: Channel, protocol_id: str, timeout_s: float) -> bool:
    try:
        return await PROBES[protocol_id].answers(channel, timeout_s)
    except (TimeoutError, StreamTerminatedError, ProtocolError, H2Error):
        return False


async def reflected_services(channel: Channel, timeout_s: float) -> set[str] | None:
    """The services server reflection lists (v1, else v1alpha); None without reflection."""
    for stub_module, pb2 in ((refl_v1, refl_v1_pb2), (refl_v1alpha, refl_v1alpha_pb2)):
        try:
            async with asyncio.timeout(timeout_s):
                stub = stub_module.ServerReflectionStub(channel)
                async with stub.ServerReflectionInfo.open() as stream:
                    await stream.send_message(pb2.ServerReflectionRequest(list_services=""), end=True)
                    reply = await stream.recv_message()
                    await stream.recv_trailing_metadata()  # the request stream ended: so does the call
        except (GRPCError, TimeoutError, StreamTerminatedError, ProtocolError, H2Error):
            continue
        if reply is not None and reply.HasField("list_services_response"):
            return {s.name for s in reply.list_services_response.service}
    return None
