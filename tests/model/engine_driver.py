"""Drive a ModelEngine the way the scheduler process does, checking its invariants each step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from reference_server.engine.model_engine import ModelEngine
from reference_server.ipc import (
    DetokenizeConfig,
    Finish,
    SamplingConfig,
    SequenceOutput,
    StoppingConfig,
    SubmitRequest,
    TokenLogprob,
)

GREEDY = SamplingConfig(0.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0, 0)
DETOKENIZE = DetokenizeConfig(True, True, (), False, 0)


def sampling(temperature: float = 0.0, *, seed: int = 0, **options: float) -> SamplingConfig:
    base = dict(
        top_p=1.0, top_k=0, min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0
    )
    base.update(options)
    return SamplingConfig(temperature=temperature, seed=seed, **base)  # type: ignore[arg-type]


def request(
    rid: str,
    prompt: Sequence[int],
    *,
    n: int = 1,
    sampling_config: SamplingConfig = GREEDY,
    max_tokens: int = 16,
    min_tokens: int = 0,
    stop_token_ids: tuple[int, ...] = (),
    ignore_eos: bool = True,
    top_logprobs: int | None = None,
) -> SubmitRequest:
    stopping = StoppingConfig(max_tokens, min_tokens, stop_token_ids, ignore_eos)
    return SubmitRequest(rid, list(prompt), n, sampling_config, stopping, top_logprobs, DETOKENIZE)


@dataclass
class Result:
    tokens: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    finishes: dict[tuple[str, int], Finish] = field(default_factory=dict)
    logprobs: dict[tuple[str, int], list[TokenLogprob]] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)
    steps: int = 0

    def record(self, out: SequenceOutput) -> None:
        key = (out.rid, out.output_index)
        assert key not in self.finishes, f"output {key} emitted after its finish"
        self.tokens.setdefault(key, []).extend(out.token_ids)
        if out.logprobs is not None:
            assert len(out.logprobs) == len(out.token_ids)
            self.logprobs.setdefault(key, []).extend(out.logprobs)
        if out.cached_prompt_tokens is not None:
            assert out.rid not in self.cached, f"{out.rid} reported cached_prompt_tokens twice"
            self.cached[out.rid] = out.cached_prompt_tokens
        if out.finish is not None:
            self.finishes[key] = out.finish


def run(engine: ModelEngine, arrivals: dict[int, list[SubmitRequest]], *, max_steps: int = 10_000) -> Result:
    """Add each request at its step, step until idle, check KV integrity after every step."""
    result = Result()
    pending = dict(arrivals)
    step = 0
    while pending or engine.has_work():
        for req in pending.pop(step, []):
            engine.add_request(req)
        if engine.has_work():
            for out in engine.step():
                result.record(out)
        engine.check_integrity()
        step += 1
        assert step < max_steps, "engine made no progress"
    result.steps = step
    assert_idle(engine)
    return result


def assert_idle(engine: ModelEngine) -> None:
    engine.check_integrity()
    load = engine.load(paused=False)
    assert (
        load.running_sequences,
        load.waiting_sequences,
        load.kv_tokens_in_use,
        load.requests_in_engine,
    ) == (
        0,
        0,
        0,
        0,
    ), load
    assert engine.kv.reserved == 0
