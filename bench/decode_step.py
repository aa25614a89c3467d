"""Where one decode step goes at 1 stream, and before/after comparisons of it.

    python bench/decode_step.py [--threads 1] [--steps 96] [--rounds 3] [--trees DIR,DIR,...]
                                [--kernels torch|native|avx512|avx2] [--kv-cache dense|int8] [--context 48]
                                [--json out.json]

In-process, no gRPC: a ``ModelEngine`` (bf16, the embedded model, ``--weights``, ``--kv-cache``) decodes one greedy
request (a 48-token prompt, or ``--context`` tokens, EOS ignored) and every step is timed; then the parts of the
same step are timed alone, at the same shapes, in the same process:
- ``projections``: the 120 layer projections and the LM head on the padded decode rows;
- ``attention``: the step's attention plan and the 30 layers' ``attention.forward``;
- ``model``: the model forward (everything between the embedding and the final norm) and the
  LM head, so ``model - projections - attention`` is the eager glue (norms, RoPE, residuals);
- ``sampling``: ``sample()`` on the step's logits;
- ``step``: ``ModelEngine.step()``; ``step - model - sampling`` is the scheduler's bookkeeping.
The parts describe the torch model's step (``--kernels torch``, the default here); with
``--kernels native`` the step and ``model`` are the native call (engine/native/), and the other
parts still time the torch modules, for comparison.
With ``--trees``, each round runs this script once per source tree (a checkout of another
commit, e.g. ``git archive`` of main), alternating, each in a fresh process; medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PARTS = ("step", "model", "projections", "attention", "glue", "sampling", "bookkeeping")


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure(
    threads: int, steps: int, weights: str, kernels: str, context: int, kv_cache: str
) -> dict[str, float]:
    """Medians in ms of each part of a decode step (run inside the tree under test)."""
    import torch

    from reference_server.engine.batcher import ScheduledChunk
    from reference_server.engine.config import ModelEngineConfig
    from reference_server.engine.model_engine import ModelEngine
    from reference_server.engine.sampler import sample
    from reference_server.ipc import DetokenizeConfig, SamplingConfig, StoppingConfig, SubmitRequest

    # trees from before the native kernels have no such field, and run torch
    native_aware = "kernels" in ModelEngineConfig.__dataclass_fields__
    options: dict[str, str] = {"kernels": kernels} if native_aware else {}
    if kv_cache != "dense":  # trees from before the int8 KV cache know no such field
        options["kv_cache"] = kv_cache
    engine = ModelEngine(
        ModelEngineConfig(num_threads=threads, load_embedding_model=False, weights=weights, **options)
    )
    greedy = SamplingConfig(0.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0, 0)
    detokenize = DetokenizeConfig(True, True, (), False, 0)
    prompt = list(range(1000, 1000 + context))

    def submit(rid: str, max_tokens: int) -> None:
        stopping = StoppingConfig(max_tokens, 0, (), True)
        engine.add_request(SubmitRequest(rid, prompt, 1, greedy, stopping, None, detokenize))

    submit("warmup", 16)
    while engine.has_work():
        engine.step()
    submit("timed", steps + 1)
    engine.step()  # the prefill
    step_times = []
    for _ in range(steps // 2):
        start = time.perf_counter()
        engine.step()
        step_times.append(time.perf_counter() - start)
    # the running sequence, halfway: time its parts at this shape (its last KV slot is rewritten;
    # the attention plan is the one the last runner.forward made)
    group = next(iter(engine.batcher.running.values()))
    seq = group.outputs[0]
    chunk = ScheduledChunk(seq, seq.num_computed_tokens, 1, True)
    slots = torch.tensor([int(engine.kv.table.read(seq.row, seq.num_computed_tokens)[-1])])
    runner, model = engine.runner, engine.model
    logits = runner.forward([chunk], slots)
    rows, _ = engine._sample_rows([chunk])
    repeats = max(10, steps // 2)
    parts = {
        "model": median_ms(lambda: runner.forward([chunk], slots), repeats),
        "sampling": median_ms(lambda: sample(logits, rows), repeats),
    }
    x = torch.zeros(4, model.config.hidden_size, dtype=engine.dtype)
    inner = torch.zeros(4, model.config.intermediate_size, dtype=engine.dtype)

    linears = [
        (getattr(layer, name), inner if name == "down_proj" else x)
        for layer in model.layers
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    ]  # the torch model's own projections (gone in a native engine)

    def projections() -> None:
        with torch.inference_mode():
            for linear, rows in linears:
                linear(rows)
            model.compute_logits(x[:1])

    # a native engine released its torch weights: the step is the native call, nothing to split
    parts["projections"] = float("nan") if runner.native is not None else median_ms(projections, repeats)
    c = model.config
    q = torch.zeros(4, c.num_heads, c.head_dim, dtype=engine.dtype)
    kv = torch.zeros(4, c.num_kv_heads, c.head_dim, dtype=engine.dtype)

    def attention() -> None:
        with torch.inference_mode():
            for index in range(c.num_layers):
                engine.attention.forward(index, q, kv, kv)

    # a native step plans no torch attention, so there is nothing of it to time at this shape
    parts["attention"] = float("nan") if runner.native is not None else median_ms(attention, repeats)
    for _ in range(steps - steps // 2):
        start = time.perf_counter()
        engine.step()
        step_times.append(time.perf_counter() - start)
    parts["step"] = 1000 * statistics.median(step_times)
    parts["glue"] = parts["model"] - parts["projections"] - parts["attention"]
    parts["bookkeeping"] = parts["step"] - parts["model"] - parts["sampling"]
    return parts


def run_tree(tree: str, args: argparse.Namespace) -> dict[str, float]:
    command = [
        sys.executable, __file__, "--single", "--threads", str(args.threads),
        "--steps", str(args.steps), "--weights", args.weights, "--context", str(args.context),
    ]  # fmt: skip
    if args.kernels != "torch":  # trees from before the native kernels know no such option
        command += ["--kernels", args.kernels]
    if args.kv_cache != "dense":
        command += ["--kv-cache", args.kv_cache]
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(command, cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
    parts: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--weights", default="dense", choices=("dense", "q4_1", "int8"))
    parser.add_argument("--kernels", default="torch", choices=("torch", "native", "avx512", "avx2"))
    parser.add_argument("--kv-cache", default="dense", choices=("dense", "int8"))
    parser.add_argument("--context", type=int, default=48, help="prompt tokens before the timed decode")
    parser.add_argument("--trees", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.single:
        print(
            json.dumps(
                measure(args.threads, args.steps, args.weights, args.kernels, args.context, args.kv_cache)
            )
        )
        return
    trees = args.trees.split(",")
    samples: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    loads: list[float] = []
    for round_index in range(args.rounds):
        for tree in trees:
            samples[tree].append(run_tree(tree, args))
            loads.append(os.getloadavg()[0])
            print(f"round {round_index + 1} {tree}: {samples[tree][-1]}", file=sys.stderr)
    report: dict[str, Any] = {
        "context": args.context,
        "threads": args.threads,
        "load_average": statistics.median(loads),
        "trees": {},
    }
    print(
        f"context {args.context}, threads {args.threads}, load average median {statistics.median(loads):.2f} max {max(loads):.2f}"
    )
    print(f"{'tree':<40} " + " ".join(f"{p:>12}" for p in PARTS) + "   tok/s")
    for tree, rounds in samples.items():
        medians = {p: statistics.median(r[p] for r in rounds) for p in PARTS}
        report["trees"][tree] = medians
        row = " ".join(f"{medians[p]:>12.2f}" for p in PARTS)
        print(f"{tree[-40:]:<40} {row}   {1000 / medians['step']:.1f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
