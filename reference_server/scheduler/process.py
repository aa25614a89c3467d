"""The scheduler process: owns the engine, steps it, and streams token ids to the detokenizer."""

from __future__ import annotations

import logging
import sys
import traceback

import zmq

from reference_server import ipc
from reference_server.config import IpcAddresses, ServerConfig
from reference_server.engine.base import Engine
from reference_server.scheduler.engine_factory import create_engine
from reference_server.worker_io import pull_socket, push_socket, setup_worker

log = logging.getLogger("lmrpc.scheduler")


def run_scheduler(config: ServerConfig, addresses: IpcAddresses) -> None:
    """Process entry point."""
    setup_worker("lmrpc-scheduler", config.log_level)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    inbox = pull_socket(context, addresses.scheduler)
    to_detokenizer = push_socket(context, addresses.detokenizer)
    to_frontend = push_socket(context, addresses.frontend)
    try:
        engine = create_engine(config.engine)
        to_frontend.send(ipc.encode(ipc.Ready("scheduler", engine.info())))
        SchedulerLoop(engine, inbox, to_detokenizer, to_frontend).run()
    except Exception as exc:
        log.error("scheduler failed:\n%s", traceback.format_exc())
        to_frontend.send(ipc.encode(ipc.WorkerFailed("scheduler", f"{type(exc).__name__}: {exc}")))
        context.destroy(linger=1000)
        sys.exit(1)
    context.destroy(linger=1000)


class SchedulerLoop:
    def __init__(
        self,
        engine: Engine,
        inbox: zmq.Socket[bytes],
        to_detokenizer: zmq.Socket[bytes],
        to_frontend: zmq.Socket[bytes],
    ) -> None:
        self.engine = engine
        self.inbox = inbox
        self.to_detokenizer = to_detokenizer
        self.to_frontend = to_frontend
        self.paused = False
        self.running = True

    def run(self) -> None:
        while self.running:
            self._receive(block=self.paused or not self.engine.has_work())
            if self.running and not self.paused and self.engine.has_work():
                self._send_outputs(self.engine.step())

    def _receive(self, *, block: bool) -> None:
        """Handle every queued message; wait for the first one only if there is nothing to do."""
        flags = 0 if block else zmq.NOBLOCK
        while self.running:
            try:
                frame = self.inbox.recv(flags)
            except zmq.Again:
                return
            self._handle(ipc.scheduler_decoder.decode(frame))
            flags = zmq.NOBLOCK

    def _handle(self, message: ipc.SCHEDULER_INBOX) -> None:
        engine = self.engine
        if isinstance(message, ipc.SubmitRequest):
            register = ipc.RegisterRequest(message.rid, message.num_outputs, message.detokenize)
            self.to_detokenizer.send(ipc.encode(register))
            engine.add_request(message)
        elif isinstance(message, ipc.AbortRequests):
            self._send_outputs([out for rid in message.rids for out in engine.abort_request(rid)])
        elif isinstance(message, ipc.FinishOutput):
            engine.finish_output(message.rid, message.output_index)
        elif isinstance(message, ipc.QueryLoad):
            self._reply(ipc.LoadReply(message.query_id, engine.load(paused=self.paused)))
        elif isinstance(message, ipc.FlushCache):
            self._reply(ipc.FlushReply(message.query_id, engine.flush_cache()))
        elif isinstance(message, ipc.SetPaused):
            self.paused = message.paused
            self._reply(ipc.PausedReply(message.query_id, self.paused))
        elif isinstance(message, ipc.EmbedTexts):
            self._reply(self._embed(message))
        elif isinstance(message, ipc.Shutdown):
            self.to_detokenizer.send(ipc.encode(message))
            self.running = False

    def _embed(self, message: ipc.EmbedTexts) -> ipc.EmbedReply:
        try:
            vectors, counts = self.engine.embed(message.texts)
        except ValueError as exc:
            return ipc.EmbedReply(message.query_id, [], [], error=str(exc))
        return ipc.EmbedReply(message.query_id, vectors, counts)

    def _send_outputs(self, outputs: list[ipc.SequenceOutput]) -> None:
        if outputs:
            self.to_detokenizer.send(ipc.encode(ipc.StepOutputs(outputs)))

    def _reply(self, message: ipc.LoadReply | ipc.FlushReply | ipc.PausedReply | ipc.EmbedReply) -> None:
        self.to_frontend.send(ipc.encode(message))
