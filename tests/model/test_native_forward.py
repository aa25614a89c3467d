"""The native forward pass (reference_server/engine/native), in each instruction set this CPU runs
(avx2 on an AVX-512 host too): its matmul against float64, its rows and threads invariance, its
tokens against transformers in float32, a token's numbers being the same whether it was decoded,
prefilled in a chunk, or taken from the prefix cache; and the avx2 kernels computing the very
numbers of the avx512 ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from engine_driver import assert_idle, request, run

from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.model_engine import ModelEngine
from reference_server.engine.native.kernels import ISAS, Isa, load_kernels, unavailable_reason
from reference_server.engine.native.model import FORMAT_CODES, PANEL, unsupported_reason
from reference_server.engine.native.tuning import KernelTuning
from reference_server.models.llama import LlamaConfig
from reference_server.models.quantized import BlockFormat, BlockWeight, quantize
from reference_server.models.tokenizer import TokenizerBundle

pytestmark = pytest.mark.model
MISSING = {isa: unavailable_reason(isa) for isa in ISAS}
EACH_ISA = pytest.mark.parametrize(
    "isa",
    [
        pytest.param(isa, marks=pytest.mark.skipif(why is not None, reason=f"no {isa} kernels: {why}"))
        for isa, why in MISSING.items()
    ],
)


def native_matmul(
    weight: torch.Tensor, x: torch.Tensor, isa: Isa, threads: int = 1, tuning: KernelTuning | None = None
) -> torch.Tensor:
    lib = load_kernels(isa, tuning)
    n, k = weight.shape
    packed = torch.empty((-(-n // PANEL) * PANEL, k), dtype=torch.bfloat16)
    lib.lm_pack_weight(weight.data_ptr(), packed.data_ptr(), n, k)
    y = torch.empty((x.shape[0], n), dtype=torch.float32)
    lib.lm_matmul(packed.data_ptr(), x.data_ptr(), y.data_ptr(), x.shape[0], n, k, threads)
    return y


@EACH_ISA
def test_matmul_rows_do_not_change_with_the_batch_or_the_threads(isa: Isa) -> None:
    generator = torch.Generator().manual_seed(7)
    # 200 outputs: three full panels and a partial one; 45 rows: 7 full register tiles of avx512 and
    # one of 3, or avx2's blocks of 32 and 13 rows sharing widened weights; 48 k pairs: a span of 32
    # widened at a time and one of 16
    weight = torch.randn((200, 96), generator=generator).bfloat16()
    x = torch.randn((45, 96), generator=generator).bfloat16()
    together = native_matmul(weight, x, isa)
    alone = torch.cat([native_matmul(weight, x[i : i + 1].contiguous(), isa) for i in range(45)])
    assert torch.equal(together, alone)
    assert torch.equal(together, native_matmul(weight, x, isa, threads=2))
    exact = x.double() @ weight.double().T
    assert torch.allclose(together.double(), exact, rtol=1e-5, atol=1e-4)


def packed_blocks(
    weight: BlockWeight, isa: Isa, tuning: KernelTuning | None = None
) -> tuple[torch.Tensor, int]:
    lib, code = load_kernels(isa, tuning), FORMAT_CODES[weight.format]
    packed = torch.empty(lib.lm_packed_bytes(code, weight.rows, weight.columns), dtype=torch.uint8)
    lib.lm_pack_quant(code, weight.blocks.ctypes.data, packed.data_ptr(), weight.rows, weight.columns)
    return packed, code


def quantized_matmul(
    weight: BlockWeight, x: torch.Tensor, isa: Isa, threads: int = 1, tuning: KernelTuning | None = None
) -> torch.Tensor:
    packed, code = packed_blocks(weight, isa, tuning)
    y = torch.empty((x.shape[0], weight.rows), dtype=torch.float32)
    status = load_kernels(isa, tuning).lm_project(
        code, packed.data_ptr(), x.data_ptr(), y.data_ptr(), x.shape[0], weight.rows, weight.columns, threads
    )
    assert status == 0
    return y


@EACH_ISA
@pytest.mark.parametrize("format", ["q4_1", "q8_0"])
def test_quantized_matmul_is_the_dequantized_weights_in_float64(format: BlockFormat, isa: Isa) -> None:
    """The codes become bf16 in registers and each group's sum is scaled once: no weight is
    rounded, so the products are those of GGUF's own dequantized values, to float32 sums."""
    generator = torch.Generator().manual_seed(11)
    # 200 outputs: three full panels and a partial one; 37 rows: blocks of 32 and 5 sharing unpacked
    # codes (quant_rows), against each row alone in a register tile (quant_tile)
    weight = quantize(torch.randn((200, 96), generator=generator) * 0.05, format)
    if format == "q8_0":  # the ends of the int8 range, which quantize() never writes, in every vector
        blocks = weight.blocks.reshape(200, 3, 34)
        blocks[::5, :, 2::7], blocks[2::5, :, 5::9] = 0x80, 0x7F
    x = torch.randn((37, 96), generator=generator).bfloat16()
    together = quantized_matmul(weight, x, isa)
    alone = torch.cat([quantized_matmul(weight, x[i : i + 1].contiguous(), isa) for i in range(37)])
    assert torch.equal(together, alone)
    assert torch.equal(together, quantized_matmul(weight, x, isa, threads=2))
    values = weight.dequantized().double()
    exact = x.double() @ values.T
    scale = x.double().abs() @ values.abs().T  # the size of the sum's terms
    assert float(((together.double() - exact).abs() / scale).max()) < 1e-6
    # a column read back (a tied head's embedding row) is the GGUF value exactly
    packed, code = packed_blocks(weight, isa)
    column = torch.empty(96, dtype=torch.float32)
    for n in (0, 63, 64, 199):
        load_kernels(isa).lm_unpack_column(code, packed.data_ptr(), n, 96, column.data_ptr())
        assert torch.equal(column, values[n].float())


