"""The built distributions and their clean environments (dist.py): scripts/test.sh builds them
once and says where in ``$LMRPC_DIST``; a test run without it builds them here, once a session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .dist import ENVIRONMENTS, Dist, build


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    folder = os.environ.get("LMRPC_DIST")
    if folder:
        built = Dist(Path(folder))
        missing = [name for name in ENVIRONMENTS if not (built.venv(name) / "bin" / "python").exists()]
        assert not missing, f"LMRPC_DIST={folder} lacks {missing}: run python -m tests.install.dist"
        return built
    return build(tmp_path_factory.mktemp("dist"))
