"""Administrative commands to the scheduler that lmrpc.v1 has no RPC for: the profiler, and
replacing the model's weights.

Dialects whose protocols have them (SGLang's StartProfile, StopProfile, UpdateWeightsFromDisk)
reach the scheduler here, through the same query path as lmrpc's own administration. A refusal
is a GRPCError whose status the scheduler named (``ipc.AdminRefusal``).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from grpclib import GRPCError, Status

from reference_server import ipc
from reference_server.frontend.context import FrontendContext
from reference_server.frontend.engine_link import WorkerUnavailableError

COMMAND_TIMEOUT_S = 30.0
WEIGHTS_TIMEOUT_S = 600.0


class EngineAdmin:
    def __init__(self, context: FrontendContext) -> None:
        self.ctx = context

    async def start_profile(self, output_dir: str) -> str:
        """Start a torch.profiler recording of the scheduler; its trace goes to ``output_dir``."""
        return await self._command(lambda qid: ipc.StartProfile(qid, output_dir))

    async def stop_profile(self) -> str:
        """Stop the recording; the message names the trace file."""
        return await self._command(ipc.StopProfile)

    async def update_weights(self, model_path: str) -> str:
        """Replace the weights by those at ``model_path``; requests in flight go on. Loading a
        checkpoint takes a while, and the scheduler steps no request meanwhile."""
        return await self._command(lambda qid: ipc.UpdateWeights(qid, model_path), WEIGHTS_TIMEOUT_S)

    async def _command(
        self, make: Callable[[int], msgspec.Struct], timeout_s: float = COMMAND_TIMEOUT_S
    ) -> str:
        self.ctx.ready_engine()
        try:
            reply = await self.ctx.link.query(make, timeout_s)
        except WorkerUnavailableError as exc:
            raise GRPCError(Status.UNAVAILABLE, str(exc)) from None
        assert isinstance(reply, ipc.AdminReply)
        if reply.refusal is not None:
            raise GRPCError(Status[reply.refusal.upper()], reply.message)
        return reply.message