@EACH_ISA
def test_the_weight_prefetch_never_changes_a_number(isa: Isa) -> None:
    """Each host's tuning (tuning.py) moves only when weights are requested, never what is summed."""
    generator = torch.Generator().manual_seed(5)
    # long enough rows that the requests run ahead inside a panel: 8 KB is 16 of its 512-byte pairs
    weight = torch.randn((130, 1536), generator=generator)
    x = torch.randn((7, 1536), generator=generator).bfloat16()
    off, ahead = KernelTuning(0, 0, "off"), KernelTuning(8192, 8192, "8 KB")
    assert torch.equal(
        native_matmul(weight.bfloat16(), x, isa, tuning=off),
        native_matmul(weight.bfloat16(), x, isa, tuning=ahead),
    )
    for format in ("q4_1", "q8_0"):
        blocks = quantize(weight * 0.05, format)
        assert torch.equal(
            quantized_matmul(blocks, x, isa, tuning=off), quantized_matmul(blocks, x, isa, tuning=ahead)
        )


SETTINGS = {
    "dense": ("dense", "dense"),
    "q4_1": ("q4_1", "dense"),
    "int8": ("int8", "dense"),
    "int8-kv": ("dense", "int8"),
}


@pytest.fixture(
    scope="module",
    params=[(isa, name) for isa in ISAS for name in SETTINGS],
    ids=[f"{isa}-{name}" for isa in ISAS for name in SETTINGS],
)
def engine(request: pytest.FixtureRequest) -> Iterator[ModelEngine]:
    """The native engine in each instruction set, with each weight format and with an int8 KV cache
    (the module's tests run once per setting)."""
    isa, name = request.param
    if MISSING[isa] is not None:
        pytest.skip(f"no {isa} kernels: {MISSING[isa]}")
    weights, kv_cache = SETTINGS[name]
    config = ModelEngineConfig(
        kv_tokens=4096, load_embedding_model=False, kernels=isa, weights=weights, kv_cache=kv_cache
    )
    engine = ModelEngine(config)
    assert engine.runner.native is not None and engine.runner.native.isa == isa
    yield engine


def chat(tokenizer: TokenizerBundle, text: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": text}])


def test_native_greedy_tokens_are_the_float32_models_choices(
    engine: ModelEngine, tokenizer: TokenizerBundle
) -> None:
    transformers = pytest.importorskip("transformers")
    from test_greedy_oracle import hf_model

    prompt = chat(tokenizer, "What is the capital of France?")
    result = run(engine, {0: [request("france", prompt, max_tokens=30, top_logprobs=0)]})
    tokens = result.tokens[("france", 0)]
    assert "Paris" in tokenizer.decode(tokens)
    model = hf_model(transformers)
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1 :].float()
    reference = torch.log_softmax(logits, dim=-1)
    chosen = reference.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    # every token is the float32 model's choice or within bf16 noise of it, and the reported
    # logprob is the float32 one within bf16 noise: a wrong rotation, mask or norm is far off both.
    # An int8 KV cache's own noise (~1 % relative error on the keys) fits too: 0.06 nats at most here.
    assert float((reference.max(dim=-1).values - chosen).max()) < 0.2
    reported = torch.tensor([lp.logprob for lp in result.logprobs[("france", 0)]])
    assert float((reported - chosen).abs().max()) < 0.2


