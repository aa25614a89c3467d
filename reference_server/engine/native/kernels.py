"""Compile ``forward.c`` for this CPU once (cached by its source, the CPU and its tuning) and load it.

The kernels need an x86-64 CPU with AVX512-BF16 and a C compiler; without either the engine
runs the torch model (``unavailable_reason`` says why).
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

from reference_server.cache_dir import cache_dir
from reference_server.cpu import cpu_flags, cpu_id
from reference_server.engine.native.tuning import KernelTuning, tuning_from_environment

SOURCE = Path(__file__).with_name("forward.c")
REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512_bf16")
COMPILE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-Wall")


class KernelsUnavailable(RuntimeError):
    pass


def _compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise KernelsUnavailable("no C compiler (cc or gcc) on PATH")
    return compiler


def _build(compiler: str, flags: frozenset[str], tuning: KernelTuning) -> Path:
    source = SOURCE.read_bytes()
    options = (*COMPILE_FLAGS, *tuning.compile_flags())
    key = hashlib.sha256(source + " ".join(options).encode() + " ".join(sorted(flags)).encode())
    target = cache_dir() / "native" / f"forward-{key.hexdigest()[:16]}.so"
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


@functools.cache
def load_kernels(tuning: KernelTuning | None = None) -> ctypes.CDLL:
    """The compiled library (this host's tuning unless one is given), or KernelsUnavailable saying
    what is missing."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise KernelsUnavailable(f"the native kernels are x86-64 only, not {platform.machine()}")
    flags = cpu_flags()
    missing = [f for f in REQUIRED_CPU_FLAGS if f not in flags]
    if missing:
        raise KernelsUnavailable(f"the CPU lacks {', '.join(missing)}")
    lib = ctypes.CDLL(str(_build(_compiler(), flags, tuning or kernel_tuning())))
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
    return lib


def unavailable_reason() -> str | None:
    try:
        load_kernels()
    except (KernelsUnavailable, OSError, subprocess.SubprocessError) as error:
        return str(error)
    return None
