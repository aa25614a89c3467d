"""What crosses the process boundaries: nothing is dropped silently, and no message content can
kill a worker (each undecodable or refused request fails alone)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest
import zmq
from grpclib import Status

from reference_server import ipc
from reference_server.config import IpcAddresses
from reference_server.detokenizer.incremental import DecodeTable
from reference_server.detokenizer.process import DetokenizerLoop
from reference_server.engine.fake import FakeEngine, FakeEngineConfig
from reference_server.frontend.engine_link import EngineLink, WorkerUnavailableError
from reference_server.frontend.requests import FlowHooks, RequestState, RequestTable
from reference_server.models.tokenizer import TokenizerBundle, whole_character_tokens
from reference_server.scheduler.grammars import GrammarQueue
from reference_server.scheduler.process import SchedulerLoop

if TYPE_CHECKING:
    from reference_server.engine.constraints import Grammar, GrammarCompiler

SAMPLING = ipc.SamplingConfig(1.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0, 7)
STOPPING = ipc.StoppingConfig(max_tokens=3, min_tokens=0, stop_token_ids=(), ignore_eos=True)
DETOKENIZE = ipc.DetokenizeConfig(True, True, (), False, 0)


def submit(rid: str) -> ipc.SubmitRequest:
    return ipc.SubmitRequest(rid, [5, 6, 7], 1, SAMPLING, STOPPING, None, DETOKENIZE)


def table() -> RequestTable:
    return RequestTable(5.0, FlowHooks(lambda rid, credit: None, 64))


@pytest.fixture
def addresses() -> Iterator[IpcAddresses]:
    found = IpcAddresses.create()
    yield found
    import shutil

    shutil.rmtree(found.folder, ignore_errors=True)


def test_the_link_queues_every_message_even_when_the_scheduler_lags(addresses: IpcAddresses) -> None:
    async def main() -> int:
        link = EngineLink(addresses, table())
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        scheduler = context.socket(zmq.PULL)
        scheduler.bind(addresses.scheduler)
        try:
            for i in range(20_000):  # far past ZMQ's default high-water mark of 1000
                link.send(ipc.AbortRequests([f"r{i}"]))
            received = 0
            while scheduler.poll(2000):
                scheduler.recv()
                received += 1
            return received
        finally:
            link.close()
            context.destroy(linger=0)

    assert asyncio.run(main()) == 20_000


def test_the_link_refuses_to_send_after_a_failure_and_queries_time_out(addresses: IpcAddresses) -> None:
    async def main() -> None:
        link = EngineLink(addresses, table())
        try:
            with pytest.raises(WorkerUnavailableError, match=r"did not answer within 0\.05 s"):
                await link.query(ipc.QueryLoad, timeout_s=0.05)
            link.fail("the scheduler process exited (code -9)")
            with pytest.raises(WorkerUnavailableError, match="code -9"):
                link.send(ipc.AbortRequests(["r1"]))
        finally:
            link.close()

    asyncio.run(main())


def test_an_undecodable_worker_frame_fails_the_requests_it_names_at_once(addresses: IpcAddresses) -> None:
    """Not after the stall timeout: the frontend cannot read the frame, so the stream it names would
    otherwise wait for events that never come; the engine is told to drop the request too."""

    async def main() -> tuple[RequestState, bytes]:
        requests = table()
        link = EngineLink(addresses, requests)
        state = requests.register("owner", "req-1", 1)
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        scheduler = context.socket(zmq.PULL)
        scheduler.bind(addresses.scheduler)
        worker = context.socket(zmq.PUSH)
        worker.connect(addresses.frontend)
        link.start()
        try:
            bad_event = [state.rid, 0, "not a list", "", None, None, 1, None]
            worker.send(msgspec.msgpack.encode({"type": "output_batch", "events": [bad_event]}))
            await asyncio.wait_for(state.next_events(), 5)
            assert scheduler.poll(5000), "the engine was not told to drop the request"
            return state, scheduler.recv()
        finally:
            link.close()
            context.destroy(linger=0)

    state, sent = asyncio.run(main())
    assert state.failure is not None and state.failure[0] == Status.INTERNAL.value
    assert "could not decode" in state.failure[1]
    assert ipc.scheduler_decoder.decode(sent) == ipc.AbortRequests([state.rid])


def test_an_undecodable_worker_frame_naming_no_request_is_only_logged(addresses: IpcAddresses) -> None:
    async def main() -> tuple[int, str] | None:
        requests = table()
        link = EngineLink(addresses, requests)
        state = requests.register("owner", "req-1", 1)
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        worker = context.socket(zmq.PUSH)
        worker.connect(addresses.frontend)
        link.start()
        try:
            worker.send(b"\xc1 not msgpack")
            worker.send(ipc.encode(ipc.RequestFailed(state.rid, "detokenizer", "a readable failure")))
            await asyncio.wait_for(state.next_events(), 5)  # the link is still reading
            return state.failure
        finally:
            link.close()
            context.destroy(linger=0)

    assert asyncio.run(main()) == (Status.INTERNAL.value, "a readable failure")


class _Sockets:
    """A scheduler loop wired to in-process sockets the test reads and writes."""

    def __init__(self, engine: FakeEngine, grammars: GrammarQueue | None = None) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.to_scheduler = self.context.socket(zmq.PUSH)
        inbox = self.context.socket(zmq.PULL)
        inbox.bind("inproc://scheduler")
        self.to_scheduler.connect("inproc://scheduler")
        self.detokenizer = self.context.socket(zmq.PULL)
        self.detokenizer.bind("inproc://detokenizer")
        self.frontend = self.context.socket(zmq.PULL)
        self.frontend.bind("inproc://frontend")
        to_detokenizer, to_frontend = self.context.socket(zmq.PUSH), self.context.socket(zmq.PUSH)
        to_detokenizer.connect("inproc://detokenizer")
        to_frontend.connect("inproc://frontend")
        self.loop = SchedulerLoop(engine, inbox, to_detokenizer, to_frontend, grammars=grammars)
        self.thread = threading.Thread(target=self.loop.run, daemon=True)
        self.thread.start()

    def frontend_message(self) -> ipc.FRONTEND_INBOX:
        assert self.frontend.poll(5000), "nothing reached the frontend"
        message: ipc.FRONTEND_INBOX = ipc.frontend_decoder.decode(self.frontend.recv())
        return message

    def close(self) -> None:
        self.to_scheduler.send(ipc.encode(ipc.Shutdown()))
        self.thread.join(5)
        self.context.destroy(linger=0)


def fake_engine() -> FakeEngine:
    return FakeEngine(FakeEngineConfig("fake", 100, (2,), None, tuple(range(10, 50))))


def test_an_undecodable_request_fails_alone_and_the_scheduler_keeps_serving() -> None:
    sockets = _Sockets(fake_engine())
    try:
        bad = msgspec.msgpack.encode({"type": "submit", "rid": "r-bad", "prompt_ids": "not a list"})
        sockets.to_scheduler.send(bad)
        failed = sockets.frontend_message()
        assert isinstance(failed, ipc.RequestFailed) and failed.rid == "r-bad"
        assert "could not decode" in failed.message
        sockets.to_scheduler.send(ipc.encode(ipc.QueryLoad(1)))
        reply = sockets.frontend_message()
        assert isinstance(reply, ipc.LoadReply) and reply.load.requests_in_engine == 0
        assert sockets.thread.is_alive()
    finally:
        sockets.close()


class _RefusingEngine(FakeEngine):
    def add_request(self, request: ipc.SubmitRequest, grammar: Grammar | None = None) -> None:
        if request.rid == "r-refused":
            super().add_request(request, grammar)  # half-done state the scheduler must clean up
            raise RuntimeError("cannot take it")
        super().add_request(request, grammar)


def test_a_request_the_engine_refuses_fails_alone_and_leaves_nothing_behind() -> None:
    sockets = _Sockets(_RefusingEngine(fake_engine().config))
    try:
        sockets.to_scheduler.send(ipc.encode(submit("r-refused")))
        failed = sockets.frontend_message()
        assert isinstance(failed, ipc.RequestFailed) and failed.rid == "r-refused"
        sockets.to_scheduler.send(ipc.encode(submit("r-fine")))
        register = ipc.detokenizer_decoder.decode(sockets.detokenizer.recv())
        assert isinstance(register, ipc.RegisterRequest) and register.rid == "r-fine"  # r-refused never was
        sockets.to_scheduler.send(ipc.encode(ipc.QueryLoad(2)))
        while True:
            reply = sockets.frontend_message()
            if isinstance(reply, ipc.LoadReply):
                break
        assert sockets.thread.is_alive()
    finally:
        sockets.close()


def test_an_undecodable_message_fails_its_request_in_the_detokenizer_too(tokenizer: TokenizerBundle) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    inbox, frontend, scheduler = (context.socket(zmq.PULL) for _ in range(3))
    for socket, name in ((inbox, "detok"), (frontend, "front"), (scheduler, "sched")):
        socket.bind(f"inproc://{name}")
    feed, to_frontend, to_scheduler = (context.socket(zmq.PUSH) for _ in range(3))
    for socket, name in ((feed, "detok"), (to_frontend, "front"), (to_scheduler, "sched")):
        socket.connect(f"inproc://{name}")
    loop = DetokenizerLoop(
        DecodeTable.build(tokenizer.tokenizer, tokenizer.vocab_size), inbox, to_frontend, to_scheduler
    )
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        feed.send(msgspec.msgpack.encode({"type": "register", "rid": "r-bad", "num_outputs": "two"}))
        assert frontend.poll(5000) and scheduler.poll(5000)
        failed = ipc.frontend_decoder.decode(frontend.recv())
        assert isinstance(failed, ipc.RequestFailed) and failed.rid == "r-bad"
        assert ipc.scheduler_decoder.decode(scheduler.recv()) == ipc.AbortRequests(["r-bad"])
        feed.send(ipc.encode(ipc.RegisterRequest("r-ok", 1, DETOKENIZE)))
        feed.send(
            ipc.encode(ipc.StepOutputs([ipc.SequenceOutput("r-ok", 0, [28120], finish=ipc.Finish("length"))]))
        )
        assert frontend.poll(5000)
        batch = ipc.frontend_decoder.decode(frontend.recv())
        assert isinstance(batch, ipc.OutputBatch) and batch.events[0].rid == "r-ok"
    finally:
        feed.send(ipc.encode(ipc.Shutdown()))
        thread.join(5)
        context.destroy(linger=0)


def test_the_engine_steps_on_while_the_profiler_is_imported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A StartProfile whose torch.profiler import takes long (seconds on a busy machine) is answered
    when the import is done, and the requests in flight are stepped meanwhile; a StopProfile sent
    behind it is answered after it, in order."""
    import reference_server.scheduler.profiler as profiler

    imported = threading.Event()
    monkeypatch.setattr(profiler, "_profiler_imported", lambda: False)
    monkeypatch.setattr(profiler, "_import_profiler", lambda: imported.wait(10))
    sockets = _Sockets(fake_engine())
    try:
        sockets.to_scheduler.send(ipc.encode(ipc.StartProfile(1, str(tmp_path))))
        sockets.to_scheduler.send(ipc.encode(ipc.StopProfile(2)))
        sockets.to_scheduler.send(ipc.encode(submit("r-during")))
        while not any(o.finish is not None for o in _outputs(sockets)):
            pass  # the request runs to its end while the profiler is still being imported
        assert not sockets.frontend.poll(0), "a profiler command was answered before its import ended"
        imported.set()
        started, stopped = sockets.frontend_message(), sockets.frontend_message()
        assert isinstance(started, ipc.AdminReply) and started.query_id == 1 and started.refusal is None
        assert isinstance(stopped, ipc.AdminReply) and stopped.query_id == 2 and stopped.refusal is None
        assert stopped.path.startswith(str(tmp_path))
    finally:
        imported.set()
        sockets.close()


