"""Lanes for the engine-protocol self-test: one reference server (fake engine) serving lmrpc.v1 and
the vLLM dialect on its main port, SGLang's scheduler protocol on ``--sglang-scheduler-port`` and SGLang's native
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
    "--sglang-scheduler-port", "0",
    "--sglang-runtime-port", "0",
)  # fmt: skip


PROTOCOLS = ("vllm-engine", "sglang-scheduler", "sglang-runtime")  # each with a zoo in front of its port


def server_target(server: ServerProcess, protocol: str) -> str:
    """The reference server's port for ``protocol`` (the main port serves lmrpc.v1 and the vLLM dialect)."""
    return {
        "sglang-scheduler": server.sglang_scheduler_target,
        "sglang-runtime": server.sglang_runtime_target,
    }.get(protocol, server.target)


@dataclass
class EngineLane:
    lane: Lane  # the server and its reset, with the vLLM zoo as its zoo
    other_zoos: list[subprocess.Popen[bytes]]
    ports: dict[str, dict[str, int]] = field(default_factory=dict)

    @staticmethod
    def start(timeout_s: float = 120.0) -> EngineLane:
        server = ServerProcess(engine="fake", args=SERVER_ARGS).start()
        zoos: list[subprocess.Popen[bytes]] = []
        ports = {}
        try:
            for protocol in PROTOCOLS:
                zoo, ports[protocol] = start_zoo(
                    "tests.selftest.protocols.zoo", "--protocol", protocol,
                    "--upstream", server_target(server, protocol), timeout_s=timeout_s,
                )  # fmt: skip
                zoos.append(zoo)
        except BaseException:
            for zoo in zoos:
                zoo.kill()
            server.stop()
            raise
        return EngineLane(Lane(server, zoos[0]), zoos[1:], ports)

    def server_target(self, protocol: str) -> str:
        return server_target(self.lane.server, protocol)

    def target(self, protocol: str, mutant: str) -> str:
        return f"127.0.0.1:{self.ports[protocol][mutant]}"

    def reset(self) -> None:
        self.lane.reset()

    def stop(self) -> None:
        for zoo in self.other_zoos:
            if zoo.poll() is None:
                zoo.terminate()
                try:
                    zoo.wait(10)
                except subprocess.TimeoutExpired:
                    zoo.kill()
        self.lane.stop()
