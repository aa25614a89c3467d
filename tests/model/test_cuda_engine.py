"""The engine on a GPU with each attention backend (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from engine_driver import request, run

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.models.tokenizer import TokenizerBundle

pytestmark = [
    pytest.mark.model,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("backend", ["sdpa", "flashinfer"])
def test_generates_on_cuda(backend: str, tokenizer: TokenizerBundle) -> None:
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    engine = ModelEngine(
        ModelEngineConfig(
            device="cuda", attention_backend=backend, kv_tokens=4096, load_embedding_model=False
        )
    )
    assert engine.attention.name == backend
    prompt = tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    others = [request(f"o{i}", prompt[: 10 + i], max_tokens=8) for i in range(6)]
    result = run(
        engine,
        {
            0: [request("france", prompt, max_tokens=12), *others],
            2: [request("n", prompt, n=3, max_tokens=6)],
        },
    )
    assert "Paris" in tokenizer.decode(result.tokens[("france", 0)])
    assert result.tokens[("n", 0)] == result.tokens[("n", 1)] == result.tokens[("n", 2)]
