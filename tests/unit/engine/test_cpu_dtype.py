"""The CPU's instruction set decides the torch model's default dtype: a CPU without native bf16 GEMMs
(AVX2 only, as on many AMD EPYC hosts) runs it in float32, because torch emulates bf16 there several
times slower and oneDNN refuses to prepack bf16 weights at all (the server died at start-up before).
The native kernels run bf16 there (test_kernel_isa.py)."""

from __future__ import annotations

import pytest
import torch

from reference_server import cpu
from reference_server.engine.config import ModelEngineConfig
from reference_server.models.packed_linear import prepack_supported

AVX2 = frozenset({"fma", "avx", "f16c", "avx2"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


@pytest.mark.parametrize(
    ("flags", "dtype", "packs"), [(AVX2, torch.float32, False), (AVX512, torch.bfloat16, True)]
)
def test_default_cpu_dtype_follows_native_bf16(
    monkeypatch: pytest.MonkeyPatch, flags: frozenset[str], dtype: torch.dtype, packs: bool
) -> None:
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    config = ModelEngineConfig(load_embedding_model=False, kernels="torch")
    assert config.torch_dtype(torch.device("cpu")) == dtype
    assert prepack_supported(torch.device("cpu"), torch.bfloat16) is (
        packs and torch.backends.mkldnn.is_available()
    )


def test_quantized_weights_keep_bf16_without_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "cpu_flags", lambda: AVX2)
    config = ModelEngineConfig(load_embedding_model=False, weights="q4_1")
    assert config.torch_dtype(torch.device("cpu")) == torch.bfloat16


def test_an_explicit_dtype_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "cpu_flags", lambda: AVX2)
    assert (
        ModelEngineConfig(load_embedding_model=False, dtype="bfloat16").torch_dtype(torch.device("cpu"))
        == torch.bfloat16
    )
