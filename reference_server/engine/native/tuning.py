"""How far ahead the kernels request the weights they are about to read, per microarchitecture.

A one-row matmul streams its weights once; on its own the hardware's prefetcher kept that stream at
about half the memory's bandwidth on an Intel Xeon, and software requests 8 KB ahead nearly doubled
it (4-bit panels 14.3 -> 6.8 ms a step, bf16 26.1 -> 21.0 ms). On AMD Zen 4 the same bf16 requests
cost a third of the step (16.5 -> 21.8 ms), while its 4-bit steps kept their lead with them. So the
distance is chosen from the CPU's identity at start, per weight format, and printed in the log;
``LMRPC_KERNEL_PREFETCH`` (``bf16=BYTES,quant=BYTES``, either part) overrides it to measure another
choice on any host (0 turns a format's requests off). The numbers a step computes never depend on it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from reference_server.cpu import CpuId

OVERRIDE_ENV = "LMRPC_KERNEL_PREFETCH"
AHEAD = 8192  # bytes: what won on the Intel host it was measured on
ZEN_FAMILIES = range(0x17, 0x20)  # Zen, Zen 2 (0x17), Zen 3 and Zen 4 (0x19), Zen 5 (0x1A)


@dataclass(frozen=True, slots=True)
class KernelTuning:
    bf16_prefetch: int  # bytes of bf16 weight panels requested ahead of their use; 0: none
    quant_prefetch: int  # the same for q4_1 / q8_0 blocks
    why: str

    def compile_flags(self) -> tuple[str, ...]:
        return (f"-DPREFETCH_BF16={self.bf16_prefetch}", f"-DPREFETCH_QUANT={self.quant_prefetch}")

    def __str__(self) -> str:
        def ahead(n: int) -> str:
            return f"{n} B ahead" if n else "off"

        return f"weight prefetch bf16 {ahead(self.bf16_prefetch)}, 4/8-bit {ahead(self.quant_prefetch)} ({self.why})"


def tuning_for(cpu: CpuId, override: str | None = None) -> KernelTuning:
    """The tuning for ``cpu``, then ``override`` (the environment variable's syntax) on top."""
    if cpu.vendor == "AuthenticAMD" and cpu.family in ZEN_FAMILIES:
        chosen = KernelTuning(0, AHEAD, f"AMD Zen, family {cpu.family:#x}")
    else:
        chosen = KernelTuning(AHEAD, AHEAD, f"{cpu.vendor or 'unknown vendor'}, family {cpu.family}")
    return _overridden(chosen, override) if override else chosen


def tuning_from_environment(cpu: CpuId) -> KernelTuning:
    return tuning_for(cpu, os.environ.get(OVERRIDE_ENV) or None)


def _overridden(tuning: KernelTuning, override: str) -> KernelTuning:
    values: dict[str, int] = {}
    for part in override.split(","):
        key, _, number = part.strip().partition("=")
        if key not in ("bf16", "quant") or not number.strip().isdigit():
            raise ValueError(f"{OVERRIDE_ENV}={override!r}: want bf16=BYTES,quant=BYTES (either part)")
        values[key] = int(number)
        if values[key] % 64 or values[key] > 1 << 20:
            raise ValueError(
                f"{OVERRIDE_ENV}: {key}={values[key]} must be whole 64-byte lines, at most 1 MiB"
            )
    return replace(
        tuning,
        bf16_prefetch=values.get("bf16", tuning.bf16_prefetch),
        quant_prefetch=values.get("quant", tuning.quant_prefetch),
        why=f"{OVERRIDE_ENV}={override}",
    )
