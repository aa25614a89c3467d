"""Keep the CPU engine's freed memory for reuse instead of handing it back to the kernel.

A long prefill allocates and frees the same few-MB attention temporaries thousands of times.
glibc serves blocks above its mmap threshold with fresh mappings and trims the heap's top after
each free, so every one of those blocks comes back as new pages: one page fault (and a zeroed
page) per 4 KiB, ~1.2 M faults for an 8,000-token prompt. Fixing both thresholds keeps such
blocks on the heap, where a free makes them reusable at once; the cost is that the process keeps
its peak heap (a few hundred MB) after the prompt ends.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger("lmrpc.engine")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest; blocks above it are mapped (and faulted) anyway
TRIM_THRESHOLD_BYTES = 1 << 30


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the kernel once (after loading, whose float32 copies of
    the checkpoint the kept heap would otherwise hold for the process's life)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
        trim(0)


def keep_freed_memory() -> bool:
    """Set the thresholds on glibc (True); elsewhere (musl, macOS) change nothing (False)."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if not done:
        log.info("mallopt refused the heap thresholds; freed memory goes back to the kernel")
    return done
