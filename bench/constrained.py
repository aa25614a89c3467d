"""Constrained decoding's price: decode tokens/s of unconstrained streams, of JSON-Schema-constrained
streams, and of both in one batch, measured side by side in one run on the real model.

    python bench/constrained.py [--concurrency 1,8] [--seconds 6] [--rounds 3] [--threads N] [--json out.json]

c streams each send greedy requests back to back, straight into ``ModelEngine.step()`` in this
process (the scheduler's compile thread and IPC are not what is measured): the same chat prompts,
the same max_tokens (spread over [mean/2, 3*mean/2)), ignore_eos. Constrained requests carry a
schema whose documents are longer than max_tokens (a list of 12 people), so they also end
LENGTH and both kinds do the same work but for the grammar: a token mask per output per step
(llguidance), applied in the sampler, and the sampled token fed back.

Settings, each after a warm-up: ``plain``: c unconstrained streams (the unconstrained path);
``constrained``: c constrained streams; ``mixed`` (c >= 2): half of each in one batch (every step
serves both, so each stream of either kind gets the same tokens/s: what a constraint costs its
neighbours is its setting's total against ``plain``'s). Settings alternate within each round;
medians over rounds. Each setting also reports its median step and the part of it outside the
forward pass (batching, masks, sampling: where constraints cost), which a busy machine sways far
less than the model's own time.

Also reported, as CPU time: the schema's compile time, cold and from the cache; the grammar's
work per constrained token (its mask, then feeding it the token), replayed over a generated
output, and over a fixed text of each other kind of constraint (``REPLAYS``); ``sample()`` for c
rows with and without masks; and the only work the unconstrained path gained, the sampler's look
for masks (``_apply_masks``). Only ``GrammarCompiler``'s public surface is used, so the same file
measures another tree's grammar engine (copy it into that tree's bench/).

On a machine shared with other jobs, pass ``--threads 1`` (see bench/engine.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.constraints import Grammar, GrammarCompiler
from reference_server.engine.model_engine import ModelEngine
from reference_server.engine.sampler import SampleRow, _apply_masks, sample
from reference_server.ipc import Constraint, DetokenizeConfig, SamplingConfig, StoppingConfig, SubmitRequest
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import load_tokenizer

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city"],
}
PEOPLE = json.dumps({"type": "array", "items": PERSON, "minItems": 12, "maxItems": 12})
ASK = "Request {i}: list twelve people as JSON, each with a name, an age and a city."
# a constraint of each other kind and a text it accepts, replayed token by token (cpu_costs)
REPLAYS = {
    "json_object": (
        Constraint("json_object"),
        '{"id": 7, "tags": ["a", "b"], "note": "The quick brown fox jumps over the lazy dog."}',
    ),
    "regex": (
        Constraint("regex", r"[A-Z][a-z]+ [0-9]{3}-[0-9]{4}, [a-z]+@[a-z]+\.com"),
        "Ann 555-0123, ann@mail.com",
    ),
    "choice": (Constraint("choice", choices=("red", "green", "blue", "dark red")), "dark red"),
    "ebnf sum": (
        Constraint("ebnf", 'root ::= "(" num (" + " num)* ")"\nnum ::= [1-9] [0-9]*'),
        "(12 + 30 + 7 + 1234)",
    ),
    "ebnf words": (
        Constraint("ebnf", 'root ::= word (" " word)* "."\nword ::= [a-z]+'),
        "the quick brown fox jumps over the lazy dog.",
    ),
    "ebnf line": (
        Constraint("ebnf", 'root ::= [^\\n]* "\\n"'),
        "The quick brown fox jumps over the lazy dog, twice.\n",
    ),
}
GREEDY = SamplingConfig(0.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0, 0)
DETOKENIZE = DetokenizeConfig(False, True, (), False, 0)


@dataclass
class Sample:
    setting: str
    round: int
    plain_tokens_per_s: float  # tokens of unconstrained outputs
    constrained_tokens_per_s: float
    step_ms: float  # median engine.step()
    outside_forward_ms: float  # median of a step less its forward pass: batching, masks, sampling


class ForwardClock:
    """Times the forward pass inside each engine.step(), so the rest of a step (where the grammar
    works) can be told apart from the model, whose time swings with a busy machine."""

    def __init__(self, engine: ModelEngine) -> None:
        self.seconds = 0.0
        forward = engine.runner.forward

        def timed(*args: Any) -> Any:
            began = time.perf_counter()
            try:
                return forward(*args)
            finally:
                self.seconds += time.perf_counter() - began

        engine.runner.forward = timed  # type: ignore[method-assign]


def tokens_for(i: int, mean: int) -> int:
    return mean // 2 + (i * 37) % mean


def load(
    engine: ModelEngine,
    clock: ForwardClock,
    prompts: list[list[int]],
    grammar: Grammar,
    streams: tuple[int, int],
    max_tokens: int,
    warmup: float,
    seconds: float,
) -> tuple[float, float, float, float]:
    """(unconstrained tokens/s, constrained tokens/s, step ms, outside-forward ms) of ``streams`` =
    (plain, constrained) concurrent streams."""
    counter = itertools.count()
    constrained_rids: set[str] = set()
    counts = [0, 0]

    def submit(constrained: bool) -> None:
        i = next(counter)
        rid = f"r{i}"
        stopping = StoppingConfig(tokens_for(i, max_tokens), 0, (), True)
        request = SubmitRequest(
            rid, prompts[i % len(prompts)], 1, GREEDY, stopping, None, DETOKENIZE,
            constraint=Constraint("json_schema", PEOPLE) if constrained else None,
        )  # fmt: skip
        if constrained:
            constrained_rids.add(rid)
        engine.add_request(request, grammar if constrained else None)

    for constrained, count in enumerate(streams):
        for _ in range(count):
            submit(bool(constrained))
    start = time.perf_counter()
    window = (start + warmup, start + warmup + seconds)
    steps: list[float] = []
    outside: list[float] = []
    while time.perf_counter() < window[1]:
        clock.seconds = 0.0
        began = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        if window[0] <= began:
            steps.append(now - began)
            outside.append(now - began - clock.seconds)
        for out in outputs:
            constrained = out.rid in constrained_rids
            if window[0] <= now:
                counts[constrained] += len(out.token_ids)
            if out.finish is not None:
                constrained_rids.discard(out.rid)
                submit(constrained)
    for rid in list(engine.batcher.running) + [g.rid for g in engine.batcher.waiting]:
        engine.abort_request(rid)
    return (
        counts[0] / seconds,
        counts[1] / seconds,
        1000 * statistics.median(steps),
        1000 * statistics.median(outside),
    )


def generated_tokens(engine: ModelEngine, prompt: list[int], grammar: Grammar, max_tokens: int) -> list[int]:
    stopping = StoppingConfig(max_tokens, 0, (), True)
    constraint = Constraint("json_schema", PEOPLE)
    engine.add_request(
        SubmitRequest("probe", prompt, 1, GREEDY, stopping, None, DETOKENIZE, constraint=constraint), grammar
    )
    tokens: list[int] = []
    while engine.has_work():
        tokens += [t for out in engine.step() for t in out.token_ids]
    return tokens


def median_us(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return 1e6 * statistics.median(times)


def replay(grammar: Grammar, tokens: list[int]) -> None:
    matcher = grammar.matcher()
    for token_id in tokens:
        matcher.allowed_tokens()
        matcher.accept(token_id)


def cpu_costs(
    compiler: GrammarCompiler,
    grammar: Grammar,
    tokens: list[int],
    vocab: int,
    concurrency: list[int],
    encode: Callable[[str], list[int]],
) -> dict[str, float]:
    """Microseconds: the grammar's work per token (the schema's, then each replay's), and the
    sampler's with and without masks."""
    costs = {"grammar per token": median_us(partial(replay, grammar, tokens), 5) / len(tokens)}
    for kind, (constraint, text) in REPLAYS.items():
        ids = encode(text)
        per_text = median_us(partial(replay, compiler.compile(constraint), ids), 5)
        costs[f"  {kind} per token"] = per_text / len(ids)
    mask = grammar.matcher().allowed_tokens()
    for c in concurrency:
        logits = torch.randn(c, vocab)
        plain = [SampleRow(i, GREEDY, None, [], [], (), None) for i in range(c)]
        constrained = [SampleRow(i, GREEDY, None, [], [], (), None, mask) for i in range(c)]
        costs[f"sample() c={c} plain"] = median_us(partial(sample, logits, plain), 200)
        costs[f"sample() c={c} constrained"] = median_us(partial(sample, logits, constrained), 200)
        costs[f"mask check c={c} plain"] = median_us(partial(_apply_masks, logits, logits, plain), 2000)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--seconds", type=float, default=6.0, help="measurement window per setting")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each window")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating settings (noise)")
    parser.add_argument("--max-tokens", type=int, default=64, help="mean max_tokens per request")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    source = resolve_model(None)
    tokenizer = load_tokenizer(source)
    prompts = [tokenizer.encode_chat([{"role": "user", "content": ASK.format(i=i)}]) for i in range(32)]
    engine = ModelEngine(
        ModelEngineConfig(
            source=source, kv_tokens=16384, max_running_sequences=max(16, 2 * max(concurrency)),
            load_embedding_model=False,
        )
    )  # fmt: skip
    compiler = GrammarCompiler(tokenizer, engine.info().vocab_size)
    began = time.perf_counter()
    grammar = compiler.compile(Constraint("json_schema", PEOPLE))
    cold_ms = 1000 * (time.perf_counter() - began)
    began = time.perf_counter()
    compiler.compile(Constraint("json_schema", PEOPLE))
    cached_ms = 1000 * (time.perf_counter() - began)
    print(
        f"schema compiled in {cold_ms:.1f} ms ({cached_ms:.3f} ms from the cache); "
        f"{torch.get_num_threads()} torch threads, window {args.seconds}s after {args.warmup}s warm-up, "
        f"max_tokens ~{args.max_tokens}"
    )
    tokens = generated_tokens(engine, prompts[0], grammar, 2 * args.max_tokens)
    costs = cpu_costs(compiler, grammar, tokens, engine.info().vocab_size, concurrency, tokenizer.encode)
    for name, us in costs.items():
        print(f"{name:<28} {us:9.1f} us")
    clock = ForwardClock(engine)
    samples: list[Sample] = []
    for r in range(args.rounds):
        for c in concurrency:
            for setting, streams in settings(c):
                sample = Sample(
                    setting,
                    r,
                    *load(
                        engine, clock, prompts, grammar, streams, args.max_tokens, args.warmup, args.seconds
                    ),
                )
                samples.append(sample)
                print(
                    f"  round {r}: {setting:<18} plain {sample.plain_tokens_per_s:7.1f} tok/s  constrained "
                    f"{sample.constrained_tokens_per_s:7.1f} tok/s  step {sample.step_ms:6.2f} ms  outside the "
                    f"forward pass {sample.outside_forward_ms:6.3f} ms"
                )
    medians = report(samples, concurrency)
    print(f"load average during the run: {os.getloadavg()[0]:.2f} (this machine has {os.cpu_count()} cores)")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "compile_ms": cold_ms,
                    "cpu_us": costs,
                    "samples": [asdict(s) for s in samples],
                    "medians": medians,
                },
                indent=2,
            )
        )


