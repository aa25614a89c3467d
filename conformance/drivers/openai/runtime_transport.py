"""The OpenAI API carried by SGLang's native gRPC service (``sglang.runtime.v1.SglangService``):
``ChatComplete`` and ``Complete`` take the body of ``POST /chat/completions`` and
``/completions`` as JSON bytes and stream back the answer as JSON chunks; ``ListModels`` answers
what ``GET /models`` lists. This client gives the OpenAI cases the same ``Exchange`` an HTTP server
gives them, so one reading of the clauses judges both:

- a streamed answer is ``text/event-stream``: each non-empty ``json_chunk`` is one event's data,
  and the RPC's last message (an empty chunk, ``finished = true``) is ``[DONE]``; a status after
  the first message is a broken stream;
- an answer with ``stream`` unset is one message, the whole JSON object, ``finished = true``;
- a status before any message is the HTTP status gRPC's mapping gives (INVALID_ARGUMENT 400,
  UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404, RESOURCE_EXHAUSTED 429,
  UNIMPLEMENTED 501, UNAVAILABLE 503, …) with an OpenAI error object naming the status;
- SGLang's own ``GET /get_server_info`` and ``POST /tokenize`` (at the server root) are
  ``GetServerInfo``'s JSON and ``Tokenize``; any other path is 404.

    endpoint = OpenAIEndpoint.parse("sglang-runtime://127.0.0.1:50052")
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.exceptions import ProtocolError, StreamTerminatedError
from h2.exceptions import H2Error

from conformance.drivers.openai.client import OpenAIClient, OpenAIEndpoint
from conformance.drivers.openai.exchange import DONE, End, Exchange, OpenAIRequest, SseEvent
from lmrpc._gen.sglang.runtime import v1 as rt

SCHEME = "sglang-runtime"
SERVICE = "/sglang.runtime.v1.SglangService"
RPCS = {"/chat/completions": "ChatComplete", "/completions": "Complete"}
HTTP_OF = {
    Status.INVALID_ARGUMENT: 400,
    Status.FAILED_PRECONDITION: 400,
    Status.OUT_OF_RANGE: 400,
    Status.UNAUTHENTICATED: 401,
    Status.PERMISSION_DENIED: 403,
    Status.NOT_FOUND: 404,
    Status.ALREADY_EXISTS: 409,
    Status.RESOURCE_EXHAUSTED: 429,
    Status.CANCELLED: 499,
    Status.UNIMPLEMENTED: 501,
    Status.UNAVAILABLE: 503,
    Status.DEADLINE_EXCEEDED: 504,
}
JSON = {"content-type": "application/json"}
EVENTS = {"content-type": "text/event-stream"}
TRANSPORT = (StreamTerminatedError, ProtocolError, H2Error, OSError, ConnectionError)


def client_for(endpoint: OpenAIEndpoint, *, connect_s: float = 10.0) -> OpenAIClient:
    """The client for an endpoint: over HTTP, or through SGLang's native service."""
    if urlsplit(endpoint.root_url).scheme == SCHEME:
        return RuntimeOpenAIClient(endpoint, connect_s=connect_s)
    return OpenAIClient(endpoint, connect_s=connect_s)


def _error_body(status: int, message: str, grpc_status: Status) -> str:
    kind = "invalid_request_error" if status < 500 else "server_error"
    error = {"message": f"{grpc_status.name}: {message}", "type": kind, "param": None, "code": status}
    return json.dumps({"error": error})


