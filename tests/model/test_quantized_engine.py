"""The engine with quantized weights (``q4_1``: the Q4_1 GGUF's layer weights kept 4-bit, in torch's
int4 kernel or the native one; ``int8``, native only): the same batch invariance as the dense
engine, and the model still answers."""

from __future__ import annotations

import pytest
from engine_driver import request, run, sampling

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.engine.native.kernels import unavailable_reason
from reference_server.models.int4_linear import Int4Linear
from reference_server.models.llama import Released
from reference_server.models.tokenizer import TokenizerBundle

pytestmark = pytest.mark.model
KERNELS_MISSING = unavailable_reason()


@pytest.mark.parametrize(("weights", "kernels"), [("q4_1", "torch"), ("q4_1", "native"), ("int8", "native")])
def test_quantized_engine_is_batch_invariant_and_answers(
    tokenizer: TokenizerBundle, weights: str, kernels: str
) -> None:
    if kernels == "native" and KERNELS_MISSING is not None:
        pytest.skip(f"no native kernels: {KERNELS_MISSING}")
    engine = ModelEngine(
        ModelEngineConfig(
            kv_tokens=4096,
            max_running_sequences=8,
            max_batch_tokens=64,
            load_embedding_model=False,
            weights=weights,
            kernels=kernels,
        )
    )
    native = engine.runner.native
    if kernels == "torch":
        assert native is None and isinstance(engine.model.layers[0].qkv_proj, Int4Linear)
    else:
        assert native is not None and native.layer_format == {"q4_1": "q4_1", "int8": "q8_0"}[weights]
        assert isinstance(engine.model.layers[0].qkv_proj, Released)  # only the packed copies stay
        assert native.head_format == "q8_0"  # the embedded GGUF's own token embedding is Q8_0

    def chat(text: str) -> list[int]:
        return tokenizer.encode_chat([{"role": "user", "content": text}])

    greedy = request("greedy", chat("What is the capital of France?"), max_tokens=12)
    seeded = request("seeded", chat("Write a haiku about the sea."), sampling_config=sampling(0.9, seed=7))
    alone_greedy = run(engine, {0: [greedy]}).tokens[("greedy", 0)]
    alone_seeded = run(engine, {0: [seeded]}).tokens[("seeded", 0)]
    engine.flush_cache()
    others = [
        request("long", chat(" ".join(f"Item {i}: a fox." for i in range(40))), max_tokens=6),
        request("n2", chat("Name three primary colors."), n=2, sampling_config=sampling(1.0, seed=5)),
        request("short", [1, 2, 3], max_tokens=9),
    ]
    batched = run(engine, {0: others[:2], 1: [greedy, others[2]], 3: [seeded]})
    assert batched.tokens[("greedy", 0)] == alone_greedy
    assert batched.tokens[("seeded", 0)] == alone_seeded
    assert "Paris" in tokenizer.decode(alone_greedy)
