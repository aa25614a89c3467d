"""Prefill: time to first token of one long prompt, next to the GEMM floor of the same work and
next to llama.cpp, measured side by side in one run.

    python bench/prefill.py [--threads 1] [--lengths 512,2048,8000] [--rounds 2] [--json out.json]

For each prompt length N (a unique prompt per round, max_tokens 1):
- ``lmrpc``: the reference server's TTFT (``--engine model``, chunks of 512 tokens);
- ``GEMM floor``: in this process, with the same thread count, the bf16 GEMMs that prefill must
  do and nothing else: every layer's projections on the prompt in chunks of 512 rows plus the
  LM head on one row (``F.linear``), and each chunk's attention scores and P·V over the keys it
  sees (``bmm``), without softmax, masking, KV gathers or Python;
- ``llama.cpp bf16`` / ``llama.cpp Q4_1``: llama-server on the bf16 GGUF (bench/gguf_bf16.py)
  and the embedded Q4_1 GGUF, ``--threads N``.
Medians over interleaved rounds, with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from anchors import LlamaTarget, LmrpcTarget, Target, first_token, long_prompt
from gguf_bf16 import ensure_bf16
from llama_cpp import LlamaServer, llama_server_binary

from reference_server.models.llama import LlamaConfig
from reference_server.models.loader import load_weights
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import load_tokenizer
from reference_server.testing import ServerProcess

CHUNK = 512  # the server's default max_batch_tokens


class GemmFloor:
    """The prefill's GEMMs in bf16 with random weights of the model's shapes."""

    def __init__(self, config: LlamaConfig) -> None:
        c = config
        shapes = [(c.q_size + 2 * c.kv_size, c.hidden_size), (c.hidden_size, c.q_size)]
        shapes += [(2 * c.intermediate_size, c.hidden_size), (c.hidden_size, c.intermediate_size)]
        self.layer_weights = [torch.randn(shape, dtype=torch.bfloat16) * 0.02 for shape in shapes]
        self.head = torch.randn(c.vocab_size, c.hidden_size, dtype=torch.bfloat16) * 0.02
        self.config = c

    def seconds(self, num_tokens: int) -> tuple[float, float]:
        """(linear, attention) seconds for one prompt of ``num_tokens``."""
        c = self.config
        group = c.num_heads // c.num_kv_heads
        linear = attention = 0.0
        for start in range(0, num_tokens, CHUNK):
            rows = min(CHUNK, num_tokens - start)
            keys = start + rows
            x = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=torch.bfloat16) for w in self.layer_weights}
            q = torch.randn(c.num_kv_heads, rows * group, c.head_dim, dtype=torch.bfloat16)
            k = torch.randn(c.num_kv_heads, keys, c.head_dim, dtype=torch.bfloat16)
            began = time.perf_counter()
            for _ in range(c.num_layers):
                for w in self.layer_weights:
                    F.linear(x[w.shape[1]], w)
            linear += time.perf_counter() - began
            began = time.perf_counter()
            for _ in range(c.num_layers):
                scores = torch.bmm(q, k.transpose(1, 2))  # [KVH, rows*group, keys]
                torch.bmm(scores, k)  # P·V has the shape of Q·K^T's transpose
            attention += time.perf_counter() - began
        began = time.perf_counter()
        F.linear(torch.randn(1, c.hidden_size, dtype=torch.bfloat16), self.head)
        return linear + time.perf_counter() - began, attention


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", default="512,2048,8000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    parser.add_argument("--build", action="store_true", help="build llama-server if it is missing")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(n) for n in args.lengths.split(",")]
    source = resolve_model(None)
    tokenizer = load_tokenizer(source)
    config, _ = load_weights(source)
    floor = GemmFloor(config)
    results: dict[str, dict[int, list[float]]] = {}
    with_llama = not args.no_llama
    server_args = ("--threads", str(args.threads), "--no-embedding", "--kv-tokens", "16384")
    with ServerProcess(engine="model", args=server_args, startup_timeout_s=600) as server:
        targets: list[Target] = [LmrpcTarget("lmrpc", server)]
        llamas: list[LlamaServer] = []
        if with_llama:
            binary = llama_server_binary(build=args.build)
            for name, model in (
                ("llama.cpp bf16", ensure_bf16(source.path)),
                ("llama.cpp Q4_1", source.path),
            ):
                llama = LlamaServer(binary, model, threads=args.threads, slots=1, context=max(lengths) + 64)
                llamas.append(llama.__enter__())
                targets.append(LlamaTarget(name, llama))
        try:
            asyncio.run(first_token(targets[0], long_prompt(tokenizer, 64, salt=-1)))  # warm-up
            for r in range(args.rounds):
                for n in lengths:
                    prompt = long_prompt(tokenizer, n, salt=1000 + r)
                    for target in targets:
                        seconds = asyncio.run(first_token(target, prompt))
                        results.setdefault(target.name, {}).setdefault(n, []).append(seconds)
                    linear, attention = floor.seconds(n)
                    for name, value in (
                        ("GEMM floor", linear + attention),
                        ("linear", linear),
                        ("bmm", attention),
                    ):
                        results.setdefault(name, {}).setdefault(n, []).append(value)
                    row = "  ".join(f"{name} {values[n][-1]:.2f}s" for name, values in results.items())
                    print(f"  round {r} N={n}: {row}  load {os.getloadavg()[0]:.2f}", flush=True)
        finally:
            for llama in llamas:
                llama.__exit__(None, None, None)
    median = {name: {n: statistics.median(v) for n, v in by_n.items()} for name, by_n in results.items()}
    names = ["lmrpc", "GEMM floor", "linear", "bmm"] + [t.name for t in targets[1:]]
    head = ["threads", "prompt tokens"] + [f"{name} s" for name in names] + ["lmrpc / floor"]
    head += [f"lmrpc / {t.name}" for t in targets[1:]]
    print(f"\n(medians of {args.rounds} rounds)\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for n in lengths:
        cells = [str(args.threads), str(n)] + [f"{median[name][n]:.2f}" for name in names]
        cells.append(f"{median['lmrpc'][n] / median['GEMM floor'][n]:.2f}")
        cells += [f"{median['lmrpc'][n] / median[t.name][n]:.2f}" for t in targets[1:]]
        print("| " + " | ".join(cells) + " |")
    print(f"\nload average (1 min) at the end: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": results, "medians": median}, indent=2))


if __name__ == "__main__":
    main()
