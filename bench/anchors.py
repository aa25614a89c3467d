"""lmrpc against llama.cpp's llama-server on the same model, same threads, one interleaved run.

    python bench/anchors.py [--threads 1] [--concurrency 1,8,32] [--rounds 3] [--seconds 12]
                            [--prefill 2048,8000] [--prefill-rounds 1] [--context 4096,8000]
                            [--llama-isa native,avx2] [--lmrpc-args ARGS] [--lmrpc-extra ARGS]
                            [--build] [--json out.json]

AVX2 comparison, in one run: lmrpc on its native kernels and (a second server) on its AVX2
kernels, beside llama.cpp built for the native ISA and for AVX2 only (``bash
bench/build_llama_server.sh avx2`` builds that once, ~15 min on 2 cores; ``--build`` runs it):

    python bench/anchors.py --threads 1 --llama-isa native,avx2 --lmrpc-extra "--kernels avx2"

Servers, all started once and left up (an idle one uses no CPU):
- ``lmrpc``: the reference server (``--engine model``), bf16 weights dequantized from the
  embedded SmolLM2-135M Q4_1 GGUF, ``--threads N`` (with ``--lmrpc-args "ARGS"``, those extra
  arguments too, and named ``lmrpc ARGS``);
- ``llama.cpp Q4_1``: llama-server on that same GGUF (its own Q4_1 kernels);
- ``llama.cpp bf16``: llama-server on a bf16 GGUF written by ``bench/gguf_bf16.py`` from the same
  dequantized values, so precision is equal both ways;
- with ``--lmrpc-extra "ARGS"``, a second lmrpc server with those extra arguments.
The llama.cpp pair runs once per build in ``--llama-isa`` (default ``native``: GGML_NATIVE;
``avx2``: AVX2/FMA/F16C only, no AVX-512). With more than the native build alone, each row names
its build: ``llama.cpp native Q4_1``, ``llama.cpp avx2 bf16``, ...
llama-server runs with ``--threads N --threads-batch N``, one slot per stream, one shared KV
buffer (``--kv-unified``), its prompt cache on (lmrpc has its prefix cache on too).

Workloads, every request sent as the same token ids to every server (chat-templated prompts of
~48 tokens, distinct per request; greedy, EOS ignored, ``--max-tokens`` fixed):
- streams: c clients send requests back to back; after ``--warmup`` seconds, tokens received in
  a ``--seconds`` window give aggregate decode tokens/s, and every request started in the window
  gives a TTFT sample (p50, p99);
- prefill: one request of exactly N prompt tokens (unique per round, so no cache helps) and
  max_tokens 1; its TTFT.
- context: one stream decoding ``--context-tokens`` tokens after a prompt of exactly N tokens
  (unique per round): its TTFT, and its decode tokens/s from the first token to the last, which
  a long conversation's user meets; printed beside the server's own one-stream short-prompt rate.
Each round visits every setting on every server in turn; medians over rounds are reported,
with the load average (the machine may be shared: compare only numbers from one run).

The limit beside every one-stream figure: before the servers start, ``bench/bandwidth.py``
measures the machine's memory read bandwidth at 1 thread, at ``--threads`` and on all cores. A
one-stream decode step reads every weight once, so its tokens/s is at most the bandwidth at the
server's threads divided by the bytes of its weights (llama.cpp: its GGUF's size; lmrpc: its
packed projections and head, bf16 or GGUF blocks per ``--weights``); the table prints each
one-stream figure as a fraction of that limit. ``--lmrpc-extra "--weights q4_1"`` adds lmrpc
on the GGUF's own 4-bit blocks beside the bf16 default.
Memory: each server's PSS (all its processes, shared pages counted once; bench/process_memory.py)
idle after the warm-up and at the end of each streams window.
The llama-server binaries are built by ``bench/build_llama_server.sh [avx2]`` (``--build`` runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bandwidth import read_bandwidth_gbps
from gguf_bf16 import ensure_bf16
from llama_cpp import ISAS, LlamaServer, llama_server_binary
from process_memory import tree_pss_mb

from lmrpc.client import LmrpcClient
from lmrpc.v1 import GenerateRequest, SamplingParams, StoppingCriteria, TokenIds
from reference_server.engine.native.kernels import best_isa, unavailable_reason
from reference_server.models.loader import load_config
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import TokenizerBundle, load_tokenizer
from reference_server.testing import ServerProcess

TOPICS = ("the sea", "a lighthouse", "autumn", "a robot", "the moon", "a city", "trains", "bread")
FILLER = (
    "The old harbour town woke slowly: gulls argued over the fish market, a baker pulled the first "
    "loaves from the oven, and the ferry's horn rolled across the grey water toward the islands. "
)


class Target(Protocol):
    name: str

    @property
    def pid(self) -> int:
        """The server's root process."""
        ...

    def stream(self, prompt_ids: list[int], max_tokens: int) -> AsyncIterator[int]:
        """Greedy generation, EOS ignored: the token count of each event as it arrives."""
        ...


