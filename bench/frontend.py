"""Frontend + pipeline throughput: the reference server (fake engine, zero delay) vs a bare grpclib
streaming server, side by side in one run.

    python bench/frontend.py [--seconds 5] [--concurrency 1,8,64] [--json out.json]

For each concurrency c, c client tasks issue Generate calls back to back (max_tokens tokens each,
ignore_eos) against each server in turn; we count tokens and TokenDelta messages received and
the time to first token of every call. The bare server sends one TokenDelta per token as fast as
grpclib allows (yielding to the loop after each message, as the reference server does); its
tokens/s is the ceiling. The reference server may merge deltas for a busy client (STREAM-9), so
tokens/s is the fair comparison; messages/s is reported too.

``--compare-without-dialect`` adds a third server, started with ``--no-vllm-engine`` (no vLLM
dialect, no KV-cache events), to the same interleaved rounds: what serving smg's dialect costs
lmrpc.v1 requests. The servers take turns going first, round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path

from grpclib.server import Server

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmrpc.client import LmrpcClient
from lmrpc.v1 import (
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    InferenceServiceBase,
    OutputFinished,
    PromptInfo,
    SamplingParams,
    StoppingCriteria,
    TokenDelta,
    Usage,
)
from reference_server.frontend.grpc_hooks import StreamingDiscipline
from reference_server.testing import ServerProcess


class BareInference(StreamingDiscipline, InferenceServiceBase):
    """The ceiling: no validation, no tokenizer, no processes; one token per message (streamed
    as the server streams)."""

    async def generate(self, message: GenerateRequest) -> AsyncIterator[GenerateResponse]:
        rid = message.request_id
        n = message.stopping.max_tokens if message.stopping and message.stopping.max_tokens else 16
        yield GenerateResponse(request_id=rid, prompt_info=PromptInfo(prompt_tokens=4, seed=1, num_outputs=1))
        for i in range(n):
            yield GenerateResponse(
                request_id=rid, delta=TokenDelta(output_index=0, token_ids=[1000 + i % 500], text="x")
            )
        yield GenerateResponse(
            request_id=rid,
            finished=OutputFinished(output_index=0, reason=FinishReason.LENGTH, completion_tokens=n),
            usage=Usage(prompt_tokens=4, completion_tokens=n),
        )


async def serve_bare(port_file: str) -> None:
    server = Server([BareInference()])
    await server.start("127.0.0.1", 0)
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    Path(port_file).write_text(str(port))
    await asyncio.Event().wait()


@dataclass
class Result:
    server: str
    concurrency: int
    tokens_per_s: float
    messages_per_s: float
    requests: int
    ttft_p50_ms: float
    ttft_p99_ms: float


async def load(target: str, concurrency: int, seconds: float, max_tokens: int, name: str) -> Result:
    request = GenerateRequest(
        text="benchmark prompt", sampling=SamplingParams(temperature=0.0),
        stopping=StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
    )  # fmt: skip
    tokens = messages = 0
    ttfts: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def worker(client: LmrpcClient) -> None:
        nonlocal tokens, messages
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            first = True
            async for response in client.stream(request, timeout=120):
                if response.delta is not None:
                    if first:
                        ttfts.append(time.perf_counter() - started)
                        first = False
                    tokens += len(response.delta.token_ids)
                    messages += 1

    async with LmrpcClient.connect(target) as client:
        await client.inference.generate(request).__anext__()  # connect and warm up
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    ttfts.sort()
    return Result(
        server=name,
        concurrency=concurrency,
        tokens_per_s=tokens / elapsed,
        messages_per_s=messages / elapsed,
        requests=len(ttfts),
        ttft_p50_ms=1000 * statistics.median(ttfts),
        ttft_p99_ms=1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds per setting; medians are reported"
    )
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--token-delay", type=float, default=0.0,
        help="fake engine seconds per step (0: as fast as it goes; >0 shows one message per token at a set rate)",
    )  # fmt: skip
    parser.add_argument(
        "--compare-without-dialect", action="store_true",
        help="also run a reference server with --no-vllm-engine, side by side",
    )  # fmt: skip
    parser.add_argument("--bare-server", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        asyncio.run(serve_bare(args.bare_server))
        return
    port_file = Path("/tmp") / f"lmrpc-bench-bare-{time.time_ns()}"
    bare = subprocess.Popen([sys.executable, __file__, "--bare-server", str(port_file)])
    try:
        while not port_file.exists():
            time.sleep(0.05)
        bare_target = f"127.0.0.1:{port_file.read_text()}"
        server_args = ("--fake-token-delay", str(args.token_delay))
        with contextlib.ExitStack() as stack:
            targets = {"bare": bare_target}
            targets["lmrpc"] = stack.enter_context(ServerProcess(engine="fake", args=server_args)).target
            if args.compare_without_dialect:
                without = ServerProcess(engine="fake", args=(*server_args, "--no-vllm-engine"))
                targets["no-dialect"] = stack.enter_context(without).target
            rows = []
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                runs: dict[str, list[Result]] = {name: [] for name in targets}
                for round_ in range(args.rounds):
                    order = list(targets.items())
                    for name, target in order[round_ % len(order) :] + order[: round_ % len(order)]:
                        runs[name].append(
                            asyncio.run(load(target, concurrency, args.seconds, args.max_tokens, name))
                        )
                rows.append({name: median_result(results) for name, results in runs.items()})
    finally:
        bare.kill()
        port_file.unlink(missing_ok=True)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(
            json.dumps([{k: asdict(v) for k, v in row.items()} for row in rows], indent=2)
        )


def median_result(results: list[Result]) -> Result:
    def med(field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in results))

    first = results[0]
    return Result(
        first.server, first.concurrency, med("tokens_per_s"), med("messages_per_s"),
        int(med("requests")), med("ttft_p50_ms"), med("ttft_p99_ms"),
    )  # fmt: skip


def print_table(rows: list[dict[str, Result]]) -> None:
    print(
        f"{'streams':>7} | {'bare tok/s':>10} | {'lmrpc tok/s':>11} | {'ratio':>5} | {'lmrpc msg/s':>11} | "
        f"{'lmrpc TTFT p50/p99 ms':>21} | {'bare TTFT p50/p99 ms':>20}"
    )
    for row in rows:
        bare, ours = row["bare"], row["lmrpc"]
        print(
            f"{ours.concurrency:>7} | {bare.tokens_per_s:>10.0f} | {ours.tokens_per_s:>11.0f} | "
            f"{ours.tokens_per_s / bare.tokens_per_s:>5.2f} | {ours.messages_per_s:>11.0f} | "
            f"{ours.ttft_p50_ms:>10.1f}/{ours.ttft_p99_ms:<10.1f} | {bare.ttft_p50_ms:>9.1f}/{bare.ttft_p99_ms:<10.1f}"
        )
    if all("no-dialect" in row for row in rows):
        print()
        print(
            f"{'streams':>7} | {'with dialect tok/s':>18} | {'without tok/s':>13} | {'ratio':>5} | "
            f"{'with TTFT p50/p99 ms':>20} | {'without TTFT p50/p99 ms':>23}"
        )
        for row in rows:
            ours, without = row["lmrpc"], row["no-dialect"]
            print(
                f"{ours.concurrency:>7} | {ours.tokens_per_s:>18.0f} | {without.tokens_per_s:>13.0f} | "
                f"{ours.tokens_per_s / without.tokens_per_s:>5.2f} | {ours.ttft_p50_ms:>9.1f}/{ours.ttft_p99_ms:<10.1f} | "
                f"{without.ttft_p50_ms:>11.1f}/{without.ttft_p99_ms:<11.1f}"
            )


if __name__ == "__main__":
    main()
