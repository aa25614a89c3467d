"""Compile ``forward.c`` for an instruction set once (cached by its sources, the CPU and its tuning)
and load it.

Two builds of the same source: ``avx512`` (AVX512-BF16 and VNNI: one instruction per operation the
kernels name, isa_avx512.h) and ``avx2`` (AVX2, FMA and F16C, as most desktop and laptop CPUs and
many cloud hosts have: isa_avx2.h widens bf16 in registers and emulates the rest exactly). The
best one the CPU runs is chosen at start; either can be forced (``--kernels avx2``) to test and
measure both on one host. Without a C compiler, or on a CPU with neither, the engine runs the
torch model (``unavailable_reason`` says why).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

from reference_server.cache_dir import cache_dir
from reference_server.cpu import cpu_flags, cpu_id
from reference_server.engine.native.tuning import KernelTuning, tuning_from_environment

SOURCE = Path(__file__).with_name("forward.c")
HEADERS = tuple(SOURCE.with_name(name) for name in ("isa_avx512.h", "isa_avx2.h"))
COMPILE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-Wall")

Isa = Literal["avx512", "avx2"]
ISAS: tuple[Isa, ...] = ("avx512", "avx2")  # best first
ISA_CPU_FLAGS: dict[Isa, tuple[str, ...]] = {
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"),
    "avx2": ("avx2", "fma", "f16c"),
}
# avx2 never uses AVX-512, even on a host that has it, and nothing beyond the flags it checks (not
# x86-64-v3, whose BMI and MOVBE a hypervisor may hide)
ISA_COMPILE_FLAGS: dict[Isa, tuple[str, ...]] = {
    "avx512": ("-march=native",),
    "avx2": ("-mavx", "-mavx2", "-mfma", "-mf16c", "-mtune=native", "-DISA_AVX2"),
}


class KernelsUnavailable(RuntimeError):
    pass


def _compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise KernelsUnavailable("no C compiler (cc or gcc) on PATH")
    return compiler


def _build(compiler: str, isa: Isa, flags: frozenset[str], tuning: KernelTuning) -> Path:
    source = b"".join(path.read_bytes() for path in (SOURCE, *HEADERS))
    options = (*COMPILE_FLAGS, *ISA_COMPILE_FLAGS[isa], *tuning.compile_flags())
    key = hashlib.sha256(source + " ".join(options).encode() + " ".join(sorted(flags)).encode())
    target = cache_dir() / "native" / f"forward-{isa}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # build beside the target, then rename: servers starting together never load a half-written file
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        result = subprocess.run(
            [compiler, *options, str(SOURCE), "-o", str(built), "-lm"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise KernelsUnavailable(f"{compiler} failed on {SOURCE.name}: {result.stderr.strip()[:2000]}")
        os.replace(built, target)
    return target


@functools.cache
def kernel_tuning() -> KernelTuning:
    """This host's tuning (tuning.py), read once: every library a process loads is built with it."""
    return tuning_from_environment(cpu_id())


def missing_flags(isa: Isa) -> list[str]:
    """The CPU flags ``isa`` needs that this CPU lacks (all of them off x86-64)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return list(ISA_CPU_FLAGS[isa])
    flags = cpu_flags()
    return [flag for flag in ISA_CPU_FLAGS[isa] if flag not in flags]


def best_isa() -> Isa | None:
    """The fastest instruction set of the kernels this CPU runs, or None."""
    return next((isa for isa in ISAS if not missing_flags(isa)), None)


def choose_isa(isa: Isa | None = None) -> Isa:
    """``isa`` if this CPU runs it (None: the best one it runs), else KernelsUnavailable saying why."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise KernelsUnavailable(f"the native kernels are x86-64 only, not {platform.machine()}")
    if isa is None:
        chosen = best_isa()
        if chosen is None:
            raise KernelsUnavailable(
                f"the CPU lacks {', '.join(missing_flags('avx2'))} (the avx2 kernels' least)"
            )
        return chosen
    if missing := missing_flags(isa):
        raise KernelsUnavailable(f"the CPU lacks {', '.join(missing)} for the {isa} kernels")
    return isa


@functools.cache
def load_kernels(isa: Isa | None = None, tuning: KernelTuning | None = None) -> ctypes.CDLL:
    """The compiled library for ``isa`` (the best this CPU runs unless given; this host's tuning
    unless one is given), or KernelsUnavailable saying what is missing."""
    chosen = choose_isa(isa)
    lib = ctypes.CDLL(str(_build(_compiler(), chosen, cpu_flags(), tuning or kernel_tuning())))
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    lib.lm_pack_weight.argtypes = [pointer, pointer, integer, integer]
    lib.lm_pack_weight.restype = None
    lib.lm_matmul.argtypes = [pointer, pointer, pointer, integer, integer, integer, integer]
    lib.lm_matmul.restype = None
    lib.lm_forward.argtypes = [
        pointer, integer, pointer, pointer, integer, pointer, pointer, pointer, integer, pointer, pointer, integer,
    ]  # fmt: skip
    lib.lm_forward.restype = integer
    lib.lm_packed_bytes.argtypes = [integer, integer, integer]
    lib.lm_packed_bytes.restype = ctypes.c_size_t
    lib.lm_pack_quant.argtypes = [integer, pointer, pointer, integer, integer]
    lib.lm_pack_quant.restype = None
    lib.lm_project.argtypes = [integer, pointer, pointer, pointer, integer, integer, integer, integer]
    lib.lm_project.restype = integer
    lib.lm_unpack_column.argtypes = [integer, pointer, integer, integer, pointer]
    lib.lm_unpack_column.restype = None
    lib.lm_isa.argtypes = []
    lib.lm_isa.restype = ctypes.c_char_p
    return lib


def unavailable_reason(isa: Isa | None = None) -> str | None:
    try:
        load_kernels(isa)
    except (KernelsUnavailable, OSError, subprocess.SubprocessError) as error:
        return str(error)
    return None
