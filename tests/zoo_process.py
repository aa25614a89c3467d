"""Start a mutant zoo (a test process serving one port per mutant) and read its ports.

A zoo writes ``{mutant: port}`` to the file named by ``--ready-file`` once every port listens; the
file lives in a temporary folder that is gone again as soon as the ports are read."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class ZooStartError(RuntimeError):
    pass


def start_zoo(
    module: str, *args: str, timeout_s: float = 120.0
) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """Run ``python -m module *args --ready-file F`` and wait for its ports."""
    with tempfile.TemporaryDirectory(prefix="lmrpc-zoo-") as folder:
        ready = Path(folder) / "ports.json"
        zoo = subprocess.Popen(
            [sys.executable, "-m", module, *args, "--ready-file", str(ready)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        give_up = time.monotonic() + timeout_s
        while not ready.exists():
            if zoo.poll() is not None or time.monotonic() > give_up:
                zoo.kill()
                zoo.wait()
                raise ZooStartError(f"the mutant zoo {module} did not start (exit code {zoo.returncode})")
            time.sleep(0.05)
        return zoo, json.loads(ready.read_text())
