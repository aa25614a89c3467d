"""A mutating proxy for OpenAI-compatible HTTP: it forwards every call to a real server (smg in front
of the reference server) and lets one mutant change what passes, the way a server with that one
bug would answer. It also gives the upstream a fixed number of slots (a request holds one until
its answer is over or its client leaves), so that a server which keeps working for clients that
left, like a slot-based server with that bug, shows it.

A mutant changes the request (``request``), a JSON answer (``body``), or a stream: event by event
(``event``, so timing stays the server's), or as a whole (``whole_stream``: the events are
collected, changed and sent at once; for faults about order).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp
from aiohttp import web

DONE = "[DONE]"
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive", "host"}


@dataclass
class Call:
    """What one request looks like to a mutant."""

    path: str
    body: Any  # the JSON body (None when the body is not JSON)
    served_model: str = ""  # the model the upstream lists
    state: dict[Any, Any] = field(default_factory=dict)  # a mutant's memory across the call's events

    @property
    def streaming(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def n(self) -> int:
        n = self.body.get("n", 1) if isinstance(self.body, dict) else 1
        return n if isinstance(n, int) and n > 0 else 1

    @property
    def stops(self) -> list[str]:
        stop = self.body.get("stop") if isinstance(self.body, dict) else None
        return [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str)]

    @property
    def chat(self) -> bool:
        return self.path.endswith("/chat/completions")

    @property
    def response_format(self) -> str | None:
        """The ``response_format`` type asked for (json_schema, json_object), None when none or text."""
        found = self.body.get("response_format") if isinstance(self.body, dict) else None
        kind = found.get("type") if isinstance(found, dict) else None
        return kind if isinstance(kind, str) and kind != "text" else None

    @property
    def tool_choice(self) -> str | None:
        """With tools offered: required, auto, none or named (a function object); None without tools."""
        if not isinstance(self.body, dict) or not self.body.get("tools"):
            return None
        choice = self.body.get("tool_choice", "auto")
        return "named" if isinstance(choice, dict) else str(choice)


class Mutant:
    """The correct proxy: nothing changed. Subclasses are one-fault mutants."""

    name: ClassVar[str] = "reference-proxy"
    expected: ClassVar[frozenset[str]] = frozenset()  # case IDs (or globs) it must fail, exactly
    tolerated: ClassVar[frozenset[str]] = frozenset()  # cases it may fail as well (the same fault seen twice)
    buffered: ClassVar[bool] = False  # collect a stream's events and change them together
    keeps_slot_after_disconnect: ClassVar[bool] = False
    blocks_on_slow_reader: ClassVar[bool] = False
    stalls_once_s: ClassVar[float] = 0.0  # a host that pauses once for this long (controls only)
    runs: ClassVar[frozenset[str]] = frozenset()  # a control's cases (empty: every case)

    @property
    def is_control(self) -> bool:
        return not self.expected

    @classmethod
    def describe(cls) -> str:
        return " ".join((cls.__doc__ or "").split())

    def buffers(self, call: Call) -> bool:
        """Whether this call's stream is collected and changed as a whole (``whole_stream``)."""
        return self.buffered

    def request(self, call: Call) -> Any:
        return call.body

    def body(self, call: Call, status: int, body: Any) -> tuple[int, Any]:
        return status, body

    def event(self, call: Call, data: str) -> list[str]:
        """One upstream event's data (a JSON chunk or ``[DONE]``) -> the data of the events sent."""
        return [data]

    def whole_stream(self, call: Call, events: list[str]) -> list[str]:
        return events

    def refused_stream(self, call: Call, status: int, body: Any) -> list[str] | None:
        """A streaming request the upstream refused (a 4xx): the events of a 200 stream to answer
        with instead, or None to pass the refusal on."""
        return None


