"""Where the reference server keeps what it builds once per machine (tokenizers, native kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$LMRPC_CACHE_DIR``, default ``~/.cache/lmrpc``."""
    return Path(os.environ.get("LMRPC_CACHE_DIR", Path.home() / ".cache" / "lmrpc"))