def settings(c: int) -> list[tuple[str, tuple[int, int]]]:
    """(name, (unconstrained streams, constrained streams)) of concurrency c."""
    result = [(f"plain c={c}", (c, 0)), (f"constrained c={c}", (0, c))]
    if c >= 2:
        result.append((f"mixed c={c}", (c // 2, c - c // 2)))
    return result


def report(samples: list[Sample], concurrency: list[int]) -> dict[str, list[float]]:
    by_setting: dict[str, list[Sample]] = {}
    for s in samples:
        by_setting.setdefault(s.setting, []).append(s)
    rounds = len(samples) // len(by_setting)
    print(
        f"\n{'setting':<18} {'plain tok/s':>12} {'constrained tok/s':>18} {'total':>8} {'step ms':>8} "
        f"{'outside forward ms':>19}   (medians of {rounds} rounds)"
    )
    medians: dict[str, list[float]] = {}
    for setting, runs in by_setting.items():
        plain = statistics.median(s.plain_tokens_per_s for s in runs)
        constrained = statistics.median(s.constrained_tokens_per_s for s in runs)
        total = statistics.median(s.plain_tokens_per_s + s.constrained_tokens_per_s for s in runs)
        step = statistics.median(s.step_ms for s in runs)
        outside = statistics.median(s.outside_forward_ms for s in runs)
        medians[setting] = [plain, constrained, total, step, outside]
        print(
            f"{setting:<18} {plain:>12.1f} {constrained:>18.1f} {total:>8.1f} {step:>8.2f} {outside:>19.3f}"
        )
    print()
    for c in concurrency:
        base = medians[f"plain c={c}"][2]
        outside = medians[f"plain c={c}"][4]
        ratios = [
            f"{name.split()[0]} {medians[name][2] / base:.2f}x tokens/s, "
            f"{medians[name][4] - outside:+.3f} ms per step outside the forward pass"
            for name, _ in settings(c)[1:]
        ]
        print(f"c={c} against plain: {'; '.join(ratios)}")
    return medians


if __name__ == "__main__":
    main()
