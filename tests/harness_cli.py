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


def assert_fields_covered(*field_files: Path) -> str:
    """``conformance coverage`` on the field files of runs (``conformance run --fields``): every field of
    each protocol's schema covered, n/a with its reason or a listed open gap; its summary lines."""
    import subprocess

    done = subprocess.run(
        [*harness_command(), "coverage", *map(str, field_files)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"fields no case covers:\n{done.stdout}{done.stderr}"
    return done.stdout
