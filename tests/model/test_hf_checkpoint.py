"""A tiny random Llama written as a Hugging Face directory loads through the HF path and runs,
and greedy-decodes like transformers does on the same directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_driver import request, run, write_tiny_checkpoint

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import TokenizerBundle, load_tokenizer

pytestmark = pytest.mark.model


def test_tiny_hf_llama_runs_and_matches_transformers(tmp_path: Path, tokenizer: TokenizerBundle) -> None:
    write_tiny_checkpoint(tmp_path, tokenizer)
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
