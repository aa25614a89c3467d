"""The engine on a GPU with each attention backend (skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_driver import request, run, write_negated_checkpoint

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.models.source import resolve_model
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


def test_cuda_graphs_replay_the_eager_steps(tokenizer: TokenizerBundle) -> None:
    """Decode steps replayed from graphs give the tokens eager steps give: 3 sequences run in the
    4-row graph (the padding row repeats the last one), then 1 in the 1-row graph."""
    pytest.importorskip("flashinfer")
    prompt = tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])

    def generate(cuda_graphs: bool) -> tuple[ModelEngine, dict[tuple[str, int], list[int]]]:
        engine = ModelEngine(
            ModelEngineConfig(
                device="cuda", attention_backend="flashinfer", kv_tokens=4096,
                load_embedding_model=False, cuda_graphs=cuda_graphs,
            )
        )  # fmt: skip
        others = [request(f"o{i}", prompt[: 12 + i], max_tokens=6) for i in range(2)]
        return engine, run(engine, {0: [request("france", prompt, max_tokens=16), *others]}).tokens

    graphed_engine, graphed = generate(True)
    eager_engine, eager = generate(False)
    assert graphed_engine.runner.graphs is not None and eager_engine.runner.graphs is None
    assert graphed_engine.runner.graphs.captured_sizes == [1, 4]
    assert graphed == eager
    assert "Paris" in tokenizer.decode(graphed[("france", 0)])


def test_cuda_graphs_follow_a_weight_update(tokenizer: TokenizerBundle, tmp_path: Path) -> None:
    """A captured graph reads the weights it was captured with: after an update, the graphed
    steps must give what an engine started on the new weights gives."""
    pytest.importorskip("flashinfer")
    write_negated_checkpoint(tmp_path, tokenizer)
    prompt = tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])

    def engine(source: str | None) -> ModelEngine:
        return ModelEngine(
            ModelEngineConfig(
                source=resolve_model(source), device="cuda", attention_backend="flashinfer",
                kv_tokens=4096, load_embedding_model=False,
            )
        )  # fmt: skip

    updated = engine(None)
    before = run(updated, {0: [request("a", prompt, max_tokens=8)]}).tokens[("a", 0)]
    updated.update_weights(resolve_model(tmp_path))
    after = run(updated, {0: [request("b", prompt, max_tokens=8)]}).tokens[("b", 0)]
    fresh = run(engine(str(tmp_path)), {0: [request("c", prompt, max_tokens=8)]}).tokens[("c", 0)]
    assert after == fresh != before
