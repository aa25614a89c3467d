"""The engine with quantized weights (``q4_1``: the Q4_1 GGUF's layer weights kept 4-bit, in torch's
int4 kernel or the native one; ``int8``, native only) or an int8 KV cache (native only): the same
batch invariance as the dense engine, and the model still answers; the native kernels' avx2 build
too (forced on an AVX-512 host), dense included. The int8 KV cache holds the codes of the very
rows a dense cache holds."""

from __future__ import annotations

import pytest
import torch
from engine_driver import request, run, sampling

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.engine.native.kernels import unavailable_reason
from reference_server.models.int4_linear import Int4Linear
from reference_server.models.llama import Released
from reference_server.models.tokenizer import TokenizerBundle

pytestmark = pytest.mark.model
KERNELS_MISSING = unavailable_reason()


@pytest.mark.parametrize(
    ("weights", "kv_cache", "kernels"),
    [
        ("q4_1", "dense", "torch"),
        ("q4_1", "dense", "native"),
        ("int8", "dense", "native"),
        ("dense", "int8", "native"),
        ("q4_1", "dense", "avx2"),  # on an AVX-512 host too: the build AVX2-only hosts run
        ("dense", "dense", "avx2"),
        ("dense", "int8", "avx2"),
    ],
)
def test_quantized_engine_is_batch_invariant_and_answers(
    tokenizer: TokenizerBundle, weights: str, kv_cache: str, kernels: str
) -> None:
    if (
        kernels != "torch"
        and (why := unavailable_reason(None if kernels == "native" else "avx2")) is not None
    ):
        pytest.skip(f"no {kernels} kernels: {why}")
    engine = ModelEngine(
        ModelEngineConfig(
            kv_tokens=4096,
            max_running_sequences=8,
            max_batch_tokens=64,
            load_embedding_model=False,
            weights=weights,
            kv_cache=kv_cache,
            kernels=kernels,
        )
    )
    native = engine.runner.native
    if kernels == "torch":
        assert native is None and isinstance(engine.model.layers[0].qkv_proj, Int4Linear)
    else:
        assert (
            native is not None
            and native.layer_format == {"dense": "bf16", "q4_1": "q4_1", "int8": "q8_0"}[weights]
        )
        assert isinstance(engine.model.layers[0].qkv_proj, Released)  # only the packed copies stay
        assert kernels == "native" or native.isa == kernels
        # the embedded GGUF's own token embedding is Q8_0
        assert native.head_format == ("bf16" if weights == "dense" else "q8_0")
        assert engine.kv.pool.k[0].dtype == (torch.int8 if kv_cache == "int8" else torch.bfloat16)

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


def test_an_int8_kv_cache_holds_the_codes_of_the_dense_caches_rows(tokenizer: TokenizerBundle) -> None:
    """Layer 0's keys and values come before any attention, so both caches get the same rows: the
    int8 one keeps round(x * 127 / max|x|) of each token's row per KV head, and max|x| / 127."""
    if KERNELS_MISSING is not None:
        pytest.skip(f"no native kernels: {KERNELS_MISSING}")
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Name three primary colors."}])
    pools = {}
    for kv_cache in ("dense", "int8"):
        engine = ModelEngine(
            ModelEngineConfig(kv_tokens=256, load_embedding_model=False, kernels="native", kv_cache=kv_cache)
        )
        run(engine, {0: [request("colors", prompt, max_tokens=1)]})  # writes the prompt's K/V only
        pools[kv_cache] = engine.kv.pool
    dense, coded = pools["dense"], pools["int8"]
    n = len(prompt)  # a fresh engine's first slots, in the same order in both
    for rows, planes, plane_scales in (
        (dense.k[0], coded.k[0], coded.k_scales[0]),
        (dense.v[0], coded.v[0], coded.v_scales[0]),
    ):
        x = rows[:n].float()  # [slots, kv heads, head_dim]; the int8 pool keeps a plane per KV head
        codes, scales = planes.transpose(0, 1), plane_scales.transpose(0, 1)
        largest = x.abs().amax(dim=-1)
        assert torch.equal(scales[:n], largest / 127)
        # a true division, as the kernels': 127 / tensor is torch's reciprocal times 127
        inverse = torch.where(largest > 0, torch.full_like(largest, 127) / largest, torch.zeros_like(largest))
        assert torch.equal(codes[:n].float(), torch.round(x * inverse[..., None]))
        assert not codes[n:].any()
