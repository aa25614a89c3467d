"""Run a reference server in a subprocess, for tests and benchmarks.

    with ServerProcess(engine="fake") as server:
        client = LmrpcClient.connect(server.target)

The server binds a free port (``--port 0``) and reports it through a ready file once it is
serving, so tests never race for ports and never talk to a half-started server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

ROLES = {"lmrpc-scheduler": "scheduler", "lmrpc-detokeniz": "detokenizer"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for servers that cannot bind port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServerStartError(RuntimeError):
    pass


class ServerProcess:
    def __init__(
        self,
        *,
        engine: str = "fake",
        args: tuple[str, ...] = (),
        startup_timeout_s: float = 120.0,
        env: dict[str, str] | None = None,
        launcher: tuple[str, ...] = ("-m", "reference_server"),
        python: str = sys.executable,
        cwd: str | None = None,
    ) -> None:
        self.engine = engine
        self.launcher = launcher  # what runs the server: a module of the server, or a test's variant
        self.python = python  # another environment's interpreter runs the server installed there
        self.cwd = cwd
        self.args = args
        self.startup_timeout_s = startup_timeout_s
        self.env = env
        self.port = 0
        self.sglang_scheduler_port = (
            0  # with --sglang-scheduler-port: the port of the SGLang scheduler protocol
        )
        self.sglang_runtime_port = 0  # with --sglang-runtime-port: SGLang's native gRPC service
        self.process: subprocess.Popen[bytes] | None = None
        self._folder = Path(tempfile.mkdtemp(prefix="lmrpc-test-"))
        self.log_path = self._folder / "server.log"
        self._kept_log: str | None = None  # the log, once stop() has removed the folder

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sglang_scheduler_target(self) -> str:
        return f"127.0.0.1:{self.sglang_scheduler_port}"

    @property
    def sglang_runtime_target(self) -> str:
        return f"127.0.0.1:{self.sglang_runtime_port}"

    def start(self) -> ServerProcess:
        self._folder.mkdir(exist_ok=True)
        self._kept_log = None
        ready_file = self._folder / "ready"
        ready_file.unlink(missing_ok=True)
        command = [
            self.python, *self.launcher,
            "--engine", self.engine, "--port", "0", "--ready-file", str(ready_file), *self.args,
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(self.env or {})},
                cwd=self.cwd,
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while not ready_file.exists():
            if self.process.poll() is not None:
                raise ServerStartError(f"server exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(f"server not ready after {self.startup_timeout_s} s:\n{self.log()}")
            time.sleep(0.05)
        first, *more = ready_file.read_text().splitlines()
        self.port = int(first)
        for line in more:
            name, _, port = line.partition(" ")
            if name == "sglang-scheduler":
                self.sglang_scheduler_port = int(port)
            elif name == "sglang-runtime":
                self.sglang_runtime_port = int(port)
        return self

    def log(self) -> str:
        if self._kept_log is not None:
            return self._kept_log
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self) -> None:
        """Send SIGTERM (graceful drain) without waiting."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout_s)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._remove_folder()
        return self.process.returncode

    def _remove_folder(self) -> None:
        if self._folder.exists():
            self._kept_log = self.log()
            shutil.rmtree(self._folder, ignore_errors=True)

    def worker_pids(self) -> dict[str, int]:
        """Pids of the worker processes by role ("scheduler", "detokenizer")."""
        assert self.process is not None
        pids = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                name = (entry / "comm").read_text().strip()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == self.process.pid and name in ROLES:
                pids[ROLES[name]] = int(entry.name)
        return pids

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
