"""Drive a ModelEngine the way the scheduler process does, checking its invariants each step."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

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
from reference_server.models.loader import load_weights
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import TokenizerBundle

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


TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def write_tiny_checkpoint(folder: Path, tokenizer: TokenizerBundle) -> None:
    """A 2-layer random Llama as a Hugging Face directory (safetensors, config, tokenizer)."""
    gen = torch.Generator().manual_seed(0)
    c, vocab = TINY_CONFIG, tokenizer.vocab_size
    h, i, d = int(c["hidden_size"]), int(c["intermediate_size"]), int(c["head_dim"])
    q, kv = int(c["num_attention_heads"]) * d, int(c["num_key_value_heads"]) * d

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.3

    weights = {
        "model.embed_tokens.weight": rand(vocab, h),
        "lm_head.weight": rand(vocab, h),
        "model.norm.weight": torch.ones(h),
    }
    for layer in range(int(c["num_hidden_layers"])):
        p = f"model.layers.{layer}."
        weights |= {
            p + "input_layernorm.weight": 1 + rand(h),
            p + "post_attention_layernorm.weight": 1 + rand(h),
            p + "self_attn.q_proj.weight": rand(q, h),
            p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h),
            p + "self_attn.o_proj.weight": rand(h, q),
            p + "mlp.gate_proj.weight": rand(i, h),
            p + "mlp.up_proj.weight": rand(i, h),
            p + "mlp.down_proj.weight": rand(h, i),
        }
    save_file(weights, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(
        json.dumps(TINY_CONFIG | {"vocab_size": vocab, "torch_dtype": "float32"})
    )
    tokenizer.tokenizer.save(str(folder / "tokenizer.json"))


def write_negated_checkpoint(folder: Path, tokenizer: TokenizerBundle) -> None:
    """The embedded model's own weights with the final norm negated (every logit flips sign, so
    greedy decoding picks other tokens), as a Hugging Face directory."""
    source = resolve_model(None)
    config, weights = load_weights(source)
    weights["model.norm.weight"] = -weights["model.norm.weight"]
    save_file(
        {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in weights.items()},
        str(folder / "model.safetensors"),
    )
    hf_config = {
        "model_type": "llama",
        "num_hidden_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_context_tokens,
        "tie_word_embeddings": config.tie_embeddings,
    }
    (folder / "config.json").write_text(json.dumps(hf_config))
    tokenizer.tokenizer.save(str(folder / "tokenizer.json"))
