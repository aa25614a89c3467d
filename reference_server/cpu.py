"""What this CPU can do, read once from /proc/cpuinfo: its instruction-set flags, and whether it
multiplies bfloat16 natively (oneDNN's bf16 GEMM needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT; without
them torch emulates bf16 several times slower than float32, and oneDNN refuses to prepack it)."""

from __future__ import annotations

import functools
from pathlib import Path

BF16_GEMM_FLAG_SETS = (frozenset({"avx512bw", "avx512vl", "avx512dq"}), frozenset({"avx_ne_convert"}))


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def bf16_gemm_native() -> bool:
    """Whether oneDNN runs bfloat16 matmuls on this CPU natively (and can prepack their weights)."""
    flags = cpu_flags()
    return any(needed <= flags for needed in BF16_GEMM_FLAG_SETS)
