"""The CPU engine keeps freed heap memory: a burst of large temporaries, freed and allocated again,
must not come back as fresh pages (an 8,000-token prefill took ~1.2 M page faults without it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import resource, sys
    import torch
    from reference_server.engine.host_memory import keep_freed_memory

    kept = sys.argv[1] == "keep" and keep_freed_memory()

    def burst():
        blocks = [torch.ones(3 << 20) for _ in range(4)]  # 4 x 12 MB alive at once, then freed
        del blocks

    burst(); burst()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        burst()
    print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(mode: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], check=True, capture_output=True, text=True, timeout=120
    ).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_temporaries_are_reused_without_page_faults() -> None:
    kept, faults = _faults("keep")
    assert kept, "keep_freed_memory() did not set glibc's thresholds"
    # 20 bursts of 48 MB are 245,760 fresh 4 KiB pages. glibc's default got ~128,000-245,000
    # faults here in some runs and ~12,000 in others (its adaptive mmap threshold), so the
    # default is no baseline; the setting must keep every run near the ~12,000 floor.
    fresh_pages = 20 * 4 * (12 << 20) // 4096
    assert faults * 5 < fresh_pages, f"{faults} page faults for {fresh_pages} pages of temporaries"
