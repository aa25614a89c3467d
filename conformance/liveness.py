"""Is the target still serving? Health ``""``, GetServerInfo, and a one-token Generate must all work."""

from __future__ import annotations

import asyncio

from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from conformance.context import Ctx
from conformance.session import Session
from lmrpc.v1 import GenerateRequest, GetServerInfoRequest, StoppingCriteria


async def probe(session: Session) -> tuple[bool, str]:
    budget = session.budgets.liveness_s
    channel = session.target.fresh_channel()
    ctx = Ctx(session, "liveness", {})
    try:
        try:
            health = await asyncio.wait_for(HealthStub(channel).Check(HealthCheckRequest(service="")), budget)
            if health.status != HealthCheckResponse.SERVING:
                return False, f"health is {HealthCheckResponse.ServingStatus.Name(health.status)}"
        except GRPCError:
            pass  # a health service that errs is SVC-2's and HEALTH-1's business; the calls below decide
        await asyncio.wait_for(session.target.control.get_server_info(GetServerInfoRequest()), budget)
        request = GenerateRequest(
            request_id=ctx.uid("probe"), text="Hello", stopping=StoppingCriteria(max_tokens=1)
        )
        stream = ctx.open(request, channel=channel)
        record = await stream.finish(budget)
        if not record.ended_ok:
            return False, f"a one-token Generate ended {record.end.value} {record.status_message}".strip()
        return True, "serving"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        await ctx.close()
        channel.close()
