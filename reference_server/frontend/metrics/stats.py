"""What the frontend measures about the requests it serves: plain counters and histograms,
updated on the event loop, read by the Prometheus exporter and by GetLoads.

Latencies are taken where the frontend first sees a token (as vLLM's and SGLang's frontends do):
time to first token from the Generate call's arrival, inter-token latency between the token
events of one output (an event of k merged tokens counts k intervals of a k-th of its gap).
"""

from __future__ import annotations

import bisect
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from reference_server.ipc import OutputEvent

# vLLM's buckets, with finer ones at the low end for a fast CPU engine
TTFT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
THROUGHPUT_WINDOW_S = 30.0


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count

    def cumulative(self) -> list[tuple[str, float]]:
        """``(upper bound, cumulative count)`` pairs, Prometheus style, ending with +Inf."""
        result, total = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            result.append((bound, float(total)))
        return result


@dataclass
class _Timing:
    arrival: float
    first_token: float | None = None
    last_token: dict[int, float] = field(default_factory=dict)  # output index -> time


class ServingStats:
    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0  # prompt tokens that were looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, found
        self.finished: Counter[str] = Counter()  # outputs by finish reason
        self.cancelled = 0  # requests whose client went away (or whose deadline passed) mid-stream
        self.rpcs: Counter[tuple[str, str, str]] = Counter()  # (protocol, rpc, status code)
        self._timings: dict[str, _Timing] = {}  # rid -> timing
        self._throughput_samples: deque[tuple[float, int]] = deque()

    # ── hooks (reference_server.frontend.metrics.observe) ─────────────────────────────────────

    def on_register(self, rid: str) -> None:
        self._timings[rid] = _Timing(time.monotonic())

    def on_submit(self, rid: str, prompt_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.prefix_cache_queries += prompt_tokens

    def on_events(self, events: Iterable[OutputEvent]) -> None:
        now = time.monotonic()
        for event in events:
            if event.cached_prompt_tokens is not None:
                self.prefix_cache_hits += event.cached_prompt_tokens
            if event.finish is not None:
                self.finished[event.finish.reason] += 1
            count = len(event.token_ids)
            timing = self._timings.get(event.rid)
            if not count or timing is None:
                continue
            self.generation_tokens += count
            last = timing.last_token.get(event.output_index)
            if last is not None:
                self.itl.observe((now - last) / count, count)
            elif timing.first_token is None:
                timing.first_token = now
                self.ttft.observe(now - timing.arrival)
            timing.last_token[event.output_index] = now

    def on_unregister(self, rid: str, *, completed: bool, cancelled: bool) -> None:
        timing = self._timings.pop(rid, None)
        if cancelled:
            self.cancelled += 1
        if completed and timing is not None:
            self.e2e.observe(time.monotonic() - timing.arrival)

    def on_rpc(self, protocol: str, rpc: str, code: str) -> None:
        self.rpcs[protocol, rpc, code] += 1

    # ── rates (GetLoads) ────────────────────────────────────────────────────────────────────

    def gen_throughput(self) -> float:
        """Generated tokens per second over the last half minute or so (0 until known)."""
        now = time.monotonic()
        samples = self._throughput_samples
        samples.append((now, self.generation_tokens))
        while len(samples) > 2 and now - samples[1][0] >= THROUGHPUT_WINDOW_S:
            samples.popleft()
        then, tokens = samples[0]
        return (self.generation_tokens - tokens) / (now - then) if now > then else 0.0

    def cache_hit_rate(self) -> float:
        """Share of prompt tokens served from the prefix cache since the server started."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