class RuntimeOpenAIClient(OpenAIClient):
    """``OpenAIClient`` over ``sglang.runtime.v1``'s pass-through RPCs (one HTTP/2 channel)."""

    def __init__(self, endpoint: OpenAIEndpoint, model: str = "", *, connect_s: float = 10.0) -> None:
        super().__init__(endpoint, model, connect_s=connect_s)
        self._opened: Channel | None = None
        self._metadata = {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else None

    @property
    def _channel(self) -> Channel:
        """One channel, opened on first use (inside the event loop that uses it)."""
        if self._opened is None:
            parts = urlsplit(self.endpoint.root_url)
            self._opened = Channel(parts.hostname, parts.port, ssl=self.endpoint.tls)
        return self._opened

    async def aclose(self) -> None:
        if self._opened is not None:
            self._opened.close()
        await super().aclose()

    def _auth(self, headers: Mapping[str, str] | None) -> dict[str, str] | None:
        given = {k.lower(): v for k, v in (headers or {}).items() if k.lower() == "authorization"}
        return given or self._metadata

    async def send(
        self,
        request: OpenAIRequest,
        *,
        total_s: float,
        idle_s: float,
        disconnect_after: int | None = None,
        on_event: Callable[[SseEvent], None] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Exchange:
        exchange = Exchange(request, "POST", self.endpoint.url(request.path))
        body = json.dumps(self.body_of(request)).encode()
        await self._call(exchange, request.path, body, total_s, idle_s if request.stream else total_s,
                         disconnect_after, on_event, self._auth(headers))  # fmt: skip
        return exchange

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        root: bool = False,
        total_s: float,
    ) -> Exchange:
        exchange = Exchange(None, method, self.endpoint.url(path, root=root))
        started = time.monotonic()
        if method == "GET" and path == "/models" and not root:
            await self._models(exchange, total_s)
        elif method == "GET" and path == "/get_server_info" and root:
            await self._unary(exchange, total_s, self._server_info)
        elif (
            method == "POST"
            and path == "/tokenize"
            and root
            and isinstance(json_body, dict)
            and "prompt" in json_body
        ):
            await self._unary(exchange, total_s, lambda stub, t: self._tokenize(stub, t, json_body))
        elif method == "POST" and path in RPCS and not root:
            body = content if content is not None else json.dumps(json_body).encode()
            await self._call(exchange, path, body, total_s, total_s, None, None, self._auth(headers))
        else:
            exchange.status, exchange.headers = 404, dict(JSON)
            exchange.text = _error_body(404, f"{method} {path}: not a call of {SCHEME}", Status.NOT_FOUND)
        exchange.duration_s = time.monotonic() - started
        return exchange

    @contextlib.asynccontextmanager
    async def unread(self, request: OpenAIRequest, *, total_s: float) -> AsyncIterator[Exchange]:
        """A stream whose client never reads: the call is made and left unread until the block ends."""
        exchange = Exchange(request, "POST", self.endpoint.url(request.path))
        started = time.monotonic()
        body = rt.OpenAiRequest(json_body=json.dumps(self.body_of(request)).encode())
        try:
            async with self._channel.request(
                f"{SERVICE}/{RPCS[request.path]}",
                Cardinality.UNARY_STREAM,
                rt.OpenAiRequest,
                rt.OpenAiStreamChunk,
                timeout=total_s,
                metadata=self._metadata,
            ) as stream:
                await stream.send_message(body, end=True)
                await stream.recv_initial_metadata()
                exchange.status, exchange.headers = 200, dict(EVENTS)
                try:
                    yield exchange
                finally:
                    exchange.end, exchange.duration_s = End.CANCELLED, time.monotonic() - started
                    await stream.cancel()
        except GRPCError as exc:
            if not exchange.status:
                self._refused(exchange, exc)
                yield exchange
        except TRANSPORT as exc:
            if not exchange.status:
                exchange.end, exchange.detail = End.BROKEN, f"{type(exc).__name__}: {exc}"
                yield exchange

    # ── the unary calls: /models, SGLang's /get_server_info and /tokenize ──
    async def _unary(
        self,
        exchange: Exchange,
        total_s: float,
        call: Callable[[rt.SglangServiceStub, float], Awaitable[Any]],
    ) -> None:
        try:
            answer = await call(rt.SglangServiceStub(self._channel), total_s)
        except GRPCError as exc:
            self._refused(exchange, exc)
            return
        except (*TRANSPORT, TimeoutError) as exc:
            exchange.end, exchange.detail = End.BROKEN, f"{type(exc).__name__}: {exc}"
            return
        exchange.status, exchange.headers, exchange.text = 200, dict(JSON), json.dumps(answer)

    async def _models(self, exchange: Exchange, total_s: float) -> None:
        async def listed(stub: rt.SglangServiceStub, timeout: float) -> dict[str, Any]:
            reply = await stub.list_models(rt.ListModelsRequest(), timeout=timeout, metadata=self._metadata)
            data = [
                {"id": card.id, "object": "model", "owned_by": "sglang", "root": card.root or card.id}
                | ({"max_model_len": card.max_model_len} if card.max_model_len is not None else {})
                for card in reply.models
            ]
            return {"object": "list", "data": data}

        await self._unary(exchange, total_s, listed)

    async def _server_info(self, stub: rt.SglangServiceStub, timeout: float) -> Any:
        reply = await stub.get_server_info(
            rt.GetServerInfoRequest(), timeout=timeout, metadata=self._metadata
        )
        return json.loads(reply.json_info or "{}")

    async def _tokenize(self, stub: rt.SglangServiceStub, timeout: float, body: Mapping[str, Any]) -> Any:
        asked = rt.TokenizeRequest(
            text=str(body["prompt"]), add_special_tokens=bool(body.get("add_special_tokens"))
        )
        reply = await stub.tokenize(asked, timeout=timeout, metadata=self._metadata)
        return {"tokens": list(reply.tokens), "count": reply.count, "max_model_len": reply.max_model_len}

    def _refused(self, exchange: Exchange, exc: GRPCError) -> None:
        status = HTTP_OF.get(exc.status, 500)
        exchange.status, exchange.headers = status, dict(JSON)
        exchange.text = _error_body(status, exc.message or "", exc.status)

    async def _call(
        self,
        exchange: Exchange,
        path: str,
        body: bytes,
        total_s: float,
        idle_s: float,
        disconnect_after: int | None,
        on_event: Callable[[SseEvent], None] | None,
        metadata: dict[str, str] | None,
    ) -> None:
        started = time.monotonic()
        streamed = False
        try:
            async with (
                asyncio.timeout(total_s),
                self._channel.request(
                    f"{SERVICE}/{RPCS[path]}",
                    Cardinality.UNARY_STREAM,
                    rt.OpenAiRequest,
                    rt.OpenAiStreamChunk,
                    metadata=metadata,
                ) as stream,
            ):
                await stream.send_message(rt.OpenAiRequest(json_body=body), end=True)
                while True:
                    try:
                        async with asyncio.timeout(idle_s):
                            chunk = await stream.recv_message()
                    except TimeoutError:
                        exchange.end, exchange.detail = End.HUNG, f"nothing arrived for {idle_s:.1f}s"
                        await stream.cancel()
                        return
                    if chunk is None:
                        break
                    if not exchange.status:
                        streamed = self._streams(body)
                        exchange.status, exchange.headers = 200, dict(EVENTS if streamed else JSON)
                    if not streamed:
                        exchange.text += chunk.json_chunk.decode("utf-8", errors="replace")
                        continue
                    data = chunk.json_chunk.decode("utf-8", errors="replace") if chunk.json_chunk else DONE
                    if chunk.json_chunk or chunk.finished:
                        event = SseEvent(time.monotonic() - started, "", data)
                        exchange.events.append(event)
                        if on_event is not None:
                            on_event(event)
                    if disconnect_after is not None and len(exchange.events) >= disconnect_after:
                        exchange.end = End.CANCELLED
                        await stream.cancel()
                        return
                await stream.recv_trailing_metadata()
        except GRPCError as exc:
            if not exchange.status:
                self._refused(exchange, exc)
            else:
                exchange.end, exchange.detail = End.BROKEN, f"status {exc.status.name}: {exc.message}"
        except TimeoutError:
            exchange.end, exchange.detail = End.HUNG, f"still open after {total_s:.1f}s"
        except TRANSPORT as exc:
            exchange.end, exchange.detail = End.BROKEN, f"{type(exc).__name__}: {exc}"
        finally:
            exchange.duration_s = time.monotonic() - started

    @staticmethod
    def _streams(body: bytes) -> bool:
        try:
            parsed = json.loads(body)
        except ValueError:
            return False
        return isinstance(parsed, dict) and parsed.get("stream") is True
