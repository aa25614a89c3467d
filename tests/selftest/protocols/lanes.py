"""Lanes for the engine-protocol self-test: one reference server (fake engine) serving lmrpc.v1 and
the vLLM dialect on its main port, SGLang's scheduler protocol on ``--sglang-port`` and SGLang's native
service on ``--sglang-runtime-port``, with a zoo of each engine protocol's mutants in front of the
matching port. Mutants that share a lane run one after
another (load-watching cases need a quiet server); lanes run side by side."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from zoo_process import start_zoo

from reference_server.testing import ServerProcess

from ..lanes import ABORT_GRACE_S, KV_TOKENS, MAX_WAITING, TOKEN_DELAY_S, Lane

SERVER_ARGS = (
    "--fake-token-delay", TOKEN_DELAY_S,
    "--kv-tokens", KV_TOKENS,
    "--max-waiting-requests", MAX_WAITING,
    "--abort-grace", ABORT_GRACE_S,
    "--sglang-port", "0",
    "--sglang-runtime-port", "0",
)  # fmt: skip


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
                zoo, ports[protocol] = start_zoo(
                    "tests.selftest.protocols.zoo", "--protocol", protocol, "--upstream", upstream,
                    timeout_s=timeout_s,
                )  # fmt: skip
                zoos.append(zoo)
        except BaseException:
            for zoo in zoos:
                zoo.kill()
            server.stop()
            raise
        return EngineLane(Lane(server, zoos[0]), zoos[1], ports)

    def server_target(self, protocol: str) -> str:
        server = self.lane.server
        return {
            "sglang-scheduler": server.sglang_target,
            "sglang-runtime": server.sglang_runtime_target,
        }.get(protocol, server.target)

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
