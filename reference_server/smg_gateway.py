"""Run the smg gateway (``smg launch``, PyPI package ``smg``) in front of reference servers, for
tests and benchmarks.

    with ServerProcess() as a, ServerProcess() as b, SmgGateway([a.target, b.target]) as gateway:
        client = OpenAI(base_url=gateway.base_url, api_key="none")

smg finds the workers' protocol itself (the vLLM dialect) and fetches the tokenizer over
GetTokenizer. The gateway counts as started once every worker is healthy in it and the model's
tokenizer answers ``/v1/tokenize``, so the first request never races the registration.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from reference_server.testing import free_port

STARTUP_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.1


class GatewayStartError(RuntimeError):
    pass


def smg_binary() -> str:
    """The ``smg`` next to this interpreter (the project's venv), else the one on PATH."""
    local = Path(sys.executable).parent / "smg"
    return str(local) if local.exists() else "smg"


class SmgGateway:
    def __init__(
        self,
        worker_targets: list[str],
        *,
        model: str,
        policy: str = "cache_aware",
        args: tuple[str, ...] = (),
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.worker_targets = worker_targets
        self.model = model
        self.policy = policy
        self.args = args
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        self.metrics_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._folder = Path(tempfile.mkdtemp(prefix="lmrpc-smg-"))
        self.log_path = self._folder / "smg.log"
        self._kept_log: str | None = None  # the log, once stop() has removed the folder

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL."""
        return f"{self.url}/v1"

    def start(self) -> SmgGateway:
        self._folder.mkdir(exist_ok=True)
        self._kept_log = None
        self.port, self.metrics_port = free_port(), free_port()
        command = [
            smg_binary(), "launch",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *(f"grpc://{target}" for target in self.worker_targets),
            "--policy", self.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
            *self.args,
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._ready():
            if self.process.poll() is not None:
                raise GatewayStartError(f"smg exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise GatewayStartError(f"smg not ready after {self.startup_timeout_s} s:\n{self.log()}")
            time.sleep(POLL_INTERVAL_S)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/readiness", timeout=2) as response:
                if json.load(response).get("healthy_workers") != len(self.worker_targets):
                    return False
            body = json.dumps({"model": self.model, "prompt": "ready?"}).encode()
            request = urllib.request.Request(
                f"{self.url}/v1/tokenize", data=body, headers={"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def metrics(self) -> str:
        """smg's own Prometheus text."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        return sum_samples(self.metrics(), name, **labels)

    def workers(self) -> list[dict[str, object]]:
        """smg's view of each worker: url, status and the load it routes by (requests it counts
        as running there)."""
        with urllib.request.urlopen(f"{self.url}/workers", timeout=5) as response:
            listed = json.load(response).get("workers", [])
        return [{key: worker.get(key) for key in ("url", "status", "load")} for worker in listed]

    def log(self) -> str:
        if self._kept_log is not None:
            return self._kept_log
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._folder.exists():
            self._kept_log = self.log()
            shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> SmgGateway:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


_SAMPLE = re.compile(r"^(?P<name>[^\s{]+)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def sum_samples(text: str, name: str, **labels: str) -> float:
    """Sum of the Prometheus text samples named ``name`` that carry all of ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] != name:
            continue
        found = dict(_LABEL.findall(match["labels"] or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match["value"])
    return total
