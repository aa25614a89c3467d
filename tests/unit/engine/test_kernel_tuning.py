"""The kernels' weight prefetch, chosen per microarchitecture (reference_server/engine/native/tuning.py)."""

from __future__ import annotations

import pytest

from reference_server.cpu import CpuId
from reference_server.engine.native.tuning import AHEAD, tuning_for

ZEN_4 = CpuId("AuthenticAMD", 0x19, 0x11, "AMD EPYC 9R14")
XEON = CpuId("GenuineIntel", 6, 207, "Intel(R) Xeon(R) Processor")


def test_zen_reads_bf16_without_software_prefetch_and_keeps_it_for_blocks() -> None:
    tuning = tuning_for(ZEN_4)
    assert (tuning.bf16_prefetch, tuning.quant_prefetch) == (0, AHEAD)
    assert "-DPREFETCH_BF16=0" in tuning.compile_flags()
    assert "bf16 off" in str(tuning) and "Zen" in str(tuning)


def test_intel_and_unknown_hosts_prefetch_both_formats() -> None:
    for cpu in (XEON, CpuId("", -1, -1, "")):
        tuning = tuning_for(cpu)
        assert (tuning.bf16_prefetch, tuning.quant_prefetch) == (AHEAD, AHEAD)


def test_the_override_replaces_only_what_it_names() -> None:
    tuning = tuning_for(XEON, "bf16=0")
    assert (tuning.bf16_prefetch, tuning.quant_prefetch) == (0, AHEAD)
    tuning = tuning_for(ZEN_4, "bf16=4096, quant=16384")
    assert (tuning.bf16_prefetch, tuning.quant_prefetch) == (4096, 16384)
    assert "LMRPC_KERNEL_PREFETCH" in tuning.why


@pytest.mark.parametrize("bad", ["bf16", "fp8=64", "bf16=-64", "bf16=100", "quant=4194304", "bf16=1e3"])
def test_a_bad_override_is_refused_naming_the_variable(bad: str) -> None:
    with pytest.raises(ValueError, match="LMRPC_KERNEL_PREFETCH"):
        tuning_for(XEON, bad)
