"""Lanes for the engine-protocol self-test: one reference server (fake engine) serving lmrpc.v1 and
the vLLM dialect on its main port and SGLang's scheduler protocol on ``--sglang-port``, with a zoo of
each protocol's mutants in front of the matching port. Mutants that share a lane run one after
another (load-watching cases need a quiet server); lanes run side by side."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from reference_server.testing import ServerProcess

from ..lanes import KV_TOKENS, MAX_WAITING, ROOT, TOKEN_DELAY_S, Lane

SERVER_ARGS = (
    "--fake-token-delay", TOKEN_DELAY_S,
    "--kv-tokens", KV_TOKENS,
    "--max-waiting-requests", MAX_WAITING,
    "--sglang-port", "0",
)  # fmt: skip


def start_zoo(
    protocol: str, upstream: str, timeout_s: float
) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    ready = Path(tempfile.mkdtemp(prefix="lmrpc-engine-zoo-")) / "ports.json"
    zoo = subprocess.Popen(
        [sys.executable, "-m", "tests.selftest.protocols.zoo", "--protocol", protocol,
         "--upstream", upstream, "--ready-file", str(ready)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    give_up = time.monotonic() + timeout_s
    while not ready.exists():
        if zoo.poll() is not None or time.monotonic() > give_up:
            zoo.kill()
            raise RuntimeError(f"the {protocol} mutant zoo did not start (exit code {zoo.poll()})")
        time.sleep(0.05)
    return zoo, json.loads(ready.read_text())


@dataclass
class EngineLane:
    lane: Lane  # the server and its reset, with the vLLM zoo as its zoo
    sglang_zoo: subprocess.Popen[bytes]
    ports: dict[str, dict[str, int]] = field(default_factory=dict)

    @staticmethod
    def start(timeout_s: float = 120.0) -> EngineLane:
        server = ServerProcess(engine="fake", args=SERVER_ARGS).start()
        zoos: list[subprocess.Popen[bytes]] = []
        ports = {}
        try:
            for protocol, upstream in (
                ("vllm-engine", server.target),
                ("sglang-scheduler", server.sglang_target),
            ):
                zoo, ports[protocol] = start_zoo(protocol, upstream, timeout_s)
                zoos.append(zoo)
        except BaseException:
            for zoo in zoos:
                zoo.kill()
            server.stop()
            raise
        return EngineLane(Lane(server, zoos[0]), zoos[1], ports)

    def server_target(self, protocol: str) -> str:
        server = self.lane.server
        return server.sglang_target if protocol == "sglang-scheduler" else server.target

    def target(self, protocol: str, mutant: str) -> str:
        return f"127.0.0.1:{self.ports[protocol][mutant]}"

    def reset(self) -> None:
        self.lane.reset()

    def stop(self) -> None:
        if self.sglang_zoo.poll() is None:
            self.sglang_zoo.terminate()
            try:
                self.sglang_zoo.wait(10)
            except subprocess.TimeoutExpired:
                self.sglang_zoo.kill()
        self.lane.stop()