class LmrpcTarget:
    def __init__(self, name: str, server: ServerProcess) -> None:
        self.name = name
        self.server = server

    @property
    def pid(self) -> int:
        assert self.server.process is not None
        return self.server.process.pid

    async def stream(self, prompt_ids: list[int], max_tokens: int) -> AsyncIterator[int]:
        request = GenerateRequest(
            token_ids=TokenIds(ids=prompt_ids),
            sampling=SamplingParams(temperature=0.0),
            stopping=StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        )
        async with LmrpcClient.connect(self.server.target) as client:
            async for response in client.stream(request, timeout=900):
                if response.delta is not None and response.delta.token_ids:
                    yield len(response.delta.token_ids)


class LlamaTarget:
    def __init__(self, name: str, server: LlamaServer) -> None:
        self.name = name
        self.server = server

    @property
    def pid(self) -> int:
        assert self.server.process is not None
        return self.server.process.pid

    def stream(self, prompt_ids: list[int], max_tokens: int) -> AsyncIterator[int]:
        return self.server.stream(prompt_ids, max_tokens)


@dataclass
class Sample:
    target: str
    setting: str
    round: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    requests: int
    load_average: float


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def streams(
    target: Target, prompts: list[list[int]], c: int, max_tokens: int, warmup: float, seconds: float
) -> tuple[float, list[float], int, float]:
    """Aggregate tokens/s in the window, TTFTs of requests started in it, requests started, and
    the server's memory (PSS, MB) at the window's end, under this load."""
    counter = itertools.count()
    ttfts: list[float] = []
    tokens = 0
    start = time.perf_counter()
    window = (start + warmup, start + warmup + seconds)

    async def client() -> None:
        nonlocal tokens
        while True:
            prompt = prompts[next(counter) % len(prompts)]
            started = time.perf_counter()
            first = True
            async for count in target.stream(prompt, max_tokens):
                now = time.perf_counter()
                if first and window[0] <= started <= window[1]:
                    ttfts.append(now - started)
                first = False
                if window[0] <= now <= window[1]:
                    tokens += count

    tasks = [asyncio.create_task(client()) for _ in range(c)]
    await asyncio.sleep(warmup + seconds)
    memory_mb = tree_pss_mb(target.pid)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(1.0)  # let the server notice the closed streams before the next setting
    return tokens / seconds, ttfts, len(ttfts), memory_mb


async def long_context_decode(target: Target, prompt: list[int], max_tokens: int) -> tuple[float, float]:
    """TTFT in seconds, and decode tokens/s from the first event to the last."""
    started = time.perf_counter()
    events: list[tuple[float, int]] = []
    async for count in target.stream(prompt, max_tokens):
        events.append((time.perf_counter(), count))
    decoded = sum(count for _, count in events[1:])
    if not decoded:
        raise RuntimeError(f"{target.name} streamed one event for a {len(prompt)}-token prompt")
    return events[0][0] - started, decoded / (events[-1][0] - events[0][0])


async def first_token(target: Target, prompt: list[int]) -> float:
    started = time.perf_counter()
    async for _ in target.stream(prompt, 1):
        return time.perf_counter() - started
    raise RuntimeError(f"{target.name} returned no token")


