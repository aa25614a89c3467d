"""Traces of requests across the server's processes, continuing the caller's W3C trace (TRACE-1).

Off by default. With ``--otlp-endpoint URL`` each process exports its spans over OTLP/HTTP: the
frontend's span of a Generate call is a child of the caller's ``traceparent``, and the scheduler's
span of the request is a child of the frontend's, handed over in ``ipc.SubmitRequest.trace_parent``
(a ``traceparent`` header value). A process that traces nothing never imports OpenTelemetry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

EXPORT_DELAY_MS = 200  # spans reach the collector a fraction of a second after they end
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def valid_traceparent(value: str) -> str:
    """``value`` if it is a W3C traceparent this server continues (version 00, ids not all zero),
    else "" (a caller's malformed header starts a new trace; it never fails the call)."""
    found = _TRACEPARENT.match(value.strip().lower())
    if found is None or set(found.group(1)) == {"0"} or set(found.group(2)) == {"0"}:
        return ""
    return found.group(0)


@dataclass
class Tracing:
    """One process's tracer and the spans of its requests in flight."""

    tracer: Tracer
    provider: TracerProvider
    spans: dict[str, tuple[Span, int]] = field(default_factory=dict)  # rid -> (span, outputs left)

    def start(self, rid: str, name: str, parent: str, outputs: int, attributes: Mapping[str, Any]) -> str:
        """Open the span of request ``rid`` (a child of the ``parent`` traceparent, if any); returns
        the traceparent that hands it to the next process."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        propagator = TraceContextTextMapPropagator()
        context = propagator.extract({"traceparent": parent}) if parent else None
        span = self.tracer.start_span(
            name, context=context, kind=SpanKind.SERVER, attributes=dict(attributes)
        )
        self.spans[rid] = (span, outputs)
        carrier: dict[str, str] = {}
        propagator.inject(carrier, context=trace.set_span_in_context(span))
        return carrier.get("traceparent", "")

    def output_finished(self, rid: str) -> None:
        """One output of ``rid`` finished; its span ends with the last."""
        entry = self.spans.get(rid)
        if entry is None:
            return
        span, left = entry
        if left > 1:
            self.spans[rid] = (span, left - 1)
        else:
            self.end(rid)

    def end(self, rid: str, **attributes: Any) -> None:
        entry = self.spans.pop(rid, None)
        if entry is not None:
            entry[0].set_attributes(attributes)
            entry[0].end()

    def shutdown(self) -> None:
        """End what is open and flush every span to the collector."""
        for rid in list(self.spans):
            self.end(rid, **{"lmrpc.ended_by": "shutdown"})
        self.provider.shutdown()


def start_tracing(service: str, endpoint: str | None) -> Tracing | None:
    """This process's tracing, exporting to ``endpoint``; None when tracing is off."""
    if not endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=endpoint)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_DELAY_MS))
    return Tracing(provider.get_tracer("lmrpc.reference_server"), provider)
