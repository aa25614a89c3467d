"""The scheduler process: owns the engine, steps it, and streams token ids to the detokenizer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, assert_never

import msgspec
import zmq

from reference_server import ipc
from reference_server.config import IpcAddresses, ServerConfig
from reference_server.engine.base import Engine
from reference_server.engine.kv_events import KV_EVENT_BLOCK_SIZE
from reference_server.models.loader import CheckpointMismatchError
from reference_server.models.source import ModelNotFoundError, resolve_model
from reference_server.scheduler.engine_factory import create_engine
from reference_server.scheduler.grammars import GrammarQueue, compiler_factory
from reference_server.scheduler.profiler import ProfilerStateError, SchedulerProfiler
from reference_server.tracing import Tracing, start_tracing
from reference_server.worker_io import WorkerSockets, run_worker

if TYPE_CHECKING:
    from reference_server.engine.constraints import Grammar

log = logging.getLogger("lmrpc.scheduler")
PROFILER_POLL_MS = 20  # how often an idle loop looks whether torch.profiler has been imported
GRAMMAR_POLL_MS = 2  # how often an idle loop looks whether a parked request's grammar is compiled


def run_scheduler(config: ServerConfig, addresses: IpcAddresses) -> None:
    """Process entry point."""

    def serve(sockets: WorkerSockets) -> None:
        engine = create_engine(config.engine)
        info = engine.info()
        sockets.to_frontend.send(ipc.encode(ipc.Ready("scheduler", info)))
        tracing = start_tracing("lmrpc-reference-scheduler", config.otlp_endpoint)
        grammars = GrammarQueue(compiler_factory(config.engine.model_path, info.vocab_size))
        try:
            SchedulerLoop(
                engine, sockets.inbox, sockets.to_peer, sockets.to_frontend, tracing, grammars
            ).run()
        finally:
            grammars.close()
            if tracing is not None:
                tracing.shutdown()

    run_worker(
        "scheduler", config.log_level,
        inbox=addresses.scheduler, peer=addresses.detokenizer, frontend=addresses.frontend, serve=serve,
    )  # fmt: skip


class SchedulerLoop:
    def __init__(
        self,
        engine: Engine,
        inbox: zmq.Socket[bytes],
        to_detokenizer: zmq.Socket[bytes],
        to_frontend: zmq.Socket[bytes],
        tracing: Tracing | None = None,
        grammars: GrammarQueue | None = None,
    ) -> None:
        self.engine = engine
        self.tracing = tracing  # spans of the requests in flight (TRACE-1)
        self.grammars = grammars  # constrained requests wait there for their grammar; None: refused
        self.inbox = inbox
        self.to_detokenizer = to_detokenizer
        self.to_frontend = to_frontend
        self.paused = False
        self.running = True
        self.profiler = SchedulerProfiler()
        # Profiler commands that arrived while torch.profiler was being imported, answered in order
        # once it is: the engine keeps stepping meanwhile.
        self.profiler_commands: list[ipc.StartProfile | ipc.StopProfile] = []

    def run(self) -> None:
        while self.running:
            idle = self.paused or not self.engine.has_work()
            self._receive(block=idle, wake_after_ms=self._wake_after_ms())
            if self.profiler_commands and self.profiler.ready:
                for command in self.profiler_commands:
                    self._profiler_command(command)
                self.profiler_commands.clear()
            if self.grammars is not None:
                for request, grammar in self.grammars.ready():
                    self._admit(request, grammar)
            if self.running and not self.paused and self.engine.has_work():
                with self.profiler.step_range():
                    outputs = self.engine.step()
                self._send_outputs(outputs)
            self._send_kv_events()

    def _wake_after_ms(self) -> int | None:
        """How long an idle loop may wait for a message: not past a grammar or profiler awaited."""
        if self.grammars is not None and self.grammars.waiting:
            return GRAMMAR_POLL_MS
        return PROFILER_POLL_MS if self.profiler_commands else None

    def _receive(self, *, block: bool, wake_after_ms: int | None = None) -> None:
        """Handle every queued message; wait for the first one only if there is nothing to do (and
        then at most ``wake_after_ms``, when something else is awaited)."""
        if block and wake_after_ms is not None and not self.inbox.poll(wake_after_ms):
            return
        flags = 0 if block else zmq.NOBLOCK
        while self.running:
            try:
                frame = self.inbox.recv(flags)
            except zmq.Again:
                return
            message = self._decode(frame)
            if message is not None:
                self._handle(message)
            flags = zmq.NOBLOCK

    def _decode(self, frame: bytes) -> ipc.SCHEDULER_INBOX | None:
        """A message, or None: an undecodable frame fails its own request, never this process."""
        try:
            message: ipc.SCHEDULER_INBOX = ipc.scheduler_decoder.decode(frame)
        except msgspec.DecodeError as exc:
            rid = ipc.rid_of(frame)
            log.error("undecodable message for request %s: %s", rid, exc)
            if rid is not None:
                self._fail_request(rid, f"the scheduler could not decode the request: {exc}")
            return None
        return message

    def _handle(self, message: ipc.SCHEDULER_INBOX) -> None:
        engine = self.engine
        match message:
            case ipc.SubmitRequest():
                self._submit(message)
            case ipc.GrantTokens():
                engine.grant_tokens(message.rid, message.credit)
            case ipc.AbortRequests():
                self._send_outputs([out for rid in message.rids for out in self._abort(rid)])
            case ipc.FinishOutput():
                engine.finish_output(message.rid, message.output_index)
            case ipc.QueryLoad():
                self._reply(ipc.LoadReply(message.query_id, engine.load(paused=self.paused)))
            case ipc.FlushCache():
                self._reply(ipc.FlushReply(message.query_id, engine.flush_cache()))
            case ipc.SetPaused():
                self.paused = message.paused
                self._reply(ipc.PausedReply(message.query_id, self.paused))
            case ipc.EmbedTexts():
                self._reply(self._embed(message))
            case ipc.StartProfile():
                if self.profiler_commands or not self.profiler.ready:
                    self.profiler.load_in_background()
                    self.profiler_commands.append(message)
                else:
                    self._reply(self._start_profile(message))
            case ipc.StopProfile():  # recording means loaded: only a start still waiting holds it back
                if self.profiler_commands:
                    self.profiler_commands.append(message)
                else:
                    self._reply(self._stop_profile(message))
            case ipc.UpdateWeights():
                self._reply(self._update_weights(message))
            case ipc.Shutdown():
                self.to_detokenizer.send(ipc.encode(message))
                self.running = False
            case _:
                assert_never(message)

    def _submit(self, request: ipc.SubmitRequest) -> None:
        grammar = None
        if request.constraint is not None:
            if self.grammars is None:
                self._fail_request(request.rid, "this scheduler does not compile constraints")
                return
            grammar = self.grammars.compiled(request.constraint)
            if grammar is None:
                self.grammars.park(request)  # the engine gets it once compiled (GrammarQueue)
                return
        self._admit(request, grammar)

    def _admit(self, request: ipc.SubmitRequest, grammar: Grammar | str | None) -> None:
        # The engine takes the request before the detokenizer hears of it, so a request the
        # engine refuses leaves no state behind anywhere; registration still reaches the
        # detokenizer before the request's first outputs, which only a later step makes.
        if isinstance(grammar, str):
            self._fail_request(request.rid, f"the constraint could not be compiled: {grammar}")
            return
        try:
            self.engine.add_request(request, grammar)
        except Exception as exc:
            log.exception("the engine refused request %s", request.rid)
            self.engine.abort_request(request.rid)
            self._fail_request(request.rid, f"the engine could not take the request: {exc}")
            return
        register = ipc.RegisterRequest(request.rid, request.num_outputs, request.detokenize)
        self.to_detokenizer.send(ipc.encode(register))
        if self.tracing is not None:
            attributes = {"lmrpc.rid": request.rid, "lmrpc.prompt_tokens": len(request.prompt_ids)}
            self.tracing.start(
                request.rid, "scheduler request", request.trace_parent, request.num_outputs, attributes
            )

    def _abort(self, rid: str) -> list[ipc.SequenceOutput]:
        parked = self.grammars.drop(rid) if self.grammars is not None else None
        if parked is None:
            return self.engine.abort_request(rid)
        # never reached the engine or the detokenizer: register it so that its finishes reach the stream
        self.to_detokenizer.send(ipc.encode(ipc.RegisterRequest(rid, parked.num_outputs, parked.detokenize)))
        return [
            ipc.SequenceOutput(rid, i, [], finish=ipc.Finish("aborted")) for i in range(parked.num_outputs)
        ]

    def _fail_request(self, rid: str, message: str) -> None:
        if self.tracing is not None:
            self.tracing.end(rid, **{"lmrpc.failure": message})
        self.to_frontend.send(ipc.encode(ipc.RequestFailed(rid, "scheduler", message)))

    def _embed(self, message: ipc.EmbedTexts) -> ipc.EmbedReply:
        try:
            vectors, counts = self.engine.embed(message.texts)
        except ValueError as exc:
            return ipc.EmbedReply(message.query_id, [], [], error=str(exc))
        return ipc.EmbedReply(message.query_id, vectors, counts)

    def _profiler_command(self, message: ipc.StartProfile | ipc.StopProfile) -> None:
        if isinstance(message, ipc.StartProfile):
            self._reply(self._start_profile(message))
        else:
            self._reply(self._stop_profile(message))

    def _start_profile(self, message: ipc.StartProfile) -> ipc.AdminReply:
        try:
            started = self.profiler.start(message.output_dir)
        except ProfilerStateError as exc:
            return ipc.AdminReply(message.query_id, str(exc), "failed_precondition")
        except OSError as exc:
            return ipc.AdminReply(
                message.query_id,
                f"output_dir={message.output_dir!r}: cannot write there: {exc}",
                "invalid_argument",
            )
        return ipc.AdminReply(
            message.query_id, f"Profiling started (traces go to {started}).", path=str(started)
        )

    def _stop_profile(self, message: ipc.StopProfile) -> ipc.AdminReply:
        try:
            path = self.profiler.stop()
        except ProfilerStateError as exc:
            return ipc.AdminReply(message.query_id, str(exc), "failed_precondition")
        except OSError as exc:
            return ipc.AdminReply(message.query_id, f"the trace could not be written: {exc}", "internal")
        return ipc.AdminReply(message.query_id, f"Profiling stopped; the trace is {path}", path=str(path))

    def _update_weights(self, message: ipc.UpdateWeights) -> ipc.AdminReply:
        """Runs between two steps, so every step runs on one set of weights; a refusal leaves
        the engine serving the weights it had."""
        query, path = message.query_id, message.model_path
        if not Path(path).expanduser().exists():
            return ipc.AdminReply(query, f"model_path={path!r} does not exist", "not_found")
        try:
            source = resolve_model(path)
        except ModelNotFoundError as exc:
            return ipc.AdminReply(
                query, f"model_path={path!r} is not a loadable model: {exc}", "invalid_argument"
            )
        try:
            done = self.engine.update_weights(source)
        except CheckpointMismatchError as exc:
            return ipc.AdminReply(
                query, f"model_path={path!r} does not fit the served model: {exc}", "failed_precondition"
            )
        except (ValueError, OSError) as exc:
            return ipc.AdminReply(
                query, f"model_path={path!r} could not be loaded: {exc}", "invalid_argument"
            )
        except Exception as exc:
            log.exception("the weights of %s could not be loaded", path)
            return ipc.AdminReply(query, f"model_path={path!r} could not be loaded: {exc}", "internal")
        return ipc.AdminReply(query, done)

    def _send_outputs(self, outputs: list[ipc.SequenceOutput]) -> None:
        if outputs:
            self.to_detokenizer.send(ipc.encode(ipc.StepOutputs(outputs)))
        if self.tracing is not None:
            for output in outputs:
                if output.finish is not None:
                    self.tracing.output_finished(output.rid)

    def _send_kv_events(self) -> None:
        events = self.engine.drain_kv_events()
        if events:
            self.to_frontend.send(ipc.encode(ipc.KvEvents(KV_EVENT_BLOCK_SIZE, events)))

    def _reply(
        self, message: ipc.LoadReply | ipc.FlushReply | ipc.PausedReply | ipc.EmbedReply | ipc.AdminReply
    ) -> None:
        self.to_frontend.send(ipc.encode(message))