def chunk(data: str) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class Proxy:
    def __init__(self, mutant: Mutant, upstream: str, slots: int, served_model: str) -> None:
        self.mutant = mutant
        self.served_model = served_model
        self.upstream = upstream.rstrip("/")  # the server root: http://host:port
        self.slots = asyncio.Semaphore(slots)
        self.writing = asyncio.Lock()  # blocks_on_slow_reader: every stream writes under one lock
        self.streams_since: dict[int, float] = {}  # the streams being written: when each began
        self.stall_ends: float | None = None  # stalls_once_s: when the one pause ends, once it began
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)

    async def _close(self, _: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        call = Call(request.path, body, self.served_model)
        if _ignored_upstream(call):
            return web.json_response(IGNORED_REFUSAL, status=400)
        if body is not None:
            changed = self.mutant.request(call)
            raw, call.body = json.dumps(changed).encode(), changed
        generating = request.path.endswith(("/chat/completions", "/completions"))
        if self.mutant.stalls_once_s:
            await self._stall_once(generating and not call.streaming)
        if self.mutant.blocks_on_slow_reader:
            async with self.writing:  # the one loop is stuck in a write to a client that does not read
                pass
        if not generating:
            return await self._forward(request, call, raw)
        async with self._slot(request):
            return await self._forward(request, call, raw)

    async def _stall_once(self, may_begin: bool) -> None:
        """Every request waits out the one pause. It begins at the first request that may begin it
        while a stream has been written for a second or more: a pause that lands beside a long
        stream, as a loaded host's did beside FLOW-1's unread one, and lasts past its close."""
        now = asyncio.get_running_loop().time()
        if self.stall_ends is None and may_begin and any(now - t >= 1.0 for t in self.streams_since.values()):
            self.stall_ends = now + self.mutant.stalls_once_s
        if self.stall_ends is not None and now < self.stall_ends:
            await asyncio.sleep(self.stall_ends - now)

    @contextlib.asynccontextmanager
    async def _slot(self, request: web.Request) -> AsyncIterator[None]:
        await self.slots.acquire()
        try:
            yield
        finally:
            self.slots.release()

    async def _forward(self, request: web.Request, call: Call, raw: bytes) -> web.StreamResponse:
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self.session.request(
            request.method, self.upstream + request.path_qs, data=raw or None, headers=headers
        ) as upstream:
            content_type = upstream.headers.get("content-type", "")
            if content_type.startswith("text/event-stream"):
                return await self._stream(request, call, upstream)
            data = await upstream.read()
            status = upstream.status
            if 400 <= status < 500 and call.streaming:
                events = self.mutant.refused_stream(call, status, _json_or_none(data))
                if events is not None:
                    return await self._events_response(request, events)
            if content_type.startswith("application/json") and request.path.endswith("completions"):
                try:
                    status, changed = self.mutant.body(call, status, json.loads(data))
                    data = json.dumps(changed).encode()
                except ValueError:
                    pass
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
            return web.Response(status=status, body=data, headers=out_headers)

    async def _stream(
        self, request: web.Request, call: Call, upstream: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        transport = request.transport
        if self.mutant.blocks_on_slow_reader and transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            transport.set_write_buffer_limits(high=4096)
        collected: list[str] = []
        buffered = self.mutant.buffers(call)
        self.streams_since[id(response)] = asyncio.get_running_loop().time()
        try:
            async for data in _events(upstream):
                if buffered:
                    collected.append(data)
                    continue
                for out in self.mutant.event(call, data):
                    await self._write(response, out)
            for out in self.mutant.whole_stream(call, collected) if buffered else []:
                await self._write(response, out)
            await response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError, asyncio.CancelledError):
            if self.mutant.keeps_slot_after_disconnect:  # the client left; the work goes on anyway
                with contextlib.suppress(Exception):
                    async for _ in _events(upstream):
                        pass
            raise
        finally:
            self.streams_since.pop(id(response), None)
        return response

    async def _events_response(self, request: web.Request, events: list[str]) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for data in events:
            await self._write(response, data)
        await response.write_eof()
        return response

    async def _write(self, response: web.StreamResponse, data: str) -> None:
        payload = f"data: {data}\n\n".encode()
        if self.mutant.blocks_on_slow_reader:
            async with self.writing:
                await response.write(payload)
        else:
            await response.write(payload)


# What smg 1.13 gets wrong (docs/reports/baselines/smg-1.13-reference.toml) every proxy refuses
# instead, as an honest server would, so that the correct proxy passes everything and each
# mutant's verdict is its own fault's: legacy completions `logprobs` (accepted, none answered:
# processor.rs "TODO: wire legacy LogProbs"), and `logprobs` on a streamed chat request (the entries
# of tokens without text are dropped: streaming.rs skips a chunk of empty text before its logprobs).
IGNORED_REFUSAL = {
    "error": {
        "message": "logprobs is not served on /v1/completions or on streamed chat here",
        "type": "invalid_request_error",
        "param": "logprobs",
        "code": None,
    }
}


def _ignored_upstream(call: Call) -> bool:
    if not isinstance(call.body, dict) or call.body.get("logprobs") in (None, False):
        return False
    return call.path.endswith("/v1/completions") or call.streaming


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


async def _events(upstream: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The data of each server-sent event of ``upstream`` (multi-line data joined)."""
    lines: list[str] = []
    async for raw in upstream.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
        elif not line and lines:
            yield "\n".join(lines)
            lines = []
    if lines:
        yield "\n".join(lines)
