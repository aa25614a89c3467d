"""What this CPU is and can do, read once from /proc/cpuinfo: who made it (vendor, family, model:
the microarchitecture kernels are tuned for), its instruction-set flags, and whether it multiplies
bfloat16 natively (oneDNN's bf16 GEMM needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT; without
them torch emulates bf16 several times slower than float32, and oneDNN refuses to prepack it)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

BF16_GEMM_FLAG_SETS = (frozenset({"avx512bw", "avx512vl", "avx512dq"}), frozenset({"avx_ne_convert"}))


@dataclass(frozen=True, slots=True)
class CpuId:
    vendor: str  # "GenuineIntel", "AuthenticAMD", "" when unknown
    family: int
    model: int
    name: str

    def __str__(self) -> str:
        return f"{self.name or 'unknown CPU'} ({self.vendor or '?'} family {self.family} model {self.model})"


@functools.cache
def _first_processor() -> dict[str, str]:
    """The fields of the first processor in /proc/cpuinfo (every core of a host is the same kind)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _integer(text: str | None) -> int:
    try:
        return int(text or "", 0)
    except ValueError:
        return -1


@functools.cache
def cpu_id() -> CpuId:
    fields = _first_processor()
    return CpuId(
        vendor=fields.get("vendor_id", ""),
        family=_integer(fields.get("cpu family")),
        model=_integer(fields.get("model")),
        name=fields.get("model name", ""),
    )


@functools.cache
def cpu_flags() -> frozenset[str]:
    return frozenset(_first_processor().get("flags", "").split())


def bf16_gemm_native() -> bool:
    """Whether oneDNN runs bfloat16 matmuls on this CPU natively (and can prepack their weights)."""
    flags = cpu_flags()
    return any(needed <= flags for needed in BF16_GEMM_FLAG_SETS)
