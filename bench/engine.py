"""Model engine throughput: aggregate decode tokens/s and time to first token at 1, 8 and 32
concurrent streams, next to a plain single-request torch loop, measured side by side in one run.

    python bench/engine.py [--concurrency 1,8,32] [--seconds 8] [--rounds 5] [--threads N] [--direct] [--json out.json]

Streams: each of c client tasks sends greedy Generate calls back to back (a distinct chat prompt
of ~48 tokens per call, 32-95 tokens each, ignore_eos), through the gRPC server
(``lmrpc-server --engine model``) or, with ``--direct``, straight into ``ModelEngine.step()``
in this process. After a warm-up, tokens received during a fixed window give the aggregate
tokens/s; every call started in the window gives a TTFT sample.

Plain loop: the same ``LlamaModel`` with a dense per-layer KV cache, batch 1, greedy, one
request after another (prefill, then decode) for the same window: what you get without an
engine. Settings alternate within each round; medians over rounds are reported with ratios.

On a machine shared with other jobs, pass ``--threads 1``: two-thread OpenMP teams stall
whenever another process takes a core, and the numbers swing by 10x between rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.ipc import DetokenizeConfig, SamplingConfig, StoppingConfig, SubmitRequest
from reference_server.models.llama import LlamaModel
from reference_server.models.loader import load_llama
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import TokenizerBundle, load_tokenizer

TOPICS = ("the sea", "a lighthouse", "autumn", "a robot", "the moon", "a city", "trains", "bread")


def prompt_text(i: int) -> str:
    return f"Request {i}: write a long, detailed story about {TOPICS[i % len(TOPICS)]} for a curious child."


def tokens_for(i: int, mean: int) -> int:
    """Call i's max_tokens: spread over [mean/2, 3*mean/2) so streams do not run in lockstep."""
    return mean // 2 + (i * 37) % mean


@dataclass
class Sample:
    setting: str
    round: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    requests: int


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def sample(setting: str, tokens: int, seconds: float, ttfts: list[float]) -> Sample:
    p50 = statistics.median(ttfts) if ttfts else float("nan")
    return Sample(setting, 0, tokens / seconds, 1000 * p50, 1000 * percentile(ttfts, 0.99), len(ttfts))


# ── plain single-request loop ───────────────────────────────────────────────────────────────


class DenseCache:
    """One sequence, contiguous per-layer K/V: the textbook KV cache."""

    def __init__(self, model: LlamaModel, max_len: int) -> None:
        c = model.config
        dtype = model.embed_tokens.weight.dtype
        self.k = [
            torch.zeros(1, c.num_kv_heads, max_len, c.head_dim, dtype=dtype) for _ in range(c.num_layers)
        ]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.length = 0
        self.new = 0

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n, start = self.new, self.length
        self.k[layer][0, :, start : start + n] = k[:n].transpose(0, 1)
        self.v[layer][0, :, start : start + n] = v[:n].transpose(0, 1)
        keys, values = self.k[layer][:, :, : start + n], self.v[layer][:, :, : start + n]
        out = F.scaled_dot_product_attention(
            q[:n].transpose(0, 1)[None], keys, values, is_causal=n > 1, enable_gqa=True
        )[0].transpose(0, 1)
        return F.pad(out, (0, 0, 0, 0, 0, q.shape[0] - n))


def plain_loop(model: LlamaModel, prompts: list[list[int]], max_tokens: int, seconds: float) -> Sample:
    if seconds > 0:
        plain_loop(model, prompts[-1:], 4, 0.0)  # one short warm-up request
    tokens = 0
    ttfts: list[float] = []
    began = time.perf_counter()
    for i in itertools.count():
        if i and time.perf_counter() - began >= seconds:
            break
        prompt, length = prompts[i % len(prompts)], tokens_for(i, max_tokens)
        cache = DenseCache(model, len(prompt) + length)
        started = time.perf_counter()
        feed = prompt
        for step in range(length):
            cache.new = len(feed)
            hidden = model(torch.tensor(feed), torch.arange(cache.length, cache.length + len(feed)), cache)
            cache.length += len(feed)
            feed = [int(model.compute_logits(hidden[-1:]).argmax())]
            if step == 0:
                ttfts.append(time.perf_counter() - started)
            tokens += 1
    return sample("plain loop (batch 1)", tokens, time.perf_counter() - began, ttfts)


