"""Administrative commands to the scheduler: the profiler, and replacing the model's weights.

lmrpc's StartProfile, StopProfile and UpdateWeights (ADMIN-1, ADMIN-2) and the dialects whose
protocols have them (SGLang's StartProfile, StopProfile, UpdateWeightsFromDisk) reach the
scheduler here. A refusal is a GRPCError whose status the scheduler named (``ipc.AdminRefusal``).
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

    async def start_profile(self, output_dir: str) -> ipc.AdminReply:
        """Start a torch.profiler recording of the scheduler; its trace goes to ``output_dir``
        (the reply's ``path``)."""
        return await self._command(lambda qid: ipc.StartProfile(qid, output_dir))

    async def stop_profile(self) -> ipc.AdminReply:
        """Stop the recording; the reply's ``path`` is the trace file."""
        return await self._command(ipc.StopProfile)

    async def update_weights(self, model_path: str, weights_version: str | None = None) -> ipc.AdminReply:
        """Replace the weights by those at ``model_path``; requests in flight go on. Loading a
        checkpoint takes a while, and the scheduler steps no request meanwhile. Once done,
        ``weights_version`` (by default the count of updates these workers took) names them."""
        engine = self.ctx.ready_engine()
        reply = await self._command(lambda qid: ipc.UpdateWeights(qid, model_path), WEIGHTS_TIMEOUT_S)
        engine.updates += 1
        engine.weights_version = weights_version or f"update-{engine.updates}"
        return reply

    async def _command(
        self, make: Callable[[int], msgspec.Struct], timeout_s: float = COMMAND_TIMEOUT_S
    ) -> ipc.AdminReply:
        self.ctx.ready_engine()
        try:
            reply = await self.ctx.link.query(make, timeout_s)
        except WorkerUnavailableError as exc:
            raise GRPCError(Status.UNAVAILABLE, str(exc)) from None
        assert isinstance(reply, ipc.AdminReply)
        if reply.refusal is not None:
            raise GRPCError(Status[reply.refusal.upper()], reply.message)
        return reply