def test_threads_do_not_change_native_tokens(engine: ModelEngine, tokenizer: TokenizerBundle) -> None:
    native = engine.runner.native
    assert native is not None
    prompt = chat(tokenizer, "Write a haiku about the sea.")
    one = run(engine, {0: [request("one", prompt, max_tokens=20, top_logprobs=0)]})
    native.threads = 2
    try:
        two = run(engine, {0: [request("two", prompt, max_tokens=20, top_logprobs=0)]})
    finally:
        native.threads = 1
    assert one.tokens[("one", 0)] == two.tokens[("two", 0)]
    assert one.logprobs[("one", 0)] == two.logprobs[("two", 0)]


LONG_QUESTION = "Summarize this: " + " ".join(
    f"item {i} is a {('red', 'green', 'blue')[i % 3]} box;" for i in range(40)
)


@pytest.mark.parametrize("question", ["Name three primary colors.", LONG_QUESTION], ids=["short", "long"])
def test_a_token_is_the_same_decoded_prefilled_or_cached(
    engine: ModelEngine, tokenizer: TokenizerBundle, question: str
) -> None:
    """A decode row reads its keys straight from the pool (every KV head in lockstep, values in spans
    of 64 keys); a prompt chunk gathers them first. The long question (over 300 tokens) crosses many
    blocks and spans."""
    engine.flush_cache()
    prompt = chat(tokenizer, question)
    decoded = run(engine, {0: [request("decoded", prompt, max_tokens=12, top_logprobs=0)]})
    answer = decoded.tokens[("decoded", 0)]
    engine.flush_cache()
    # the prompt plus the first 8 answer tokens, prefilled in one chunk: the next token and its
    # logprob are those of the 9th decode step, bit for bit
    fed = prompt + answer[:8]
    prefilled = run(engine, {0: [request("prefilled", fed, max_tokens=1, top_logprobs=0)]})
    cached = run(engine, {0: [request("cached", fed, max_tokens=1, top_logprobs=0)]})
    assert cached.cached["cached"] == len(fed) - 1
    for result, rid in ((prefilled, "prefilled"), (cached, "cached")):
        assert result.tokens[(rid, 0)] == [answer[8]]
        assert result.logprobs[(rid, 0)][0] == decoded.logprobs[("decoded", 0)][8]
    assert_idle(engine)


def test_out_of_range_ids_and_positions_are_refused_before_anything_is_written(engine: ModelEngine) -> None:
    native = engine.runner.native
    assert native is not None
    config = engine.model.config
    before = engine.kv.pool.k[0][0].clone()
    for token_id, position in ((config.vocab_size, 0), (-1, 0), (1, config.max_context_tokens)):
        with pytest.raises(ValueError, match="out of range"):
            native.forward([token_id], [position], [0, 1], [0], torch.tensor([0]), [0])
    assert torch.equal(engine.kv.pool.k[0][0], before)


def test_unsupported_settings_say_why(tokenizer: TokenizerBundle) -> None:
    config = LlamaConfig.__new__(LlamaConfig)  # unsupported_reason reads the device and dtype first
    assert "bfloat16 on the CPU" in str(unsupported_reason(config, torch.device("cpu"), torch.float32))
    with pytest.raises(ValueError, match="kernels='native' cannot run here"):
        ModelEngine(
            ModelEngineConfig(dtype="float32", kv_tokens=256, load_embedding_model=False, kernels="native")
        )
    with pytest.raises(ValueError, match=r"int8 weights run only in the native kernels.*--kernels torch"):
        ModelEngine(
            ModelEngineConfig(kv_tokens=256, load_embedding_model=False, weights="int8", kernels="torch")
        )
    with pytest.raises(ValueError, match=r"kv_cache='int8' runs only in the native kernels.*--kernels torch"):
        ModelEngine(
            ModelEngineConfig(kv_tokens=256, load_embedding_model=False, kv_cache="int8", kernels="torch")
        )
    odd = LlamaConfig(2, 64, 128, 2, 1, 48, 10000.0, 1e-5, 100, 64, True)
    assert "head_dim=48 is not a multiple of 64 for an int8 KV cache" in str(
        unsupported_reason(odd, torch.device("cpu"), torch.bfloat16, kv_cache="int8")
    )


