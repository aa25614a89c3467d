"""A tiny random Llama written as a Hugging Face directory loads through the HF path and runs,
and greedy-decodes like transformers does on the same directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from engine_driver import request, run
from safetensors.torch import save_file

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import TokenizerBundle, load_tokenizer

pytestmark = pytest.mark.model

CONFIG = {
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


def write_checkpoint(folder: Path, tokenizer: TokenizerBundle) -> None:
    gen = torch.Generator().manual_seed(0)
    c, vocab = CONFIG, tokenizer.vocab_size
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
    (folder / "config.json").write_text(json.dumps(CONFIG | {"vocab_size": vocab, "torch_dtype": "float32"}))
    tokenizer.tokenizer.save(str(folder / "tokenizer.json"))


def test_tiny_hf_llama_runs_and_matches_transformers(tmp_path: Path, tokenizer: TokenizerBundle) -> None:
    write_checkpoint(tmp_path, tokenizer)
    source = resolve_model(tmp_path)
    assert source.kind == "hf"
    assert load_tokenizer(source).eos_token_ids == (2,)
    engine = ModelEngine(
        ModelEngineConfig(
            source=source, dtype="float32", kv_tokens=1024, max_running_sequences=4, max_batch_tokens=64,
            load_embedding_model=False,
        )
    )  # fmt: skip
    info = engine.info()
    assert (info.model_id, info.max_context_tokens, info.eos_token_ids) == (tmp_path.name, 512, [2])
    prompt = tokenizer.encode("Hello there, tiny model!")
    result = run(
        engine, {0: [request("tiny", prompt, max_tokens=10), request("n2", prompt, n=2, max_tokens=4)]}
    )
    tokens = result.tokens[("tiny", 0)]
    assert len(tokens) == 10 and result.tokens[("n2", 0)] == tokens[:4] == result.tokens[("n2", 1)]

    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    feed, expected = list(prompt), []
    with torch.inference_mode():
        for _ in range(10):
            expected.append(int(model(torch.tensor([feed])).logits[0, -1].argmax()))
            feed.append(expected[-1])
    assert tokens == expected
