"""The harness's HTTP client for OpenAI-compatible servers (httpx, with httpx-sse's event decoder).

It reads event streams event by event, keeping every event's name, data and arrival time, so that
the framing itself can be judged (the official ``openai`` SDK hides it: it drops ``[DONE]``, merges
nothing-events and raises on an ``error`` event). It never spawns a server.

    endpoint = OpenAIEndpoint.parse("http://127.0.0.1:8080")       # base URL .../v1
    async with OpenAIClient(endpoint, model="m") as client:
        exchange = await client.send(OpenAIRequest("chat", {...}), total_s=30, idle_s=10)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from httpx_sse import EventSource, SSEError

from conformance.drivers.base import ConnectOptions
from conformance.drivers.openai.exchange import End, Exchange, OpenAIRequest, SseEvent
from conformance.stream import wiretap

if TYPE_CHECKING:
    from conformance.drivers.openai.target import HttpTarget

DEFAULT_PREFIX = "/v1"
SCHEMES = ("http", "https", "sglang-runtime")  # the last: drivers/openai/runtime_transport.py
UNREAD_RCVBUF = 4096
TRANSPORT_ERRORS = (httpx.HTTPError, SSEError, OSError, ValueError)


@dataclass(frozen=True, slots=True)
class OpenAIEndpoint:
    """Where the server is: its OpenAI base URL (``.../v1``) and the server root beside it (where
    llama.cpp, vLLM and SGLang serve ``/tokenize``, ``/props``, ``/version``)."""

    base_url: str
    root_url: str
    api_key: str | None = None
    tls: ssl.SSLContext | None = None  # None: the system's trust store (https) or plaintext (http)

    @staticmethod
    def parse(
        target: str, *, api_key: str | None = None, tls: ssl.SSLContext | None = None
    ) -> OpenAIEndpoint:
        parts = urlsplit(target)
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise ValueError(
                f"target={target!r} must be an http:// or https:// URL (such as http://HOST:PORT), or "
                "sglang-runtime://HOST:PORT for the OpenAI API through SGLang's native gRPC service"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"target={target!r} must not carry a query or fragment")
        try:
            parts.port  # noqa: B018 - validates the port
        except ValueError:
            raise ValueError(f"target={target!r} has an invalid port") from None
        prefix = parts.path.rstrip("/") or DEFAULT_PREFIX
        root = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        return OpenAIEndpoint(root + prefix, root, api_key, tls)

    def url(self, path: str, *, root: bool = False) -> str:
        return (self.root_url if root else self.base_url) + path

    async def ready(self, connect_s: float) -> tuple[bool, str]:
        """Ready once it lists a model (``Address``)."""
        from conformance.drivers.openai.discover import list_models  # they build on this module
        from conformance.drivers.openai.runtime_transport import client_for

        async with client_for(self, connect_s=connect_s) as client:
            try:
                models, _ = await list_models(client, connect_s)
            except Exception as exc:  # refused, not yet an OpenAI server, a 503 while loading...
                return False, f"{type(exc).__name__}: {exc}"
            return bool(models), f"GET /models lists {models}"

    async def connect(self, protocol_id: str, options: ConnectOptions) -> tuple[HttpTarget, str]:
        from conformance.drivers.openai.target import HttpTarget

        return await HttpTarget.connect(self, options), f"--protocol {protocol_id}"

    def __str__(self) -> str:
        return self.base_url


class OpenAIClient:
    def __init__(self, endpoint: OpenAIEndpoint, model: str = "", *, connect_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self.model = model
        self._http = self._client(endpoint, connect_s)
        self._fresh = self._client(endpoint, connect_s, keep_alive=False)
        # A reader that stops: a small receive buffer, so the server meets a full connection after
        # a few kilobytes instead of the megabytes a tuned loopback socket takes in.
        self._unread = self._client(
            endpoint, connect_s, socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, UNREAD_RCVBUF)]
        )

    @staticmethod
    def _client(
        endpoint: OpenAIEndpoint,
        connect_s: float,
        socket_options: list[tuple[int, int, int]] | None = None,
        *,
        keep_alive: bool = True,
    ) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        verify: ssl.SSLContext | bool = endpoint.tls if endpoint.tls is not None else True
        return httpx.AsyncClient(
            headers=headers,
            verify=verify,
            timeout=httpx.Timeout(None, connect=connect_s),
            # an idle connection is dropped well before servers' usual 5 s keep-alive timeout
            limits=httpx.Limits(
                max_connections=512, max_keepalive_connections=64 if keep_alive else 0, keepalive_expiry=1.0
            ),
            transport=httpx.AsyncHTTPTransport(verify=verify, socket_options=socket_options),
            trust_env=False,  # a proxy from the environment would stand between the harness and the server
        )

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for client in (self._http, self._fresh, self._unread):
            await client.aclose()

    def body_of(self, request: OpenAIRequest) -> dict[str, Any]:
        body = dict(request.body)
        if "model" not in body and self.model:
            body["model"] = self.model
        wiretap.note_body(request.path.strip("/"), body)
        return body

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
        """POST a chat or completions request and read the answer to its end. ``disconnect_after``:
        close the connection after that many events (a client that goes away mid-stream)."""
        exchange = Exchange(request, "POST", self.endpoint.url(request.path))
        await self._run(
            exchange,
            self._http.build_request(
                "POST", exchange.url, json=self.body_of(request), headers=dict(headers or {})
            ),
            total_s,
            # a body comes whole when the answer is done: silence until then is the work, not a hang
            idle_s if request.stream else total_s,
            disconnect_after,
            on_event,
        )
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
        """Any other call (``/models``, ``/tokenize``, a malformed body): read to its end."""
        exchange = Exchange(None, method, self.endpoint.url(path, root=root))
        built = self._http.build_request(
            method, exchange.url, json=json_body, content=content, headers=dict(headers or {})
        )
        await self._run(exchange, built, total_s, total_s, None, None)
        return exchange

    @contextlib.asynccontextmanager
    async def unread(self, request: OpenAIRequest, *, total_s: float) -> AsyncIterator[Exchange]:
        """A stream whose client never reads its body: sent, the status and headers read, then left
        unread until the block ends (the connection is closed then)."""
        exchange = Exchange(request, "POST", self.endpoint.url(request.path))
        built = self._unread.build_request("POST", exchange.url, json=self.body_of(request))
        started = time.monotonic()
        try:
            async with asyncio.timeout(total_s):
                response = await self._unread.send(built, stream=True)
        except TRANSPORT_ERRORS as exc:
            exchange.end, exchange.detail = End.BROKEN, f"{type(exc).__name__}: {exc}"
            yield exchange
            return
        except TimeoutError:
            exchange.end, exchange.detail = End.HUNG, f"no response headers within {total_s:.1f}s"
            yield exchange
            return
        exchange.status, exchange.headers = response.status_code, _headers(response)
        try:
            yield exchange
        finally:
            exchange.end, exchange.duration_s = End.CANCELLED, time.monotonic() - started
            await response.aclose()

    async def _run(
        self,
        exchange: Exchange,
        built: httpx.Request,
        total_s: float,
        idle_s: float,
        disconnect_after: int | None,
        on_event: Callable[[SseEvent], None] | None,
    ) -> None:
        started = time.monotonic()
        built.extensions["timeout"] = httpx.Timeout(None, connect=min(total_s, 30.0), read=idle_s).as_dict()
        try:
            async with asyncio.timeout(total_s):
                response = await self._send(built)
                try:
                    exchange.status, exchange.headers = response.status_code, _headers(response)
                    if exchange.is_event_stream:
                        await _read_events(response, exchange, started, disconnect_after, on_event)
                    else:
                        exchange.text = (await response.aread()).decode("utf-8", errors="replace")
                finally:
                    await response.aclose()
        except httpx.ReadTimeout:
            exchange.end, exchange.detail = End.HUNG, f"nothing arrived for {idle_s:.1f}s"
        except TimeoutError:
            exchange.end, exchange.detail = End.HUNG, f"still open after {total_s:.1f}s"
        except TRANSPORT_ERRORS as exc:
            exchange.end, exchange.detail = End.BROKEN, f"{type(exc).__name__}: {exc}"
        finally:
            exchange.duration_s = time.monotonic() - started

    async def _send(self, built: httpx.Request) -> httpx.Response:
        """Send, once more on a fresh connection when the server closed a kept-alive one as the
        request went out (it answered nothing: the request never reached it). A server may close an
        idle connection at any time (HTTP/1.1 keep-alive), so that race is the client's to absorb,
        never the server's fault; a server that closes a fresh connection too fails as before."""
        try:
            return await self._http.send(built, stream=True)
        except httpx.RemoteProtocolError:
            return await self._fresh.send(built, stream=True)


async def _read_events(
    response: httpx.Response,
    exchange: Exchange,
    started: float,
    disconnect_after: int | None,
    on_event: Callable[[SseEvent], None] | None,
) -> None:
    events = EventSource(response).aiter_sse()
    async with contextlib.aclosing(events):
        async for sse in events:
            event = SseEvent(
                time.monotonic() - started, sse.event if sse.event != "message" else "", sse.data
            )
            exchange.events.append(event)
            if on_event is not None:
                on_event(event)
            if disconnect_after is not None and len(exchange.events) >= disconnect_after:
                exchange.end = End.CANCELLED
                return


def _headers(response: httpx.Response) -> dict[str, str]:
    return {name.lower(): value for name, value in response.headers.items()}
