"""An OTLP/HTTP traces receiver (``--otlp-listen HOST:PORT``): the server under test exports its
spans here, and TRACE-1 reads them. It answers ``POST /v1/traces`` with a protobuf (optionally
gzip) ``ExportTraceServiceRequest`` body, as the OpenTelemetry exporters send it, and keeps every
span it receives for the rest of the run."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from dataclasses import dataclass, field

from lmrpc.client import parse_target

MAX_BODY_BYTES = 16 << 20
_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    name: str
    service: str  # the resource's service.name


@dataclass
class SpanReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self, listen: str) -> None:
        self._server = await asyncio.start_server(self._serve, *parse_target(listen))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    async def wait_for(self, trace_id: str, parent_span_id: str, budget_s: float) -> list[ReceivedSpan]:
        """The spans of ``trace_id`` once one of them is a child of ``parent_span_id`` (or the
        budget is spent), a short while later so that the rest of the trace arrives too."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + budget_s
        while not any(s.parent_span_id == parent_span_id for s in self.of_trace(trace_id)):
            left = give_up - loop.time()
            if left <= 0:
                return self.of_trace(trace_id)
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)
        await asyncio.sleep(min(1.0, max(0.0, give_up - loop.time())))
        return self.of_trace(trace_id)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = _headers(head)
                length = int(headers.get("content-length", "0"))
                if length > MAX_BODY_BYTES:
                    return
                body = await reader.readexactly(length)
                if headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                self._add(body)
                writer.write(_OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    def _add(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"),
                "",
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.name,
                            service,
                        )
                    )
        self._arrived.set()


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if ":" in line)
    }