# ── engine, in process ──────────────────────────────────────────────────────────────────────


def direct_load(
    engine: ModelEngine, prompts: list[list[int]], c: int, max_tokens: int, warmup: float, seconds: float
) -> Sample:
    greedy = SamplingConfig(0.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0, 0)
    detok = DetokenizeConfig(False, True, (), False, 0)
    counter = itertools.count()
    sent: dict[str, float] = {}
    ttfts: list[float] = []
    tokens = 0
    start = time.perf_counter()
    window: tuple[float, float] = (start + warmup, start + warmup + seconds)

    def submit() -> None:
        i = next(counter)
        sent[f"r{i}"] = time.perf_counter()
        stopping = StoppingConfig(tokens_for(i, max_tokens), 0, (), True)
        engine.add_request(
            SubmitRequest(f"r{i}", prompts[i % len(prompts)], 1, greedy, stopping, None, detok)
        )

    for _ in range(c):
        submit()
    while time.perf_counter() < window[1]:
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if window[0] <= now:
                tokens += len(out.token_ids)
            if out.rid in sent:
                if sent[out.rid] >= window[0]:
                    ttfts.append(now - sent[out.rid])
                del sent[out.rid]
            if out.finish is not None:
                submit()
    for rid in list(engine.batcher.running) + [g.rid for g in engine.batcher.waiting]:
        engine.abort_request(rid)
    return sample(f"engine direct c={c}", tokens, seconds, ttfts)


# ── engine, through gRPC ────────────────────────────────────────────────────────────────────


