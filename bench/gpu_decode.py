"""Decode tokens/s of the model engine on a CUDA GPU, beside the GPU's memory-bandwidth limit.

    python bench/gpu_decode.py [--backends sdpa,flashinfer,flashinfer-eager] [--streams 1,8,32]
                               [--tokens 128] [--random-weights DIR] [--json out.json]

In-process (no gRPC): a ``ModelEngine`` on ``cuda`` per attention backend (``flashinfer`` replays
its decode steps from CUDA graphs, ``flashinfer-eager`` does not) decodes ``--streams`` greedy
requests at once (48-token prompts, EOS ignored) and the steps after their prefill are timed. Before that, a device-to-device copy of 1 GiB measures the memory bandwidth (bytes read
and written); a one-stream decode step reads every weight once, so bandwidth / weight bytes is the
one-stream limit, printed beside each one-stream figure. Each backend also decodes a greedy
request alone and among others, and reports whether its tokens changed (a GPU engine does not
claim batch invariance; the figure says how often it holds).

``--random-weights DIR`` writes a bf16 checkpoint of the embedded model's shape with random
weights (and the tokenizer given by ``--tokenizer``) into DIR and serves that: the speed of a
step does not depend on the weights' values, and a machine without the embedded model can run it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.ipc import DetokenizeConfig, SamplingConfig, StoppingConfig, SubmitRequest
from reference_server.models.source import ModelSource, resolve_model

GREEDY = SamplingConfig(0.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0, 0)
DETOKENIZE = DetokenizeConfig(False, True, (), False, 0)
SMOLLM2_135M = {  # the embedded model's configuration (its GGUF's metadata)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0, "tie_word_embeddings": True, "vocab_size": 49152, "torch_dtype": "bfloat16",
}  # fmt: skip
PROMPT_TOKENS = 48


def write_random_checkpoint(folder: Path, tokenizer_json: Path) -> ModelSource:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    c = SMOLLM2_135M
    h, i, d = int(c["hidden_size"]), int(c["intermediate_size"]), int(c["head_dim"])  # type: ignore[call-overload]
    q, kv = int(c["num_attention_heads"]) * d, int(c["num_key_value_heads"]) * d  # type: ignore[call-overload]
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).bfloat16()

    weights = {"model.embed_tokens.weight": rand(int(c["vocab_size"]), h), "model.norm.weight": torch.ones(h)}  # type: ignore[call-overload]
    for layer in range(int(c["num_hidden_layers"])):  # type: ignore[call-overload]
        p = f"model.layers.{layer}."
        weights |= {
            p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
            p + "mlp.gate_proj.weight": rand(i, h), p + "mlp.up_proj.weight": rand(i, h),
            p + "mlp.down_proj.weight": rand(h, i),
        }  # fmt: skip
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(c))
    (folder / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    return resolve_model(folder)


def copy_bandwidth_gbps() -> float:
    """Device-to-device copy of 1 GiB, bytes read and written per second (median of 10)."""
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * source.numel() / statistics.median(times[2:]) / 1e9


def weight_bytes(engine: ModelEngine) -> int:
    """Bytes a one-stream step reads: the layers' projections and the LM head (the embedding
    lookup reads one row per token)."""
    c = engine.model.config
    element = torch.empty((), dtype=engine.dtype).element_size()
    return (c.num_layers * c.layer_parameters + c.vocab_size * c.hidden_size) * element


def prompts(count: int, vocab: int, salt: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(salt)
    return [
        torch.randint(100, vocab - 100, (PROMPT_TOKENS,), generator=generator).tolist() for _ in range(count)
    ]


def decode(engine: ModelEngine, batch: list[list[int]], tokens: int) -> tuple[float, dict[str, list[int]]]:
    """Tokens/s of the steps after every request's first token, and each request's tokens."""
    stopping = StoppingConfig(tokens, 0, (), True)
    for n, prompt in enumerate(batch):
        engine.add_request(SubmitRequest(f"r{n}", prompt, 1, GREEDY, stopping, None, DETOKENIZE))
    produced: dict[str, list[int]] = {}
    started, counted = 0.0, 0
    while engine.has_work():
        outputs = engine.step()
        torch.cuda.synchronize()
        for output in outputs:
            produced.setdefault(output.rid, []).extend(output.token_ids)
        if not started and len(produced) == len(batch):
            started = time.perf_counter()  # every request has its first token: decode from here
        elif started:
            counted += sum(len(o.token_ids) for o in outputs)
    elapsed = time.perf_counter() - started
    return counted / elapsed, produced


def measure(
    backend: str, source: ModelSource, bandwidth: float, args: argparse.Namespace
) -> dict[str, float]:
    """One engine with this backend: decode tok/s per stream count (median of the rounds, each
    count decoded once untimed first: its CUDA graph is captured there), and whether a greedy
    request's tokens are the same alone and among 15 others."""
    config = ModelEngineConfig(
        source=source, device="cuda", attention_backend=backend.removesuffix("-eager"), kv_tokens=65536,
        max_running_sequences=64, max_batch_tokens=4096, load_embedding_model=False,
        cuda_graphs=not backend.endswith("-eager"),
    )  # fmt: skip
    engine = ModelEngine(config)
    vocab = engine.model.config.vocab_size
    decode(engine, prompts(4, vocab, salt=1), 16)  # warm-up: kernels, allocator
    row: dict[str, float] = {"weight_mb": weight_bytes(engine) / 1e6}
    for streams in [int(s) for s in args.streams.split(",")]:
        decode(engine, prompts(streams, vocab, salt=streams), 4)
        rates = [
            decode(engine, prompts(streams, vocab, salt=100 * r + streams), args.tokens)[0]
            for r in range(args.rounds)
        ]
        row[f"streams={streams}"] = statistics.median(rates)
        row[f"step_ms_streams={streams}"] = 1000 * streams / row[f"streams={streams}"]
    alone = decode(engine, prompts(1, vocab, salt=7), 32)[1]["r0"]
    together = decode(engine, prompts(1, vocab, salt=7) + prompts(15, vocab, salt=8), 32)[1]["r0"]
    row["same_tokens_alone_and_batched"] = float(alone == together)
    row["one_stream_limit"] = bandwidth * 1e9 / (row["weight_mb"] * 1e6)
    graphs = engine.runner.graphs
    row["graph_sizes"] = float(len(graphs.captured_sizes)) if graphs is not None else 0.0
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="sdpa,flashinfer,flashinfer-eager")
    parser.add_argument("--streams", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--random-weights", default=None, help="serve a random checkpoint written here")
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json for --random-weights")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    if args.random_weights:
        if not args.tokenizer:
            raise SystemExit("--random-weights needs --tokenizer tokenizer.json")
        source = write_random_checkpoint(Path(args.random_weights), Path(args.tokenizer))
    else:
        source = resolve_model(None)
    bandwidth = copy_bandwidth_gbps()
    print(f"GPU: {torch.cuda.get_device_name()}, copy bandwidth {bandwidth:.0f} GB/s; model {source.path}")
    results: dict[str, dict[str, float]] = {}
    for backend in args.backends.split(","):
        if backend.removesuffix("-eager") == "flashinfer":
            try:
                import flashinfer  # noqa: F401
            except ImportError as error:
                print(f"{backend}: not installed ({error})")
                continue
        try:
            row = measure(backend, source, bandwidth, args)
        except Exception:  # one backend failing (a kernel it cannot build, say) leaves the others' rows
            print(f"{backend}: failed\n{traceback.format_exc()}")
            continue
        results[backend] = row
        cells = ", ".join(
            f"{k.removeprefix('streams=')} streams {v:.0f} tok/s"
            for k, v in row.items()
            if k.startswith("streams=")
        )
        limit = row["one_stream_limit"]
        print(
            f"{backend}: {cells}; 1 stream at {row.get('streams=1', float('nan')) / limit:.1%} of its limit "
            f"({limit:.0f} tok/s = {bandwidth:.0f} GB/s / {row['weight_mb']:.0f} MB); greedy tokens alone == "
            f"batched: {bool(row['same_tokens_alone_and_batched'])}"
        )
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"gpu": torch.cuda.get_device_name(), "copy_gbps": bandwidth, "results": results}, indent=2
            )
        )


if __name__ == "__main__":
    main()
