"""Prometheus metrics over HTTP (``--metrics-port``), named like vLLM's (``vllm:...``) and
SGLang's where they mean the same, under the ``lmrpc:`` prefix.

| metric | kind | like |
|---|---|---|
| ``lmrpc:grpc_requests_total{protocol,rpc,code}`` | counter | (RPCs of lmrpc, vllm, health, reflection) |
| ``lmrpc:time_to_first_token_seconds`` | histogram | ``vllm:time_to_first_token_seconds`` |
| ``lmrpc:inter_token_latency_seconds`` | histogram | ``vllm:inter_token_latency_seconds`` |
| ``lmrpc:e2e_request_latency_seconds`` | histogram | ``vllm:e2e_request_latency_seconds`` |
| ``lmrpc:prompt_tokens_total``, ``lmrpc:generation_tokens_total`` | counter | vLLM's |
| ``lmrpc:prefix_cache_queries_total``, ``lmrpc:prefix_cache_hits_total`` | counter (tokens) | vLLM's |
| ``lmrpc:cache_hit_rate`` | gauge | ``sglang:cache_hit_rate`` (since start) |
| ``lmrpc:request_success_total{finished_reason}`` | counter (outputs: stop, length, abort) | vLLM's |
| ``lmrpc:request_cancelled_total`` | counter (client cancel or deadline mid-stream) | |
| ``lmrpc:num_requests_running``, ``lmrpc:num_requests_waiting`` | gauge (sequences) | vLLM's |
| ``lmrpc:num_requests_active`` | gauge (Generate calls in flight) | |
| ``lmrpc:kv_cache_usage_perc`` | gauge (0-1, held by requests) | ``vllm:kv_cache_usage_perc`` |
| ``lmrpc:kv_cache_tokens{state=in_use,cached,total}`` | gauge | |
| ``lmrpc:kv_event_blocks`` | gauge (live blocks published as KV events) | |
| ``lmrpc:kv_event_batches_total`` | counter (KV event batches published; the last sequence number) | |

Beside them, under vLLM's own names, the three gauges the Kubernetes inference gateway's endpoint
picker reads by default (its ``--total-queued-requests-metric``, ``--total-running-requests-metric``
and ``--kv-cache-usage-percentage-metric``), so that a default-configured picker routes on this
server's load (contract LOAD-2): ``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and
``vllm:kv_cache_usage_perc``, the same values as their ``lmrpc:`` twins.

A scrape reads everything on the event loop (the load as ControlService.GetLoad answers it), so
it sees one consistent moment.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from lmrpc.v1 import Load
from reference_server.frontend.kv_events import KvEventHub
from reference_server.frontend.metrics.stats import Histogram, ServingStats

SCRAPE_TIMEOUT_S = 5.0
FINISH_REASONS = {"stop": "stop", "length": "length", "aborted": "abort"}


@dataclass(frozen=True)
class _Snapshot:
    counters: dict[str, float]
    rpcs: dict[tuple[str, str, str], int]
    finished: dict[str, int]
    histograms: dict[str, tuple[list[tuple[str, float]], float]]
    cache_hit_rate: float
    kv_event_blocks: int
    kv_event_batches: int
    load: Load | None


class ServerCollector(Collector):
    def __init__(
        self,
        stats: ServingStats,
        read_load: Callable[[], Awaitable[Load | None]],  # what GetLoad answers now
        kv_events: KvEventHub,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.stats = stats
        self.read_load = read_load
        self.kv_events = kv_events
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        snapshot = asyncio.run_coroutine_threadsafe(self._snapshot(), self.loop).result(SCRAPE_TIMEOUT_S)
        yield from _families(snapshot)

    async def _snapshot(self) -> _Snapshot:
        s = self.stats
        load = None
        try:
            load = await self.read_load()
        except Exception:  # starting, or a worker is gone: the request metrics still count
            load = None

        def histogram(h: Histogram) -> tuple[list[tuple[str, float]], float]:
            return h.cumulative(), h.sum

        return _Snapshot(
            counters={
                "prompt_tokens": s.prompt_tokens,
                "generation_tokens": s.generation_tokens,
                "prefix_cache_queries": s.prefix_cache_queries,
                "prefix_cache_hits": s.prefix_cache_hits,
                "request_cancelled": s.cancelled,
            },
            rpcs=dict(s.rpcs),
            finished=dict(s.finished),
            histograms={
                "time_to_first_token_seconds": histogram(s.ttft),
                "inter_token_latency_seconds": histogram(s.itl),
                "e2e_request_latency_seconds": histogram(s.e2e),
            },
            cache_hit_rate=s.cache_hit_rate(),
            kv_event_blocks=self.kv_events.live_blocks,
            kv_event_batches=self.kv_events.sequence_number,
            load=load,
        )


def _families(snapshot: _Snapshot) -> Iterator[Metric]:
    rpcs = CounterMetricFamily(
        "lmrpc:grpc_requests",
        "Finished gRPC calls by protocol, method and status",
        labels=["protocol", "rpc", "code"],
    )
    for (protocol, rpc, code), count in sorted(snapshot.rpcs.items()):
        rpcs.add_metric([protocol, rpc, code], count)
    yield rpcs
    docs = {
        "prompt_tokens": "Prompt tokens of requests handed to the engine",
        "generation_tokens": "Generated tokens",
        "prefix_cache_queries": "Prompt tokens looked up in the prefix cache",
        "prefix_cache_hits": "Prompt tokens found in the prefix cache",
        "request_cancelled": "Generate calls that ended early: the client cancelled or its deadline passed",
    }
    for name, value in snapshot.counters.items():
        yield CounterMetricFamily(f"lmrpc:{name}", docs[name], value=value)
    finished = CounterMetricFamily(
        "lmrpc:request_success", "Finished outputs by finish reason", labels=["finished_reason"]
    )
    for reason, label in FINISH_REASONS.items():
        finished.add_metric([label], snapshot.finished.get(reason, 0))
    yield finished
    histogram_docs = {
        "time_to_first_token_seconds": "From the Generate call to the first token reaching the frontend",
        "inter_token_latency_seconds": "Between consecutive tokens of one output, at the frontend",
        "e2e_request_latency_seconds": "From the Generate call to its last message (requests that completed)",
    }
    for name, (buckets, total) in snapshot.histograms.items():
        yield HistogramMetricFamily(f"lmrpc:{name}", histogram_docs[name], buckets=buckets, sum_value=total)
    yield GaugeMetricFamily(
        "lmrpc:cache_hit_rate",
        "Share of prompt tokens found in the prefix cache since start",
        value=snapshot.cache_hit_rate,
    )
    yield GaugeMetricFamily(
        "lmrpc:kv_event_blocks",
        "Live prefix-cache blocks published as KV events",
        value=snapshot.kv_event_blocks,
    )
    yield CounterMetricFamily(
        "lmrpc:kv_event_batches",
        "KV event batches published (the last sequence number)",
        value=snapshot.kv_event_batches,
    )
    load = snapshot.load
    if load is None:
        return
    usage = load.kv_tokens_in_use / load.kv_tokens_total if load.kv_tokens_total else 0.0
    for prefix in ("lmrpc", "vllm"):  # vllm: what the inference gateway reads by default (LOAD-2)
        yield GaugeMetricFamily(
            f"{prefix}:num_requests_running", "Sequences being decoded", value=load.running_sequences
        )
        yield GaugeMetricFamily(
            f"{prefix}:num_requests_waiting", "Sequences waiting for admission", value=load.waiting_sequences
        )
        yield GaugeMetricFamily(
            f"{prefix}:kv_cache_usage_perc", "KV-cache share held by requests (0-1)", value=usage
        )
    yield GaugeMetricFamily(
        "lmrpc:num_requests_active", "Generate calls in flight", value=load.active_requests
    )
    tokens = GaugeMetricFamily("lmrpc:kv_cache_tokens", "KV-cache token slots", labels=["state"])
    tokens.add_metric(["in_use"], load.kv_tokens_in_use)
    tokens.add_metric(["cached"], load.kv_tokens_cached)
    tokens.add_metric(["total"], load.kv_tokens_total)
    yield tokens


class MetricsServer:
    """The HTTP endpoint (``/metrics``), in a thread of its own."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._httpd.server_port)

    @classmethod
    def start(cls, host: str, port: int, collector: ServerCollector) -> MetricsServer:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        httpd, thread = start_http_server(port, addr=host, registry=registry)
        return cls(httpd, thread)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)