# ── prompts ─────────────────────────────────────────────────────────────────────────────────


def chat_prompts(tokenizer: TokenizerBundle, count: int) -> list[list[int]]:
    texts = [
        f"Request {i}: write a long, detailed story about {TOPICS[i % len(TOPICS)]} for a curious child."
        for i in range(count)
    ]
    return [tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]


def long_prompt(tokenizer: TokenizerBundle, num_tokens: int, salt: int) -> list[int]:
    """Exactly ``num_tokens`` ids of plain prose, different from the first token on per salt."""
    ids = tokenizer.encode(f"Document {salt}. " + FILLER * (num_tokens // 30 + 2))
    return ids[:num_tokens]


# ── the machine ─────────────────────────────────────────────────────────────────────────────


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def lmrpc_weight_bytes(extra_args: list[str]) -> int:
    """Bytes of weights an lmrpc server with these arguments reads per one-stream decode step: the
    30 layers' projections and the LM head, packed as ``--weights`` says (the embedding lookup
    reads one row per token)."""
    weights = extra_args[extra_args.index("--weights") + 1] if "--weights" in extra_args else "dense"
    c = load_config(resolve_model(None))
    layer_bytes = {"dense": 2.0, "q4_1": 20 / 32, "int8": 34 / 32}[weights]  # GGUF block bytes per weight
    head_bytes = 2.0 if weights == "dense" else 34 / 32  # the embedded GGUF's head is Q8_0
    return int(c.num_layers * c.layer_parameters * layer_bytes + c.vocab_size * c.hidden_size * head_bytes)


def native_kernels_or_why() -> str:
    """What ``--kernels auto`` runs here (a server's ``--kernels ISA`` forces another)."""
    isa = best_isa()
    reason = unavailable_reason(isa)
    return f"native {isa} by default" if reason is None else f"torch ({reason})"


# ── driver ──────────────────────────────────────────────────────────────────────────────────


def summarize(samples: list[Sample], targets: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for s in samples:
        table.setdefault(s.setting, {}).setdefault(s.target, {})
    for setting, by_target in table.items():
        for name in targets:
            runs = [s for s in samples if s.setting == setting and s.target == name]
            if runs:
                by_target[name] = {
                    "tokens_per_s": statistics.median(r.tokens_per_s for r in runs),
                    "ttft_p50_ms": statistics.median(r.ttft_p50_ms for r in runs),
                    "ttft_p99_ms": statistics.median(r.ttft_p99_ms for r in runs),
                    "rounds": len(runs),
                }
    return table


def print_tables(table: dict[str, dict[str, dict[str, float]]], targets: list[str], threads: int) -> None:
    lmrpc, anchors = targets[0], [t for t in targets if t.startswith("llama.cpp")]
    others = [t for t in targets[1:] if not t.startswith("llama.cpp")]
    head = ["threads", "streams"] + [f"{t} tok/s" for t in targets] + [f"{lmrpc} / {a}" for a in anchors]
    head += [f"{o} / {a}" for o in others for a in anchors]
    head += [f"TTFT p50 / p99 ms: {t}" for t in targets]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for setting, by_target in table.items():
        if not setting.startswith("streams="):
            continue
        tps = {t: by_target[t]["tokens_per_s"] for t in targets}
        cells = [str(threads), setting.removeprefix("streams=")] + [f"{tps[t]:.1f}" for t in targets]
        cells += [f"{tps[lmrpc] / tps[a]:.2f}" for a in anchors]
        cells += [f"{tps[o] / tps[a]:.2f}" for o in others for a in anchors]
        cells += [f"{by_target[t]['ttft_p50_ms']:.0f} / {by_target[t]['ttft_p99_ms']:.0f}" for t in targets]
        print("| " + " | ".join(cells) + " |")
    prefill = [s for s in table if s.startswith("prefill=")]
    if prefill:
        head = ["threads", "prompt tokens"] + [f"{t} TTFT s" for t in targets]
        head += [f"{lmrpc} / {a}" for a in anchors]
        print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for setting in prefill:
            secs = {t: table[setting][t]["ttft_p50_ms"] / 1000 for t in targets}
            cells = [str(threads), setting.removeprefix("prefill=")] + [f"{secs[t]:.2f}" for t in targets]
            cells += [f"{secs[lmrpc] / secs[a]:.2f}" for a in anchors]
            print("| " + " | ".join(cells) + " |")
    contexts = [s for s in table if s.startswith("context=")]
    if contexts:
        short = table.get("streams=1", {})
        head = ["threads", "context tokens"] + [f"{t} decode tok/s" for t in targets]
        head += [f"{lmrpc} / {a}" for a in anchors] + [f"{t} / its 1-stream" for t in targets if t in short]
        head += [f"{t} TTFT s" for t in targets]
        print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for setting in contexts:
            tps = {t: table[setting][t]["tokens_per_s"] for t in targets}
            cells = [str(threads), setting.removeprefix("context=")] + [f"{tps[t]:.1f}" for t in targets]
            cells += [f"{tps[lmrpc] / tps[a]:.2f}" for a in anchors]
            cells += [f"{tps[t] / short[t]['tokens_per_s']:.0%}" for t in targets if t in short]
            cells += [f"{table[setting][t]['ttft_p50_ms'] / 1000:.2f}" for t in targets]
            print("| " + " | ".join(cells) + " |")


def print_limits(
    table: dict[str, dict[str, dict[str, float]]],
    targets: list[str],
    threads: int,
    bandwidth_gbps: dict[int, float],
    weight_bytes: dict[str, int],
) -> None:
    """Each one-stream figure against the memory-bound limit: bandwidth / bytes read per token."""
    one = table.get("streams=1")
    if not one:
        return
    gbps = bandwidth_gbps[threads]
    head = ["threads", "target", "1-stream tok/s", "weights MB", f"limit tok/s ({gbps:.1f} GB/s)", "of limit"]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name in targets:
        size = weight_bytes.get(name)
        if name not in one or size is None:
            continue
        tps, limit = one[name]["tokens_per_s"], gbps * 1e9 / size
        print(f"| {threads} | {name} | {tps:.1f} | {size / 1e6:.0f} | {limit:.1f} | {tps / limit:.0%} |")


def print_memory(memory: dict[str, dict[str, float]]) -> None:
    """Each server's memory (PSS of all its processes) idle after warm-up and at the end of each
    streams window (the most over rounds)."""
    phases = list(next(iter(memory.values())))
    head = ["target"] + [f"PSS MB, {phase}" for phase in phases]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, by_phase in memory.items():
        print(f"| {name} | " + " | ".join(f"{by_phase[phase]:.0f}" for phase in phases) + " |")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads / llama.cpp threads")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=12.0, help="measurement window per setting")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds of load before each window")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prefill", default="2048,8000", help="prompt lengths for TTFT ('' for none)")
    parser.add_argument("--prefill-rounds", type=int, default=1)
    parser.add_argument(
        "--context", default="4096,8000", help="prompt lengths for long-context decode ('' for none)"
    )
    parser.add_argument(
        "--context-tokens", type=int, default=64, help="tokens decoded after each long prompt"
    )
    parser.add_argument("--lmrpc-args", default="", help="extra args for the (first) lmrpc server")
    parser.add_argument("--lmrpc-extra", default=None, help="also run an lmrpc server with these args")
    parser.add_argument(
        "--llama-isa",
        default="native",
        help=f"llama.cpp builds to run, comma-separated, of {','.join(ISAS)} (each: Q4_1 and bf16)",
    )
    parser.add_argument("--skip-q4", action="store_true", help="no llama.cpp Q4_1 server")
    parser.add_argument("--build", action="store_true", help="build llama-server if it is missing")
    parser.add_argument("--json", default=None)
    return parser.parse_args()


def llama_isas(args: argparse.Namespace) -> list[str]:
    isas = [isa.strip() for isa in args.llama_isa.split(",") if isa.strip()]
    unknown = [isa for isa in isas if isa not in ISAS]
    if not isas or unknown:
        raise SystemExit(f"--llama-isa: {args.llama_isa!r}, want a list of {', '.join(ISAS)}")
    return list(dict.fromkeys(isas))


def llama_name(isas: list[str], isa: str, weights: str) -> str:
    """``llama.cpp Q4_1`` for the native build alone (as before), else ``llama.cpp avx2 Q4_1``."""
    return f"llama.cpp {weights}" if isas == ["native"] else f"llama.cpp {isa} {weights}"


def lmrpc_name(args: argparse.Namespace) -> str:
    return f"lmrpc {args.lmrpc_args}" if args.lmrpc_args else "lmrpc"


def start_targets(
    stack: ExitStack,
    args: argparse.Namespace,
    binaries: dict[str, Path],
    gguf: Path,
    bf16: Path,
    context: int,
) -> list[Target]:
    """lmrpc (and lmrpc with --lmrpc-extra), then per llama.cpp build, llama.cpp on the Q4_1 GGUF
    and on its bf16 copy."""
    concurrency = [int(c) for c in args.concurrency.split(",")]
    lmrpc_args = ["--threads", str(args.threads), "--no-embedding", "--kv-tokens", "32768"]
    lmrpc_args += ["--max-running", str(max(64, *concurrency))]
    targets: list[Target] = []

    def start_lmrpc(name: str, extra: list[str]) -> None:
        server = ServerProcess(engine="model", args=(*lmrpc_args, *extra), startup_timeout_s=600)
        targets.append(LmrpcTarget(name, stack.enter_context(server)))

    def start_llama(name: str, binary: Path, model: Path) -> None:
        server = LlamaServer(binary, model, threads=args.threads, slots=max(concurrency), context=context)
        targets.append(LlamaTarget(name, stack.enter_context(server)))

    start_lmrpc(lmrpc_name(args), shlex.split(args.lmrpc_args))
    if args.lmrpc_extra:
        start_lmrpc("lmrpc " + args.lmrpc_extra, shlex.split(args.lmrpc_extra))
    isas = list(binaries)
    for isa, binary in binaries.items():
        if not args.skip_q4:
            start_llama(llama_name(isas, isa, "Q4_1"), binary, gguf)
        start_llama(llama_name(isas, isa, "bf16"), binary, bf16)
    return targets


def print_sample(sample: Sample) -> None:
    print(
        f"  round {sample.round} {sample.setting:<14} {sample.target:<24} {sample.tokens_per_s:8.1f} tok/s  "
        f"TTFT p50 {sample.ttft_p50_ms:8.1f} ms  p99 {sample.ttft_p99_ms:8.1f} ms  "
        f"load {sample.load_average:.2f}",
        flush=True,
    )


def measure_streams(
    targets: list[Target], prompts: list[list[int]], args: argparse.Namespace, samples: list[Sample]
) -> dict[str, dict[str, float]]:
    """Decode tok/s and TTFT at each concurrency, round by round, the targets taking turns; returns
    each target's memory idle and at the end of each window."""
    for target in targets:  # warm up every server (first-call allocations, page faults)
        asyncio.run(streams(target, prompts, 2, 16, 0.0, 2.0))
    time.sleep(2.0)
    memory = {t.name: {"idle": tree_pss_mb(t.pid)} for t in targets}
    for r in range(args.rounds):
        for c in [int(c) for c in args.concurrency.split(",")]:
            for target in targets:
                run = streams(target, prompts, c, args.max_tokens, args.warmup, args.seconds)
                tps, ttfts, n, memory_mb = asyncio.run(run)
                memory[target.name][f"{c} streams"] = max(
                    memory_mb, memory[target.name].get(f"{c} streams", 0.0)
                )
                p50 = statistics.median(ttfts) * 1000 if ttfts else float("nan")
                p99 = percentile(ttfts, 0.99) * 1000
                samples.append(Sample(target.name, f"streams={c}", r, tps, p50, p99, n, os.getloadavg()[0]))
                print_sample(samples[-1])
    return memory


def measure_long_prompts(
    targets: list[Target], tokenizer: TokenizerBundle, args: argparse.Namespace, samples: list[Sample]
) -> None:
    """TTFT of each --prefill length, then decode tok/s after each --context length."""
    for r in range(args.prefill_rounds):
        for length in [int(n) for n in args.prefill.split(",") if n]:
            prompt = long_prompt(tokenizer, length, salt=r)
            for target in targets:
                ttft = asyncio.run(first_token(target, prompt)) * 1000
                samples.append(
                    Sample(target.name, f"prefill={length}", r, 0.0, ttft, ttft, 1, os.getloadavg()[0])
                )
                print_sample(samples[-1])
    for r in range(args.prefill_rounds):
        for length in [int(n) for n in args.context.split(",") if n]:
            prompt = long_prompt(tokenizer, length, salt=1000 + r)
            for target in targets:
                ttft_s, tps = asyncio.run(long_context_decode(target, prompt, args.context_tokens))
                ms = ttft_s * 1000
                samples.append(
                    Sample(target.name, f"context={length}", r, tps, ms, ms, 1, os.getloadavg()[0])
                )
                print_sample(samples[-1])


def main() -> None:
    args = parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    prefill_lengths = [int(n) for n in args.prefill.split(",") if n]
    context_lengths = [int(n) for n in args.context.split(",") if n]
    source = resolve_model(None)
    tokenizer = load_tokenizer(source)
    prompts = chat_prompts(tokenizer, 64)
    isas = llama_isas(args)
    binaries = {isa: llama_server_binary(build=args.build, isa=isa) for isa in isas}
    bf16 = ensure_bf16(Path(source.path))
    longest = [n + 16 for n in prefill_lengths] + [n + args.context_tokens + 16 for n in context_lengths]
    context = max([8192, *longest]) + max(concurrency) * (args.max_tokens + 64)
    print(f"CPU: {cpu_model()}; lmrpc kernels: {native_kernels_or_why()}")
    bandwidth = {n: read_bandwidth_gbps(n) for n in sorted({1, args.threads, os.cpu_count() or 1})}
    print("read bandwidth: " + ", ".join(f"{n} thread(s) {g:.1f} GB/s" for n, g in bandwidth.items()))
    weight_bytes = {lmrpc_name(args): lmrpc_weight_bytes(shlex.split(args.lmrpc_args))}
    if args.lmrpc_extra:
        weight_bytes["lmrpc " + args.lmrpc_extra] = lmrpc_weight_bytes(shlex.split(args.lmrpc_extra))
    for isa in isas:
        weight_bytes[llama_name(isas, isa, "Q4_1")] = Path(source.path).stat().st_size
        weight_bytes[llama_name(isas, isa, "bf16")] = bf16.stat().st_size
    for isa, binary in binaries.items():
        print(f"llama-server ({isa}): {binary}")
    print(f"bf16 GGUF: {bf16}\nthreads {args.threads}, max_tokens {args.max_tokens}, "
          f"window {args.seconds}s after {args.warmup}s, {args.rounds} rounds, {os.cpu_count()} cores")  # fmt: skip

    samples: list[Sample] = []
    with ExitStack() as stack:
        targets = start_targets(stack, args, binaries, Path(source.path), bf16, context)
        memory = measure_streams(targets, prompts, args, samples)
        measure_long_prompts(targets, tokenizer, args, samples)
    names = [t.name for t in targets]
    table = summarize(samples, names)
    print_tables(table, names, args.threads)
    print_limits(table, names, args.threads, bandwidth, weight_bytes)
    print_memory(memory)
    loads = [s.load_average for s in samples]
    print(f"\nload average (1 min) during the run: median {statistics.median(loads):.2f}, "
          f"max {max(loads):.2f} ({os.cpu_count()} cores)")  # fmt: skip
    if args.json:
        report = {
            "samples": [asdict(s) for s in samples],
            "medians": table,
            "read_bandwidth_gbps": bandwidth,
            "cpu": cpu_model(),
            "lmrpc_kernels": native_kernels_or_why(),
            "llama_server": {isa: str(binary) for isa, binary in binaries.items()},
            "weight_bytes": weight_bytes,
            "memory_pss_mb": memory,
        }
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
