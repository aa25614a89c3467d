"""The detokenizer process: token ids in, UTF-8-safe text deltas and stop-string finishes out."""

from __future__ import annotations

import logging
from typing import assert_never

import msgspec
import zmq

from reference_server import ipc
from reference_server.config import IpcAddresses, ServerConfig
from reference_server.detokenizer.incremental import DecodeTable
from reference_server.detokenizer.state import RequestText
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import load_tokenizer
from reference_server.worker_io import WorkerSockets, run_worker

log = logging.getLogger("lmrpc.detokenizer")


def run_detokenizer(config: ServerConfig, addresses: IpcAddresses) -> None:
    """Process entry point."""

    def serve(sockets: WorkerSockets) -> None:
        tokenizer = load_tokenizer(resolve_model(config.engine.model_path))
        table = DecodeTable.build(tokenizer.tokenizer, tokenizer.vocab_size)
        sockets.to_frontend.send(ipc.encode(ipc.Ready("detokenizer")))
        DetokenizerLoop(table, sockets.inbox, sockets.to_frontend, sockets.to_peer).run()

    run_worker(
        "detokenizer", config.log_level,
        inbox=addresses.detokenizer, peer=addresses.scheduler, frontend=addresses.frontend, serve=serve,
    )  # fmt: skip


class DetokenizerLoop:
    def __init__(
        self,
        table: DecodeTable,
        inbox: zmq.Socket[bytes],
        to_frontend: zmq.Socket[bytes],
        to_scheduler: zmq.Socket[bytes],
    ) -> None:
        self.table = table
        self.inbox = inbox
        self.to_frontend = to_frontend
        self.to_scheduler = to_scheduler
        self.requests: dict[str, RequestText] = {}

    def run(self) -> None:
        while True:
            frame = self.inbox.recv()
            try:
                message = ipc.detokenizer_decoder.decode(frame)
            except msgspec.DecodeError as exc:
                rid = ipc.rid_of(frame)
                log.error("undecodable message for request %s: %s", rid, exc)
                if rid is not None:
                    self._fail(rid, f"the detokenizer could not decode the request: {exc}")
                continue
            match message:
                case ipc.Shutdown():
                    return
                case ipc.RegisterRequest():
                    self._register(message)
                case ipc.StepOutputs():
                    self._process(message.outputs)
                case _:
                    assert_never(message)

    def _register(self, message: ipc.RegisterRequest) -> None:
        try:
            self.requests[message.rid] = RequestText.create(
                self.table, message.rid, message.num_outputs, message.detokenize
            )
        except Exception as exc:
            log.exception("cannot detokenize request %s", message.rid)
            self._fail(message.rid, f"the detokenizer could not take the request: {exc}")

    def _fail(self, rid: str, message: str) -> None:
        """One request failed here: stop it in the engine, end its stream, keep serving the rest."""
        self.requests.pop(rid, None)
        self.to_scheduler.send(ipc.encode(ipc.AbortRequests([rid])))
        self.to_frontend.send(ipc.encode(ipc.RequestFailed(rid, "detokenizer", message)))

    def _process(self, outputs: list[ipc.SequenceOutput]) -> None:
        events = []
        for step in outputs:
            request = self.requests.get(step.rid)
            if request is None:
                continue  # the request already ended (e.g. a stop string matched)
            try:
                event, stop_engine = request.process(step)
            except Exception as exc:
                log.exception("cannot detokenize output %d of request %s", step.output_index, step.rid)
                self._fail(step.rid, f"the detokenizer failed on the request's output: {exc}")
                continue
            if event is not None:
                events.append(event)
            if stop_engine:
                self.to_scheduler.send(ipc.encode(ipc.FinishOutput(step.rid, step.output_index)))
            if request.done:
                del self.requests[step.rid]
        if events:
            self.to_frontend.send(ipc.encode(ipc.OutputBatch(events)))
