"""The engine in float32 against a straightforward reference: transformers' LlamaForCausalLM
built from the same config and the same dequantized GGUF weights (full recompute each token)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from engine_driver import request, run

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.models.loader import load_weights
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import TokenizerBundle

pytestmark = pytest.mark.model
transformers = pytest.importorskip("transformers")

# notes/model.md: 30 greedy tokens of the chat prompt, EOS ignored, float32
EXPECTED_FRANCE = [504, 3575, 282, 4649, 314, 7042, 30, 2, 198, 2, 1, 9690, 198, 2, 198]
EXPECTED_FRANCE += [1, 4093, 198, 57, 5248, 3946, 288, 7198, 253, 725, 1406, 281, 260, 2342, 30]
NUM_TOKENS = 30


def hf_model(transformers_module: Any) -> Any:
    """transformers' LlamaForCausalLM in float32 with the embedded model's dequantized weights."""
    config, weights = load_weights(resolve_model(None))
    hf_config = transformers_module.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_context_tokens,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=config.tie_embeddings,
    )
    model = transformers_module.LlamaForCausalLM(hf_config).eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert unexpected == [] and missing == ["lm_head.weight"]  # tied to the embeddings
    return model


def oracle_greedy(prompt: list[int], num_tokens: int) -> tuple[list[int], list[float]]:
    model = hf_model(transformers)
    tokens: list[int] = []
    logprobs: list[float] = []
    past, feed = None, list(prompt)
    with torch.inference_mode():
        for _ in range(num_tokens):
            out = model(torch.tensor([feed]), past_key_values=past, use_cache=True)
            logits, past = out.logits[0, -1].float(), out.past_key_values
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            tokens.append(token)
            feed = [token]
    return tokens, logprobs


def test_float32_greedy_matches_transformers(tokenizer: TokenizerBundle) -> None:
    prompt = tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    engine = ModelEngine(ModelEngineConfig(dtype="float32", kv_tokens=2048, load_embedding_model=False))
    result = run(engine, {0: [request("france", prompt, max_tokens=NUM_TOKENS, top_logprobs=0)]})
    del engine
    tokens = result.tokens[("france", 0)]
    assert "Paris" in tokenizer.decode(tokens)
    expected, expected_logprobs = oracle_greedy(prompt, NUM_TOKENS)
    assert tokens == expected
    assert tokens == EXPECTED_FRANCE
    got_logprobs = [lp.logprob for lp in result.logprobs[("france", 0)]]
    assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(got_logprobs, expected_logprobs, strict=True))
