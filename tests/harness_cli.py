"""``conformance`` as the tests run it: the wheel's, from the harness-only environment that
scripts/test.sh builds (``$LMRPC_DIST``, tests/install/dist.py), so every suite the tests run is
also a run of what users install; else this checkout's, for a test run by hand."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def harness_command() -> list[str]:
    dist = os.environ.get("LMRPC_DIST")
    if dist:
        program = Path(dist) / "harness" / "bin" / "conformance"
        if not program.exists():
            raise FileNotFoundError(
                f"LMRPC_DIST={dist} has no harness environment: run python -m tests.install.dist"
            )
        return [str(program)]
    return [sys.executable, "-m", "conformance"]
