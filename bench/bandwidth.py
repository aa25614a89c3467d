"""This machine's memory read bandwidth, the limit of a memory-bound decode step.

    python bench/bandwidth.py [--threads 1,2] [--megabytes 1024] [--repeats 5]

A one-stream decode step reads every weight once, so tokens/s can be at most the read bandwidth
divided by the bytes of weights read per token; ``bench/anchors.py`` prints each one-stream figure
as a fraction of that limit. The probe sums a buffer far larger than the caches with plain C,
compiled for this CPU with OpenMP (``bandwidth.c``); the best of ``--repeats`` passes is reported,
in GB/s (10^9 bytes per second).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_server.cache_dir import cache_dir

SOURCE = Path(__file__).with_name("bandwidth.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


@functools.cache
def _library() -> ctypes.CDLL:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    target = cache_dir() / "bench" / f"bandwidth-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            built = Path(scratch) / target.name
            subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], check=True, timeout=120)
            os.replace(built, target)
    lib = ctypes.CDLL(str(target))
    lib.lm_read_words.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.lm_read_words.restype = ctypes.c_uint64
    return lib


def read_bandwidth_gbps(threads: int, megabytes: int = 1024, repeats: int = 5) -> float:
    """The best of ``repeats`` passes over a ``megabytes`` buffer read by ``threads`` threads, in GB/s."""
    words = np.ones(megabytes * 2**20 // 8, dtype=np.uint64)  # written once: every page is backed
    lib = _library()
    pointer = words.ctypes.data
    lib.lm_read_words(pointer, words.size, threads)  # a first pass warms the threads and the TLB
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        total = lib.lm_read_words(pointer, words.size, threads)
        best = min(best, time.perf_counter() - started)
        if total != words.size:
            raise RuntimeError(f"the probe summed {total}, not {words.size}: it did not read every word")
    return words.nbytes / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", default=f"1,{os.cpu_count() or 1}", help="thread counts to measure")
    parser.add_argument("--megabytes", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for threads in sorted({int(t) for t in args.threads.split(",")}):
        gbps = read_bandwidth_gbps(threads, args.megabytes, args.repeats)
        print(f"read bandwidth, {threads} thread(s): {gbps:.1f} GB/s")


if __name__ == "__main__":
    main()
