"""The same chat requests over lmrpc.v1 gRPC (straight to the server) and over OpenAI HTTP/SSE
through smg (to the same server), side by side in one run; then smg's aggregate throughput over
two replicas against one.

    python bench/openai_vs_grpc.py [--engine model|fake] [--seconds 20] [--rounds 3]
                                   [--concurrency 1,32] [--max-tokens 64] [--json out.json]

Every request is a greedy chat with a prompt of its own ("Request k: ...", so no two share more
than the chat template's system prompt) that generates exactly ``--max-tokens`` tokens
(ignore_eos). For each concurrency c, c client tasks send requests back to back for
``--seconds``; TTFT is the time to the first generated token (lmrpc: the first TokenDelta; OpenAI:
the first chunk with content), tokens/s counts every generated token (OpenAI: the usage the last
chunk reports) over the time until the last request ended. Paths alternate round by round and
the medians of ``--rounds`` rounds are reported, with the load average. Replicas run one torch
thread each; the clients run in this process (the official ``openai`` AsyncOpenAI client, and
lmrpc's own).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openai import AsyncOpenAI

from lmrpc.client import LmrpcClient
from lmrpc.v1 import ChatInput, ChatMessage, GenerateRequest, SamplingParams, StoppingCriteria
from reference_server.models.source import DEFAULT_MODEL_ID
from reference_server.smg_gateway import SmgGateway, sum_samples
from reference_server.testing import ServerProcess, free_port

QUESTION = "Request {k}: write a short story about a lighthouse keeper and a storm."


@dataclass
class Result:
    path: str
    concurrency: int
    tokens_per_s: float
    requests: int
    ttft_p50_ms: float
    ttft_p99_ms: float


def result(path: str, concurrency: int, tokens: int, elapsed: float, ttfts: list[float]) -> Result:
    ttfts = sorted(ttfts)
    return Result(
        path, concurrency, tokens / elapsed, len(ttfts),
        1000 * statistics.median(ttfts), 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
    )  # fmt: skip


async def drive(
    concurrency: int, seconds: float, one: Callable[[int], Awaitable[tuple[float, int]]]
) -> tuple[int, float, list[float]]:
    """Run ``one(k)`` (-> TTFT, tokens) back to back on ``concurrency`` tasks for ``seconds``."""
    counter = itertools.count()
    tokens, ttfts = 0, []
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal tokens
        while time.perf_counter() < stop_at:
            ttft, count = await one(next(counter))
            ttfts.append(ttft)
            tokens += count

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tokens, time.perf_counter() - began, ttfts


async def grpc_load(target: str, concurrency: int, seconds: float, max_tokens: int) -> Result:
    async with LmrpcClient.connect(target) as client:

        async def one(k: int) -> tuple[float, int]:
            request = GenerateRequest(
                chat=ChatInput(messages=[ChatMessage(role="user", content=QUESTION.format(k=k))]),
                sampling=SamplingParams(temperature=0.0),
                stopping=StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
            )
            started, ttft, tokens = time.perf_counter(), 0.0, 0
            async for response in client.stream(request, timeout=600):
                if response.delta is not None and response.delta.token_ids:
                    if not tokens:
                        ttft = time.perf_counter() - started
                    tokens += len(response.delta.token_ids)
            return ttft, tokens

        await one(-1)  # connect and warm up
        tokens, elapsed, ttfts = await drive(concurrency, seconds, one)
    return result("lmrpc gRPC", concurrency, tokens, elapsed, ttfts)


async def openai_load(
    gateway: SmgGateway, concurrency: int, seconds: float, max_tokens: int, path: str
) -> Result:
    async with AsyncOpenAI(base_url=gateway.base_url, api_key="none", max_retries=0, timeout=600) as client:

        async def one(k: int) -> tuple[float, int]:
            started, ttft, tokens = time.perf_counter(), 0.0, 0
            stream = await client.chat.completions.create(
                model=gateway.model, messages=[{"role": "user", "content": QUESTION.format(k=k)}],
                max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            async for chunk in stream:
                if not ttft and chunk.choices and chunk.choices[0].delta.content:
                    ttft = time.perf_counter() - started
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            return ttft, tokens

        await one(-1)
        tokens, elapsed, ttfts = await drive(concurrency, seconds, one)
    return result(path, concurrency, tokens, elapsed, ttfts)


def median(results: list[Result]) -> Result:
    def med(field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in results))

    first = results[0]
    return Result(
        first.path,
        first.concurrency,
        med("tokens_per_s"),
        int(med("requests")),
        med("ttft_p50_ms"),
        med("ttft_p99_ms"),
    )


def generate_calls(metrics_port: int) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        return sum_samples(
            response.read().decode(), "lmrpc:grpc_requests_total", protocol="vllm-engine", rpc="Generate"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=("model", "fake"), default="model")
    parser.add_argument("--fake-token-delay", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model = DEFAULT_MODEL_ID if args.engine == "model" else f"fake-{DEFAULT_MODEL_ID}"
    replica_args = ["--no-embedding", "--threads", "1"]
    if args.engine == "fake":
        replica_args += ["--fake-token-delay", str(args.fake_token_delay)]
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        metrics = [free_port(), free_port()]
        a, b = (
            stack.enter_context(
                ServerProcess(
                    engine=args.engine, args=(*replica_args, "--metrics-port", str(port)),
                    startup_timeout_s=300, env={"OMP_NUM_THREADS": "1"},
                )
            )
            for port in metrics
        )  # fmt: skip
        one = stack.enter_context(SmgGateway([a.target], model=model))
        two = stack.enter_context(SmgGateway([a.target, b.target], model=model))
        rows: list[dict[str, Result]] = []
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            runs: dict[str, list[Result]] = {"grpc": [], "openai": []}
            for _ in range(args.rounds):
                runs["grpc"].append(
                    asyncio.run(grpc_load(a.target, concurrency, args.seconds, args.max_tokens))
                )
                runs["openai"].append(
                    asyncio.run(
                        openai_load(one, concurrency, args.seconds, args.max_tokens, "OpenAI SSE via smg")
                    )
                )
            rows.append({k: median(v) for k, v in runs.items()})
        scale: dict[str, list[Result]] = {"1": [], "2": []}
        shares: list[tuple[float, float]] = []
        top = max(int(c) for c in args.concurrency.split(","))
        for _ in range(args.rounds):
            scale["1"].append(
                asyncio.run(openai_load(one, top, args.seconds, args.max_tokens, "smg, 1 replica"))
            )
            before = [generate_calls(p) for p in metrics]
            scale["2"].append(
                asyncio.run(openai_load(two, top, args.seconds, args.max_tokens, "smg, 2 replicas"))
            )
            after = [generate_calls(p) for p in metrics]
            shares.append((after[0] - before[0], after[1] - before[1]))
    load_after = os.getloadavg()
    print_tables(rows, {k: median(v) for k, v in scale.items()}, shares, args, load_before, load_after)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "paths": [{k: asdict(v) for k, v in row.items()} for row in rows],
                    "replicas": {k: asdict(median(v)) for k, v in scale.items()},
                    "shares": shares,
                    "loadavg": [load_before, load_after],
                },
                indent=2,
            )
        )


def print_tables(
    rows: list[dict[str, Result]],
    scale: dict[str, Result],
    shares: list[tuple[float, float]],
    args: argparse.Namespace,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> None:
    print(
        f"engine={args.engine} max_tokens={args.max_tokens} seconds={args.seconds} rounds={args.rounds} "
        f"loadavg {load_before[0]:.2f} -> {load_after[0]:.2f}"
    )
    print("| streams | path | TTFT p50 ms | TTFT p99 ms | tokens/s | requests |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        for r in row.values():
            print(
                f"| {r.concurrency} | {r.path} | {r.ttft_p50_ms:.1f} | {r.ttft_p99_ms:.1f} | {r.tokens_per_s:.1f} | {r.requests} |"
            )
        grpc, openai = row["grpc"], row["openai"]
        print(
            f"|   | OpenAI/gRPC | {openai.ttft_p50_ms / grpc.ttft_p50_ms:.2f}x | {openai.ttft_p99_ms / grpc.ttft_p99_ms:.2f}x "
            f"| {openai.tokens_per_s / grpc.tokens_per_s:.2f}x | |"
        )
    print()
    print(
        "| behind smg (OpenAI SSE) | streams | tokens/s | TTFT p50 ms | requests per replica (A/B, each round) |"
    )
    print("|---|---|---|---|---|")
    one, two = scale["1"], scale["2"]
    split = ", ".join(f"{a:.0f}/{b:.0f}" for a, b in shares)
    print(f"| 1 replica | {one.concurrency} | {one.tokens_per_s:.1f} | {one.ttft_p50_ms:.1f} | |")
    print(f"| 2 replicas | {two.concurrency} | {two.tokens_per_s:.1f} | {two.ttft_p50_ms:.1f} | {split} |")
    print(f"| 2 / 1 | | {two.tokens_per_s / one.tokens_per_s:.2f}x | | |")


if __name__ == "__main__":
    main()