def _outputs(sockets: _Sockets) -> list[ipc.SequenceOutput]:
    assert sockets.detokenizer.poll(5000), "the engine did not step"
    message = ipc.detokenizer_decoder.decode(sockets.detokenizer.recv())
    return message.outputs if isinstance(message, ipc.StepOutputs) else []


def test_a_request_waiting_for_its_grammar_holds_back_no_other(tokenizer: TokenizerBundle) -> None:
    """A constrained request whose grammar is still compiling (here: until the test lets it) is
    parked outside the engine: an unconstrained request sent after it runs to its end, a parked
    request can be aborted, and the parked request runs once its grammar is done, which is
    compiled once for all the requests that wait on it."""
    from reference_server.engine.constraints import GrammarCompiler

    gate = threading.Event()

    class GatedCompiler(GrammarCompiler):
        def compile(self, constraint: ipc.Constraint) -> Grammar:
            gate.wait(10)
            return super().compile(constraint)

    compilers: list[GrammarCompiler] = []

    def make_compiler() -> GrammarCompiler:
        compilers.append(GatedCompiler(tokenizer, tokenizer.vocab_size))
        return compilers[-1]

    config = FakeEngineConfig(
        "fake", tokenizer.vocab_size, tokenizer.eos_token_ids, None, whole_character_tokens(tokenizer)
    )
    sockets = _Sockets(FakeEngine(config), GrammarQueue(make_compiler))
    digits = ipc.Constraint("regex", "[0-9]{3}")
    stopping = ipc.StoppingConfig(max_tokens=8, min_tokens=0, stop_token_ids=(), ignore_eos=False)
    constrained = [
        ipc.SubmitRequest(rid, [5, 6, 7], 2, SAMPLING, stopping, None, DETOKENIZE, constraint=digits)
        for rid in ("r-parked", "r-aborted")
    ]
    try:
        for request in (*constrained, submit("r-plain")):
            sockets.to_scheduler.send(ipc.encode(request))
        assert _detokenizer_message(sockets) == ipc.RegisterRequest("r-plain", 1, DETOKENIZE)
        while not any(o.finish is not None for o in _outputs(sockets)):
            pass  # r-plain runs to its end while the grammar compiles
        sockets.to_scheduler.send(ipc.encode(ipc.AbortRequests(["r-aborted"])))
        assert _detokenizer_message(sockets) == ipc.RegisterRequest("r-aborted", 2, DETOKENIZE)
        aborted = _outputs(sockets)
        assert [(o.rid, o.finish) for o in aborted] == [("r-aborted", ipc.Finish("aborted"))] * 2
        gate.set()
        assert _detokenizer_message(sockets) == ipc.RegisterRequest("r-parked", 2, DETOKENIZE)
        texts: dict[int, list[int]] = {0: [], 1: []}
        finishes: dict[int, ipc.Finish] = {}
        while len(finishes) < 2:
            for out in _outputs(sockets):
                assert out.rid == "r-parked"
                texts[out.output_index] += out.token_ids
                if out.finish is not None:
                    finishes[out.output_index] = out.finish
        for index in (0, 1):
            assert finishes[index] == ipc.Finish("stop", eos_token_id=tokenizer.eos_token_ids[0])
            assert tokenizer.decode(texts[index][:-1]).isdigit() and len(texts[index]) == 4
        assert len(compilers) == 1 and compilers[0].compilations == 1
    finally:
        gate.set()
        sockets.close()


def _detokenizer_message(sockets: _Sockets) -> ipc.DETOKENIZER_INBOX:
    assert sockets.detokenizer.poll(5000), "nothing reached the detokenizer"
    message: ipc.DETOKENIZER_INBOX = ipc.detokenizer_decoder.decode(sockets.detokenizer.recv())
    return message