async def grpc_load(
    target: str, texts: list[str], c: int, max_tokens: int, warmup: float, seconds: float
) -> Sample:
    from lmrpc.client import LmrpcClient
    from lmrpc.v1 import ChatInput, ChatMessage, GenerateRequest, SamplingParams, StoppingCriteria

    counter = itertools.count()
    ttfts: list[float] = []
    tokens = 0
    window: tuple[float, float] = (0.0, 0.0)

    def make(i: int) -> GenerateRequest:
        return GenerateRequest(
            chat=ChatInput(messages=[ChatMessage(role="user", content=texts[i % len(texts)])]),
            sampling=SamplingParams(temperature=0.0),
            stopping=StoppingCriteria(max_tokens=tokens_for(i, max_tokens), ignore_eos=True),
        )

    async def worker(client: LmrpcClient) -> None:
        nonlocal tokens
        while True:
            started = time.perf_counter()
            first = True
            async for response in client.stream(make(next(counter)), timeout=600):
                if response.delta is not None:
                    now = time.perf_counter()
                    if first and started >= window[0]:
                        ttfts.append(now - started)
                    first = False
                    if window[0] <= now <= window[1]:
                        tokens += len(response.delta.token_ids)

    async with LmrpcClient.connect(target) as client:
        start = time.perf_counter()
        window = (start + warmup, start + warmup + seconds)
        tasks = [asyncio.create_task(worker(client)) for _ in range(c)]
        await asyncio.sleep(warmup + seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while (await client.load()).active_requests:  # cancelled streams are aborted
            await asyncio.sleep(0.1)
    return sample(f"engine grpc c={c}", tokens, seconds, ttfts)


# ── driver ──────────────────────────────────────────────────────────────────────────────────


def chat_prompts(tokenizer: TokenizerBundle, count: int) -> tuple[list[str], list[list[int]]]:
    texts = [prompt_text(i) for i in range(count)]
    return texts, [tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]


def report(samples: list[Sample], concurrency: list[int], label: str) -> dict[str, float]:
    by_setting: dict[str, list[Sample]] = {}
    for s in samples:
        by_setting.setdefault(s.setting, []).append(s)
    rounds = len(samples) // len(by_setting)
    header = f"{'setting':<24} {'tokens/s':>10} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'requests':>9}"
    print(f"\n{header}   (medians of {rounds} rounds)")
    medians: dict[str, float] = {}
    for setting, runs in by_setting.items():
        tps = statistics.median(r.tokens_per_s for r in runs)
        medians[setting] = tps
        p50 = statistics.median(r.ttft_p50_ms for r in runs)
        p99 = statistics.median(r.ttft_p99_ms for r in runs)
        print(f"{setting:<24} {tps:>10.1f} {p50:>12.1f} {p99:>12.1f} {sum(r.requests for r in runs):>9}")
    base = medians[f"engine {label} c={concurrency[0]}"]
    plain = medians["plain loop (batch 1)"]
    print()
    for c in concurrency[1:]:
        tps = medians[f"engine {label} c={c}"]
        print(
            f"batching gain c={c} vs c={concurrency[0]}: {tps / base:.2f}x   vs plain loop: {tps / plain:.2f}x"
        )
    print(f"engine c={concurrency[0]} vs plain loop: {base / plain:.2f}x")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=8.0, help="measurement window per setting")
    parser.add_argument("--warmup", type=float, default=6.0, help="seconds of load before each window")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of alternating settings (noise)")
    parser.add_argument("--max-tokens", type=int, default=64, help="mean max_tokens per call")
    parser.add_argument("--direct", action="store_true", help="drive ModelEngine in process instead of gRPC")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads here and in the server (OMP_NUM_THREADS)"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    source = resolve_model(None)
    texts, prompts = chat_prompts(load_tokenizer(source), 64)
    model = load_llama(source, device=torch.device("cpu"), dtype=torch.bfloat16)
    print(f"prompts ~{statistics.mean(len(p) for p in prompts):.0f} tokens, max_tokens {args.max_tokens}, "
          f"{torch.get_num_threads()} torch threads, window {args.seconds}s after {args.warmup}s warm-up")  # fmt: skip
    samples: list[Sample] = []
    label = "direct" if args.direct else "grpc"
    server_args = ("--no-embedding", "--kv-tokens", "16384", "--max-running", str(max(64, max(concurrency))))

    def measure_round(r: int, run_engine: Callable[[int], Sample]) -> None:
        samples.append(plain_loop(model, prompts, args.max_tokens, args.seconds))
        for c in concurrency:
            samples.append(run_engine(c))
        for s in samples[-1 - len(concurrency) :]:
            s.round = r
            print(
                f"  round {r}: {s.setting:<22} {s.tokens_per_s:8.1f} tok/s  TTFT p50 {s.ttft_p50_ms:7.1f} ms"
            )

    if args.direct:
        engine = ModelEngine(
            ModelEngineConfig(
                kv_tokens=16384, max_running_sequences=max(64, max(concurrency)), load_embedding_model=False
            )
        )
        for r in range(args.rounds):
            measure_round(
                r, lambda c: direct_load(engine, prompts, c, args.max_tokens, args.warmup, args.seconds)
            )
    else:
        from reference_server.testing import ServerProcess

        env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else None
        with ServerProcess(engine="model", args=server_args, startup_timeout_s=300, env=env) as server:
            for r in range(args.rounds):
                measure_round(
                    r,
                    lambda c: asyncio.run(
                        grpc_load(server.target, texts, c, args.max_tokens, args.warmup, args.seconds)
                    ),
                )
    medians = report(samples, concurrency, label)
    print(f"load average during the run: {os.getloadavg()[0]:.2f} (this machine has {os.cpu_count()} cores)")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"samples": [asdict(s) for s in samples], "medians": medians}, indent=2)
        )


if __name__ == "__main__":
    main()
