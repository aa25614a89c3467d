"""What an OpenAI-profile case talks to the server with (``ctx.http``): the target's client, with
every call recorded for the case's repro script."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from conformance.drivers.openai.exchange import Exchange, OpenAIRequest, SseEvent
from conformance.drivers.openai.support import Support
from conformance.drivers.openai.target import HttpTarget
from conformance.drivers.openai.view import CompletionView, view_of


@dataclass(slots=True)
class HttpCall:
    """One call of the transcript. ``t_s`` is relative to the case start."""

    t_s: float
    method: str
    url: str
    body: Any = None  # the JSON body as sent
    content: bytes | None = None  # a raw body (malformed input)
    headers: Mapping[str, str] | None = None
    disconnect_after: int | None = None  # the client closed the connection after this many events
    unread: bool = False  # the client never read the body
    outcome: str = ""


class CaseHttp:
    def __init__(self, target: HttpTarget, *, call_s: float, idle_s: float) -> None:
        self.target = target
        self.call_s = call_s
        self.idle_s = idle_s
        self.transcript: list[HttpCall] = []
        self._t0 = time.monotonic()

    @property
    def support(self) -> Support:
        return self.target.support

    @property
    def model(self) -> str:
        return self.target.model

    def _record(self, call: HttpCall) -> HttpCall:
        self.transcript.append(call)
        return call

    def _now(self) -> float:
        return time.monotonic() - self._t0

    async def send(
        self,
        request: OpenAIRequest,
        *,
        total_s: float | None = None,
        disconnect_after: int | None = None,
        on_event: Callable[[SseEvent], None] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Exchange:
        client = self.target.client
        call = self._record(
            HttpCall(
                self._now(),
                "POST",
                client.endpoint.url(request.path),
                client.body_of(request),
                headers=headers,
                disconnect_after=disconnect_after,
            )
        )
        exchange = await client.send(
            request,
            total_s=total_s or self.call_s,
            idle_s=self.idle_s,
            disconnect_after=disconnect_after,
            on_event=on_event,
            headers=headers,
        )
        call.outcome = exchange.summary()
        return exchange

    async def answer(self, request: OpenAIRequest, **kw: Any) -> tuple[Exchange, CompletionView]:
        exchange = await self.send(request, **kw)
        return exchange, view_of(exchange)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        root: bool = False,
    ) -> Exchange:
        client = self.target.client
        call = self._record(
            HttpCall(self._now(), method, client.endpoint.url(path, root=root), json_body, content, headers)
        )
        exchange = await client.request(
            method,
            path,
            json_body=json_body,
            content=content,
            headers=headers,
            root=root,
            total_s=self.call_s,
        )
        call.outcome = exchange.summary()
        return exchange

    @contextlib.asynccontextmanager
    async def unread(self, request: OpenAIRequest) -> AsyncIterator[Exchange]:
        client = self.target.client
        call = self._record(
            HttpCall(
                self._now(), "POST", client.endpoint.url(request.path), client.body_of(request), unread=True
            )
        )
        async with client.unread(request, total_s=self.call_s) as exchange:
            yield exchange
        call.outcome = exchange.summary()
