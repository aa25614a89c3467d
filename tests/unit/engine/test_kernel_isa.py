"""Which instruction set the native kernels run in (reference_server/engine/native/kernels.py): the
best one the CPU's flags allow, or the one ``--kernels`` forces; a CPU that lacks what is forced is
told which flags are missing; and the avx2 build holds no AVX-512 instruction, so forcing it on an
AVX-512 host runs what an AVX2-only host runs."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from reference_server import cpu
from reference_server.cli import parse_args
from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.native import kernels
from reference_server.engine.native.kernels import KernelsUnavailable, best_isa, choose_isa

AVX2 = frozenset({"avx", "avx2", "fma", "f16c"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni"}
SSE = frozenset({"sse4_2"})


@pytest.fixture
def flags(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(kernels.platform, "machine", lambda: "x86_64")
    return monkeypatch


def with_flags(monkeypatch: pytest.MonkeyPatch, cpu_flags: frozenset[str]) -> None:
    monkeypatch.setattr(kernels, "cpu_flags", lambda: cpu_flags)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: cpu_flags)


def test_the_best_instruction_set_the_cpu_runs_is_chosen(flags: pytest.MonkeyPatch) -> None:
    with_flags(flags, AVX512)
    assert best_isa() == choose_isa() == "avx512"
    assert choose_isa("avx2") == "avx2"  # forced: AVX-512 hosts run AVX2 too
    with_flags(flags, AVX2)
    assert best_isa() == choose_isa() == "avx2"
    with_flags(flags, SSE)
    assert best_isa() is None


def test_a_cpu_without_what_is_asked_is_told_which_flags_it_lacks(flags: pytest.MonkeyPatch) -> None:
    with_flags(flags, AVX2)
    with pytest.raises(
        KernelsUnavailable,
        match=r"lacks avx512f, avx512bw, avx512vl, avx512_bf16, avx512_vnni for the avx512",
    ):
        choose_isa("avx512")
    with_flags(flags, SSE)
    with pytest.raises(KernelsUnavailable, match="lacks avx2, fma, f16c"):
        choose_isa()


def test_an_avx2_host_runs_bf16_in_the_native_kernels_and_float32_in_torch(flags: pytest.MonkeyPatch) -> None:
    """bf16 GEMMs are emulated in torch there (float32 is faster), but the avx2 kernels widen bf16
    in registers: the default dtype follows whichever runs the steps."""
    with_flags(flags, AVX2)
    cpu_device = torch.device("cpu")
    assert ModelEngineConfig(load_embedding_model=False).torch_dtype(cpu_device) == torch.bfloat16
    assert (
        ModelEngineConfig(load_embedding_model=False, kernels="avx2").torch_dtype(cpu_device)
        == torch.bfloat16
    )
    assert (
        ModelEngineConfig(load_embedding_model=False, kernels="torch").torch_dtype(cpu_device)
        == torch.float32
    )
    with_flags(flags, SSE)
    assert ModelEngineConfig(load_embedding_model=False).torch_dtype(cpu_device) == torch.float32


def test_the_option_names_each_instruction_set(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--kernels", "avx2"]).engine.kernels == "avx2"
    assert parse_args(["--kernels", "avx512"]).engine.kernels == "avx512"
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    kernels_help = capsys.readouterr().out.split("--kernels", 1)[1].split("\n  --", 1)[0]
    assert "avx2" in kernels_help and "avx512" in kernels_help
    assert ModelEngineConfig(load_embedding_model=False, kernels="avx2").kernel_isa() == "avx2"
    assert ModelEngineConfig(load_embedding_model=False, kernels="native").kernel_isa() is None
    with pytest.raises(ValueError, match="kernels='avx3' must be one of auto, native, avx512, avx2, torch"):
        ModelEngineConfig(load_embedding_model=False, kernels="avx3")


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump")
def test_the_avx2_build_holds_no_avx512_instruction() -> None:
    if (why := kernels.unavailable_reason("avx2")) is not None:
        pytest.skip(f"no avx2 kernels here: {why}")
    library = kernels.load_kernels("avx2")
    assert library.lm_isa() == b"avx2"
    listing = subprocess.run(
        ["objdump", "-d", library._name], capture_output=True, text=True, check=True
    ).stdout
    assert "ymm" in listing  # it is vectorized at all
    assert "zmm" not in listing and "%k1" not in listing  # no 512-bit register, no mask register