def documented_pairs(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x w^T summed as vdpbf16ps is documented to sum it: per pair of inputs in order, the second
    product added, then the first, each sum rounded to float32 (a bf16 product is exact in it)."""
    w, inputs = weight.float(), x.float()
    y = torch.zeros((x.shape[0], weight.shape[0]))
    for k in range(0, weight.shape[1], 2):
        y = y + inputs[:, k + 1 : k + 2] * w[:, k + 1]
        y = y + inputs[:, k : k + 1] * w[:, k]
    return y


PROBE = torch.Generator().manual_seed(13)
PROBE_WEIGHT = torch.randn((64, 96), generator=PROBE).bfloat16()
PROBE_X = torch.randn((3, 96), generator=PROBE).bfloat16()


def avx512_sums_as_documented() -> bool:
    """Whether this CPU's vdpbf16ps gives its documented sums (an Intel Xeon does); the avx2 build
    writes those, so only then do both builds promise the same numbers."""
    return torch.equal(
        native_matmul(PROBE_WEIGHT, PROBE_X, "avx512"), documented_pairs(PROBE_WEIGHT, PROBE_X)
    )


def skip_unless_both_builds_sum_alike() -> None:
    if any(MISSING.values()):
        pytest.skip("the CPU runs only one of the instruction sets")
    if not avx512_sums_as_documented():
        pytest.skip(
            "this CPU's vdpbf16ps rounds otherwise than its documented two sums: the builds may differ in the last bits"
        )


@EACH_ISA
def test_the_bf16_matmul_sums_as_vdpbf16ps_is_documented(isa: Isa) -> None:
    """The avx2 build's contract everywhere; the avx512 build's where the CPU keeps the documented
    order and roundings (else the avx512 case says so and skips)."""
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn((130, 576), generator=generator).bfloat16()
    x = torch.randn((9, 576), generator=generator).bfloat16()
    if isa == "avx512" and not avx512_sums_as_documented():
        pytest.skip("this CPU's vdpbf16ps rounds otherwise than its documented two sums")
    assert torch.equal(native_matmul(weight, x, isa), documented_pairs(weight, x))


@pytest.mark.parametrize("name", ["dense", "q4_1-int8-kv"])
def test_the_avx2_kernels_compute_the_numbers_of_the_avx512_ones(
    tokenizer: TokenizerBundle, name: str
) -> None:
    """vdpbf16ps adds a pair's second product, then its first, each rounded once: the avx2 kernels'
    two FMAs on bf16 widened in registers are the same operations, every other step is exact or
    the same instruction, and the sums run in the same order: a prompt chunk and decode rows in one
    step give the same tokens and logprobs in both, bit for bit."""
    skip_unless_both_builds_sum_alike()
    weights, kv_cache = ("dense", "dense") if name == "dense" else ("q4_1", "int8")
    long, short = chat(tokenizer, LONG_QUESTION), chat(tokenizer, "Name three primary colors.")
    results = {}
    for isa in ISAS:
        config = ModelEngineConfig(
            kv_tokens=2048,
            max_running_sequences=8,
            max_batch_tokens=64,
            load_embedding_model=False,
            kernels=isa,
            weights=weights,
            kv_cache=kv_cache,
        )
        # the short request decodes while the long one's prompt is prefilled in chunks beside it
        results[isa] = run(
            ModelEngine(config),
            {
                0: [request("short", short, max_tokens=16, top_logprobs=2)],
                2: [request("long", long, max_tokens=8, top_logprobs=2)],
            },
        )
    for key in (("short", 0), ("long", 0)):
        assert results["avx2"].tokens[key] == results["avx512"].tokens[key]
        assert results["avx2"].logprobs[key] == results["avx512"].logprobs[key]


@pytest.mark.parametrize("format", ["bf16", "q4_1", "q8_0"])
def test_the_avx2_matmul_is_the_avx512_one_bit_for_bit(format: str) -> None:
    skip_unless_both_builds_sum_alike()
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn((130, 576), generator=generator)
    x = torch.randn((9, 576), generator=generator).bfloat16()
    if format == "bf16":
        avx512, avx2 = (native_matmul(weight.bfloat16(), x, isa) for isa in ISAS)
    else:
        blocks = quantize(weight * 0.05, format)  # type: ignore[arg-type]
        avx512, avx2 = (quantized_matmul(blocks, x, isa) for isa in ISAS)
    assert torch.equal(avx2, avx512)
